"""One table across benchmark runs: per method and dataset, mean Tok/s with its speedup over that run's vanilla,
tokens per forward, ms per step (wall time / engine steps) and identity with vanilla.

    python scripts/bench_summary.py runs/appendix-b-float32/{humaneval,math500,cnndm}/results.json
"""
from __future__ import annotations

import argparse
import json


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+")
    args = ap.parse_args(argv)
    runs = []
    for path in args.results:
        d = json.load(open(path))
        runs.append((f"{d['meta']['dataset']} ({d['meta']['n_prompts']})", d))
    methods = list(dict.fromkeys(m for _, d in runs for m in d["summary"]))
    head = "| method | " + " | ".join(f"{name}: Tok/s (x vanilla) | tok/fwd | ms/step | identical" for name, _ in runs)
    print(head + " | mean speedup |")
    print("|---|" + "---|---|---|---|" * len(runs) + "---|")
    for m in methods:
        cells, ups = [], []
        for _, d in runs:
            s = d["summary"].get(m)
            if s is None:
                cells.append("- | - | - | -")
                continue
            recs = d["records"][m]
            wall = sum(r["stats"]["wall_s"] for r in recs)
            steps = sum(r["stats"]["steps"] for r in recs)
            ups.append(s["speedup"])
            cells.append(f"{s['tok_s']:.1f} ({s['speedup']:.2f}x) | {s['tok_per_fwd']:.2f} | "
                         f"{1000 * wall / max(steps, 1):.0f} | {s['identical']}/{s['n']}")
        mean = f"{sum(ups) / len(ups):.2f}x" if ups else "-"
        print(f"| {m} | " + " | ".join(cells) + f" | {mean} |")


if __name__ == "__main__":
    main()
