"""Arguments and builders shared by the generate and bench CLIs."""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch

from .calibrate import DEFAULT_RATIO, load_budget
from .config import CopyConfig, EngineConfig, SamplingConfig
from .engine import Engine
from .drafters.eagle3 import Eagle3Drafter, TreeConfig
from .drafters.eagle3_model import Eagle3LoadError, load_eagle3
from .drafters.draft_model import DraftModelDrafter
from .methods import METHODS, NEEDS_NEURAL, NEEDS_PROBE, NEURAL_METHODS, build_policy
from .probe import ProbeError, load_probe
from .models import DEFAULT_MODEL, LoadedModel, ModelLoadError, load_model

ASSETS = Path(__file__).resolve().parents[1] / "assets"
DEFAULT_HEADS = {DEFAULT_MODEL: ASSETS / "eagle3-smollm2-135m"}
DEFAULT_PROBES = {DEFAULT_MODEL: Path(__file__).resolve().parents[1] / "probes" / "smollm2-135m-instruct.safetensors"}


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


def add_neural_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--eagle", default="auto", help="EAGLE3 head: folder or HF id ('auto': the shipped head "
                    "for the offline default model)")
    ap.add_argument("--draft", default=None, help="SPS draft model (HF id or folder) sharing the tokenizer")
    ap.add_argument("--neural", default="eagle3", choices=NEURAL_METHODS,
                    help="the neural drafter copyspec falls back to")
    ap.add_argument("--probe", default="auto", help="copy-intent probe (.safetensors); 'auto': the shipped one")
    ap.add_argument("--tau", type=float, default=None, help="override the probe's threshold")
    ap.add_argument("--bandit-c", type=float, default=1.0, help="BanditSpec UCB exploration constant")
    ap.add_argument("--chain", action="store_true", help="EAGLE3: chain drafting instead of the dynamic tree")
    ap.add_argument("--gamma", type=int, default=5, help="chain length (EAGLE3 --chain, SPS)")
    ap.add_argument("--tree-topk", type=int, default=4)
    ap.add_argument("--tree-depth", type=int, default=5)
    ap.add_argument("--tree-tokens", type=int, default=24, help="draft nodes per tree (capped by the budget)")


class Neural:
    """Loads the neural drafters' weights once; makes a fresh drafter (own caches) per engine."""

    def __init__(self, args, lm: LoadedModel):
        self.args, self.lm = args, lm
        self._loaded: dict = {}   # shared by with_overrides() views: weights load once

    def _once(self, key: str, load):
        if key not in self._loaded:
            self._loaded[key] = load()
        return self._loaded[key]

    def _shipped(self, flag: str, defaults: dict, what: str) -> str:
        """The value of --eagle / --probe, with 'auto' resolved to the file shipped for this model."""
        name = getattr(self.args, flag, "auto")
        if name not in (None, "auto"):
            return name
        path = defaults.get(self.lm.name)
        if path is None or not path.exists():
            raise SystemExit(f"error: no shipped {what} for {self.lm.name}; pass --{flag} FILE")
        return str(path)

    def available(self, kind: str) -> bool:
        if kind == "sps":
            return bool(getattr(self.args, "draft", None))
        default = DEFAULT_HEADS.get(self.lm.name)
        return getattr(self.args, "eagle", "auto") not in (None, "auto") or (default is not None and default.exists())

    @property
    def head(self):
        def load():
            try:
                return load_eagle3(self._shipped("eagle", DEFAULT_HEADS, "EAGLE3 head"), self.lm.model)
            except Eagle3LoadError as e:
                raise SystemExit(f"error: {e}")
        return self._once("head", load)

    @property
    def draft_model(self):
        def load():
            if not getattr(self.args, "draft", None):
                raise SystemExit("error: method sps needs --draft MODEL (a small model sharing the tokenizer)")
            try:
                return load_model(self.args.draft, self.lm.dtype, str(self.lm.device)).model
            except (ModelLoadError, ValueError) as e:
                raise SystemExit(f"error: {e}")
        return self._once("draft", load)

    @property
    def probe(self):
        def load():
            try:
                return load_probe(self._shipped("probe", DEFAULT_PROBES, "probe"), self.lm.model)
            except ProbeError as e:
                raise SystemExit(f"error: {e}")
        return self._once("probe", load)

    def with_overrides(self, overrides: dict) -> "Neural":
        """A view with other drafting options that shares the loaded weights."""
        import copy as _copy
        other = _copy.copy(self)
        other.args = argparse.Namespace(**{**vars(self.args), **overrides})
        return other

    def make(self, kind: str, cfg: EngineConfig, seed: int = 0):
        a = self.args
        gen = torch.Generator().manual_seed(seed + 1)
        if kind == "eagle3":
            tree = TreeConfig(top_k=a.tree_topk, depth=a.tree_depth, total_tokens=a.tree_tokens)
            return Eagle3Drafter(self.head, self.lm.model, tree, chain=a.chain, gamma=a.gamma,
                                 sampling=cfg.sampling, generator=gen)
        return DraftModelDrafter(self.draft_model, self.lm.model.config.vocab_size, gamma=a.gamma,
                                 sampling=cfg.sampling, generator=gen)


