"""The EAGLE-3 data-scaling curve: one head per prefix of the ShareGPT answers (`python -m switchsd.regen_sharegpt`),
each scored by validation agreement per TTT step (the held-out ShareGPT answers) and by MT-Bench chain tau.

    nohup python scripts/eagle3_scaling.py --sizes 2000,5000,10000,20000 > ~/.cache/switchsd/eagle3/scaling.log &

Every point resumes (the trainer checkpoints; a finished point is skipped); results accumulate in
`<state>/scaling.json`, one row per (size, variant). Sizes beyond the answers available are skipped.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from switchsd.training.regen_job import DEFAULT_STATE, load_split


def run(cmd: list[str]) -> str:
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out.stdout


def mtbench_tau(head: Path, out: Path, limit: int, max_new: int) -> float:
    """Tokens per target forward of EAGLE-3 chain 3 on MT-Bench first turns (the bench's last line is JSON)."""
    last = run([sys.executable, "-m", "switchsd.bench", "--dataset", "mtbench", "--limit", str(limit),
                "--max-new-tokens", str(max_new), "--methods", "eagle3@chain3", "--eagle", str(head),
                "--out", str(out)]).strip().splitlines()[-1]
    methods = json.loads(last)["methods"]
    return float(next(iter(methods.values()))["tok_per_fwd"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", default=str(DEFAULT_STATE))
    ap.add_argument("--sizes", default="2000,5000,10000,20000")
    ap.add_argument("--tf-answers", type=int, default=0, help="teacher-forced samples added to every point")
    ap.add_argument("--init", default=None, help="start every point from this head (default: from scratch)")
    ap.add_argument("--epochs", type=float, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--mtbench-limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()
    state = Path(args.state).expanduser()
    have = len(load_split(state, "train"))
    result_path = state / "scaling.json"
    rows = json.loads(result_path.read_text()) if result_path.exists() else []
    variant = f"init={args.init or 'scratch'},tf={args.tf_answers},epochs={args.epochs},lr={args.lr}"
    for n in [int(x) for x in args.sizes.split(",")]:
        if n > have:
            print(f"skip {n}: only {have} answers so far", flush=True)
            continue
        if any(r["answers"] == n and r["variant"] == variant for r in rows):
            continue
        work = state / "scaling" / f"{n}-{hashlib.sha1(variant.encode()).hexdigest()[:8]}"   # stable across runs
        cmd = [sys.executable, "-m", "switchsd.train_eagle3", "--sharegpt", str(state), "--answers", str(n),
               "--tf-answers", str(args.tf_answers), "--epochs", str(args.epochs), "--lr", str(args.lr),
               "--work", str(work), "--out", str(work / "head")]
        if args.init:
            cmd += ["--init", args.init]
        meta_line = run(cmd).strip().splitlines()[-1]
        meta = json.loads(meta_line)
        tau = mtbench_tau(work / "head", work / "mtbench", args.mtbench_limit, args.max_new_tokens)
        rows.append({"answers": n, "variant": variant, "val_acc": meta["val_acc_all"], "mtbench_chain3_tau": tau,
                     "steps": meta["steps"]})
        result_path.write_text(json.dumps(rows, indent=1))
        print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
