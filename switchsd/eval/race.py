"""A race: several methods on one prompt, every lane timed the same way.

    for item in race(build, lanes, prompt_ids, max_new_tokens=96, repeats=3):
        ...   # progress lines (str), then one RaceResult

Timing, so that a speedup on screen is one the method earned:
- a warm-up before the timed rounds: every lane runs a short generation first (not timed), so no lane pays the
  process's cold start (first forwards, allocator growth, the head's first call);
- every lane is a fresh engine on the same model, stepped by the same loop (`run_round`, on the caller's thread);
- the lanes of a round take turns, `turn` engine steps each (TURN): a lane's clock runs only during its own
  steps, so a slow spell of the machine (seconds long on a shared VM, longer than a whole run) falls on every lane
  alike instead of on whichever lane was running;
- a step runs slower right after another method's work (the CPU's caches hold that method's weights, KV cache
  and drafter): with one step per turn every step pays it (lanes ran 10-20% under `switchsd bench`'s speed), with
  TURN steps per turn one step in TURN does; and the turn order is shuffled every cycle (seeded), so no lane may
  always follow the same one;
- `repeats` rounds; each lane shows its median run (by Tok/s); a speedup is the median over rounds of the lane's
  Tok/s over the reference's in the same round;
- one clock: a lane's Tok/s is its median run's tokens / the time of its own steps (prefill included, as the
  wall time of `switchsd bench`), and its replay timeline (`timeline`) ends at that same time.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from ..core.engine import Engine, Generation
from ..core.events import StepEvent, summarize

WARMUP_TOKENS = 8
TURN = 8            # engine steps per turn: ~30-60 ms at this project's CPU speeds, far shorter than a slow spell


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
    pick: int | None = None     # the round shown (RaceResult.settle: the round of the median same-round ratio)

    @property
    def median_index(self) -> int:
        if self.pick is not None:
            return self.pick
        order = sorted(range(len(self.runs)), key=lambda i: self.runs[i].stats["tok_s"])
        return order[(len(order) - 1) // 2]

    @property
    def shown(self) -> Generation:
        """The run the lane shows and replays: the reference lane's median by Tok/s; any other lane's run in the
        round whose ratio to the reference is the median ratio (so its Tok/s and speedup are one round's)."""
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

    def settle(self) -> None:
        """After the last round: every lane but the reference shows the round of its median ratio."""
        for name, lane in self.lanes.items():
            if name != self.reference:
                lane.pick = self.median_round(name)

    def _ratios(self, name: str) -> list[tuple[float, int]]:
        lane, ref = self.lanes[name].runs, self.lanes[self.reference].runs
        return sorted((a.stats["tok_s"] / b.stats["tok_s"], i) for i, (a, b) in enumerate(zip(lane, ref))
                      if b.stats["tok_s"] > 0)

    def median_round(self, name: str) -> int | None:
        """The round whose same-round ratio to the reference is the median (the lower middle of an even count)."""
        r = self._ratios(name)
        return r[(len(r) - 1) // 2][1] if r else None

    def speedup(self, name: str) -> float:
        """This lane's Tok/s over the reference's in the same round, in the round of the median ratio."""
        r = self._ratios(name)
        return r[(len(r) - 1) // 2][0] if r else 0.0

    def reference_tok_s(self, name: str) -> float:
        """The reference's Tok/s in the round `speedup(name)` comes from."""
        i = self.median_round(name)
        return self.lanes[self.reference].runs[i].stats["tok_s"] if i is not None else 0.0


def timeline(run: Generation) -> tuple[list[float], list[int]]:
    """(seconds since the start at the end of each step, cumulative tokens) of one run, on the clock of its
    Tok/s: step ends as stamped (`timings["end"]`), the last one being the run's wall time."""
    ts, ns, n = [], [], 0
    for e in run.events:
        n += len(e.new_tokens)
        ts.append(e.timings.get("end", 0.0))
        ns.append(n)
    if ts:
        ts[-1] = run.stats["wall_s"]
    return ts, ns


def run_round(engines: Sequence[Engine], ids: list[int], clock: Callable[[], float] = time.perf_counter,
              seed: int = 0, turn: int = TURN) -> list[tuple[Generation, dict | None]]:
    """Run every engine to the end, taking turns of `turn` steps each in an order shuffled every cycle (`seed`); returns
    per engine its Generation (wall time = the time of its own steps; each step's `timings["end"]` restamped on
    that clock) and its cost gate's outlook. The engines are closed at the end."""
    shuffle = random.Random(seed)
    gens = [e.generate(ids, torch.Generator().manual_seed(0)) for e in engines]
    own = [0.0] * len(engines)
    events: list[list[StepEvent]] = [[] for _ in engines]
    live = list(range(len(engines)))
    try:
        while live:
            for i in shuffle.sample(live, len(live)):
                target = engines[i].target
                target.attach()                 # only this lane's capture hooks fire during its turn
                for _ in range(turn):
                    t0 = clock()
                    event = next(gens[i], None)
                    if engines[i].device.type == "cuda":
                        torch.cuda.synchronize()
                    own[i] += clock() - t0
                    if event is None:
                        live.remove(i)
                        break
                    event.timings["end"] = own[i]
                    events[i].append(event)
                target.close()
        out = []
        for engine, evs, wall in zip(engines, events, own):
            outlook = getattr(engine.policy, "outlook", None)
            tokens = [t for e in evs for t in e.new_tokens]
            out.append((Generation(list(ids), tokens, evs, summarize(evs, wall)),
                        outlook() if outlook is not None else None))
        return out
    finally:
        for g, engine in zip(gens, engines):
            g.close()
            engine.close()


def _direct(fn, *args):
    return fn(*args)


def race(build: Callable[[LaneSpec, int], Engine], lanes: Sequence[LaneSpec], ids: list[int], max_new_tokens: int,
         repeats: int = 3, warmup_tokens: int = WARMUP_TOKENS, reference: str | None = None,
         run: Callable = _direct, skip: Callable[[LaneSpec, Exception], bool] = lambda spec, e: False,
         clock: Callable[[], float] = time.perf_counter, turn: int = TURN) -> Iterator[str | RaceResult]:
    """Yields a progress line before the warm-up and each round, then the RaceResult. `build(spec, max_new)` makes
    a fresh engine; `run(fn, *args)` calls fn where the torch work belongs (the studio: its torch thread). A lane
    whose build fails with an exception for which `skip(spec, e)` is true is left out (the others still race).
    `reference`: the lane speedups divide by (default: the first). `warmup_tokens=0` skips the warm-up (only to
    show what it prevents: the lane that steps first then pays the process's cold start)."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    if turn < 1:
        raise ValueError("turn (steps per turn) must be >= 1")
    if not lanes:
        raise ValueError("a race needs at least one lane")
    reference = reference or lanes[0].name
    live: list[LaneSpec] = []
    warm: list[Engine] = []
    for spec in lanes:
        try:
            warm.append(build(spec, max(1, min(warmup_tokens, max_new_tokens))))
        except Exception as e:
            if spec.name != reference and skip(spec, e):
                continue
            raise
        live.append(spec)
    if warmup_tokens > 0:
        yield "warming up every lane (a short run each, untimed)…"
        run(run_round, warm, ids, clock, -1, turn)
    else:
        for engine in warm:
            engine.close()
    result = RaceResult({s.name: LaneResult(s) for s in live}, reference)
    for r in range(repeats):
        yield f"round {r + 1}/{repeats}: {len(live)} lanes taking turns, {turn} step{'s' * (turn > 1)} each…"
        engines = [build(spec, max_new_tokens) for spec in live]
        for spec, (g, outlook) in zip(live, run(run_round, engines, ids, clock, r, turn)):
            result.lanes[spec.name].runs.append(g)
            result.lanes[spec.name].gates.append(outlook)
    result.settle()
    yield result


def plain_share(events: Sequence[StepEvent]) -> float:
    """Share of steps that drafted nothing."""
    return sum(1 for e in events if len(e.tree_tokens) <= 1) / len(events) if events else 0.0
