"""Measure the target's verification cost curve, pick the fastest dtype, derive the default budget.

    python -m switchsd calibrate [--model M] [--dtype auto|float32|bfloat16] [--forward auto|lean|hf]
                                 [--max-tokens 64] [--prefix 256]

Times one target forward over n = 1..N new tokens on top of a cached prefix (rounds over every n, after a warm-up
round; the fastest of the rounds, so that a burst of other work on the machine inflates no single point) and stores
{n: ms} in `$SWITCHSD_CACHE/calibration/` (`$SWITCHSD_CALIBRATION` overrides the folder). That curve is what the
cost gate decides with and what verify forwards are padded by (`switchsd.core.costs.VerifyCost`); an engine built
for an uncalibrated device measures a short curve itself on first use (a few seconds). With `--dtype auto` on a CPU
every format is measured (float32, bfloat16, and for a 4-bit GGUF model int4 and q4q8) and the one
that decodes fastest over its whole curve (`decode_ms_per_token`) becomes this device's `--dtype auto` (recorded in
`dtype-cpu.json`). The default budget is the largest n whose forward costs at most
`ratio` x a one-token forward (default 2.0). Recorded with the curve: per drafting shape (chains, copy tries,
EAGLE's tree) the expected accepted draft tokens at which it starts to pay here (`break_even`); the cost gate makes
that comparison every step with its online acceptance estimates.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from ..core.costs import VerifyCost
from ..io import write_text_atomic
from ..kernels.build import available as kernels_available
from . import int4
from .dense import attention_dtype
from .forward import FORWARDS, make_target, resolve_forward
from .loading import (
    GGUF_FORMATS,
    INT4,
    NOT_AUTO,
    Q4Q8,
    LoadedModel,
    calibration_dir,
    dtype_choice_path,
    gguf_model,
    load_model,
)

DEFAULT_RATIO = 2.0
# the workloads a format is chosen for: per drafted token acceptance 0 (nothing to draft: one-row steps), 0.5 (a
# neural draft on chat) and 0.8 (a copy that mostly holds); each at the chain length the cost gate would pick
ACCEPTANCE = (0.0, 0.5, 0.8)
FALLBACK_BUDGET = 16
POINTS = (1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256)


def calibration_path(lm: LoadedModel, forward: str = "auto") -> Path:
    """One curve per model, device, dtype and forward (the lean forward, or transformers' with its kernel)."""
    safe = lm.name.replace("/", "--")
    kind = resolve_forward(lm.model, forward)
    if kind == "lean":          # a lean forward attending in another dtype than its activations is another curve
        att = attention_dtype(lm.dtype, lm.device) if lm.precision in INT4 else lm.dtype   # (`LeanLlama.att_dtype`)
        kind = "lean" if att == lm.dtype else f"lean-attn-{str(att).replace('torch.', '')}"
    else:
        kind = lm.attn
    return calibration_dir() / f"{safe}-{lm.device.type}-{lm.precision}-{kind}.json"


@torch.inference_mode()
def measure(lm: LoadedModel, max_tokens: int = 64, prefix: int = 256, repeats: int = 5,
            progress: bool = True, forward: str = "auto") -> dict[int, float]:
    """{n: ms} of one verify forward over n new tokens after `prefix` cached ones, through the engine's forward."""
    model, dev = lm.model, lm.device
    target = make_target(model, (), forward)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, prefix + max_tokens), generator=gen).to(dev)
    cache = target.new_cache(prefix + max_tokens)
    target.forward(ids[:, :prefix], cache, logit_rows=-1)
    points = [n for n in POINTS if n <= max_tokens]
    times: dict[int, list[float]] = {n: [] for n in points}
    from tqdm import tqdm
    bar = tqdm(total=(repeats + 1) * len(points), desc="calibrating", unit="forward", disable=not progress)
    # rounds over all sizes (not repeats of one size, then the next): noise from other processes lands spread over
    # the sizes, and each size keeps its fastest time (noise only ever adds)
    for r in range(repeats + 1):  # round 0 is a warm-up
        for n in points:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            target.forward(ids[:, prefix:prefix + n], cache)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            cache.crop(prefix)
            if r:
                times[n].append(dt)
            bar.update()
    bar.close()
    curve = {n: 1000 * min(ts) for n, ts in times.items()}
    return curve


