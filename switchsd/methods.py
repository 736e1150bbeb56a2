"""Method name -> policy with its drafters. One engine runs them all."""
from __future__ import annotations

from typing import Sequence

from .config import CopyConfig
from .drafters.base import Drafter
from .drafters.copy import CopyDrafter, CopySpecDrafter, PLDDrafter
from .policies import BanditSpec, Fixed, Policy, SwitchSD

METHODS = ("vanilla", "copy", "pld", "copyspec", "eagle3", "sps", "switchsd", "switchsd-sps", "banditspec")
NEURAL_METHODS = ("eagle3", "sps")
NEEDS_NEURAL = ("eagle3", "sps", "switchsd", "switchsd-sps", "banditspec")
NEEDS_PROBE = ("switchsd", "switchsd-sps")


def build_policy(method: str, eos_ids: Sequence[int] = (), copy: CopyConfig = CopyConfig(),
                 neural: Drafter | None = None, tau: float | None = None, bandit_c: float = 1.0) -> Policy:
    """`neural`: the neural drafter (EAGLE3 head or SPS draft model) for methods that use one.
    copyspec falls back to it when its 3-gram does not match (plain steps when it is None).
    `tau`: the probe threshold of the SwitchSD gate (the engine scores the probe)."""
    if method == "vanilla":
        return Fixed([])
    if method == "copy":
        return Fixed([CopyDrafter(copy)])
    if method == "pld":
        return Fixed([PLDDrafter(max_ngram=2, num_tokens=10, eos_ids=eos_ids)])
    if method == "copyspec":
        return Fixed([CopySpecDrafter(gamma=3, num_tokens=10)] + ([neural] if neural is not None else []))
    if method in ("switchsd", "switchsd-sps"):
        if tau is None:
            raise ValueError(f"method {method!r} needs a copy-intent probe (--probe FILE)")
        return SwitchSD(CopyDrafter(copy), neural, tau)
    if method == "banditspec":
        if neural is None:
            raise ValueError("method 'banditspec' needs a neural drafter (--eagle HEAD)")
        return BanditSpec(CopyDrafter(copy), neural, c=bandit_c)
    if method in NEURAL_METHODS:
        if neural is None:
            raise ValueError(f"method {method!r} needs a neural drafter "
                             f"({'--eagle HEAD' if method == 'eagle3' else '--draft MODEL'})")
        return Fixed([neural])
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
