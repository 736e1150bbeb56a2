"""`switchsd.models.calibrate`: the monotone envelope, the budget it implies (including the no-qualifying-size
case), the cost curve saved and read back per model / dtype / forward, the fallback when a device is not
calibrated or its file is corrupt, and a real measurement on a tiny model."""
from __future__ import annotations

import json

import pytest
from helpers import make_tiny_model

from switchsd.models import calibrate as cal
from switchsd.models.loading import LoadedModel


@pytest.fixture
def lm(tmp_path, monkeypatch):
    monkeypatch.setenv("SWITCHSD_CACHE", str(tmp_path))
    monkeypatch.delenv("SWITCHSD_CALIBRATION")           # the suite's own folder (conftest): not here
    return LoadedModel(make_tiny_model(), tokenizer=None, name="tiny/model")


def test_monotone_envelope_is_the_min_over_larger_sizes():
    curve = {1: 10.0, 2: 16.0, 3: 15.0, 4: 12.0, 8: 20.0, 16: 19.0}
    assert cal.monotone(curve) == {1: 10.0, 2: 12.0, 3: 12.0, 4: 12.0, 8: 19.0, 16: 19.0}
    env = cal.monotone(curve)
    assert all(env[a] <= env[b] for a, b in zip(sorted(env), sorted(env)[1:]))        # non-decreasing
    assert all(env[n] <= curve[n] for n in curve)                                      # never above a measurement


def test_budget_is_the_largest_size_within_the_ratio():
    curve = {1: 10.0, 2: 16.0, 4: 12.0, 8: 20.0, 16: 25.0}
    assert cal.budget_from_curve(curve, 2.0) == 8              # 2-row noise (16 ms) does not hide 4 and 8
    assert cal.budget_from_curve(curve, 1.0) == 1              # no size beyond one token qualifies
    assert cal.budget_from_curve(curve, 2.5) == 16
    assert cal.budget_from_curve({1: 10.0, 4: 35.0}, 2.0) == 1


def test_save_then_load_budget_and_cost(lm):
    path, source = cal.calibration_path(lm), None
    assert "tiny--model-cpu-float64" in path.name
    budget, source = cal.load_budget(lm)
    assert (budget, source.startswith("fallback")) == (cal.FALLBACK_BUDGET, True)       # not calibrated yet
    assert cal.device_cost(lm, measure_if_missing=False).source == "flat"
    curve = {1: 10.0, 2: 16.0, 4: 12.0, 8: 20.0, 16: 25.0}
    saved = cal.save(lm, curve, prefix=64, ratio=2.0)
    data = json.loads(saved.read_text())
    assert data["budget"] == 8 and data["forward"] == "lean" and set(data["break_even"])
    assert cal.load_budget(lm) == (8, str(saved))
    cost = cal.device_cost(lm)
    assert cost.source == str(saved) and cost.raw(4) == 12.0
    # a forward of its own: transformers' forward has its own file
    assert cal.calibration_path(lm, "hf") != saved


def test_corrupt_file_is_measured_again(lm):
    path = cal.calibration_path(lm)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    cost = cal.device_cost(lm)                                   # measures a short curve and saves it
    data = json.loads(path.read_text())
    assert cost.source == str(path) and set(map(int, data["curve_ms"])) == {n for n in cal.POINTS if n <= 32}


def test_measure_returns_positive_times_for_every_size(lm):
    curve = cal.measure(lm, max_tokens=8, prefix=16, repeats=1, progress=False)
    assert sorted(curve) == [1, 2, 3, 4, 6, 8] and all(v > 0 for v in curve.values())


def test_calibration_folder_follows_its_variable(lm, tmp_path, monkeypatch):
    """$SWITCHSD_CALIBRATION moves every device measurement (curves and the dtype choice); unset, they live
    under $SWITCHSD_CACHE/calibration."""
    from switchsd.models.loading import dtype_choice_path
    assert cal.calibration_path(lm).parent == tmp_path / "calibration" == dtype_choice_path("cpu").parent
    monkeypatch.setenv("SWITCHSD_CALIBRATION", str(tmp_path / "own"))
    assert cal.calibration_path(lm).parent == tmp_path / "own" == dtype_choice_path("cpu").parent


def test_measure_keeps_each_sizes_fastest_round(lm, monkeypatch):
    """Rounds run over every size in turn; a size keeps its fastest round, so one slow burst (another process
    taking the CPU for a moment) moves no point of the curve."""
    calls = []
    clock = iter(range(10_000))
    slow = {7}                                        # the 8th timed forward is slowed by 'another process'

    def fake_time():
        t = next(clock)
        return t * 1e-3 + (5.0 if (t // 2) in slow and t % 2 else 0.0)
    from switchsd.models import forward as fwd
    real = fwd.make_target(lm.model, ())

    class Spy:
        def new_cache(self, n):
            return real.new_cache(n)

        def forward(self, ids, cache, **kw):
            calls.append(ids.shape[1])
            return real.forward(ids, cache, **kw)
    monkeypatch.setattr(cal, "make_target", lambda *a, **k: Spy())
    monkeypatch.setattr(cal.time, "perf_counter", fake_time)
    curve = cal.measure(lm, max_tokens=4, prefix=8, repeats=3, progress=False)
    assert calls[1:] == [1, 2, 3, 4] * 4                  # the prefill, then a warm-up round and 3 timed rounds
    assert all(abs(ms - 1.0) < 1e-9 for ms in curve.values()), curve     # the slow forward is not the minimum
