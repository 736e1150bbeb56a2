"""The paper's analyses, one command each.

    python -m switchsd analysis regime --dataset humaneval --limit 40 --max-new-tokens 256 --out runs/regime
    python -m switchsd analysis tax --results runs/humaneval/results.json [more results.json ...]
    python -m switchsd analysis temperature --dataset mtbench --limit 10 --out runs/temperature

regime (Fig. 3): SwitchSD decodes as usual; at EVERY step both the copy drafter and the neural drafter also
propose, and each draft's acceptance length is measured against the target's greedy continuation (known from
a vanilla run: at T = 0 a draft is accepted exactly as far as it matches it). Steps are split by the probe's
decision; we report the histograms and the share of copy drafts reaching the full D tokens.
temperature (Table 4): see switchsd/tempsweep.py.
tax: the share of copy attempts that accepted 0 tokens, per method (the speculation tax), from bench results.
Best lookahead (Table 3): one bench run with method variants, e.g.
    --methods vanilla,eagle3@chain3,eagle3@chain5,eagle3@chain7,switchsd@chain3,switchsd@chain5,switchsd@chain7
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..cli.common import (
    Neural,
    add_decode_args,
    add_model_args,
    add_neural_args,
    build_engine,
    copy_config,
    engine_config,
    load,
    load_prompt_file,
    resolve_budget,
)
from ..core.drafting import DraftRequest
from ..core.policies import PolicyState
from . import tempsweep
from .datasets import DATASETS


def accepted_len(candidates: list[list[int]], reference: list[int]) -> int:
    best = 0
    for c in candidates:
        n = 0
        while n < len(c) and n < len(reference) and c[n] == reference[n]:
            n += 1
        best = max(best, n)
    return best


class Shadow:
    """Wraps a SwitchSD policy; records both paths' would-be acceptance at every step."""

    def __init__(self, inner, reference: list[int], budget: int, depth: int):
        self.inner, self.reference, self.budget, self.depth = inner, reference, budget, depth
        self.drafters = inner.drafters
        self.records: list[dict] = []

    def select(self, state: PolicyState):
        decision = self.inner.select(state)
        gate = decision.why
        L = len(state.tokens)
        cont = self.reference[L:]
        req = DraftRequest(tokens=state.tokens, max_len=min(self.depth, max(len(cont) - 1, 0)), budget=self.budget - 1)
        rec = {"probe": state.probe_score, "gate": gate["copy"], "match": gate["kgram_match"]}
        if req.max_len > 0:
            cd = self.inner.copy.propose(req)
            rec["copy"] = accepted_len(cd.candidates, cont) if cd else None
            rec["copy_full"] = bool(cd) and rec["copy"] >= min(self.depth, req.max_len)
            nd = self.inner.neural.propose(req) if self.inner.neural is not None else None
            rec["neural"] = accepted_len(nd.candidates, cont) if nd else None
        self.records.append(rec)
        return decision

    def observe(self, event):
        self.inner.observe(event)


