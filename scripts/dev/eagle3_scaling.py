"""The EAGLE-3 data-scaling curve: one head per prefix of the ShareGPT answers (`python -m switchsd regen-sharegpt`),
each scored by validation agreement per TTT step (the held-out ShareGPT answers) and by MT-Bench chain tau.

    nohup python scripts/dev/eagle3_scaling.py --sizes 2000,5000,10000,20000 > ~/.cache/switchsd/eagle3/scaling.log &

Every point resumes (the trainer checkpoints; a finished point is skipped); results accumulate in
`<state>/scaling.json`, one row per (size, variant). Sizes beyond the answers available are skipped.

`--points R+T,...` trains on the first R regenerated and the first T teacher-forced answers (ShareGPT's own,
`regen_sharegpt --teacher-forced`) per point instead: with `--steps` fixed, the data-source A/B at equal compute

    python scripts/dev/eagle3_scaling.py --points 692+0,0+2798 --steps 32 --init assets/eagle3-smollm2-135m-v2 --revocab
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from switchsd.training.regen_job import DEFAULT_STATE, split_index


def run(cmd: list[str]) -> str:
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)    # progress bars go to the log
    return out.stdout


def mtbench_tau(head: Path, out: Path, limit: int, max_new: int) -> tuple[float, int]:
    """Tokens per target forward of EAGLE-3 chain 3 on MT-Bench first turns (the bench's last line is JSON), and
    the verify budget it ran with (a calibration measured under load can cap the chain: keep it in sight)."""
    last = run([sys.executable, "-m", "switchsd", "bench", "--dataset", "mtbench", "--limit", str(limit),
                "--max-new-tokens", str(max_new), "--methods", "eagle3@chain3", "--eagle", str(head),
                "--out", str(out)]).strip().splitlines()[-1]
    methods = json.loads(last)["methods"]
    budget = json.loads((out / "results.json").read_text())["meta"]["budget"]
    return float(methods["eagle3@chain3"]["tok_per_fwd"]), budget    # the bench adds vanilla as its reference row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", default=str(DEFAULT_STATE))
    ap.add_argument("--sizes", default="2000,5000,10000,20000")
    ap.add_argument("--tf-answers", type=int, default=0, help="teacher-forced samples added to every point")
    ap.add_argument("--init", default=None, help="start every point from this head (default: from scratch)")
    ap.add_argument("--points", default=None, help="R+T pairs: regenerated + teacher-forced answers per point")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per point (default: --epochs')")
    ap.add_argument("--revocab", action="store_true", help="with --init: a new draft vocabulary (--draft-vocab)")
    ap.add_argument("--draft-vocab", type=int, default=12288)
    ap.add_argument("--save-every", type=int, default=100,
                    help="checkpoint (and score 64 validation answers) every N steps")
    ap.add_argument("--epochs", type=float, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--ttt", type=int, default=7, help="training-time-test steps K (the recipe's 7; chain 3 uses 3)")
    ap.add_argument("--mtbench-limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()
    state = Path(args.state).expanduser()
    have = {sp: len(split_index(state, sp)) for sp in ("train", "tf")}
    result_path = state / "scaling.json"
    rows = json.loads(result_path.read_text()) if result_path.exists() else []
    variant = (f"init={args.init or 'scratch'},revocab={args.revocab},vocab={args.draft_vocab},epochs={args.epochs},"
               f"steps={args.steps},lr={args.lr}" + (f",ttt={args.ttt}" if args.ttt != 7 else ""))
    points = ([tuple(int(x) for x in p.split("+")) for p in args.points.split(",")] if args.points else
              [(int(x), args.tf_answers) for x in args.sizes.split(",")])
    for n, tf in points:
        if n > have["train"] or tf > have["tf"]:
            print(f"skip {n}+{tf}: only {have['train']}+{have['tf']} answers so far", flush=True)
            continue
        if any(r["answers"] == n and r.get("tf_answers", 0) == tf and r["variant"] == variant for r in rows):
            continue
        tag = hashlib.sha1(variant.encode()).hexdigest()[:8]
        work = state / "scaling" / (f"{n}-{tag}" if not tf else f"{n}+{tf}-{tag}")   # stable across runs
        cmd = [sys.executable, "-m", "switchsd", "train-eagle3", "--sharegpt", str(state), "--answers", str(n),
               "--tf-answers", str(tf), "--epochs", str(args.epochs), "--lr", str(args.lr),
               "--draft-vocab", str(args.draft_vocab), "--save-every", str(args.save_every),
               "--ttt", str(args.ttt), "--work", str(work), "--out", str(work / "head")]
        cmd += (["--init", args.init] if args.init else []) + (["--revocab"] if args.revocab else [])
        cmd += ["--steps", str(args.steps)] if args.steps else []
        meta_line = run(cmd).strip().splitlines()[-1]
        meta = json.loads(meta_line)
        tau, budget = mtbench_tau(work / "head", work / "mtbench", args.mtbench_limit, args.max_new_tokens)
        rows.append({"answers": n, "tf_answers": tf, "variant": variant, "val_acc": meta["val_acc_all"],
                     "mtbench_chain3_tau": tau, "mtbench_budget": budget, "steps": meta["steps"], "log": meta["log"],
                     "coverage": meta["coverage"], "val_coverage": meta["val_coverage"]})
        result_path.write_text(json.dumps(rows, indent=1))
        print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
