"""The int4 format's forward with keys/values and attention in float32 (A: the default where bfloat16 is emulated,
`dense.attention_dtype`) against bfloat16 (B: before), paired in one process on the same weights: per context
length and row count, A and B alternate (--pairs pairs of --steps forwards each) and the medians of the per-pair
times and of the ratios are printed. Run it on a quiet machine.

    python scripts/dev/attention_dtype_ab.py --contexts 300,1000 --rows 1,2,4 --pairs 6 --steps 10
"""
from __future__ import annotations

import argparse
import statistics as st
import time

import torch

from switchsd.models.lean import LeanLlama
from switchsd.models.loading import load_model


def per_forward_ms(lean: LeanLlama, prefix: torch.Tensor, rows: int, steps: int) -> float:
    """Mean ms of `steps` forwards of `rows` new tokens, each on the same cached prefix (rolled back between)."""
    cache = lean.new_cache(prefix.shape[1] + rows)
    lean.forward(prefix, cache, logit_rows=-1)
    ids = torch.ones(1, rows, dtype=torch.long)
    t0 = time.perf_counter()
    for _ in range(steps):
        cache.crop(prefix.shape[1])
        lean.forward(ids, cache)
    return (time.perf_counter() - t0) / steps * 1e3


@torch.inference_mode()
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="300,1000")
    ap.add_argument("--rows", default="1,2,4")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    lm = load_model(dtype="int4", device="cpu")
    a, b = LeanLlama(lm.model), LeanLlama(lm.model)
    b.att_dtype = lm.dtype                                   # bfloat16 keys/values and attention (the old path)
    print(f"A: attention in {a.att_dtype}, B: in {b.att_dtype}; {torch.get_num_threads()} threads; ms per forward")
    g = torch.Generator().manual_seed(0)
    for n in (int(c) for c in args.contexts.split(",")):
        prefix = torch.randint(0, lm.model.config.vocab_size, (1, n), generator=g)
        for rows in (int(r) for r in args.rows.split(",")):
            per_forward_ms(a, prefix, rows, 2), per_forward_ms(b, prefix, rows, 2)          # warm-up
            ta, tb = [], []
            for _ in range(args.pairs):
                ta.append(per_forward_ms(a, prefix, rows, args.steps))
                tb.append(per_forward_ms(b, prefix, rows, args.steps))
            ratio = st.median(x / y for x, y in zip(ta, tb))
            print(f"context {n:5d}, rows {rows}: A {st.median(ta):6.1f}  B {st.median(tb):6.1f}  A/B {ratio:.2f}")


if __name__ == "__main__":
    main()
