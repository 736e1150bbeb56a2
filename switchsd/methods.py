"""Method name -> policy with its drafters. One engine runs them all."""
from __future__ import annotations

from typing import Sequence

from .config import CopyConfig
from .drafters.copy import CopyDrafter, CopySpecDrafter, PLDDrafter
from .policies import Fixed, Policy

METHODS = ("vanilla", "copy", "pld", "copyspec")


def build_policy(method: str, eos_ids: Sequence[int] = (), copy: CopyConfig = CopyConfig(),
                 neural=None) -> Policy:
    """`neural`: a neural drafter for methods that fall back to one (copyspec); None = plain steps."""
    if method == "vanilla":
        return Fixed([])
    if method == "copy":
        return Fixed([CopyDrafter(copy)])
    if method == "pld":
        return Fixed([PLDDrafter(max_ngram=2, num_tokens=10, eos_ids=eos_ids)])
    if method == "copyspec":
        return Fixed([CopySpecDrafter(gamma=3, num_tokens=10)] + ([neural] if neural is not None else []))
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
