"""One factory: method name + configs -> an Engine. The CLIs, the benchmark and the studio all build here.

    drafters = Drafters(lm)                      # loads the EAGLE-3 head / draft model / probe once, lazily
    engine = build_engine("switchsd", lm, drafters)            # every default from switchsd.core.config
    engine = build_engine("eagle3@chain3", lm, drafters, EngineConfig(max_new_tokens=256))

Method names may carry variants (`NAME@chainG`, `NAME@treeKxDxN`, `+kN` copy kappa, `+tX` probe tau) so one
benchmark run compares shapes and gate settings side by side. Errors are `SetupError` (a ValueError) with a
message meant for the user; the CLIs print it, the studio shows it.
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import torch

from .core.config import CopyConfig, EngineConfig, GateConfig, NeuralConfig, SMCConfig, TreeConfig
from .core.costs import VerifyCost
from .core.engine import Engine
from .core.fingerprint import fingerprint
from .core.probe import ProbeError, load_probe
from .core.smc import SMCEngine, self_draft
from .drafters.draft_model import DraftModelDrafter
from .drafters.eagle3 import Eagle3Drafter
from .drafters.eagle3_model import Eagle3LoadError, load_eagle3
from .drafters.particles import Eagle3Particles, ModelParticles
from .methods import METHODS, NEEDS_NEURAL, NEEDS_PROBE, NEURAL_METHODS, build_policy, uses_cost_gate
from .models.calibrate import device_cost
from .models.forward import make_target, resolve_forward
from .models.loading import DEFAULT_MODEL, LoadedModel, ModelLoadError, load_model
from .models.shipped import shipped

ROOT = Path(__file__).resolve().parents[1]
# the offline model's shipped head and probe, by name (before a model is loaded); loaded models find theirs by
# fingerprint (`shipped_for`): the same model from any GGUF file or folder
DEFAULT_HEADS = {DEFAULT_MODEL: ROOT / "assets" / "eagle3-smollm2-135m"}
DEFAULT_PROBES = {DEFAULT_MODEL: ROOT / "probes" / "smollm2-135m-instruct.safetensors"}


def shipped_for(lm: LoadedModel, kind: str) -> Path | None:
    """The shipped probe (`kind` "probe") or EAGLE-3 head ("eagle3") of the loaded model, found by its fingerprint."""
    return shipped(kind, fingerprint(lm.model, lm.tokenizer))


def make_engine(model, policy, cfg: EngineConfig = EngineConfig(), eos_ids=(), max_length: int | None = None,
                probe=None, cost: VerifyCost | None = None) -> Engine:
    """An Engine on `model` with the target forward `cfg.forward` names (the lean one where supported, else
    transformers'): the one place the engine is given its target."""
    return Engine(model, policy, cfg, eos_ids, max_length, probe=probe, cost=cost, make_target=make_target)


class SetupError(ValueError):
    """A method cannot be built as asked (unknown name, missing drafter or probe, bad variant)."""


class Drafters:
    """The neural drafters' weights and the probe of one target model, loaded once on first use.
    `eagle` / `probe`: a path or HF id, or "auto" for the file shipped for the model; `draft`: an SPS model."""

    def __init__(self, lm: LoadedModel, eagle: str | None = "auto", draft: str | None = None,
                 probe: str | None = "auto"):
        self.lm, self.eagle, self.draft, self.probe_name = lm, eagle or "auto", draft, probe or "auto"
        self._loaded: dict = {}

    def _find(self, kind: str) -> Path | None:
        """The shipped probe or head whose fingerprint is this model's (the same model in any file or format)."""
        return shipped_for(self.lm, kind)

    def _shipped(self, name: str, kind: str, what: str, flag: str) -> str:
        if name != "auto":
            return name
        path = self._find(kind)
        if path is None:
            hint = ("train one: switchsd probe collect --model M, then switchsd probe train" if kind == "probe"
                    else "train one: switchsd train-eagle3 --model M")
            raise SetupError(f"no shipped {what} for {self.lm.name} (none carries its fingerprint); pass --{flag} "
                             f"FILE or {hint}")
        return str(path)

    def available(self, kind: str) -> bool:
        if kind == "sps":
            return bool(self.draft)
        if kind == "probe":
            return self.probe_name != "auto" or self._find("probe") is not None
        return self.eagle != "auto" or self._find("eagle3") is not None

    def _once(self, key: str, load, errors: tuple):
        """Load on first use; a loader's own error type becomes a SetupError with its message."""
        if key not in self._loaded:
            try:
                self._loaded[key] = load()
            except errors as e:
                raise SetupError(str(e)) from None
        return self._loaded[key]

    @property
    def head(self):
        return self._once("head", lambda: load_eagle3(
            self._shipped(self.eagle, "eagle3", "EAGLE3 head", "eagle"), self.lm.model), (Eagle3LoadError,))

    @property
    def draft_model(self):
        if not self.draft:
            raise SetupError("method sps needs --draft MODEL (a small model sharing the tokenizer)")
        return self._once("draft", lambda: load_model(self.draft, self.lm.dtype, str(self.lm.device)).model,
                          (ModelLoadError, ValueError))

    @property
    def probe(self):
        return self._once("probe", lambda: load_probe(
            self._shipped(self.probe_name, "probe", "probe", "probe"), self.lm.model), (ProbeError,))

    def make(self, kind: str, neural: NeuralConfig, sampling, seed: int = 0, cost_gate: bool = False):
        """A fresh drafter (own caches). Shape "auto": a gamma-long chain when the cost gate picks its length,
        else EAGLE's own default, the dynamic tree."""
        gen = torch.Generator().manual_seed(seed + 1)
        chain = neural.shape == "chain" or (neural.shape == "auto" and cost_gate)
        if kind == "eagle3":
            return Eagle3Drafter(self.head, self.lm.model, neural.tree, chain=chain, gamma=neural.gamma,
                                 sampling=sampling, generator=gen)
        return DraftModelDrafter(self.draft_model, self.lm.model.config.vocab_size, gamma=neural.gamma,
                                 sampling=sampling, generator=gen)


def parse_method(spec: str) -> tuple[str, dict]:
    """'eagle3@chain4' -> ('eagle3', {shape: chain, gamma: 4}); 'switchsd@tree4x5x24' -> the tree;
    '+'-joined extras: 'kN' (copy kappa), 'tX' (probe tau), 'conf' (the cost gate prices neural chains by their
    tokens' probabilities), 'pN' (SMC particles), e.g. 'switchsd@chain1+k3+t0.4', 'eagle3+conf', 'smc@chain4+p8'."""
    spec = spec.strip()
    base = re.split(r"[@+]", spec, maxsplit=1)[0]
    var = spec[len(base) + 1:]
    if base not in METHODS:
        raise SetupError(f"unknown method {base!r}; choose from {', '.join(METHODS)}")
    out: dict = {}
    for part in filter(None, var.split("+")):
        if m := re.fullmatch(r"chain(\d+)", part):
            out.update(shape="chain", gamma=int(m[1]))
        elif m := re.fullmatch(r"tree(\d+)x(\d+)x(\d+)", part):
            out.update(shape="tree", tree=(int(m[1]), int(m[2]), int(m[3])))
        elif m := re.fullmatch(r"k(\d+)", part):
            out["kappa"] = int(m[1])
        elif m := re.fullmatch(r"t(\d*\.?\d+)", part):
            out["tau"] = float(m[1])
        elif part == "conf":
            out["confidence"] = True
        elif (m := re.fullmatch(r"p(\d+)", part)) and base == "smc":
            out["particles"] = int(m[1])
        else:
            raise SetupError(f"bad method variant {spec!r}: use NAME@chainG or NAME@treeKxDxN, "
                             "optionally +kN (kappa) +tX (tau) +conf; smc: smc@chainG+pN")
    if base == "smc" and (out.keys() - {"shape", "gamma", "particles"} or out.get("shape") == "tree"):
        raise SetupError(f"bad smc variant {spec!r}: smc@chainG (drafts per cycle) +pN (particles)")
    if "tau" in out and base not in NEEDS_PROBE:
        raise SetupError(f"+t (probe tau) only applies to {', '.join(NEEDS_PROBE)}, not {base}")
    return base, out


def _with_variant(variant: dict, copy_cfg: CopyConfig, neural: NeuralConfig, gate: GateConfig):
    try:
        if "kappa" in variant:
            copy_cfg = replace(copy_cfg, kappa=variant["kappa"])
            gate = replace(gate, kappa=variant["kappa"])
        if "tau" in variant:
            gate = replace(gate, tau=variant["tau"])
        if variant.get("confidence"):
            gate = replace(gate, confidence=True)
        if variant.get("shape") == "chain":
            neural = replace(neural, shape="chain", gamma=variant["gamma"])
        elif variant.get("shape") == "tree":
            k, d, n = variant["tree"]
            neural = replace(neural, shape="tree", tree=TreeConfig(top_k=k, depth=d, total_tokens=n))
    except ValueError as e:
        raise SetupError(str(e)) from None
    return copy_cfg, neural, gate


def build_engine(method: str, lm: LoadedModel, drafters: Drafters | None = None,
                 engine: EngineConfig = EngineConfig(), copy_cfg: CopyConfig = CopyConfig(),
                 neural: NeuralConfig = NeuralConfig(), gate: GateConfig = GateConfig(),
                 cost: VerifyCost | str | None = "auto", fallback: str = "eagle3",
                 seed: int = 0, smc: SMCConfig = SMCConfig()) -> Engine | SMCEngine:
    """`cost`: the device's verification cost curve ("auto": the calibrated one, measured now if missing;
    None: no padding, and the cost gate assumes verification is free, as on a large GPU).
    `fallback`: the neural drafter copyspec falls back to (and SMC-SD drafts with) when it is at hand."""
    name, variant = parse_method(method)
    if name == "smc":
        if variant.get("shape") != "chain" and neural.shape == "chain":      # --chain --gamma G / the studio's gamma
            variant = {**variant, "gamma": neural.gamma}
        return smc_engine(lm, drafters or Drafters(lm), engine, smc, variant, fallback)
    copy_cfg, neural, gate = _with_variant(variant, copy_cfg, neural, gate)
    if name.endswith("-paper"):
        gate = replace(gate, mode="paper")
    drafters = drafters or Drafters(lm)
    try:
        resolve_forward(lm.model, engine.forward)
    except ValueError as e:
        raise SetupError(str(e)) from None
    if isinstance(cost, str):
        cost = device_cost(lm, forward=engine.forward)
    cost_gate = uses_cost_gate(name, neural, gate)
    if cost_gate and name in NEEDS_PROBE:
        copy_cfg = replace(copy_cfg, kappa=gate.kappa)
    kind = {"switchsd": "eagle3", "switchsd-paper": "eagle3", "switchsd-sps": "sps",
            "switchsd-sps-paper": "sps"}.get(name, name if name in NEURAL_METHODS else fallback)
    drafter = probe = tau = None
    if name in NEEDS_NEURAL or (name in ("copyspec", "samd") and drafters.available(kind)):
        drafter = drafters.make(kind, neural, engine.sampling, seed, cost_gate)
    if name in NEEDS_PROBE:
        probe = drafters.probe
        tau = gate.tau if gate.tau is not None else probe.tau
    try:
        policy = build_policy(name, lm.eos_ids(), copy_cfg, drafter, tau, neural_cfg=neural, gate=gate,
                              cost=cost)
    except ValueError as e:
        raise SetupError(str(e)) from None
    return make_engine(lm.model, policy, engine, lm.eos_ids(), lm.max_length, probe=probe, cost=cost)


def smc_engine(lm: LoadedModel, drafters: Drafters, engine: EngineConfig, smc: SMCConfig, variant: dict,
               kind: str) -> SMCEngine:
    """SMC-SD (approximate): particles drafted by the EAGLE-3 head (`kind` eagle3), the SPS model (sps) or the
    target's first layers (smc.self_draft_layers), at the engine's temperature."""
    s = engine.sampling
    if s.greedy:
        raise SetupError("smc (SMC-SD) samples: set a temperature > 0 (it has no greedy mode)")
    if s.top_k or s.top_p < 1 or s.min_p or s.eta:
        raise SetupError("smc weights particles by the full laws p / q: top-k, top-p, min-p and eta do not apply")
    if engine.verify != "lossless":
        raise SetupError("smc has its own (approximate) acceptance: --verify does not apply to it")
    try:
        cfg = replace(smc, gamma=variant.get("gamma", smc.gamma), n_particles=variant.get("particles", smc.n_particles),
                      draft_temperature=s.temperature, target_temperature=s.temperature)
        if cfg.self_draft_layers:
            drafter = ModelParticles(self_draft(lm.model, cfg.self_draft_layers), s.temperature)
        elif kind == "sps":
            drafter = ModelParticles(drafters.draft_model, s.temperature)
        else:
            drafter = Eagle3Particles(drafters.head, lm.model, s.temperature)
    except ValueError as e:          # SetupError is one too
        raise SetupError(str(e)) from None
    return SMCEngine(lm.model, drafter, cfg, engine.max_new_tokens, lm.eos_ids(), lm.max_length)
