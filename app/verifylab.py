"""Verification lab: decode with a (possibly LOSSY) verification rule, colour every drafted token by the rule's
acceptance probability, and show at any position the target p, the draft q and the rule's output law.

p at each position is the target's (at the run's temperature) over the final text, q the EAGLE-3 head's
one-step draft distribution at that position (the q of a step's first drafted token), and the rule's output law
follows from them (switchsd/core/rules.py). The Pareto plot reads a quality run (python -m switchsd quality).
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import torch

from switchsd.core.config import SamplingConfig
from switchsd.core.rules import RULES, Rule, overshoot_ratio
from switchsd.io import check_text

from .render import token_text
from .resources import MAX_PROMPT_CHARS, Resources, UserError

LAB_METHOD = "eagle3@chain4"
# the knob the lab's slider moves, per rule (the others keep their defaults; capped keeps c = 2)
KNOB = {"minp": "p_base", "eta": "eps", "lenience": "l", "cos": "lam", "capped": "lam", "cos-contrastive": "mu",
        "easd": "tq"}
QUALITY = Path(__file__).resolve().parents[1] / "docs" / "quality" / "summary.json"
MAX_LAB_TOKENS = 96


def make_rule(name: str, knob: float | None) -> Rule:
    if name not in RULES:
        raise UserError(f"unknown rule {str(name)[:40]!r}")
    params = {}
    if name in KNOB and knob is not None:
        params[KNOB[name]] = float(knob)
        if name == "easd":
            params["tp"] = float(knob)
    try:
        return Rule(name, params)
    except ValueError as e:
        raise UserError(str(e)) from None


@torch.inference_mode()
def run(res: Resources, prompt: str, rule_name: str, knob: float | None, temperature: float, max_new: int,
        seed: int = 0) -> dict:
    """Decode with the rule (torch thread); returns the state the view and the bars read."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError("Write a prompt first.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt has {len(prompt)} characters; the lab takes at most {MAX_PROMPT_CHARS}.")
    try:
        check_text(prompt, "The prompt")
    except ValueError as e:
        raise UserError(f"{e}.") from None
    rule = make_rule(rule_name, knob)
    if not (isinstance(temperature, (int, float)) and 0.05 <= float(temperature) <= 2.0):
        raise UserError("temperature must be between 0.05 and 2 (verification rules relax *sampling*)")
    max_new = int(max(1, min(MAX_LAB_TOKENS, int(max_new))))
    lm = res.lm()
    ids = lm.encode(prompt, chat=True)
    if len(ids) + max_new + 8 >= lm.max_length:
        raise UserError(f"The prompt has {len(ids)} tokens; the model's context is {lm.max_length}.")
    engine = res.engine(LAB_METHOD, max_new, float(temperature), gamma=None, verify=rule.name if not rule.params
                        else f"{rule.name}:" + ",".join(f"{k}={v}" for k, v in rule.params.items()))
    try:
        result = res.worker.call(lambda: engine.run(ids, torch.Generator().manual_seed(int(seed))))
    finally:
        res.worker.post(engine.close)
    toks = result.token_ids
    # per emitted token: the rule's acceptance probability if it was drafted, else None (a bonus / replacement)
    probs: list[float | None] = []
    for e in result.events:
        rows = e.accepted_rows
        probs += [e.accept_probs[r] if e.accept_probs else None for r in rows][:len(e.new_tokens)]
        probs += [None] * (len(e.new_tokens) - len(rows[:len(e.new_tokens)]))
    p, q = res.worker.call(_distributions, res, ids, toks, float(temperature))
    return {"prompt": ids, "tokens": toks, "probs": probs[:len(toks)], "p": p, "q": q, "rule": rule.name,
            "params": rule.params, "label": rule.label, "lossy": rule.lossy, "stats": result.stats,
            "temperature": float(temperature)}


@torch.inference_mode()
def _distributions(res: Resources, ids: list[int], toks: list[int], temperature: float, k: int = 12):
    """Top-k sparse p and q at every emitted position: ([(idx, val) ...], ...) per position."""
    lm = res.lm()
    drafters = res.drafters(lm)
    head = drafters.head
    from switchsd.drafters.eagle3 import Eagle3Drafter
    d = Eagle3Drafter(head, lm.model, chain=True, gamma=1, sampling=SamplingConfig(temperature))
    seq = ids + toks
    out = lm.model(input_ids=torch.tensor([seq], device=lm.device), output_hidden_states=True)
    P = torch.softmax(out.logits[0, len(ids) - 1:-1].float() / temperature, -1)                  # [n, V]
    # emitted token j was drafted (if at all) from q_along's row j - 2 (features at j - 2, pending token j - 1)
    Q = d.q_along(out.hidden_states, seq)[len(ids) - 2:len(seq) - 2].float()                   # [n, V]
    sparse = lambda M: [(v.topk(k).indices.tolist(), v.topk(k).values.tolist()) for v in M]    # noqa: E731
    return sparse(P), sparse(Q)


