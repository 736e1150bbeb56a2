"""Collect probe training / evaluation data: target completions, labels, hidden states at every site.

    switchsd probe collect --out runs/probes/mine --model FILE.gguf|FOLDER [--n 1200] [--max-new-tokens 192]
        [--sets copydiversity,realtext]            (+ constructed,natural,mtbench for the data ablation)

Sets: copydiversity (our 32-type prompts, completions by the target), realtext (copy-intent prompts on real
standard-library code, docstrings and prose, probes/realtext.py; completions by the target), constructed
(random-token sequences with a span repeated: ConstructedCopy), natural (natural English text with its own
repetitions: Python's bundled pydoc topics), mtbench (Spec-Bench ids 81-160 first turns, completions by the
target; the evaluation set of the paper's data ablation). Every stage is cached under --out and resumes.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from switchsd.eval.datasets import load_prompts
from switchsd.models.loading import load_model

from . import copydiversity, realtext
from .features import complete, site_features


def constructed_sequences(n: int, length: int, vocab: int, seed: int) -> list[tuple[int, list[int], int]]:
    """Random tokens with one to three spans (5-20 tokens) repeated later."""
    r = random.Random(seed)
    out = []
    for i in range(n):
        toks = [r.randrange(100, vocab) for _ in range(length)]
        for _ in range(r.randint(1, 3)):
            L = r.randint(5, 20)
            a = r.randrange(0, length // 2 - L)
            b = r.randrange(a + L, length - L)
            toks[b:b + L] = toks[a:a + L]
        out.append((i, toks, 0))
    return out


def natural_sequences(tokenizer, n: int, length: int, seed: int) -> list[tuple[int, list[int], int]]:
    """Windows of natural English (pydoc topics shipped with CPython), labelled on their own repetitions."""
    from pydoc_data.topics import topics
    text = "\n\n".join(topics[k] for k in sorted(topics))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    r = random.Random(seed)
    starts = sorted(r.sample(range(0, len(ids) - length), min(n, max(1, (len(ids) - length) // length))))
    return [(i, ids[s:s + length], 0) for i, s in enumerate(starts)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=1200, help="CopyDiversity prompts (80%% train / 20%% val)")
    ap.add_argument("--n-realtext", type=int, default=640, help="RealText prompts (80%% train / 20%% val)")
    ap.add_argument("--n-ablation", type=int, default=400, help="sequences for constructed and natural sets")
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--n-train", type=int, default=5, help="shortest verbatim span labelled as copy")
    ap.add_argument("--sets", default="copydiversity,realtext",
                    help="the bundled training sets (default); add constructed, natural (bundled) and mtbench (needs "
                         "Spec-Bench's question file) for the data ablation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--gen-dtype", default="float32", help="dtype of the target while it writes completions "
                    "(bfloat16 ~2x faster on AVX-512 BF16 CPUs); hidden states are always read in float32")
    args = ap.parse_args(argv)
    out = Path(args.out)
    lm = load_model(args.model, dtype="float32")
    writer = lm if args.gen_dtype in ("float32", "fp32") else load_model(args.model, dtype=args.gen_dtype)
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    for name in sets:
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        if name in ("copydiversity", "realtext"):
            rows = copydiversity.build(args.n, args.seed) if name == "copydiversity" else \
                realtext.build(args.n_realtext, args.seed)
            (d / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        elif name == "mtbench":
            rows = [{"id": i, "prompt": p["prompt"], "split": "eval"} for i, p in enumerate(load_prompts("mtbench"))]
        prompted = name in ("copydiversity", "realtext", "mtbench")
        if prompted:
            recs = complete(writer, rows, d / "completions.jsonl", args.max_new_tokens, args.batch)
            seqs = [(r["id"], r["prompt_ids"] + r["completion_ids"], len(r["prompt_ids"])) for r in recs]
        elif name == "constructed":
            seqs = constructed_sequences(args.n_ablation, 192, lm.model.config.vocab_size, args.seed)
        elif name == "natural":
            seqs = natural_sequences(lm.tokenizer, args.n_ablation, 192, args.seed)
        else:
            ap.error(f"unknown set {name!r}")
        (d / "splits.json").write_text(json.dumps(
            {str(r["id"]): r.get("split", "train") for r in rows} if prompted else {str(s[0]): "train" for s in seqs}))
        site_features(lm, seqs, d / "features", args.n_train, desc=f"{name} hidden states")


if __name__ == "__main__":
    main()
