"""Score a probe on new prompts: the target writes greedy completions, they are labelled (verbatim spans of
>= n_train tokens seen earlier), and the probe reads the decision-aligned hidden state of every position.

    switchsd probe evaluate --probe probes/smollm2-135m-instruct.safetensors --data-file PROMPTS.jsonl

Rows of the JSONL hold {"prompt": ...}. Prints AUC / F1 and, LAST, one JSON line
{"auc": .., "f1": .., "n_tokens": .., "positive_rate": ..} (F1 at the probe's own tau).
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

from switchsd.core.probe import ProbeError, load_probe
from switchsd.io import read_jsonl
from switchsd.models.capture import HiddenCapture
from switchsd.models.loading import load_model

from .features import complete
from .labels import aligned_pairs
from .metrics import best_f1, f1_at, roc_auc


def read_prompts(path: str) -> list[dict]:
    try:
        raw = read_jsonl(path)
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {e}")
    rows = []
    for i, r in enumerate(raw):
        p = r.get("prompt") if isinstance(r, dict) else None
        if not isinstance(p, str) or not p.strip():
            raise SystemExit(f"error: {path}: row {i + 1}: no 'prompt' text")
        rows.append({"id": i, "prompt": p})
    if not rows:
        raise SystemExit(f"error: {path} holds no prompts")
    return rows


@torch.inference_mode()
def score_sequences(lm, probe, seqs, n_train: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """seqs [(tokens, start of the completion)] -> (probe scores, copy labels, greedy agreement): the last is the
    share of completion tokens that are the target's argmax after the tokens before them (1.0 for the target's own
    greedy completions up to near-ties of a batched product), read from the same forwards."""
    scores, labels, agree, n = [], [], 0, 0
    with HiddenCapture(lm.model, [probe.site]) as cap:
        for toks, start in tqdm(seqs, desc="probe scores", unit="seq"):
            rows = torch.arange(max(0, start - 1), len(toks) - 1, device=lm.device)      # predict toks[start:]
            logits = lm.model(input_ids=torch.tensor([toks], device=lm.device), logits_to_keep=rows).logits[0]
            agree += int((logits.argmax(-1).cpu() == torch.tensor(toks[len(toks) - len(rows):])).sum())
            n += len(rows)
            pos, lab = aligned_pairs(toks, start, n_train)
            if not pos:
                continue
            h = cap.last[probe.site][0, pos]
            scores.append(probe.scores(h).cpu())
            labels.append(torch.tensor(lab))
    return torch.cat(scores), torch.cat(labels), agree / max(1, n)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe", required=True)
    ap.add_argument("--data-file", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--no-chat", action="store_true")
    ap.add_argument("--cache", default=None, help="JSONL cache of completions (default: a temporary file)")
    args = ap.parse_args(argv)
    rows = read_prompts(args.data_file)
    lm = load_model(args.model, dtype="float32")
    try:
        probe = load_probe(args.probe, lm.model)
    except ProbeError as e:
        raise SystemExit(f"error: {e}")
    cache = Path(args.cache) if args.cache else Path(tempfile.mkdtemp()) / "completions.jsonl"
    recs = complete(lm, rows, cache, args.max_new_tokens, chat=not args.no_chat)
    n_train = int(probe.meta.get("n_train", 5))
    s, y, _ = score_sequences(lm, probe, [(r["prompt_ids"] + r["completion_ids"], len(r["prompt_ids"]))
                                          for r in recs], n_train)
    auc, f1 = roc_auc(s, y), f1_at(s, y, probe.tau)
    bf1, btau = best_f1(s, y)
    print(f"{len(recs)} prompts, {y.numel()} decision positions, {100 * float(y.float().mean()):.1f}% copy")
    print(f"AUC {auc:.4f}  F1@tau={probe.tau:.2f} {f1:.4f}  (best F1 {bf1:.4f} at tau {btau:.2f})")
    print(json.dumps({"auc": auc, "f1": f1, "n_tokens": int(y.numel()), "positive_rate": float(y.float().mean())}))


if __name__ == "__main__":
    main()