def _dense(sp, V: int) -> torch.Tensor:
    x = torch.zeros(V, dtype=torch.float64)
    x[torch.tensor(sp[0])] = torch.tensor(sp[1], dtype=torch.float64)
    return x


def view(res: Resources, state: dict | None) -> str:
    if not state:
        return "<i>Run the lab to see each drafted token coloured by the rule's acceptance probability.</i>"
    tok = res.lm().tokenizer
    spans = []
    for i, (t, a) in enumerate(zip(state["tokens"], state["probs"])):
        bg = "#e9ecef" if a is None else f"rgba(47,158,68,{0.15 + 0.75 * a:.2f})" if a >= 0.5 else \
            f"rgba(224,49,49,{0.15 + 0.75 * (1 - a):.2f})"
        tip = "not drafted (bonus / replacement)" if a is None else f"acceptance probability {a:.3f}"
        spans.append(f'<span class="tok" data-pos="{i}" style="background:{bg}" title="#{i} · {tip}">'
                     f"{html.escape(token_text(tok, t))}</span>")
    s = state["stats"]
    badge = ('<b style="color:#c92a2a">LOSSY</b>: the output is not the target\'s distribution'
             if state["lossy"] else "<b>lossless</b>: the output follows the target's distribution")
    return (f'<div class="ssd-tokens"><div style="font-size:12px">{html.escape(state["label"])} · {badge} · '
            f'{s["new_tokens"]} tokens, {s["tok_per_fwd"]:.2f} per target forward, {s["tok_s"]:.1f} tok/s · '
            f'green = likely accepted, red = likely rejected, grey = drawn by the target</div>{"".join(spans)}</div>')


def bars(res: Resources, state: dict | None, pos: int) -> dict:
    """p, q and the rule's output law at one position (top tokens), as a Plotly figure dict."""
    from .plots import _fig
    if not state or not state["tokens"]:
        return _fig([], "p, q and the rule's output at a position", "token", "probability")
    pos = max(0, min(int(pos), len(state["tokens"]) - 1))
    V = res.lm().model.config.vocab_size
    p, q = _dense(state["p"][pos], V), _dense(state["q"][pos], V)
    p, q = p / p.sum(), q / q.sum()                    # top-k renormalised: the bars show the head of each law
    rule = Rule(state["rule"], state["params"])
    out = rule.output(p, q)
    top = torch.unique(torch.cat([p.topk(6).indices, q.topk(6).indices]))
    top = top[out[top].argsort(descending=True)].tolist()
    tok = res.lm().tokenizer
    names = [repr(token_text(tok, t))[1:-1] or "·" for t in top]
    data = [dict(type="bar", name=n, x=names, y=[float(v[t]) for t in top], marker=dict(color=c))
            for n, v, c in (("p (target)", p, "#1c7ed6"), ("q (draft)", q, "#2f9e44"),
                            (f"output ({rule.label})", out, "#e8590c"))]
    title = (f"position {pos}: emitted {repr(token_text(tok, state['tokens'][pos]))} · overshoot ratio "
             f"{overshoot_ratio(rule, p, q):.2f}")
    return _fig(data, title, "token", "probability", barmode="group")


def pareto(path: Path = QUALITY) -> dict:
    """Accuracy vs tokens per target forward of every spec in a quality run's summary.json."""
    from .plots import _fig
    if not path.exists():
        return _fig([], "no quality run shipped yet (python -m switchsd quality)", "tokens per forward", "accuracy")
    rules = json.loads(path.read_text())["rules"]
    fam = lambda k: k.split(":")[0]          # noqa: E731
    colors = {"lossless": "#212529", "target": "#868e96", "target-minp": "#adb5bd", "target-eta": "#ced4da",
              "minp": "#1c7ed6", "eta": "#4dabf7", "lenience": "#2f9e44", "cos": "#e8590c", "capped": "#7048e8",
              "easd": "#c2255c", "cos-contrastive": "#f59f00", "smc": "#0ca678"}
    data = []
    for f in colors:
        pts = sorted(((k, v) for k, v in rules.items() if fam(k) == f), key=lambda kv: kv[1]["tokens_per_forward"])
        if pts:
            data.append(dict(type="scatter", mode="markers+lines" if len(pts) > 1 else "markers", name=f,
                             x=[v["tokens_per_forward"] for _, v in pts], y=[v["accuracy"] for _, v in pts],
                             text=[k for k, _ in pts], marker=dict(color=colors[f], size=9),
                             error_y=dict(type="data", symmetric=False,
                                          array=[v["ci"][1] - v["accuracy"] for _, v in pts],
                                          arrayminus=[v["accuracy"] - v["ci"][0] for _, v in pts], thickness=1)))
    return _fig(data, "accuracy vs tokens per target forward (quality run)", "tokens per target forward",
                "accuracy", height=420)
