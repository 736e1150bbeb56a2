"""Vanilla greedy decoding of the offline model in every format (with --methods, other methods in every format
too), side by side in one process, with llama.cpp on the same GGUF file when llama-cpp-python is installed: same
chat-templated prompts, interleaved prompt by prompt, after a warm-up; mean of per-prompt Tok/s.

    python scripts/format_speed.py --dataset humaneval --limit 10 --max-new-tokens 128 --out runs/format-speed

A format may name the forward it runs on: `bfloat16@hf` is vanilla on transformers' own forward in bfloat16 (the
engine's forward before the lean one: the baseline); `--base` names the row the speedup column
divides by (default bfloat16).

Also reports, per format, the one-token forward and the verify cost curve's shape (ms at 1, 4, 8, 16 rows)
from `switchsd.models.calibrate.measure`, and each format's agreement with the float32 model's greedy tokens.
Last line: JSON {format: {"tok_s", "x_base", "x_llama_cpp", "same_as_float32"}}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from switchsd.core.config import EngineConfig
from switchsd.eval.datasets import DATASETS, load_prompts
from switchsd.eval.mismatch import explain
from switchsd.eval.peers import LlamaCppPeer, llama_cpp_missing
from switchsd.factory import Drafters, build_engine
from switchsd.models import int4
from switchsd.models.calibrate import measure
from switchsd.models.loading import gguf_path, load_model

FORMATS = ("float32", "bfloat16", "int4", "int4-float32")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="humaneval", choices=DATASETS)
    ap.add_argument("--data-file", default=None)
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--methods", default="vanilla",
                    help="engine methods to run in every format (rows: 'format', or 'format method' beyond vanilla)")
    ap.add_argument("--base", default="bfloat16", help="the row the 'x base' column divides by")
    ap.add_argument("--out", default="runs/format-speed")
    args = ap.parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if any(f.startswith("int4") for f in formats) and not int4.available():
        ap.error("this torch build has no CPU int4 kernel")
    cfg = EngineConfig(max_new_tokens=args.max_new_tokens)
    spec = {f: (f.split("@")[0], f.split("@")[1] if "@" in f else "auto") for f in formats}   # format, forward
    loaded = {d: load_model(dtype=d, device="cpu")
              for d in tqdm(dict.fromkeys(d for d, _ in spec.values()), desc="loading", file=sys.stderr)}
    lms = {f: loaded[d] for f, (d, _) in spec.items()}
    first = next(iter(lms.values()))
    prompts = load_prompts(args.dataset, args.data_file, args.limit)
    ids = [first.encode(p["prompt"], chat=True) for p in prompts]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    runners, fmt_of = {}, {}
    for f, lm in lms.items():
        drafters = Drafters(lm)
        for m in methods:
            key = f if m == "vanilla" else f"{f} {m}"
            runners[key] = build_engine(m, lm, drafters, replace(cfg, forward=spec[f][1]))
            fmt_of[key] = f
    why = llama_cpp_missing()
    if why is None:
        runners["llama-cpp"] = LlamaCppPeer(gguf_path(None), cfg, first.eos_ids())
    else:
        print(why, file=sys.stderr)
    for r in runners.values():                                  # warm-up (not timed)
        r.run(ids[0][:64])
    rates: dict[str, list[float]] = {k: [] for k in runners}
    outs: dict[str, list[list[int]]] = {k: [] for k in runners}
    for x in tqdm(ids, desc="prompts", file=sys.stderr):
        for k, r in runners.items():
            g = r.run(x)
            rates[k].append(g.stats["tok_s"])
            outs[k].append(list(g.token_ids))
    curves = {f: measure(lm, 16, 256, 3, progress=False, forward=spec[f][1]) for f, lm in lms.items()}
    curves.update({k: curves[f] for k, f in fmt_of.items()})
    base, cpp = rates.get(args.base), rates.get("llama-cpp")
    mean = {k: statistics.mean(v) for k, v in rates.items()}
    ref = outs.get("float32")
    # where a format's greedy text parts from the float32 model's: the float32 logit margin there (near-tie?)
    f32 = loaded["float32"].model if "float32" in loaded else None
    parted = {k: [explain(f32, x, a, b) for x, a, b in zip(ids, ref, outs[k]) if a != b] if ref and f32 is not None
              else [] for k in runners}
    res = {k: {"tok_s": mean[k], "parted": parted[k], "x_base": mean[k] / statistics.mean(base) if base else None,
               "x_llama_cpp": mean[k] / statistics.mean(cpp) if cpp else None,
               "same_as_float32": sum(a == b for a, b in zip(outs[k], ref)) if ref else None,
               "curve_ms": {n: curves[k][n] for n in (1, 4, 8, 16) if k in curves and n in curves[k]}}
           for k in runners}
    lines = [f"| format | Tok/s (mean) | x {args.base} | x llama.cpp | same tokens as float32 | float32 margins where "
             "it parts | verify ms at 1 / 4 / 8 / 16 rows |", "|---|---|---|---|---|---|---|"]
    for k, s in res.items():
        c = s["curve_ms"]
        lines.append(f"| {k} | {s['tok_s']:.1f} | " + (f"{s['x_base']:.2f}x" if s["x_base"] else "-") + " | "
                     + (f"{s['x_llama_cpp']:.2f}x" if s["x_llama_cpp"] else "-") + " | "
                     + (f"{s['same_as_float32']}/{len(ids)}" if s["same_as_float32"] is not None else "-") + " | "
                     + (", ".join(f"{abs(p['fp32_margin']):.3f}" if p.get("kind") == "token" else "length"
                                  for p in s["parted"]) or "-") + " | "
                     + (" / ".join(f"{c[n]:.1f}" for n in (1, 4, 8, 16) if n in c) or "-") + " |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(f"{args.dataset}, {len(ids)} prompts, {args.max_new_tokens} new tokens, vanilla "
                                  f"greedy, torch threads {torch.get_num_threads()}\n\n" + "\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "formats": res}, indent=1))
    print("\n".join(lines))
    print(json.dumps({k: {x: s[x] for x in ("tok_s", "x_base", "x_llama_cpp", "same_as_float32")}
                      for k, s in res.items()}))


if __name__ == "__main__":
    main()