def regime(args) -> None:
    prompts = load_prompt_file(args, args.limit)
    lm = load(args)
    budget, _ = resolve_budget(args, lm)
    cfg = engine_config(args, budget)
    copy_cfg = copy_config(args)
    neural = Neural(args, lm)
    chat = bool(getattr(lm.tokenizer, "chat_template", None))
    records = []
    from tqdm import tqdm
    for p in tqdm(prompts, desc="regime separation", unit="prompt"):
        ids = lm.encode(p["prompt"], chat=chat)
        ref = ids + build_engine("vanilla", lm, cfg, copy_cfg).run(ids).token_ids
        eng = build_engine("switchsd", lm, cfg, copy_cfg, neural)
        shadow = Shadow(eng.policy, ref, budget, copy_cfg.max_draft_len)
        eng.policy = shadow
        out = eng.run(ids).token_ids
        assert ids + out == ref, "switchsd must equal vanilla at T=0"
        records += [r for r in shadow.records if r.get("copy") is not None]
    active = [r for r in records if r["gate"]]
    inactive = [r for r in records if not r["gate"]]
    summary = {
        "steps_with_copy_match": len(records),
        "probe_active": {"n": len(active), "copy_full_share": sum(r["copy_full"] for r in active) / max(1, len(active)),
                         "copy_mean": sum(r["copy"] for r in active) / max(1, len(active)),
                         "neural_mean": sum(r["neural"] or 0 for r in active) / max(1, len(active))},
        "probe_inactive": {"n": len(inactive),
                           "copy_full_share": sum(r["copy_full"] for r in inactive) / max(1, len(inactive)),
                           "copy_mean": sum(r["copy"] for r in inactive) / max(1, len(inactive)),
                           "neural_mean": sum(r["neural"] or 0 for r in inactive) / max(1, len(inactive))},
        "paper": {"probe_active_copy_full_share": 0.300, "probe_inactive_copy_full_share": 0.047},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "regime.json").write_text(json.dumps({"summary": summary, "records": records}))
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=1, cols=2, subplot_titles=("probe active (copy would run)", "probe inactive"))
    for col, group in ((1, active), (2, inactive)):
        fig.add_trace(go.Histogram(x=[r["copy"] for r in group], name="copy draft", marker_color="#e8590c",
                                   opacity=0.7, xbins=dict(start=-0.5, end=copy_cfg.max_draft_len + 0.5, size=1),
                                   histnorm="probability", showlegend=col == 1), 1, col)
        fig.add_trace(go.Histogram(x=[r["neural"] or 0 for r in group], name="neural draft", marker_color="#2f9e44",
                                   opacity=0.6, xbins=dict(start=-0.5, end=copy_cfg.max_draft_len + 0.5, size=1),
                                   histnorm="probability", showlegend=col == 1), 1, col)
    fig.update_layout(barmode="overlay", title="Regime separation: accepted tokens if each path ran")
    fig.update_xaxes(title_text="accepted draft tokens")
    fig.write_html(str(out / "regime.html"), include_plotlyjs="cdn")
    try:
        fig.write_image(str(out / "regime.png"), width=1100, height=420)
    except Exception as e:
        print(f"(PNG skipped: {e.__class__.__name__})")
    print(json.dumps(summary))


def tax(args) -> None:
    rows = []
    for path in args.results:
        d = json.loads(Path(path).read_text())
        for m, s in d["summary"].items():
            c = s["paths"].get("copy")
            if c:
                rows.append((d["meta"]["dataset"], m, c["pct"], c["mal"], c.get("zero_accept")))
    print("| dataset | method | copy % of steps | copy MAL | copy attempts accepting 0 |\n|---|---|---|---|---|")
    for r in rows:
        zero = "n/a" if r[4] is None else f"{100 * r[4]:.1f}%"
        print(f"| {r[0]} | {r[1]} | {r[2]:.1f}% | {r[3]:.2f} | {zero} |")
    print(json.dumps([{"dataset": r[0], "method": r[1], "zero_accept": r[4]} for r in rows]))


def _decoding_parser(sub, name: str, limit: int, **kw) -> argparse.ArgumentParser:
    p = sub.add_parser(name, **kw)
    p.add_argument("--dataset", required=True, choices=DATASETS)
    p.add_argument("--data-file", default=None)
    p.add_argument("--limit", type=int, default=limit)
    p.add_argument("--out", default=f"runs/{name}")
    add_model_args(p)
    add_decode_args(p)
    add_neural_args(p)
    return p


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    _decoding_parser(sub, "regime", 20, help="Fig. 3: both paths' acceptance at every step, split by the gate")
    t = sub.add_parser("tax", help="false triggers: copy attempts accepting 0 tokens, from bench results")
    t.add_argument("--results", nargs="+", required=True)
    tempsweep.add_args(_decoding_parser(sub, "temperature", 10,
                                        help="Table 4: speed per temperature + the T > 0 distribution check"))
    args = ap.parse_args(argv)
    {"regime": regime, "tax": tax, "temperature": tempsweep.temperature}[args.cmd](args)


if __name__ == "__main__":
    main()
