"""The race's timing (switchsd.eval.race): a warm-up so no lane pays the process's cold start, rotated rounds,
median runs, and one clock for the Tok/s and the replay. The engines here are fakes whose "wall time" is
computed, not measured, so the checks are exact and do not depend on this machine's load."""
from __future__ import annotations

import pytest
from helpers import make_tiny_model, method_engine, random_prompt

from switchsd.core.engine import Generation
from switchsd.eval.race import LaneSpec, RaceResult, race, timeline

STEP_S = 0.010          # every fake lane: 10 ms per token
COLD_S = 0.400          # the process's first generation pays this once (first forwards, allocator growth)


class Process:
    """What the lanes share: whether the process has run anything yet, and the order of the timed runs."""
    def __init__(self, drift: float = 0.0):
        self.warm, self.drift = False, drift
        self.order: list[str] = []


class FakeEngine:
    policy = None

    def __init__(self, proc: Process, name: str, n: int):
        self.proc, self.name, self.n = proc, name, n

    def run(self, ids, generator=None) -> Generation:
        slow = 1.0 + self.proc.drift * len(self.proc.order)       # the machine slows down run after run
        wall = self.n * STEP_S * slow + (0.0 if self.proc.warm else COLD_S)
        self.proc.warm = True
        self.proc.order.append(self.name)
        return Generation(list(ids), [5] * self.n, [], {"tok_s": self.n / wall, "wall_s": wall,
                                                          "new_tokens": self.n})

    def close(self) -> None:
        pass


def _race(warmup_tokens: int, repeats: int, lanes=("a", "b"), drift: float = 0.0) -> tuple[RaceResult, Process]:
    proc = Process(drift)
    specs = [LaneSpec(x, "vanilla") for x in lanes]
    out = list(race(lambda spec, n: FakeEngine(proc, spec.name, n), specs, [3, 4], max_new_tokens=48,
                    repeats=repeats, warmup_tokens=warmup_tokens))
    assert all(isinstance(x, str) for x in out[:-1]) and isinstance(out[-1], RaceResult)
    return out[-1], proc


def test_identical_lanes_race_even_after_the_warm_up():
    result, _ = _race(warmup_tokens=8, repeats=1)
    assert result.speedup("b") == pytest.approx(1.0)


def test_without_the_warm_up_the_first_lane_pays_the_cold_start():
    """The negative control: the bug the warm-up fixes (the first lane of a fresh process credited the others
    with a speedup they did not earn) is visible to the check above."""
    result, _ = _race(warmup_tokens=0, repeats=1)
    assert result.speedup("b") > 1.5


def test_rounds_rotate_and_each_lane_shows_its_median_run():
    result, proc = _race(warmup_tokens=8, repeats=3, lanes=("a", "b", "c"))
    timed = proc.order[3:]                        # after the three warm-ups
    assert timed == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    for lane in result.lanes.values():
        assert len(lane.runs) == 3
        assert lane.shown is lane.runs[lane.median_index]
    assert result.speedup("c") == pytest.approx(1.0)


def test_speedups_pair_runs_of_one_round():
    """The machine slows 3% per run: identical lanes stay near 1.0x because each speedup is the median of
    same-round ratios; the ratio of the lanes' median runs would credit one lane with the drift."""
    result, _ = _race(warmup_tokens=8, repeats=3, lanes=("a", "b", "c"), drift=0.03)
    for name in ("b", "c"):
        assert abs(result.speedup(name) - 1) < 0.04, result.speedup(name)
    naive = result.lanes["b"].tok_s / result.lanes["a"].tok_s
    assert abs(naive - 1) > 0.05, naive


def test_bad_race_arguments_are_refused():
    with pytest.raises(ValueError, match="repeats"):
        list(race(lambda s, n: None, [LaneSpec("a", "vanilla")], [1], 8, repeats=0))
    with pytest.raises(ValueError, match="lane"):
        list(race(lambda s, n: None, [], [1], 8))


def test_the_replay_clock_is_the_tok_s_clock():
    """A lane's replay (step end stamps) ends at the wall time its Tok/s divides by, and the stamps grow."""
    model = make_tiny_model()
    g = method_engine(model, "pld", max_new_tokens=24, stop_at_eos=False).run(random_prompt(0, 12))
    ts, ns = timeline(g)
    assert ts[-1] == g.stats["wall_s"] and ns[-1] == g.stats["new_tokens"] == len(g.token_ids)
    ends = [e.timings["end"] for e in g.events]
    assert all(b >= a for a, b in zip(ends, ends[1:])) and 0 < ends[-1] <= g.stats["wall_s"]
    assert g.stats["tok_s"] == pytest.approx(g.stats["new_tokens"] / g.stats["wall_s"])
