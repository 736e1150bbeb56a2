"""What a step costs and what it is expected to yield, on the device the engine runs on.

- `VerifyCost`: the calibrated cost of one target forward over n rows (`python -m switchsd calibrate`). The
  raw curve is not monotone on every device (float32 MKL here: 2-3 rows cost more than 4-8), so the engine pads
  a verify forward with masked rows up to the cheapest size at or above it (`pad_to`), and decisions use the
  curve's monotone envelope (`ms`), which padding makes real.
- acceptance by draft position, the estimate both gates share: switchsd/core/acceptance.py.
- `Calibration`: online acceptance of a draft token given the drafter's own probability of it (the cost gate's
  `confidence` mode prices each neural chain by its tokens' probabilities).
- `VerifyScale`: what verify forwards actually take over what the curve says, per row count (in the engine,
  interleaved with drafting, multi-row forwards drift from the calibrated curve more than one-row ones).
- `EmaTimer`: a drafter's own measured cost per draft length.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class VerifyCost:
    """`curve_ms`: {rows: ms} of one forward over `rows` new tokens on a cached prefix (rows >= 1)."""
    curve_ms: dict[int, float]
    source: str = ""
    pad_gain: float = 0.03      # pad only when the padded forward is at least 3% cheaper

    def __post_init__(self):
        if not self.curve_ms or min(self.curve_ms) != 1:
            raise ValueError("a verification cost curve needs its one-row point")
        if any(not (v > 0 and math.isfinite(v)) for v in self.curve_ms.values()):
            raise ValueError("verification costs must be positive and finite")

    @property
    def points(self) -> list[int]:
        return sorted(self.curve_ms)

    def raw(self, n: int) -> float:
        """Measured cost, linear between measured points and beyond the last one."""
        pts = self.points
        if n in self.curve_ms:
            return self.curve_ms[n]
        if n > pts[-1]:
            a, b = (pts[-2], pts[-1]) if len(pts) > 1 else (pts[-1], pts[-1])
            slope = (self.curve_ms[b] - self.curve_ms[a]) / (b - a) if b > a else 0.0
            return self.curve_ms[b] + max(slope, 0.0) * (n - b)
        lo = max(p for p in pts if p < n)
        hi = min(p for p in pts if p > n)
        w = (n - lo) / (hi - lo)
        return (1 - w) * self.curve_ms[lo] + w * self.curve_ms[hi]

    def pad_to(self, n: int, limit: int | None = None) -> int:
        """The row count to run a forward of n rows at: the cheapest measured size m >= n (m <= limit)."""
        best, best_ms = n, self.raw(n)
        for m in self.points:
            if n < m <= (limit or m) and self.raw(m) < best_ms * (1 - self.pad_gain):
                best, best_ms = m, self.raw(m)
        return best

    def ms(self, n: int, limit: int | None = None) -> float:
        """Cost of verifying n rows, for decisions: the monotone envelope of the curve (min over sizes >= n),
        which padding makes real (up to the `pad_gain` margin)."""
        return min([self.raw(n)] + [self.raw(m) for m in self.points if n < m <= (limit or m)])

    def break_even(self, rows: int, draft_ms: float = 0.0) -> float:
        """Expected accepted draft tokens a draft verified in `rows` rows (and costing `draft_ms` to write)
        needs to commit tokens faster than a plain step: (ms(rows) + draft_ms) / ms(1) - 1."""
        return (self.ms(rows) + draft_ms) / self.ms(1) - 1


@dataclass
class Calibration:
    """P(a draft token is accepted | it was reached, and the drafter gave it probability c), in `bins` equal bins
    of c: (hits + weight * centre) / (trials + weight) per bin, a bin's counts decaying by `decay` at each of its
    updates. The prior is the bin's centre: what a calibrated drafter would land."""
    bins: int = 10
    weight: float = 4.0
    decay: float = 0.995
    trials: list[float] = field(default_factory=list)
    hits: list[float] = field(default_factory=list)

    def __post_init__(self):
        self.trials = self.trials or [0.0] * self.bins
        self.hits = self.hits or [0.0] * self.bins

    def bin(self, c: float) -> int:
        return min(self.bins - 1, max(0, int(c * self.bins)))

    def p(self, c: float) -> float:
        b = self.bin(c)
        return (self.hits[b] + self.weight * (b + 0.5) / self.bins) / (self.trials[b] + self.weight)

    def update(self, c: float, hit: bool) -> None:
        b = self.bin(c)
        self.trials[b] = self.trials[b] * self.decay + 1.0
        self.hits[b] = self.hits[b] * self.decay + float(hit)


@dataclass
class VerifyScale:
    """Measured verify ms / calibrated ms, learnt online. One-row forwards (most steps) and multi-row ones can
    drift apart from the curve differently, so each row count keeps its own moving ratio, blended with a pooled
    one (one-row forwards, or all multi-row forwards) by its evidence, weight n / (n + `prior`). Every ratio
    starts from what the forward was priced at (1: the curve as calibrated) and moves by `alpha` per forward."""
    alpha: float = 0.1
    prior: float = 4.0
    lo: float = 0.2              # ratios are clipped to [lo, hi]: one stalled forward must not swing the gate
    hi: float = 5.0
    own: dict[int, float] = field(default_factory=dict)
    seen: dict[int, float] = field(default_factory=dict)
    pooled: dict[bool, float] = field(default_factory=dict)    # {multi-row: ratio}

    def update(self, rows: int, ratio: float) -> None:
        r = min(max(ratio, self.lo), self.hi)
        old = self.own.get(rows, self.get(rows))    # a new row count starts from what it was priced at
        self.own[rows] = (1 - self.alpha) * old + self.alpha * r
        old = self.pooled.get(rows > 1, self.pooled.get(False, 1.0))   # pooled: from the curve as calibrated
        self.pooled[rows > 1] = (1 - self.alpha) * old + self.alpha * r
        self.seen[rows] = min(self.seen.get(rows, 0.0) + 1.0, 1e6)

    def get(self, rows: int) -> float:
        multi = rows > 1
        base = self.pooled.get(multi, self.pooled.get(not multi, 1.0))    # the other pool until this one exists
        n = self.seen.get(rows, 0.0)
        if n == 0:
            return base
        w = n / (n + self.prior)
        return w * self.own[rows] + (1 - w) * base


@dataclass
class EmaTimer:
    """Exponential moving average of a drafter's cost (ms) per draft length; unseen lengths are scaled
    from the nearest measured one (cost proportional to length: an upper bound for batched catch-up)."""
    alpha: float = 0.2
    ms: dict[int, float] = field(default_factory=dict)
    guess_ms: float = 0.0

    def add(self, length: int, ms: float) -> None:
        old = self.ms.get(length)
        self.ms[length] = ms if old is None else (1 - self.alpha) * old + self.alpha * ms

    def get(self, length: int) -> float:
        if length in self.ms:
            return self.ms[length]
        if not self.ms:
            return self.guess_ms * length
        near = min(self.ms, key=lambda k: abs(k - length))
        return self.ms[near] * length / near
