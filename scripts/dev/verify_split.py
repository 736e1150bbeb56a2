"""Where a step's 'verify' time goes: the target forward against the rest (acceptance, cache roll-back, drafter
catch-up), per verified row count, beside the drafting time and the calibrated curve's price.

    python scripts/dev/verify_split.py --method eagle3@chain3 --dtype int4 --prompts 3
"""
from __future__ import annotations

import argparse
import statistics as st
import time
from collections import defaultdict

from switchsd.core.config import EngineConfig
from switchsd.eval.datasets import load_prompts
from switchsd.factory import build_engine
from switchsd.models.loading import load_model


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="eagle3@chain3")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    lm = load_model(None, dtype=args.dtype)
    eng = build_engine(args.method, lm, engine=EngineConfig(max_new_tokens=args.max_new_tokens))
    forward, last = eng._forward, {}

    def timed(cache, tree, extra=None):
        t0 = time.perf_counter()
        out = forward(cache, tree, extra)
        last["forward"] = time.perf_counter() - t0
        return out

    eng._forward = timed
    fw, verify, draft = defaultdict(list), defaultdict(list), defaultdict(list)
    for p in load_prompts(args.dataset, limit=args.prompts):
        for ev in eng.generate(lm.encode(p["prompt"], chat=True)):
            rows = len(ev.tree_tokens)
            fw[rows].append(1000 * last["forward"])
            verify[rows].append(1000 * ev.timings["verify"])
            draft[rows].append(1000 * ev.timings["draft"])
    print(f"{args.method}, {lm.precision}: median ms per step")
    for rows in sorted(fw):
        f, v = st.median(fw[rows]), st.median(verify[rows])
        print(f"rows {rows:2d} (n={len(fw[rows]):4d}): forward {f:6.1f}, verify {v:6.1f} (rest {v - f:4.1f}), "
              f"draft {st.median(draft[rows]):5.1f}, curve {eng.cost.ms(rows):6.1f}")


if __name__ == "__main__":
    main()
