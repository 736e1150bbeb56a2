"""A quality run (python -m switchsd quality) as a Markdown table and a Pareto plot (docs/quality/pareto.png +
the summary the studio's Verification lab reads).

    python scripts/quality_report.py runs/quality-main [more run folders] --out docs/quality
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app.verifylab import pareto  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", default="docs/quality")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    merged = {"meta": [], "rules": {}}
    for run in args.runs:
        d = json.loads((Path(run) / "summary.json").read_text())
        merged["meta"].append(d["meta"])
        merged["rules"].update(d["rules"])
    (out / "summary.json").write_text(json.dumps(merged, indent=1))
    fig = pareto(out / "summary.json")
    import plotly.graph_objects as go
    try:
        go.Figure(fig).write_image(str(out / "pareto.png"), width=1000, height=520)
    except Exception as e:          # kaleido needs a Chrome: the JSON summary is always written
        print(f"(PNG skipped: {e.__class__.__name__})", file=sys.stderr)
    print("| spec | accuracy (95% CI) | tok/fwd | Tok/s | low-p rate | overshoot mass | rejected | extra |\n"
          "|---|---|---|---|---|---|---|---|")
    for spec, s in merged["rules"].items():
        extra = ", ".join(f"{k} {s[k]:.3f}" for k in ("trigger_rate", "mean_ess", "resample_rate") if k in s)
        rej = f"{s['rejected_share']:.2f}" if s["rejected_share"] >= 0 else "n/a (no rejection)"
        om = f"{s['overshoot_mass']:.3f}" if "overshoot_mass" in s else "-"
        print(f"| {s['label']} | {s['accuracy']:.3f} ({s['ci'][0]:.3f}-{s['ci'][1]:.3f}) | "
              f"{s['tokens_per_forward']:.2f} | {s['tok_s']:.1f} | {s['low_p_rate']:.4f} | {om} | {rej} | {extra} |")
    for m in merged["meta"]:
        print(f"\n`{m['command']}`")


if __name__ == "__main__":
    main()
