"""Policies choose which drafter(s) to try at each step; the engine uses the first non-empty draft.

`select` receives the decode state (committed tokens, the probe score of the last processed position when a
probe is loaded, the step's length and row limits) and returns a `Decision`: the drafters in priority order
(none: a plain, vanilla step), the caps the engine applies to this step's draft, and, apart from that control,
`why`: the explanation shown in events and the studio (the engine never reads it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

from .drafting import Drafter


@dataclass(frozen=True)
class Decision:
    """One step's choice. `max_len`: deepest draft token; `rows`: verify rows, the pending row included;
    `merge`: verify every drafter's candidates together (else the first non-empty draft runs)."""
    drafters: tuple = ()
    max_len: int | None = None
    rows: int | None = None
    merge: bool = False
    why: dict | None = None


@dataclass
class PolicyState:
    tokens: Sequence[int]
    step: int
    probe_score: float | None = None
    max_len: int = 1 << 30         # deepest draft token the engine can verify this step
    rows: int = 1 << 30            # verify rows available (pending row included)


class Policy(Protocol):
    drafters: list[Drafter]

    def select(self, state: PolicyState) -> Decision: ...
    def observe(self, event) -> None: ...


class Fixed:
    """Always try the given drafters in order (vanilla: none; copyspec: [copyspec, neural?])."""

    def __init__(self, drafters: Sequence[Drafter] = ()):
        self.drafters = list(drafters)

    def select(self, state: PolicyState) -> Decision:
        return Decision(tuple(self.drafters))

    def observe(self, event) -> None:
        pass


class SwitchSD:
    """The paper's dual gate (eq. 4): copy iff probe(h) >= tau AND the kappa-gram ending at the current token
    occurred earlier; otherwise the neural drafter. If the copy draft comes back empty the neural drafter runs."""

    def __init__(self, copier, neural=None, tau: float = 0.5):
        self.copy, self.neural, self.tau = copier, neural, float(tau)
        self.drafters = [copier] + ([neural] if neural is not None else [])

    def gate(self, score: float | None, match: bool) -> bool:
        return score is not None and score >= self.tau and match

    def select(self, state: PolicyState) -> Decision:
        match = self.copy.has_match(state.tokens)
        fire = self.gate(state.probe_score, match)
        gate = {"probe": state.probe_score, "tau": self.tau, "kgram_match": match, "copy": fire}
        neural = [self.neural] if self.neural is not None else []
        return Decision(tuple([self.copy] + neural if fire else neural), why=gate)

    def observe(self, event) -> None:
        pass


class SAMD:
    """SAM-Decoding's adaptive rule: the suffix automaton's copy when its match (the longest suffix of the text
    that occurred earlier) is at least `len_threshold` tokens, else the auxiliary drafter. Without one, the
    automaton drafts every step, min(n_predicts, 1 + alpha * match) tokens."""

    def __init__(self, sam, neural=None, len_threshold: int = 5, alpha: float = 4.0):
        self.sam, self.neural, self.len_threshold, self.alpha = sam, neural, len_threshold, alpha
        self.drafters = [sam] + ([neural] if neural is not None else [])

    def select(self, state: PolicyState) -> Decision:
        self.sam.sam.extend(state.tokens)          # idempotent: feeds only tokens it has not seen
        n = self.sam.match_len
        if self.neural is None:
            cap = min(self.sam.n_predicts, 1 + int(self.alpha * n))
            return Decision((self.sam,), max_len=cap, why={"match_len": n, "max_len": cap})
        fire = n >= self.len_threshold
        return Decision((self.sam,) if fire else (self.neural,), why={"match_len": n, "samd_copy": fire})

    def observe(self, event) -> None:
        pass


class BanditSpec:
    """UCB1 over the arms {copy, neural}; reward = tokens per second of the step (new tokens / step time),
    normalised by the largest reward seen so rewards lie in [0, 1]. Each arm is played `warmup` times first.
    Score = mean + c * sqrt(2 ln t / n). The reward goes to the path that actually ran (a copy arm whose
    draft is empty falls back to the neural drafter)."""

    def __init__(self, copier, neural, c: float = 1.0, warmup: int = 1):
        self.copy, self.neural, self.c, self.warmup = copier, neural, c, warmup
        self.drafters = [copier, neural]
        self.arms = {"copy": [0, 0.0], "neural": [0, 0.0]}     # plays, summed raw reward
        self.r_max = 1e-9

    def ucb(self) -> dict[str, float]:
        t = sum(n for n, _ in self.arms.values())
        out = {}
        for a, (n, s) in self.arms.items():
            out[a] = float("inf") if n < self.warmup else \
                (s / n) / self.r_max + self.c * math.sqrt(2 * math.log(max(t, 1)) / n)
        return out

    def select(self, state: PolicyState) -> Decision:
        scores = self.ucb()
        arm = max(scores, key=lambda a: (scores[a], a == "neural"))
        return Decision((self.copy, self.neural) if arm == "copy" else (self.neural,),
                        why={"arm": arm, "ucb": scores})

    def observe(self, event) -> None:
        arm = "copy" if event.path == "copy" else "neural" if event.path == "neural" else None
        if arm is None:
            return
        r = len(event.new_tokens) / max(event.timings.get("total", 0.0), 1e-9)
        self.r_max = max(self.r_max, r)
        self.arms[arm][0] += 1
        self.arms[arm][1] += r
