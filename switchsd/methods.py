"""Method name -> policy with its drafters (the names the CLI, the benchmark and the studio offer). One engine
runs them all; switchsd.factory builds it."""
from __future__ import annotations

from typing import Sequence

from .core.config import CopyConfig, GateConfig, LookupConfig, NeuralConfig
from .core.cost_gate import CostAware
from .core.costs import VerifyCost
from .core.drafting import Drafter
from .core.policies import SAMD, BanditSpec, Fixed, Policy, SwitchSD
from .drafters.copy import CopyDrafter, CopySpecDrafter, PLDDrafter
from .drafters.lookahead import LookaheadDrafter
from .drafters.sam import SAMDrafter

METHODS = ("vanilla", "copy", "pld", "copyspec", "eagle3", "sps", "switchsd", "switchsd-paper", "switchsd-sps",
           "switchsd-sps-paper", "banditspec", "samd", "lookahead", "smc")
# approximate methods (not lossless; sampling only): SMC-SD keeps every drafted token and weights particles
APPROXIMATE = ("smc",)
NEURAL_METHODS = ("eagle3", "sps")
NEEDS_NEURAL = ("eagle3", "sps", "switchsd", "switchsd-paper", "switchsd-sps", "switchsd-sps-paper", "banditspec")
NEEDS_PROBE = ("switchsd", "switchsd-paper", "switchsd-sps", "switchsd-sps-paper")
# a verification curve for when none is known: every forward costs the same (verification is free: a big GPU)
FREE = VerifyCost({1: 1.0}, source="flat")


def uses_cost_gate(method: str, neural: NeuralConfig, gate: GateConfig) -> bool:
    """SwitchSD with the cost gate, and a neural method whose shape the cost model picks (`shape` auto)."""
    if method in ("switchsd", "switchsd-sps"):
        return gate.mode == "cost"
    return method in NEURAL_METHODS and neural.shape == "auto"


def build_policy(method: str, eos_ids: Sequence[int] = (), copy_cfg: CopyConfig = CopyConfig(),
                 neural: Drafter | None = None, tau: float | None = None,
                 *, neural_cfg: NeuralConfig | None = None, gate: GateConfig = GateConfig(),
                 cost: VerifyCost | None = None, lookup: LookupConfig = LookupConfig()) -> Policy:
    """`neural`: the neural drafter (EAGLE3 head or SPS draft model) for methods that use one.
    copyspec falls back to it when its 3-gram does not match (plain steps when it is None).
    `tau`: the probe threshold of the SwitchSD gate (the engine scores the probe); `gate.mode` picks the cost
    gate (default) or the paper's fixed dual gate; `cost`: the device's verification cost curve."""
    neural_cfg, cost = neural_cfg or NeuralConfig(), cost or FREE
    if method == "vanilla":
        return Fixed([])
    if method == "copy":
        return Fixed([CopyDrafter(copy_cfg)])
    if method == "pld":
        return Fixed([PLDDrafter(lookup.pld_max_ngram, lookup.pld_tokens, eos_ids)])
    if method == "copyspec":
        return Fixed([CopySpecDrafter(lookup.copyspec_ngram, lookup.copyspec_tokens)] +
                     ([neural] if neural is not None else []))
    if method == "lookahead":
        return Fixed([LookaheadDrafter(lookup.lookahead_level, lookup.lookahead_window, lookup.lookahead_guess)])
    if method == "samd":
        return SAMD(SAMDrafter(lookup.samd_n_predicts, lookup.samd_alpha), neural, lookup.samd_len_threshold,
                    lookup.samd_alpha)
    if method in NEEDS_PROBE:
        if tau is None:
            raise ValueError(f"method {method!r} needs a copy-intent probe (--probe FILE)")
        if method.endswith("-paper") or gate.mode == "paper":
            return SwitchSD(CopyDrafter(copy_cfg), neural, tau)
        pld = PLDDrafter(lookup.pld_max_ngram, lookup.pld_tokens, eos_ids, candidates=gate.lookup_candidates) \
            if gate.lookup else None
        return CostAware(CopyDrafter(copy_cfg), neural, tau, cost, gate.explore, lookup=pld,
                         confidence=gate.confidence, neural_margin=gate.neural_margin,
                         neural_guess=gate.neural_guess)
    if method == "banditspec":
        if neural is None:
            raise ValueError("method 'banditspec' needs a neural drafter (--eagle HEAD)")
        return BanditSpec(CopyDrafter(copy_cfg), neural, c=gate.bandit_c)
    if method in NEURAL_METHODS:
        if neural is None:
            raise ValueError(f"method {method!r} needs a neural drafter "
                             f"({'--eagle HEAD' if method == 'eagle3' else '--draft MODEL'})")
        if uses_cost_gate(method, neural_cfg, gate):
            return CostAware(None, neural, None, cost, gate.explore, confidence=gate.confidence,
                             neural_margin=gate.neural_margin, neural_guess=gate.neural_guess)
        return Fixed([neural])
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
