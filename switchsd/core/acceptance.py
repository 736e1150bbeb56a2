"""Acceptance by draft position and what a draft is worth: the one cost model both gates price drafts with (the
engine's `CostAware`, switchsd/core/cost_gate.py, and the vLLM plugin's `PathCosts`, switchsd/vllm/costs.py).

A path's record is per draft position i: among its drafts that reached position i (every token before it
accepted), how many had token i accepted. The estimate of P(token i accepted | tokens < i accepted) is

    (hits_i + weight * prior) / (trials_i + weight)

and P(at least i accepted) is the product over positions up to i (`reach`). The record forgets: old evidence is
multiplied by a factor (`fade`), so the estimate follows the text and a path shut out by early misses drifts back
to its prior and is tried again. An option (a plain step, a draft of some depth) is worth

    (1 + expected accepted tokens) / its time        (`worth`)

tokens per unit of time, its time read from the device's step-time curve by the caller. Pure Python, no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import Sequence

# P(a draft token is accepted | the tokens before it were), before any evidence, per path
PRIORS = {"copy": 0.7, "lookup": 0.3, "neural": 0.4}
PRIOR_WEIGHT = 2.0      # drafts' worth of evidence the prior counts as
DECAY = 0.98            # the engine: a path's evidence x this at each of its updates (a half-life of ~34 drafts)
HALF_LIFE = 500         # vLLM: a draft's weight halves with every HALF_LIFE drafts verified since (any path's)


@dataclass
class Acceptance:
    """One path's acceptance by draft position (position 1 is the first draft token). `decay` multiplies the
    old evidence at each `update` (1.0: the caller fades it, e.g. by a clock of its own)."""
    prior: float = 0.5
    weight: float = PRIOR_WEIGHT
    decay: float = DECAY
    trials: list[float] = field(default_factory=list)
    hits: list[float] = field(default_factory=list)
    updates: int = 0

    def update(self, drafted: int, accepted: int) -> None:
        """One verified draft: `drafted` tokens deep, the first `accepted` of them accepted (<= drafted)."""
        if self.decay != 1.0:
            self.fade(self.decay)
        while len(self.trials) < drafted:
            self.trials.append(0.0)
            self.hits.append(0.0)
        for i in range(min(drafted, accepted + 1)):    # position i+1 was reached iff all before it were accepted
            self.trials[i] += 1.0
            if i < accepted:
                self.hits[i] += 1.0
        self.updates += 1

    def fade(self, factor: float) -> None:
        """Evidence x factor: a step on which this path could have drafted but did not (the engine), or drafts
        verified on other paths since (vLLM)."""
        self.trials = [t * factor for t in self.trials]
        self.hits = [h * factor for h in self.hits]


    def p(self, i: int, age: float = 1.0) -> float:
        """P(token i accepted | tokens < i were), i 1-based, the evidence weighed by `age` (read-only fading).
        Positions never reached borrow the deepest estimate."""
        j = min(i, len(self.trials)) - 1
        if j < 0:
            return self.prior
        return (age * self.hits[j] + self.weight * self.prior) / (age * self.trials[j] + self.weight)

    def reach(self, depth: int, age: float = 1.0) -> list[float]:
        """[depth]: P(at least i draft tokens accepted), i = 1..depth."""
        return list(accumulate((self.p(i, age) for i in range(1, depth + 1)), lambda a, b: a * b))

    def expected(self, depth: int) -> float:
        """Expected accepted tokens of a `depth`-deep draft."""
        return sum(self.reach(depth))

    def seen(self, age: float = 1.0) -> float:
        """Drafts' worth of evidence at position 1."""
        return age * self.trials[0] if self.trials else 0.0


def worth(reach: Sequence[float], depth: int, cost: float, base: float = 1.0) -> float:
    """What an option is worth: (base + expected accepted tokens of its first `depth` draft tokens) / its cost, in
    tokens per unit of `cost`. `base`: what the step commits anyway (1, its bonus token; in a batch, plus the other
    requests' tokens). depth 0: a plain step."""
    return (base + sum(reach[:depth])) / cost
