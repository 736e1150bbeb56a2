"""The race's timing (switchsd.eval.race): a warm-up so no lane pays the process's cold start, lanes taking turns
step by step so a slow spell of the machine falls on every lane alike, rotated rounds, median runs, and one clock
for the Tok/s and the replay. The engines here are fakes on a simulated clock, so the checks are exact and do not
depend on this machine's load."""
from __future__ import annotations

import pytest
from helpers import make_tiny_model, method_engine, random_prompt

from switchsd.core.events import StepEvent
from switchsd.eval.race import LaneSpec, RaceResult, race, run_round, timeline

STEP_S = 0.010          # every fake lane: 10 ms per token
COLD_S = 0.400          # the process's first step pays this once (first forwards, allocator growth)


class Process:
    """What the lanes share: a simulated clock, whether the process has run anything yet, the order of the steps,
    and the machine's speed: `slow(t)` multiplies a step's cost at time t."""
    def __init__(self, slow=lambda t: 1.0):
        self.now, self.warm, self.slow = 0.0, False, slow
        self.order: list[str] = []
        self.after: dict[str, float] = {}        # a step's cost x this, right after a step of that lane

    def clock(self) -> float:
        return self.now


class Target:
    def attach(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeEngine:
    policy = None
    target = Target()

    def __init__(self, proc: Process, name: str, n: int):
        self.proc, self.name, self.n = proc, name, n

    @property
    def device(self):
        import torch
        return torch.device("cpu")

    def generate(self, ids, generator=None):
        for step in range(self.n):
            after = self.proc.after.get(self.proc.order[-1], 1.0) if self.proc.order else 1.0
            self.proc.now += STEP_S * self.proc.slow(self.proc.now) * after + (0.0 if self.proc.warm else COLD_S)
            self.proc.warm = True
            self.proc.order.append(self.name)
            yield StepEvent(step, "vanilla", None, [], [5], [-1], [0], [], None, 5, [5], len(ids) + step)

    def close(self) -> None:
        pass


def _race(warmup_tokens: int, repeats: int, lanes=("a", "b"), slow=lambda t: 1.0, turn: int = 1
          ) -> tuple[RaceResult, Process]:
    proc = Process(slow)
    specs = [LaneSpec(x, "vanilla") for x in lanes]
    out = list(race(lambda spec, n: FakeEngine(proc, spec.name, n), specs, [3, 4], max_new_tokens=48,
                    repeats=repeats, warmup_tokens=warmup_tokens, clock=proc.clock, turn=turn))
    assert all(isinstance(x, str) for x in out[:-1]) and isinstance(out[-1], RaceResult)
    return out[-1], proc


def test_identical_lanes_race_even_after_the_warm_up():
    result, _ = _race(warmup_tokens=8, repeats=1)
    assert result.speedup("b") == pytest.approx(1.0)


def test_without_the_warm_up_the_first_lane_pays_the_cold_start():
    """The negative control: the bug the warm-up fixes (the first lane of a fresh process credited the others
    with a speedup they did not earn) is visible to the check above."""
    result, _ = _race(warmup_tokens=0, repeats=1)
    s = result.speedup("b")                       # whichever lane stepped first paid it
    assert s > 1.5 or s < 1 / 1.5, s


def test_lanes_take_turns_and_each_lane_shows_its_median_run():
    result, proc = _race(warmup_tokens=8, repeats=3, lanes=("a", "b", "c"))
    timed = proc.order[3 * 8:]                    # after the warm-up's 8 steps per lane
    assert len(timed) == 3 * 3 * 48
    for cycle in range(0, len(timed), 3):         # every cycle: each lane one step
        assert sorted(timed[cycle:cycle + 3]) == ["a", "b", "c"]
    for lane in result.lanes.values():
        assert len(lane.runs) == 3 and lane.runs[0].stats["new_tokens"] == 48
        assert lane.shown is lane.runs[lane.median_index]
    assert result.speedup("c") == pytest.approx(1.0)


def after_c(proc: Process) -> Process:
    """A step costs 30% more right after a step of lane "c" (a method whose work evicts the others' from the
    CPU's caches)."""
    proc.after = {"c": 1.3}
    return proc


def _follow_race(turn: int = 1) -> RaceResult:
    proc = after_c(Process())
    specs = [LaneSpec(x, "vanilla") for x in ("a", "b", "c")]
    out = list(race(lambda spec, n: FakeEngine(proc, spec.name, n), specs, [3, 4], max_new_tokens=96, repeats=3,
                    clock=proc.clock, turn=turn))
    return out[-1]


def test_turns_of_several_steps_pay_for_the_neighbour_once_per_turn():
    """Turns of 8 steps: a lane's steps come in runs of 8, so following "c" costs one step in 8, and lanes run
    near their own speed (one step per turn: "a" and "b" pay it on about half their steps)."""
    result, proc = _race(warmup_tokens=8, repeats=1, lanes=("a", "b", "c"), turn=8)
    timed = proc.order[3 * 8:]
    assert all(len(set(timed[i:i + 8])) == 1 for i in range(0, len(timed), 8))
    tok_s = {t: _follow_race(t).lanes["a"].tok_s for t in (1, 8)}
    assert tok_s[8] > 1.1 * tok_s[1], tok_s
    assert abs(_follow_race(8).speedup("b") - 1) < 0.05


def test_no_lane_always_follows_the_same_one():
    """The turn order is shuffled every cycle, so the cost of following "c" is shared by "a" and "b"."""
    result = _follow_race()
    assert abs(result.speedup("b") - 1) < 0.05, result.speedup("b")


def test_a_fixed_turn_order_would_charge_one_lane_for_its_neighbour(monkeypatch):
    """The negative control: turns in a fixed order (a, b, c, a, ...) make "a" always follow "c"."""
    import switchsd.eval.race as race_module

    class Fixed:
        def __init__(self, seed):
            pass

        def sample(self, xs, k):
            return list(xs)[:k]
    monkeypatch.setattr(race_module.random, "Random", Fixed)
    result = _follow_race()
    assert result.speedup("b") > 1.1, result.speedup("b")


def spell(t: float) -> float:
    """A slow spell: the machine runs at half speed for 0.4 s, a little after the timed round starts."""
    return 2.0 if 0.7 <= t < 1.1 else 1.0


def test_a_slow_spell_falls_on_every_lane_alike():
    """Identical lanes in one round, the machine halving its speed for 0.4 s of it: taking turns step by step, each
    lane's clock takes its share of the spell, so the speedup stays near 1.0x."""
    result, _ = _race(warmup_tokens=8, repeats=1, lanes=("a", "b", "c"), slow=spell)
    for name in ("b", "c"):
        assert abs(result.speedup(name) - 1) < 0.03, result.speedup(name)


def test_lane_after_lane_a_slow_spell_would_fall_on_one_lane():
    """The negative control: the same spell with the lanes run one after the other (each alone in its round, as
    the race used to time them) slows one lane's run and credits the others with a speedup."""
    proc = Process(spell)
    for name in ("a", "b", "c"):                  # warm-up, as the race does
        run_round([FakeEngine(proc, name, 8)], [3, 4], proc.clock)
    tok_s = {name: run_round([FakeEngine(proc, name, 48)], [3, 4], proc.clock)[0][0].stats["tok_s"]
             for name in ("a", "b", "c")}
    assert max(tok_s.values()) / min(tok_s.values()) > 1.3, tok_s


def test_bad_race_arguments_are_refused():
    with pytest.raises(ValueError, match="repeats"):
        list(race(lambda s, n: None, [LaneSpec("a", "vanilla")], [1], 8, repeats=0))
    with pytest.raises(ValueError, match="lane"):
        list(race(lambda s, n: None, [], [1], 8))
    with pytest.raises(ValueError, match="turn"):
        list(race(lambda s, n: None, [LaneSpec("a", "vanilla")], [1], 8, turn=0))


def test_the_replay_clock_is_the_tok_s_clock():
    """A lane's replay (step end stamps) ends at the time its Tok/s divides by, and the stamps grow; and a real
    engine's greedy text is the same whether it runs alone or takes turns with another."""
    model = make_tiny_model()
    alone = method_engine(model, "pld", max_new_tokens=24, stop_at_eos=False).run(random_prompt(0, 12))
    (g, _), (v, _) = run_round([method_engine(model, "pld", max_new_tokens=24, stop_at_eos=False),
                                method_engine(model, "vanilla", max_new_tokens=24, stop_at_eos=False)],
                               random_prompt(0, 12))
    assert g.token_ids == alone.token_ids == v.token_ids
    for run in (alone, g):
        ts, ns = timeline(run)
        assert ts[-1] == run.stats["wall_s"] and ns[-1] == run.stats["new_tokens"] == len(run.token_ids)
        ends = [e.timings["end"] for e in run.events]
        assert all(b >= a for a, b in zip(ends, ends[1:])) and 0 < ends[-1] <= run.stats["wall_s"]
        assert run.stats["tok_s"] == pytest.approx(run.stats["new_tokens"] / run.stats["wall_s"])


def test_a_lane_s_line_is_one_round_its_speedup_and_both_tok_s():
    """A lane's shown run, its speedup and the reference's Tok/s beside it come from the same round: shown Tok/s
    over the reference's in that round equals the speedup (a lane showing its median run beside a median of
    ratios could read "10.2 tok/s, 1.09x vanilla" next to vanilla's 14.2)."""
    slow = lambda t: 1.0 + 0.8 * ((int(t * 7) % 3) == 0)      # uneven spells: rounds differ
    result, _ = _race(warmup_tokens=8, repeats=5, lanes=("a", "b", "c"), slow=slow, turn=8)
    ratios = {}
    for name in ("b", "c"):
        lane, i = result.lanes[name], result.median_round(name)
        assert lane.shown is lane.runs[i]
        same = result.lanes["a"].runs[i].stats["tok_s"]
        assert result.reference_tok_s(name) == same
        assert lane.shown.stats["tok_s"] / same == pytest.approx(result.speedup(name))
        ratios[name] = sorted(r.stats["tok_s"] / v.stats["tok_s"]
                              for r, v in zip(lane.runs, result.lanes["a"].runs))
        assert result.speedup(name) == ratios[name][2]            # the median of five same-round ratios