def load(args) -> LoadedModel:
    """Load the model, turning a load failure into a one-line error instead of a traceback."""
    try:
        return load_model(args.model, args.dtype, args.device, args.device_map)
    except (ModelLoadError, ValueError) as e:
        raise SystemExit(f"error: {e}")


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


def parse_method(spec: str) -> tuple[str, dict]:
    """'eagle3@chain4' -> ('eagle3', {chain: True, gamma: 4}); 'switchsd@tree4x5x24' -> tree top_k 4, depth 5,
    24 nodes; '+'-joined extras: 'kN' (copy kappa), 'tX' (probe tau), e.g. 'switchsd@chain1+k3+t0.4'.
    Lets one bench run compare drafting shapes and gate settings side by side."""
    import re
    base, _, var = spec.partition("@")
    out: dict = {}
    for part in filter(None, var.split("+")):
        if m := re.fullmatch(r"chain(\d+)", part):
            out.update(chain=True, gamma=int(m[1]))
        elif m := re.fullmatch(r"tree(\d+)x(\d+)x(\d+)", part):
            out.update(chain=False, tree_topk=int(m[1]), tree_depth=int(m[2]), tree_tokens=int(m[3]))
        elif m := re.fullmatch(r"k(\d+)", part):
            out["kappa"] = int(m[1])
        elif m := re.fullmatch(r"t(\d*\.?\d+)", part):
            out["tau"] = float(m[1])
        else:
            raise SystemExit(f"error: bad method variant {spec!r}: use NAME@chainG or NAME@treeKxDxN, "
                             "optionally +kN (kappa) +tX (tau)")
    return base, out


def build_engine(method: str, lm: LoadedModel, cfg: EngineConfig, copy: CopyConfig,
                 neural: Neural | None = None, seed: int = 0) -> Engine:
    method, variant = parse_method(method)
    if "tau" in variant and method not in NEEDS_PROBE:
        raise SystemExit(f"error: +t (probe tau) only applies to {', '.join(NEEDS_PROBE)}, not {method}")
    if "kappa" in variant:
        copy = replace(copy, kappa=variant.pop("kappa"))
    if variant and neural is not None:
        neural = neural.with_overrides(variant)
    if method not in METHODS:
        raise SystemExit(f"error: unknown method {method!r}; choose from {', '.join(METHODS)}")
    eos = lm.eos_ids()
    drafter, probe, tau = None, None, None
    if neural is not None:
        kind = {"switchsd": "eagle3", "switchsd-sps": "sps"}.get(method, method if method in NEURAL_METHODS
                                                                  else neural.args.neural)
        if method in NEEDS_NEURAL or (method == "copyspec" and neural.available(kind)):
            drafter = neural.make(kind, cfg, seed)
        if method in NEEDS_PROBE:
            probe = neural.probe
            tau = neural.args.tau if getattr(neural.args, "tau", None) is not None else probe.tau
    try:
        policy = build_policy(method, eos, copy, drafter, tau, getattr(neural.args, "bandit_c", 1.0) if neural else 1.0)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    return Engine(lm.model, policy, cfg, eos, lm.max_length, probe=probe)
