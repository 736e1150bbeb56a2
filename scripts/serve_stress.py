"""Randomised stress test of the batched engine's identity with single-request greedy decoding (real model, float32).

    python scripts/serve_stress.py --trials 12 --requests 12 --max-new-tokens 48 --out runs/serve-stress

Each trial draws a mode (vanilla, sd with SwitchSD's per-row gate, sps with the in-process self-draft drafter),
a max batch (1-8), a torch thread count (1 or 2) and an arrival schedule counted in engine STEPS (a random number
of requests joins before each step), so a failing trial replays exactly (`--only K`). Every request's tokens are
compared with its single-request vanilla output; where one differs, the first differing token is re-scored in
float32 with a one-row forward (switchsd.eval.mismatch.explain) to tell a float near-tie (|margin| ~ 1e-5, the
rounding of a wider matrix product) from a decoding error. Last line: JSON summary.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from switchsd.core.config import EngineConfig
from switchsd.eval.datasets import load_prompts
from switchsd.eval.mismatch import explain
from switchsd.factory import Drafters, build_engine
from switchsd.models.loading import load_model
from switchsd.serve.drafting import BatchDrafter, load_draft
from switchsd.serve.engine import BatchedEngine
from switchsd.serve.load import external_decoder


def trial_plan(k: int, n: int, seed: int) -> dict:
    r = random.Random(seed * 1000 + k)
    joins, left = [], n
    while left:                                   # requests joining before each step (0 allowed: idle gaps)
        j = min(left, r.choice([0, 0, 1, 1, 2, 3, n]))
        joins.append(j)
        left -= j
    return {"mode": r.choice(["vanilla", "sd", "sps"]), "max_batch": r.choice([1, 2, 3, 4, 5, 8]),
            "threads": r.choice([1, 2]), "gamma": r.choice([2, 4, 6]), "order": r.sample(range(n), n),
            "joins": joins}


def run_trial(plan: dict, lm, ids: list[list[int]], cfg: EngineConfig, drafters: Drafters) -> dict:
    torch.set_num_threads(plan["threads"])
    mode, B = plan["mode"], plan["max_batch"]
    bd = None
    if mode == "sps":
        bd = BatchDrafter(load_draft(lm, "self:8"), plan["gamma"], B)
        make = external_decoder(lm.model, cfg, lm.eos_ids())
    else:
        m = "vanilla" if mode == "vanilla" else "switchsd"
        make = lambda: build_engine(m, lm, drafters, cfg).decoder          # noqa: E731
    sites = () if mode == "sps" else build_engine("vanilla" if mode == "vanilla" else "switchsd", lm, drafters,
                                                  cfg).sites
    be = BatchedEngine(lm.model, make, cfg, B, sites=sites)
    out = {i: [] for i in range(len(ids))}
    queue, joins = list(plan["order"]), list(plan["joins"])
    while queue or be.rows or be.waiting:
        for _ in range(joins.pop(0) if joins else len(queue)):
            i = queue.pop(0)
            be.submit(i, ids[i])
        be.admit()
        if not be.rows:
            continue
        if bd is not None:
            drafts = bd.draft({row.rid: row.req.tokens for row in be.rows})
            for row in be.rows:
                row.decoder.policy.drafters[0].put(drafts[row.rid])
        for rid, e in be.step():
            out[rid] += e.new_tokens
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--dataset", default="humaneval")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", type=int, default=None, help="replay one trial")
    ap.add_argument("--out", default="runs/serve-stress")
    args = ap.parse_args(argv)
    lm = load_model(dtype="float32", device="cpu")
    cfg = EngineConfig(max_new_tokens=args.max_new_tokens)
    ids = [lm.encode(p["prompt"], chat=True) for p in load_prompts(args.dataset, None, args.requests)]
    drafters = Drafters(lm)
    torch.set_num_threads(2)
    van = build_engine("vanilla", lm, drafters, cfg)
    refs = [van.run(x).token_ids for x in tqdm(ids, desc="single-request references", file=sys.stderr)]
    trials = [args.only] if args.only is not None else range(args.trials)
    results = []
    for k in tqdm(trials, desc="trials", file=sys.stderr):
        plan = trial_plan(k, len(ids), args.seed)
        got = run_trial(plan, lm, ids, cfg, drafters)
        torch.set_num_threads(2)
        bad = [i for i in range(len(ids)) if got[i] != refs[i]]
        why = [dict(rid=i, **explain(lm.model, ids[i], refs[i], got[i])) for i in bad]
        res = {"trial": k, **{x: plan[x] for x in ("mode", "max_batch", "threads", "gamma")},
               "identical": len(ids) - len(bad), "n": len(ids), "mismatches": why}
        results.append(res)
        print(json.dumps(res), file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    margins = [abs(m["fp32_margin"]) for r in results for m in r["mismatches"] if m.get("kind") == "token"]
    print(json.dumps({"trials": len(results), "requests": sum(r["n"] for r in results),
                      "identical": sum(r["identical"] for r in results),
                      "max_abs_margin_of_mismatches": max(margins) if margins else None}))


if __name__ == "__main__":
    main()
