"""Policies choose which drafter(s) to try at each step; the engine uses the first non-empty draft.

`select` receives the decode state (committed tokens, the probe score of the last processed position when a
probe is loaded) and returns drafters in priority order plus a `gate` dict that explains the decision
(shown in events and the app). An empty list means a plain (vanilla) step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from .drafters.base import Drafter


@dataclass
class PolicyState:
    tokens: Sequence[int]
    step: int
    probe_score: float | None = None


class Policy(Protocol):
    drafters: list[Drafter]

    def select(self, state: PolicyState) -> tuple[list[Drafter], dict | None]: ...
    def observe(self, event) -> None: ...


class Fixed:
    """Always try the given drafters in order (vanilla: none; copyspec: [copyspec, neural?])."""

    def __init__(self, drafters: Sequence[Drafter] = ()):
        self.drafters = list(drafters)

    def select(self, state: PolicyState) -> tuple[list[Drafter], dict | None]:
        return self.drafters, None

    def observe(self, event) -> None:
        pass
