"""The serving runs (scripts/serve_bench.sh) as the Markdown tables of docs/results.md "The seed systems".

    python scripts/serve_report.py runs/serve
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def load(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/serve")
    print("| max batch | vanilla tok/s | SwitchSD tok/s | SwitchSD / vanilla | vanilla latency p50 / p90 (s) | "
          "SwitchSD latency p50 / p90 (s) | identical (vanilla, SwitchSD) |\n|---|---|---|---|---|---|---|")
    for b in (1, 4, 8, 16):
        f = root / f"batch{b}"
        if not (f / "results.json").exists():
            continue
        m = load(f)["modes"]
        v, s = m["vanilla"], m["sd"]
        print(f"| {b} | {v['throughput']:.1f} | {s['throughput']:.1f} | {s['throughput'] / v['throughput']:.2f} | "
              f"{v['latency_p50']:.1f} / {v['latency_p90']:.1f} | {s['latency_p50']:.1f} / {s['latency_p90']:.1f} | "
              f"{v['identical']}/{v['n']}, {s['identical']}/{s['n']} |")
    for f in sorted(p for p in root.glob("psd-rate*") if (p / "results.json").exists()):
        d = load(f)
        meta, m = d["meta"], d["modes"]
        print(f"\nOffered load: {meta['requests']} requests, rate {meta['rate']} /s (0: all at once), max batch "
              f"{meta['max_batch']} (PSD: two sub-batches of {meta['psd_sub_batch']}), {meta['max_new_tokens']} "
              f"new tokens, draft {meta['draft']}, gamma {meta['gamma']}\n")
        print("| mode | cores | tok/s | x vanilla | latency p50 / p90 (s) | TTFT p50 (s) | D ms | V ms | "
              "(D+V)/max(D,V) | target idle | overlap (s) | identical |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
        base = m["vanilla"]["throughput"]
        cores = {"vanilla": "2", "sps": "2 (shared)", "sps-1core": "1", "psd": "1 + 1", "pearl": "1 + 1"}
        for mode, s in m.items():
            gain = f"{s['model_gain']:.2f}" if s["model_gain"] else "-"
            print(f"| {mode} | {cores.get(mode, '?')} | {s['throughput']:.1f} | {s['throughput'] / base:.2f} | "
                  f"{s['latency_p50']:.1f} / {s['latency_p90']:.1f} | {s['ttft_p50']:.1f} | {1e3 * s['D']:.0f} | "
                  f"{1e3 * s['V']:.0f} | {gain} | {s['target_idle']:.2f} | {s['overlap_s']:.1f} | "
                  f"{s['identical']}/{s['n']} |")
        if "psd" in m and "sps" in m:
            p, e1, e2 = m["psd"]["throughput"], m["sps"]["throughput"], m.get("sps-1core", {}).get("throughput")
            print(f"\nPSD / SD: {p / e1:.2f} at equal cores (2 vs 1 + 1)" +
                  (f", {p / e2:.2f} with one extra core (SD on 1 core)" if e2 else "") +
                  f"; the model predicts {m['psd']['model_gain']:.2f} from PSD's own D and V")
        print(f"\n`{meta['command']}`")


if __name__ == "__main__":
    main()
