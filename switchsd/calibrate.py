"""Measure the target's verification cost curve and derive the default verification budget.

    python -m switchsd.calibrate [--model M] [--dtype D] [--max-tokens 64] [--prefix 256]

Times one target forward over n = 1..N new tokens on top of a cached prefix (median of repeats, after a
warm-up) and stores {n: ms} in `$SWITCHSD_CACHE/calibration/`. The default budget is the largest n whose
forward costs at most `ratio` x a one-token forward (default 2.0: a verify of n tokens pays for itself as
soon as it yields one extra token). Engines built by the CLIs read it (`--budget auto`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from .cache import KVCache
from .models import LoadedModel, cache_dir, load_model

DEFAULT_RATIO = 2.0
FALLBACK_BUDGET = 16
POINTS = (1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256)


def calibration_path(lm: LoadedModel) -> Path:
    safe = lm.name.replace("/", "--")
    return cache_dir() / "calibration" / f"{safe}-{lm.device.type}-{str(lm.dtype).replace('torch.', '')}.json"


@torch.inference_mode()
def measure(lm: LoadedModel, max_tokens: int = 64, prefix: int = 256, repeats: int = 5,
            progress: bool = True) -> dict[int, float]:
    model, dev = lm.model, lm.device
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, prefix + max_tokens), generator=gen).to(dev)
    cache = KVCache(model.config)
    model(input_ids=ids[:, :prefix], cache=cache.hf, use_cache=True, logits_to_keep=1)
    points = [n for n in POINTS if n <= max_tokens]
    curve: dict[int, float] = {}
    it = points
    if progress:
        from tqdm import tqdm
        it = tqdm(points, desc="calibrating", unit="size")
    for n in it:
        times = []
        for r in range(repeats + 1):  # first run is a warm-up
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            pos = torch.arange(prefix, prefix + n, device=dev)[None]
            model(input_ids=ids[:, prefix:prefix + n], position_ids=pos, cache=cache.hf, use_cache=True)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            cache.crop(prefix)
            if r:
                times.append(dt)
        curve[n] = 1000 * statistics.median(times)
    return curve


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


def load_budget(lm: LoadedModel, ratio: float = DEFAULT_RATIO) -> tuple[int, str]:
    """(budget, where it came from). Falls back to FALLBACK_BUDGET when this device is not calibrated."""
    path = calibration_path(lm)
    if path.exists():
        data = json.loads(path.read_text())
        curve = {int(k): float(v) for k, v in data["curve_ms"].items()}
        return budget_from_curve(curve, ratio), str(path)
    return FALLBACK_BUDGET, "fallback (run python -m switchsd.calibrate)"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF id or folder (default: offline SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prefix", type=int, default=256, help="cached context length the forwards run on")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ratio", type=float, default=DEFAULT_RATIO)
    args = ap.parse_args(argv)
    if args.max_tokens < 1 or args.repeats < 1 or args.prefix < 1:
        ap.error("--max-tokens, --repeats and --prefix must be >= 1")
    lm = load_model(args.model, args.dtype, args.device)
    curve = measure(lm, args.max_tokens, args.prefix, args.repeats)
    budget = budget_from_curve(curve, args.ratio)
    path = calibration_path(lm)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = {"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype), "prefix": args.prefix,
           "curve_ms": curve, "ratio": args.ratio, "budget": budget}
    path.write_text(json.dumps(out, indent=1))
    base = curve[min(curve)]
    for n, ms in curve.items():
        print(f"{n:4d} tokens  {ms:8.2f} ms  x{ms / base:5.2f}")
    print(f"budget (largest n with cost <= {args.ratio} x one token): {budget}  -> {path}")
    print(json.dumps({"budget": budget, "curve_ms": curve, "path": str(path)}))


if __name__ == "__main__":
    main()