@torch.inference_mode()
def matmul_floor(lm: LoadedModel, rows: int = 1, repeats: int = 5, forward: str = "hf") -> float:
    """ms of the model's linear layers alone (each once, `rows` input rows, inputs made up front): what a
    one-token forward cannot go below with those kernels. forward "hf": every nn.Linear through `F.linear`
    (transformers' kernels); "lean": the lean forward's fused, packed products. Median of repeats, after a
    warm-up."""
    q4q8 = getattr(lm.model, "_switchsd_q4q8", None)
    if q4q8 is not None and resolve_forward(lm.model, forward) == "lean":     # the q4q8 format's own products
        fns = q4q8.mats
        shapes = [m.in_features for m in fns]
    elif resolve_forward(lm.model, forward) == "lean":
        from .lean import LeanLlama
        lean = LeanLlama.of(lm.model)
        fns = [lin.fast for layer in lean.layers for lin in layer if callable(getattr(lin, "fast", None))]
        fns.append(lean.head.fast)
        shapes = [f.__self__.in_features for f in fns]
    else:
        lins = [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]
        fns = [lambda x, m=m: torch.nn.functional.linear(x, m.weight, m.bias) for m in lins]
        shapes = [m.in_features for m in lins]
    xs = [torch.randn(1, rows, k, dtype=lm.dtype, device=lm.device) for k in shapes]
    times = []
    for r in range(repeats + 1):
        if lm.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for f, x in zip(fns, xs):
            f(x)
        if lm.device.type == "cuda":
            torch.cuda.synchronize()
        if r:
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def monotone(curve: dict[int, float]) -> dict[int, float]:
    """Timing noise aside, a forward over fewer tokens never costs more: cost(n) = min over m >= n."""
    out, best = {}, float("inf")
    for n in sorted(curve, reverse=True):
        best = min(best, curve[n])
        out[n] = best
    return dict(sorted(out.items()))


def budget_from_curve(curve: dict[int, float], ratio: float = DEFAULT_RATIO) -> int:
    curve = monotone(curve)
    base = curve[min(curve)]
    ok = [n for n, ms in curve.items() if ms <= ratio * base]
    return max(ok) if ok else 1


def load_budget(lm: LoadedModel, ratio: float = DEFAULT_RATIO, forward: str = "auto") -> tuple[int, str]:
    """(budget, where it came from). Falls back to FALLBACK_BUDGET when this device is not calibrated."""
    path = calibration_path(lm, forward)
    if path.exists():
        data = json.loads(path.read_text())
        curve = {int(k): float(v) for k, v in data["curve_ms"].items()}
        return budget_from_curve(curve, ratio), str(path)
    return FALLBACK_BUDGET, "fallback (run python -m switchsd calibrate)"


def device_cost(lm: LoadedModel, measure_if_missing: bool = True, forward: str = "auto") -> VerifyCost:
    """This device's verification cost curve for the engine's `forward`: the calibrated one, else
    (`measure_if_missing`) a short one measured now and saved, else a flat curve (every forward costs the same)."""
    path = calibration_path(lm, forward)
    if path.exists():
        try:
            data = json.loads(path.read_text())
            return VerifyCost({int(k): float(v) for k, v in data["curve_ms"].items()}, source=str(path))
        except (ValueError, KeyError, TypeError):
            pass    # a corrupt file: measure again
    if not measure_if_missing:
        return VerifyCost({1: 1.0}, source="flat")
    import sys
    print(f"calibrating this device's verification cost ({lm.name}, {lm.device}, "
          f"{lm.precision}; once, a few seconds)...", file=sys.stderr)
    curve = measure(lm, max_tokens=32, prefix=256, repeats=3, progress=False, forward=forward)
    save(lm, curve, 256, DEFAULT_RATIO, forward)
    return VerifyCost(curve, source=str(path))


def save(lm: LoadedModel, curve: dict[int, float], prefix: int, ratio: float, forward: str = "auto") -> Path:
    path = calibration_path(lm, forward)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = {"model": lm.name, "device": str(lm.device), "dtype": lm.precision, "prefix": prefix,
           "forward": resolve_forward(lm.model, forward), "break_even": shapes_that_pay(curve),
           "curve_ms": curve, "ratio": ratio, "budget": budget_from_curve(curve, ratio)}
    write_text_atomic(path, json.dumps(out, indent=1))
    return path


def _report(lm: LoadedModel, curve: dict[int, float], ratio: float, path: Path) -> None:
    base = curve[min(curve)]
    cost = VerifyCost(curve)
    print(f"{lm.name} on {lm.device}, {lm.precision}:")
    for n, ms in curve.items():
        pad = cost.pad_to(n)
        print(f"{n:4d} tokens  {ms:8.2f} ms  x{ms / base:5.2f}" + (f"   (padded to {pad}: {curve[pad]:.2f} ms)"
                                                                  if pad != n else ""))
    print(f"budget (largest n with cost <= {ratio} x one token): {budget_from_curve(curve, ratio)}  -> {path}")
    print("drafting shapes that pay here: a draft beats a plain step when it is expected to get more draft tokens "
          "accepted than")
    print("  " + ", ".join(f"{k} {v:.2f}" for k, v in shapes_that_pay(curve).items()))


SHAPES = {**{f"chain{g}": g + 1 for g in (1, 2, 3, 4, 5, 8)}, "copy10": 11, "copy20": 21, "tree4x5x24": 25}


def shapes_that_pay(curve: dict[int, float]) -> dict[str, float]:
    """Per drafting shape (its verify rows), the expected accepted draft tokens at which it starts to pay on
    this curve (drafting time aside): the cost gate's break-even, recorded with the calibration."""
    cost = VerifyCost(curve)
    return {name: round(cost.break_even(rows), 3) for name, rows in SHAPES.items()}


