"""Prefill and one-token decode time of the offline model per format, through the engine's forward: an N-token
prompt (random ids) prefilled twice (the second timed), then the median of ten one-token steps after it.

    python scripts/dev/prefill_time.py --formats int4,float32 --tokens 800
"""
from __future__ import annotations

import argparse
import time

import torch

from switchsd.models.forward import make_target
from switchsd.models.loading import load_model


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default="int4,float32")
    ap.add_argument("--tokens", type=int, default=800)
    args = ap.parse_args(argv)
    if args.tokens < 2:
        raise SystemExit("--tokens must be >= 2")
    for fmt in args.formats.split(","):
        lm = load_model(None, dtype=fmt)
        target = make_target(lm.model, (), "auto")
        ids = torch.randint(100, 40000, (1, args.tokens), generator=torch.Generator().manual_seed(0))  # [1, N]
        for _ in range(2):                      # the first pass makes the wide products' dense copies
            cache = target.new_cache(args.tokens + 16)
            t0 = time.perf_counter()
            target.forward(ids, cache, logit_rows=1)
            prefill = time.perf_counter() - t0
        steps = []
        for _ in range(10):
            t0 = time.perf_counter()
            target.forward(torch.tensor([[5]]), cache)
            steps.append(time.perf_counter() - t0)
        print(f"{fmt}: prefill of {args.tokens} tokens {prefill:.2f} s; one token after it "
              f"{1000 * sorted(steps)[5]:.1f} ms")


if __name__ == "__main__":
    main()
