"""Where a one-token decode step's time goes, per format: the lean forward after a prefix of --prefix tokens,
--steps one-token steps under torch's profiler, the top ops by self CPU time.

    python scripts/dev/profile_step.py --formats bfloat16,int4 --prefix 300 --steps 30
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from switchsd.models.forward import make_target
from switchsd.models.loading import load_model


@torch.inference_mode()
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default="bfloat16,int4")
    ap.add_argument("--prefix", type=int, default=300)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    for fmt in [f.strip() for f in args.formats.split(",") if f.strip()]:
        lm = load_model(dtype=fmt, device="cpu")
        target = make_target(lm.model, (), "lean")
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, lm.model.config.vocab_size, (1, args.prefix), generator=g)
        tok = torch.tensor([[1]])

        def prefilled(n: int):
            cache = target.new_cache(args.prefix + n + 8)
            target.forward(ids, cache)
            return cache

        def steps(cache, n: int) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                target.forward(tok, cache)
            return (time.perf_counter() - t0) / n

        steps(prefilled(5), 5)                                            # warm-up
        ms = 1000 * steps(prefilled(args.steps), args.steps)
        cache = prefilled(args.steps)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            steps(cache, args.steps)
        print(f"\n== {fmt}: {ms:.2f} ms per one-token step after {args.prefix} tokens "
              f"({torch.get_num_threads()} threads)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
