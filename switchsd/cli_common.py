"""Arguments and builders shared by the generate and bench CLIs."""
from __future__ import annotations

import argparse

from .calibrate import DEFAULT_RATIO, load_budget
from .config import CopyConfig, EngineConfig, SamplingConfig
from .engine import Engine
from .methods import METHODS, build_policy
from .models import LoadedModel, load_model


def add_model_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None, help="HF id or local folder (default: offline SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default="auto", help="auto (CUDA: bfloat16, CPU: float32) | float32 | bfloat16")
    ap.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: CUDA when present)")
    ap.add_argument("--device-map", default=None, help="'auto' to shard over several GPUs with accelerate")


def add_decode_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--budget", default="auto",
                    help="most tokens verified per target forward; 'auto' = from the calibrated cost curve")
    ap.add_argument("--budget-ratio", type=float, default=DEFAULT_RATIO,
                    help="with --budget auto: largest n whose forward costs <= ratio x a one-token forward")
    ap.add_argument("--kappa", type=int, default=5, help="copy path: n-gram length that must match")
    ap.add_argument("--copy-candidates", type=int, default=10, help="copy path: W, most candidates")
    ap.add_argument("--copy-len", type=int, default=20, help="copy path: D, most tokens per candidate")


def load(args) -> LoadedModel:
    return load_model(args.model, args.dtype, args.device, args.device_map)


def resolve_budget(args, lm: LoadedModel) -> tuple[int, str]:
    if str(args.budget) == "auto":
        return load_budget(lm, args.budget_ratio)
    try:
        b = int(args.budget)
    except ValueError:
        raise SystemExit(f"error: --budget must be an integer or 'auto', got {args.budget!r}")
    if b < 1:
        raise SystemExit("error: --budget must be >= 1")
    return b, "flag"


def engine_config(args, budget: int) -> EngineConfig:
    try:
        return EngineConfig(max_new_tokens=args.max_new_tokens, budget=budget,
                            sampling=SamplingConfig(args.temperature, args.top_k, args.top_p))
    except ValueError as e:
        raise SystemExit(f"error: {e}")


def copy_config(args) -> CopyConfig:
    try:
        return CopyConfig(kappa=args.kappa, max_candidates=args.copy_candidates, max_draft_len=args.copy_len)
    except ValueError as e:
        raise SystemExit(f"error: {e}")


def build_engine(method: str, lm: LoadedModel, cfg: EngineConfig, copy: CopyConfig) -> Engine:
    if method not in METHODS:
        raise SystemExit(f"error: unknown method {method!r}; choose from {', '.join(METHODS)}")
    eos = lm.eos_ids()
    return Engine(lm.model, build_policy(method, eos, copy), cfg, eos, lm.max_length)
