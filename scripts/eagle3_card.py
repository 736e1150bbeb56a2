"""The measured half of an EAGLE-3 head's card: the data-scaling curve (the rows of
`scripts/dev/eagle3_scaling.py`) and acceptance per draft position per benchmark (bench runs of the head).

    python scripts/eagle3_card.py --scaling ~/.cache/switchsd/eagle3/sharegpt/scaling.json \
        --bench runs/card/{mtbench,humaneval,math500,cnndm}/results.json --method eagle3@chain3 \
        [--append assets/eagle3-smollm2-135m/README.md]

Acceptance at position k: of the steps whose draft reached depth k with the k-1 tokens before it accepted, the
share whose k-th token was accepted too (`switchsd.core.events`); tau = tokens per target forward.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def scaling_table(rows: list[dict]) -> str:
    out = ["| regenerated + teacher-forced answers | variant | steps | val agreement per TTT step | "
           "MT-Bench chain-3 tok/fwd (verify budget) |", "|---|---|---|---|---|"]
    for r in rows:
        acc = " / ".join(f"{a:.3f}" for a in r["val_acc"])
        out.append(f"| {r['answers']} + {r.get('tf_answers', 0)} | {r['variant']} | {r['steps']} | {acc} | "
                   f"{r['mtbench_chain3_tau']:.2f} ({r.get('mtbench_budget', '?')}) |")
    return "\n".join(out)


def acceptance_table(results: list[Path], method: str) -> str:
    """One row per set and drafted path (neural for EAGLE-3; copy and neural for SwitchSD and the other mixes)."""
    runs = []
    for path in results:
        d = json.loads(path.read_text())
        s = d["summary"].get(method)
        if s is None:
            raise SystemExit(f"{path}: no {method!r} row (methods: {', '.join(d['summary'])})")
        name = (f"{d['meta']['dataset']} ({d['meta']['n_prompts']}, {d['meta']['engine']['max_new_tokens']} tokens, "
                f"{d['meta']['dtype']})")
        drafted = {p: v for p, v in sorted(s["paths"].items()) if v.get("accept_at")} or {"neural": {}}
        runs += [(name, s, p, v) for p, v in drafted.items()]
    depth = max((len(v.get("accept_at", [])) for *_, v in runs), default=0)
    out = ["| set | tok/fwd | path | % of steps | " + "".join(f"pos {k + 1} | " for k in range(depth)) + "identical |",
           "|---|---|---|---|" + "---|" * depth + "---|"]
    for name, s, p, v in runs:
        at = v.get("accept_at", [])
        cells = [f"{a:.3f}" for a in at] + ["-"] * (depth - len(at))
        out.append(f"| {name} | {s['tok_per_fwd']:.2f} | {p} | {v.get('pct', 0.0):.0f}% | "
                   + "".join(c + " | " for c in cells) + f"{s['identical']}/{s['n']} |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scaling", type=Path, default=None, help="scripts/dev/eagle3_scaling.py's scaling.json")
    ap.add_argument("--bench", type=Path, nargs="*", default=[], help="bench results.json files of the head")
    ap.add_argument("--method", default="eagle3@chain3")
    ap.add_argument("--append", type=Path, default=None, help="append the sections to this card")
    args = ap.parse_args(argv)
    parts = []
    if args.scaling:
        parts.append("## Data-scaling curve (`scripts/dev/eagle3_scaling.py`)\n\n" +
                     scaling_table(json.loads(args.scaling.expanduser().read_text())))
    if args.bench:
        parts.append(f"## Acceptance per draft position ({args.method}, T = 0)\n\n" +
                     acceptance_table(args.bench, args.method))
    text = "\n\n".join(parts) + "\n"
    if args.append:
        with args.append.open("a") as f:
            f.write("\n" + text)
    print(text, end="")


if __name__ == "__main__":
    main()
