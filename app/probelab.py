"""Probe lab: score any text with one or two probes, per token, beside the n-gram copy labels."""
from __future__ import annotations

import torch

from probes.labels import ALIGN, copy_labels
from switchsd.io import check_text
from switchsd.models.capture import HiddenCapture

from .render import heat_strip
from .resources import MAX_PROMPT_CHARS, Resources, UserError

MAX_TEXT_TOKENS = 2048
LAB_NEW_TOKENS = 128


def load_probes(res: Resources, shipped: str | None, compare: str | None, upload: str | None) -> tuple[list, list]:
    """(probes, names): the upload if there is one, else the shipped probe chosen; then the comparison."""
    first = (res.load_upload(upload), "uploaded probe") if upload else (res.load_probe(shipped), shipped)
    pairs = [first] + ([(res.load_probe(compare), compare)] if compare else [])
    return [p for p, _ in pairs], [n for _, n in pairs]


@torch.inference_mode()
def score_text(res: Resources, probes: list, names: list[str], text: str, generate: bool,
               max_new: int = LAB_NEW_TOKENS) -> dict:
    """Per-token scores of each probe (the score shown at token j is the probe on h_{j-ALIGN}, the state the
    engine reads when it decides whether token j will be copied) and the copy labels. Stored in gr.State so
    the threshold slider re-colours without recomputing."""
    if not isinstance(text, str) or not text.strip():
        raise UserError("Paste some text (or a prompt to generate from) first.")
    if len(text) > MAX_PROMPT_CHARS:
        raise UserError(f"The text has {len(text)} characters; the probe lab takes at most {MAX_PROMPT_CHARS}.")
    if not probes:
        raise UserError("Choose at least one probe.")
    try:
        check_text(text, "The text")
    except ValueError as e:
        raise UserError(f"{e}.") from None
    lm = res.lm()
    if generate:
        from switchsd.core.config import EngineConfig
        from switchsd.core.policies import Fixed
        from switchsd.factory import make_engine
        ids = lm.encode(text, chat=True)
        if len(ids) + max_new > MAX_TEXT_TOKENS:
            raise UserError(f"The prompt has {len(ids)} tokens; with the {max_new} generated ones the probe lab "
                            f"takes at most {MAX_TEXT_TOKENS} (shorten it, or untick 'Generate a completion').")
        gen = make_engine(lm.model, Fixed([]), EngineConfig(max_new_tokens=int(max_new)), lm.eos_ids(), lm.max_length)
        tokens, start = ids + gen.run(ids).token_ids, len(ids)
    else:
        tokens, start = lm.encode(text, chat=False), 0
    if len(tokens) > MAX_TEXT_TOKENS:
        raise UserError(f"The text has {len(tokens)} tokens; the probe lab takes at most {MAX_TEXT_TOKENS}.")
    if len(tokens) <= ALIGN:
        raise UserError("The text is too short to score.")
    sites = list(dict.fromkeys(p.site for p in probes))
    with HiddenCapture(lm.model, sites) as cap:
        lm.model(input_ids=torch.tensor([tokens], device=lm.device), logits_to_keep=1)
        scores = [p.scores(cap.last[p.site][0]).cpu().tolist() for p in probes]   # [T] per probe
    labels = copy_labels(tokens, int(probes[0].meta.get("n_train", 5)))
    js = list(range(max(start, ALIGN), len(tokens)))
    return {"tokens": [tokens[j] for j in js], "labels": [labels[j] for j in js],
            "scores": [[sc[j - ALIGN] for j in js] for sc in scores],
            "names": list(names), "taus": [p.tau for p in probes],
            "meta": [p.meta for p in probes]}


def render(res: Resources, state: dict | None, tau: float | None) -> str:
    if not state:
        return "<i>Score a text to see the heat strip.</i>"
    lm = res.lm()
    out = []
    for name, sc, t in zip(state["names"], state["scores"], state["taus"]):
        thr = float(tau) if tau is not None else t
        pred = [s >= thr for s in sc]
        tp = sum(p and y for p, y in zip(pred, state["labels"]))
        fp = sum(p and not y for p, y in zip(pred, state["labels"]))
        fn = sum((not p) and y for p, y in zip(pred, state["labels"]))
        f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        out.append(heat_strip(lm.tokenizer, state["tokens"], sc, state["labels"], thr,
                              f"{name.rsplit('/', 1)[-1]} · tau {thr:.2f} · F1 on this text {f1:.2f}"))
    return "".join(out)
