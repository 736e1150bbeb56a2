"""Policies choose which drafter(s) to try at each step; the engine uses the first non-empty draft.

`select` receives the decode state (committed tokens, the probe score of the last processed position when a
probe is loaded) and returns drafters in priority order plus a `gate` dict that explains the decision
(shown in events and the app). An empty list means a plain (vanilla) step.
"""
from __future__ import annotations

import math
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


class SwitchSD:
    """The paper's dual gate (eq. 4): copy iff probe(h) >= tau AND the kappa-gram ending at the current token
    occurred earlier; otherwise the neural drafter. If the copy draft comes back empty the neural drafter runs."""

    def __init__(self, copy, neural=None, tau: float = 0.5):
        self.copy, self.neural, self.tau = copy, neural, float(tau)
        self.drafters = [copy] + ([neural] if neural is not None else [])

    def gate(self, score: float | None, match: bool) -> bool:
        return score is not None and score >= self.tau and match

    def select(self, state: PolicyState) -> tuple[list, dict]:
        match = self.copy.has_match(state.tokens)
        fire = self.gate(state.probe_score, match)
        gate = {"probe": state.probe_score, "tau": self.tau, "kgram_match": match, "copy": fire}
        neural = [self.neural] if self.neural is not None else []
        return ([self.copy] + neural if fire else neural), gate

    def observe(self, event) -> None:
        pass


class BanditSpec:
    """UCB1 over the arms {copy, neural}; reward = tokens per second of the step (new tokens / step time),
    normalised by the largest reward seen so rewards lie in [0, 1]. Each arm is played `warmup` times first.
    Score = mean + c * sqrt(2 ln t / n). The reward goes to the path that actually ran (a copy arm whose
    draft is empty falls back to the neural drafter)."""

    def __init__(self, copy, neural, c: float = 1.0, warmup: int = 1):
        self.copy, self.neural, self.c, self.warmup = copy, neural, c, warmup
        self.drafters = [copy, neural]
        self.arms = {"copy": [0, 0.0], "neural": [0, 0.0]}     # plays, summed raw reward
        self.r_max = 1e-9

    def ucb(self) -> dict[str, float]:
        t = sum(n for n, _ in self.arms.values())
        out = {}
        for a, (n, s) in self.arms.items():
            out[a] = float("inf") if n < self.warmup else \
                (s / n) / self.r_max + self.c * math.sqrt(2 * math.log(max(t, 1)) / n)
        return out

    def select(self, state: PolicyState) -> tuple[list, dict]:
        scores = self.ucb()
        arm = max(scores, key=lambda a: (scores[a], a == "neural"))
        return ([self.copy, self.neural] if arm == "copy" else [self.neural]), {"arm": arm, "ucb": scores}

    def observe(self, event) -> None:
        arm = "copy" if event.path == "copy" else "neural" if event.path == "neural" else None
        if arm is None:
            return
        r = len(event.new_tokens) / max(event.timings.get("total", 0.0), 1e-9)
        self.r_max = max(self.r_max, r)
        self.arms[arm][0] += 1
        self.arms[arm][1] += r
