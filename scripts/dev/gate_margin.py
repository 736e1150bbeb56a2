"""The default EAGLE-3 (its cost gate) beside vanilla at several neural margins (`GateConfig.neural_margin`), every
engine in one process, prompts interleaved after a warm-up: how much of a chain's gain the gate keeps.

    python scripts/dev/gate_margin.py 0.05 0 --dataset mtbench --limit 20 --max-new-tokens 128
"""
from __future__ import annotations

import argparse
import time

import torch

from switchsd.core.config import EngineConfig, GateConfig
from switchsd.eval.datasets import load_prompts
from switchsd.factory import Drafters, build_engine
from switchsd.models.loading import load_model


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("margins", nargs="+", type=float)
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=6)
    args = ap.parse_args(argv)
    lm = load_model(None, dtype="auto")
    drafters = Drafters(lm)
    cfg = EngineConfig(max_new_tokens=args.max_new_tokens, budget=args.budget)
    engines = {"vanilla": build_engine("vanilla", lm, drafters, engine=cfg)}
    for m in args.margins:
        engines[f"eagle3, margin {m}"] = build_engine("eagle3", lm, drafters, engine=cfg,
                                                      gate=GateConfig(neural_margin=m))
    prompts = [lm.encode(p["prompt"], chat=True) for p in load_prompts(args.dataset, limit=args.limit)]
    for eng in engines.values():
        eng.run(prompts[0], torch.Generator().manual_seed(0))
    tokens, seconds = dict.fromkeys(engines, 0), dict.fromkeys(engines, 0.0)
    for ids in prompts:
        for name, eng in engines.items():
            t = time.perf_counter()
            res = eng.run(ids, torch.Generator().manual_seed(0))
            seconds[name] += time.perf_counter() - t
            tokens[name] += len(res.token_ids)
    base = tokens["vanilla"] / seconds["vanilla"]
    for name in engines:
        rate = tokens[name] / seconds[name]
        print(f"{name}: {rate:.1f} tok/s, {rate / base:.3f}x vanilla")


if __name__ == "__main__":
    main()
