"""A race: several methods on one prompt, every lane timed the same way.

    for item in race(build, lanes, prompt_ids, max_new_tokens=96, repeats=3):
        ...   # progress lines (str), then one RaceResult

Timing, so that a speedup on screen is one the method earned:
- a warm-up before the first timed lane: every lane runs a short generation first (not timed), so no lane pays
  the process's cold start (first forwards, allocator growth, the head's first call);
- every lane is a fresh engine on the same model, run by the same `run` function (the caller's thread);
- `repeats` rounds, the lane order rotated each round (a drift of the machine's speed hits every lane alike);
  each lane shows its median run (by Tok/s); a speedup is the median over rounds of the lane's Tok/s over the
  reference's in the same round (paired: a drift between rounds cancels);
- one clock: a lane's Tok/s is its median run's tokens / wall time (the engine's own `Generation.stats`, as in
  `switchsd bench`), and its replay timeline (`timeline`) ends at that same wall time.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from ..core.engine import Engine, Generation
from ..core.events import StepEvent

WARMUP_TOKENS = 8


@dataclass(frozen=True)
class LaneSpec:
    """One lane: its label, the method it runs and that method's options (passed to `build`)."""
    name: str
    method: str
    options: tuple = ()         # (key, value) pairs, e.g. (("gamma", 3),)


@dataclass
class LaneResult:
    spec: LaneSpec
    runs: list[Generation] = field(default_factory=list)
    gates: list[dict | None] = field(default_factory=list)   # per run: the cost gate's outlook at its end

    @property
    def median_index(self) -> int:
        order = sorted(range(len(self.runs)), key=lambda i: self.runs[i].stats["tok_s"])
        return order[(len(order) - 1) // 2]

    @property
    def shown(self) -> Generation:
        """The run the lane shows and replays: its median by Tok/s."""
        return self.runs[self.median_index]

    @property
    def tok_s(self) -> float:
        return statistics.median(g.stats["tok_s"] for g in self.runs)

    @property
    def gate(self) -> dict | None:
        return self.gates[self.median_index] if self.gates else None


@dataclass
class RaceResult:
    lanes: dict[str, LaneResult]
    reference: str                  # the lane the speedups divide by (vanilla)

    def speedup(self, name: str) -> float:
        """The median over rounds of this lane's Tok/s over the reference's in the same round: runs of one round
        lie seconds apart, so a drift of the machine's speed between rounds cancels in each ratio."""
        lane, ref = self.lanes[name].runs, self.lanes[self.reference].runs
        ratios = [a.stats["tok_s"] / b.stats["tok_s"] for a, b in zip(lane, ref) if b.stats["tok_s"] > 0]
        return statistics.median(ratios) if ratios else 0.0


def timeline(run: Generation) -> tuple[list[float], list[int]]:
    """(seconds since the start at the end of each step, cumulative tokens) of one run, on the clock of its
    Tok/s: step ends as the engine stamped them (`timings["end"]`), the last one being the run's wall time."""
    ts, ns, n = [], [], 0
    for e in run.events:
        n += len(e.new_tokens)
        ts.append(e.timings.get("end", 0.0))
        ns.append(n)
    if ts:
        ts[-1] = run.stats["wall_s"]          # what the engine measured around the loop (a few µs later)
    return ts, ns


def _direct(fn, *args):
    return fn(*args)


def _timed(engine: Engine, ids: list[int]) -> tuple[Generation, dict | None]:
    try:
        g = engine.run(ids, torch.Generator().manual_seed(0))
        outlook = getattr(engine.policy, "outlook", None)
        return g, (outlook() if outlook is not None else None)
    finally:
        engine.close()


def race(build: Callable[[LaneSpec, int], Engine], lanes: Sequence[LaneSpec], ids: list[int], max_new_tokens: int,
         repeats: int = 3, warmup_tokens: int = WARMUP_TOKENS, reference: str | None = None,
         run: Callable = _direct, skip: Callable[[LaneSpec, Exception], bool] = lambda spec, e: False
         ) -> Iterator[str | RaceResult]:
    """Yields a progress line before each generation, then the RaceResult. `build(spec, max_new)` makes a fresh
    engine; `run(fn, *args)` calls fn where the torch work belongs (the studio: its torch thread). A lane whose
    build fails with an exception for which `skip(spec, e)` is true is left out (the others still race).
    `reference`: the lane speedups divide by (default: the first). `warmup_tokens=0` skips the warm-up (only to
    show what it prevents: the first lane then pays the process's cold start)."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    if not lanes:
        raise ValueError("a race needs at least one lane")
    reference = reference or lanes[0].name
    live: list[LaneSpec] = []
    for spec in lanes:                         # warm-up: every lane once, short, untimed
        if warmup_tokens > 0:
            yield f"warming up {spec.name}…"
        try:
            engine = build(spec, max(1, min(warmup_tokens, max_new_tokens)))
        except Exception as e:
            if spec.name != reference and skip(spec, e):
                continue
            raise
        if warmup_tokens > 0:
            run(_timed, engine, ids)
        else:
            engine.close()
        live.append(spec)
    result = RaceResult({s.name: LaneResult(s) for s in live}, reference)
    n = len(live)
    for r in range(repeats):
        for i in range(n):
            spec = live[(i + r) % n]           # rotated: each lane leads one round
            yield f"round {r + 1}/{repeats}: {spec.name} ({i + 1}/{n})…"
            g, outlook = run(_timed, build(spec, max_new_tokens), ids)
            result.lanes[spec.name].runs.append(g)
            result.lanes[spec.name].gates.append(outlook)
    yield result


def plain_share(events: Sequence[StepEvent]) -> float:
    """Share of steps that drafted nothing."""
    return sum(1 for e in events if len(e.tree_tokens) <= 1) / len(events) if events else 0.0
