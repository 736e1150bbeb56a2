"""Serving benchmark: a stream of requests under each decoding mode, batched.

    python -m switchsd serve-bench --modes vanilla,sd,sps,psd --requests 16 --max-batch 4 --rate 0 \
        --max-new-tokens 64 --out runs/serve

Modes (switchsd/serve/load.py): vanilla, sd (`--method`, default switchsd), sps (`--draft` model drafting in
this process), psd (MineDraft: the drafter in its own process; the target and the drafter one core each), pearl
(one batch, the next block drafted optimistically during each verify);
`X-1core` runs X on one core. Fairness, as in MineDraft: PSD holds TWO sub-batches of `--psd-sub-batch`
(default `--max-batch`) requests each, so at max batch B it serves up to 2B requests at once; pass
`--psd-sub-batch B/2` for equal concurrency.

Per mode: throughput (generated tokens / s, from the first arrival to the last finish), end-to-end latency and
time to first token (mean, p50, p90), per-step batch sizes, identity with single-request greedy decoding
(float32 on the same prompts), and the trace (target / drafter busy intervals): mean draft time D and verify
time V per step, overlap, idle shares, and the simple model (D + V) / max(D, V) next to the measured PSD gain.
Last printed line is JSON: {"modes": {MODE: {"throughput", "latency_p50", "latency_p90", "identical", "n"}}}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from ..cli.common import add_model_args, load, load_prompt_file
from ..core.config import EngineConfig
from ..eval.datasets import DATASETS
from ..factory import Drafters, SetupError, build_engine
from ..io import write_text_atomic
from .load import Req, arrivals, run_mode


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else 0.0


def summarise(reqs: list[Req], trace, refs: dict | None) -> dict:
    lat = [r.finish - r.arrival for r in reqs]
    ttft = [r.first - r.arrival for r in reqs]
    toks = sum(len(r.tokens) for r in reqs)
    span = max(r.finish for r in reqs) - min(r.arrival for r in reqs)
    by = {w: [s for s in trace.spans if s["who"] == w] for w in ("target", "drafter")}
    busy = {w: sum(s["end"] - s["start"] for s in v) for w, v in by.items()}
    wall = max(s["end"] for s in trace.spans) if trace.spans else span
    # overlap of target and drafter busy time (both lists are time-ordered)
    overlap = sum(max(0.0, min(a["end"], b["end"]) - max(a["start"], b["start"]))
                  for a in by["target"] for b in by["drafter"] if a["start"] < b["end"] and b["start"] < a["end"])
    out = {"n": len(reqs), "tokens": toks, "throughput": toks / span if span > 0 else 0.0,
           "latency_mean": statistics.mean(lat), "latency_p50": pct(lat, 0.5), "latency_p90": pct(lat, 0.9),
           "ttft_mean": statistics.mean(ttft), "ttft_p50": pct(ttft, 0.5), "ttft_p90": pct(ttft, 0.9),
           "steps": len(by["target"]), "batch_mean": statistics.mean(s["rows"] for s in by["target"]),
           "batch_max": max(s["rows"] for s in by["target"]), **trace.busy(), "overlap_s": overlap,
           "target_idle": 1 - busy["target"] / wall if wall else 0.0,
           "drafter_idle": (1 - busy["drafter"] / wall) if by["drafter"] and wall else None,
           "identical": sum(r.tokens == refs[r.rid] for r in reqs) if refs else None}
    if refs:            # where a request parts from single-request greedy decoding (to explain it)
        out["mismatches"] = [{"rid": r.rid, "at": k, "got": r.tokens[k:k + 3], "want": refs[r.rid][k:k + 3]}
                             for r in reqs if r.tokens != refs[r.rid]
                             for k in [next((j for j, (a, b) in enumerate(zip(r.tokens, refs[r.rid])) if a != b),
                                            min(len(r.tokens), len(refs[r.rid])))]]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="vanilla,sd,sps,psd")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second (0: all at once)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--method", default="switchsd", help="the method of mode sd")
    ap.add_argument("--draft", default="self:8", help="draft model of sps / psd: HF id, folder, or self:L")
    ap.add_argument("--gamma", type=int, default=4, help="draft tokens per step (sps, psd)")
    ap.add_argument("--psd-sub-batch", type=int, default=None, help="requests per PSD sub-batch (default: --max-batch)")
    ap.add_argument("--dataset", default="humaneval", choices=DATASETS)
    ap.add_argument("--data-file", default=None)
    ap.add_argument("--no-chat", action="store_true")
    ap.add_argument("--no-check", action="store_true", help="skip the single-request greedy references")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/serve")
    add_model_args(ap)
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m.removesuffix("-1core") not in ("vanilla", "sd", "sps", "psd", "pearl")
           or m in ("psd-1core", "pearl-1core")]
    if bad or not modes:
        ap.error(f"unknown mode(s) {bad}: vanilla, sd, sps, psd, pearl, and vanilla-1core / sd-1core / sps-1core")
    for k in ("requests", "max_batch", "max_new_tokens", "gamma"):
        if getattr(args, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    if args.psd_sub_batch is not None and args.psd_sub_batch < 1:
        ap.error("--psd-sub-batch must be >= 1")
    prompts = load_prompt_file(args, args.requests)
    lm = load(args)
    cfg = EngineConfig(max_new_tokens=args.max_new_tokens)
    chat = not args.no_chat and bool(getattr(lm.tokenizer, "chat_template", None))
    ids = [lm.encode(p["prompt"], chat=chat) for p in prompts]
    times = arrivals(len(ids), args.rate, args.seed)
    drafters = Drafters(lm)
    refs = None
    if not args.no_check:
        try:
            eng = build_engine("vanilla", lm, drafters, cfg)
        except SetupError as e:
            raise SystemExit(f"error: {e}") from None
        refs = {i: eng.run(x).token_ids for i, x in enumerate(tqdm(ids, desc="single-request references",
                                                                     file=sys.stderr))}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, traces = {}, {}
    for mode in tqdm(modes, desc="serve modes", file=sys.stderr):
        reqs = [Req(i, x, t) for i, (x, t) in enumerate(zip(ids, times))]
        try:
            trace = run_mode(mode, lm, cfg, reqs, args.max_batch, method=args.method, draft=args.draft,
                             gamma=args.gamma, sub_batch=args.psd_sub_batch, drafters=drafters)
        except (SetupError, ValueError) as e:
            raise SystemExit(f"error: {mode}: {e}") from None
        results[mode] = summarise(reqs, trace, refs)
        traces[mode] = trace.spans
        print(f"{mode}: {results[mode]['throughput']:.1f} tok/s, p50 {results[mode]['latency_p50']:.2f}s",
              file=sys.stderr)
    base = results.get("vanilla", {}).get("throughput")
    meta = {"requests": len(ids), "max_batch": args.max_batch, "rate": args.rate, "max_new_tokens": args.max_new_tokens,
            "method": args.method, "draft": args.draft, "gamma": args.gamma,
            "psd_sub_batch": args.psd_sub_batch or args.max_batch, "dataset": args.dataset, "model": lm.name,
            "dtype": lm.precision, "torch_threads": torch.get_num_threads(),
            "command": "python -m switchsd serve-bench " + " ".join(argv if argv is not None else sys.argv[1:])}
    write_text_atomic(out / "results.json", json.dumps({"meta": meta, "modes": results, "traces": traces}, indent=1))
    lines = ["| mode | tok/s | x vanilla | latency p50 / p90 (s) | TTFT p50 (s) | batch mean | D (ms) | V (ms) | "
             "(D+V)/max | identical |", "|---|---|---|---|---|---|---|---|---|---|"]
    for m, s in results.items():
        gain = f"{s['model_gain']:.2f}" if s["model_gain"] else "-"
        ident = f"{s['identical']}/{s['n']}" if s["identical"] is not None else "-"
        lines.append(f"| {m} | {s['throughput']:.1f} | {s['throughput'] / base:.2f} | {s['latency_p50']:.2f} / "
                     f"{s['latency_p90']:.2f} | {s['ttft_p50']:.2f} | {s['batch_mean']:.1f} | {1e3 * s['D']:.0f} | "
                     f"{1e3 * s['V']:.0f} | {gain} | {ident} |" if base else f"| {m} | {s['throughput']:.1f} | - |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps({"modes": {m: {k: s[k] for k in ("throughput", "latency_p50", "latency_p90", "identical", "n")}
                                for m, s in results.items()}}))


if __name__ == "__main__":
    main()
