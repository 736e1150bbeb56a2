"""The drafter protocol.

A drafter sees the committed tokens (prompt + output, the pending token last) and proposes candidates.
The engine tells every drafter about each commit (`extend`), whether or not it drafted that step, so
indices stay current and neural drafters can catch up lazily.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import torch


@dataclass
class Draft:
    """Candidates in priority order. `q[c][i]`: distribution [V] token candidates[c][i] was sampled from
    (None for deterministic drafts: point masses). `match`: where a copy came from (for events/UI)."""
    candidates: list[list[int]]
    q: list[list[torch.Tensor]] | None = None
    match: dict | None = None

    def __bool__(self) -> bool:
        return any(len(c) > 0 for c in self.candidates)


@dataclass
class DraftRequest:
    tokens: Sequence[int]          # committed tokens, pending token last
    max_len: int                   # deepest candidate the engine will verify
    budget: int                    # tree rows available (pending row excluded)
    extra: dict = field(default_factory=dict)


@runtime_checkable
class Drafter(Protocol):
    name: str   # "copy", "pld", "copyspec", "eagle3", ...
    path: str   # "copy" | "neural": the path label used in events and stats

    def reset(self, tokens: Sequence[int]) -> None: ...
    def extend(self, tokens: Sequence[int], n_new: int) -> None: ...
    def propose(self, req: DraftRequest) -> Draft: ...
