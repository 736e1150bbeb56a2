"""The drafter protocol.

A drafter sees the committed tokens (prompt + output, the pending token last) and proposes candidates.
The engine tells every drafter about each commit (`extend`), whether or not it drafted that step, so
indices stay current and neural drafters can catch up lazily.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch


@dataclass
class Extra:
    """Rows a drafter adds to the verify forward that are NOT verified (Lookahead's Jacobi window): they see the
    cached prefix, the pending token (column 0 of `sees`) and the extra rows `sees[:, 1:]` marks; no tree row
    sees them, so the verified rows' outputs are unchanged, and their keys/values are dropped after the step.
    `rel_pos`: position of each row relative to the pending token. `absorb(logits [E, V])` gets their outputs."""
    tokens: list[int]
    rel_pos: list[int]
    sees: torch.Tensor              # [E, 1 + E] bool
    absorb: Callable[[torch.Tensor], None]


@dataclass
class Draft:
    """Candidates in priority order. `q[c][i]`: distribution [V] token candidates[c][i] was sampled from
    (None for deterministic drafts: point masses). `match`: where a copy came from (for events/UI).
    `extra`: unverified rows for the same forward (see Extra)."""
    candidates: list[list[int]]
    q: list[list[torch.Tensor]] | None = None
    match: dict | None = None
    extra: Extra | None = None

    def __bool__(self) -> bool:
        return any(len(c) > 0 for c in self.candidates) or self.extra is not None


@dataclass
class DraftRequest:
    tokens: Sequence[int]          # committed tokens, pending token last
    max_len: int                   # deepest candidate the engine will verify
    budget: int                    # tree rows available (pending row excluded)


def merge_drafts(drafts: Sequence[Draft]) -> tuple[Draft, list[int]]:
    """Several drafters' candidates verified in one tree (earlier drafts first); returns the merged draft and,
    per candidate, the index of the draft it came from. Point masses (q None) and sampled tokens may mix:
    the acceptance rule treats every child by its own q."""
    if len(drafts) == 1:
        return drafts[0], [0] * len(drafts[0].candidates)
    cands, qs, owner = [], [], []
    for i, d in enumerate(drafts):
        for c, cand in enumerate(d.candidates):
            cands.append(list(cand))
            qs.append(list(d.q[c]) if d.q is not None else [None] * len(cand))
            owner.append(i)
    any_q = any(q is not None for row in qs for q in row)
    match = next((d.match for d in drafts if d.match), None)
    return Draft(cands, q=qs if any_q else None, match=match), owner


class Drafter(Protocol):
    name: str   # "copy", "pld", "copyspec", "eagle3", ...
    path: str   # "copy" | "neural": the path label used in events and stats

    def reset(self, tokens: Sequence[int]) -> None: ...
    def extend(self, tokens: Sequence[int], n_new: int) -> None: ...
    def propose(self, req: DraftRequest) -> Draft: ...