def decode_ms_per_token(curve: dict[int, float], acceptance=ACCEPTANCE, longest: int = 16) -> float:
    """A format's expected decoding cost over its whole verify curve: the mean over `acceptance` workloads of
    ms per committed token, a k-token chain (k + 1 rows) committing (1 - a^(k+1)) / (1 - a) tokens per forward,
    at the best k <= `longest` for that curve (k = 0: plain decoding). One-row steps alone would miss what a flat
    curve buys the drafting methods."""
    cost = VerifyCost(curve)
    per = []
    for a in acceptance:
        per.append(min(cost.ms(k + 1) / (sum(a ** i for i in range(k + 1))) for k in range(longest + 1)))
    return sum(per) / len(per)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF id or folder (default: offline SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prefix", type=int, default=256, help="cached context length the forwards run on")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ratio", type=float, default=DEFAULT_RATIO)
    ap.add_argument("--forward", choices=FORWARDS, default="auto",
                    help="the target forward to time: auto (lean where supported), lean, hf (transformers')")
    args = ap.parse_args(argv)
    if args.max_tokens < 1 or args.repeats < 1 or args.prefix < 1:
        ap.error("--max-tokens, --repeats and --prefix must be >= 1")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtypes = [args.dtype]
    if args.dtype == "auto" and device == "cpu":     # every format, to pick this CPU's --dtype auto
        four_bit = gguf_model(args.model)
        dtypes = (["float32", "bfloat16"] + (list(INT4) if four_bit and int4.available() else [])
                  + ([Q4Q8] if four_bit and kernels_available("llama") else []))
    results, attention = {}, {}
    for dt in dtypes:
        lm = load_model(args.model, dt, device, attention="sdpa")
        name = lm.precision
        kind = resolve_forward(lm.model, args.forward)
        own = getattr(lm.model, "_switchsd_q4q8", None) is not None     # q4q8: its own forward only
        one = {"sdpa": float("nan")}
        for impl in () if own else ("sdpa", "eager"):   # transformers' faster attention kernel for decoding, per dtype
            lm.model.set_attn_implementation(impl)
            one[impl] = measure(lm, 1, args.prefix, args.repeats, progress=False, forward="hf")[1]
        attention[name] = "eager" if not own and one["eager"] < 0.95 * one["sdpa"] else "sdpa"   # the default unless clearly faster
        lm.model.set_attn_implementation(attention[name])
        if not own:
            print(f"{name}: transformers' one-token forward sdpa {one['sdpa']:.2f} ms, eager {one['eager']:.2f} ms "
                  f"-> {attention[name]}")
        curve = measure(lm, args.max_tokens, args.prefix, args.repeats, forward=kind)
        floor = matmul_floor(lm, 1, args.repeats, forward=kind)
        hf_floor = None if int4.is_int4(lm.model) or own else matmul_floor(lm, 1, args.repeats, forward="hf")
        print(f"{name}: {kind} one-token forward {curve[1]:.2f} ms = {curve[1] / floor:.2f}x its matmul floor "
              f"({floor:.2f} ms: its linear layers alone" + (f"; transformers' F.linear on the same weights "
              f"{hf_floor:.2f} ms" if hf_floor else "") + (f", transformers' forward {one[attention[name]]:.2f} ms" if not own
                                                      else "") + ")")
        path = save(lm, curve, args.prefix, args.ratio, kind)
        _report(lm, curve, args.ratio, path)
        results[name] = {"forward": kind, "curve_ms": curve, "path": str(path),
                         "budget": budget_from_curve(curve, args.ratio), "attention": attention[name],
                         "matmul_floor_ms": floor, "hf_matmul_floor_ms": hf_floor,
                         "hf_one_token_ms": one[attention[name]]}
    choice = dtype_choice_path(device)
    old = {}
    if choice.exists():
        try:
            old = json.loads(choice.read_text())
        except ValueError:
            old = {}
    out = {"attention": {**old.get("attention", {}), **attention}}
    if len(results) > 1:
        score = {d: decode_ms_per_token(r["curve_ms"]) for d, r in results.items()}
        out["fastest"] = min([d for d in results if d not in NOT_AUTO] or results, key=score.get)
        dense = [d for d in results if d not in GGUF_FORMATS]
        if dense:
            out["fastest_dense"] = min(dense, key=score.get)
        out["one_token_ms"] = {d: r["curve_ms"][1] for d, r in results.items()}
        out["decode_ms_per_token"] = {d: round(v, 3) for d, v in score.items()}
        print(f"fastest format for decoding here: {out['fastest']} (--dtype auto uses it; expected ms per "
              f"token over the curve: {out['decode_ms_per_token']})")
    else:
        out.update({k: old[k] for k in ("fastest", "fastest_dense", "one_token_ms", "decode_ms_per_token") if k in old})
    choice.parent.mkdir(parents=True, exist_ok=True)
    choice.write_text(json.dumps(out))
    print(f"attention kernels {out['attention']} -> {choice}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
