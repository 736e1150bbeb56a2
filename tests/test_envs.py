"""The environment knobs are registered once (switchsd/envs.py) and read only through it; the two gates price
drafts with one acceptance estimate (switchsd/core/acceptance.py)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from switchsd import envs
from switchsd.core.acceptance import PRIORS, Acceptance, worth
from switchsd.vllm.costs import PathCosts

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for d in ("switchsd", "app") for p in (ROOT / d).rglob("*.py")] + [ROOT / "app.py", ROOT / "Makefile"]


def test_every_switchsd_variable_named_in_the_code_is_registered():
    named = {m for p in SOURCES for m in re.findall(r"\bSWITCHSD_[A-Z0-9_]+\b", p.read_text())}
    assert named, "the scan found nothing: it would pass on any code"
    assert named - set(envs.VARS) == set(), "unregistered: add them to switchsd/envs.py"


def test_no_module_reads_a_switchsd_variable_past_the_registry():
    direct = re.compile(r"os\.(environ\.get|getenv)\(\s*[\"']SWITCHSD_|os\.environ\[\s*[\"']SWITCHSD_")
    offenders = [str(p.relative_to(ROOT)) for p in SOURCES if p.suffix == ".py" and p.name != "envs.py"
                 and direct.search(p.read_text())]
    assert offenders == []


def test_a_malformed_value_is_refused_with_its_name(monkeypatch):
    monkeypatch.setenv("SWITCHSD_HALF_LIFE", "-3")
    with pytest.raises(ValueError, match="SWITCHSD_HALF_LIFE='-3'"):
        envs.get("SWITCHSD_HALF_LIFE")
    monkeypatch.setenv("SWITCHSD_REFRESH_S", "fast")
    with pytest.raises(ValueError, match="SWITCHSD_REFRESH_S"):
        envs.get("SWITCHSD_REFRESH_S")
    monkeypatch.setenv("SWITCHSD_HALF_LIFE", "50")
    assert envs.get("SWITCHSD_HALF_LIFE") == 50
    monkeypatch.delenv("SWITCHSD_HALF_LIFE")
    assert envs.get("SWITCHSD_HALF_LIFE") == 500


def test_help_env_lists_every_variable():
    out = subprocess.run([sys.executable, "-m", "switchsd", "--help-env"], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert all(name in out for name in envs.VARS)


def test_both_gates_read_one_acceptance_estimate():
    """The vLLM plugin's record (forgetting by its own clock: here never) and the engine's `Acceptance` give the
    same P(at least j accepted) for the same drafts, and price an option alike."""
    drafts = [(4, 2), (2, 2), (6, 0), (3, 3), (5, 4), (1, 0)]
    costs, acc = PathCosts(max_len=8, half_life=None), Acceptance(prior=PRIORS["copy"], decay=1.0)
    for d, a in drafts:
        costs.credit("copy:high:3", d, a)
        acc.update(d, a)
    assert list(costs.rates("copy:high:3", 6)) == pytest.approx(acc.reach(6), abs=0)
    assert list(costs.rates("neural", 3)) == pytest.approx(Acceptance(prior=PRIORS["neural"]).reach(3), abs=0)
    assert worth(acc.reach(3), 3, 2.0) == pytest.approx((1 + sum(acc.reach(3))) / 2.0)
