"""SwitchSD's dual gate and BanditSpec: decisions unit-tested, greedy output identical to vanilla."""
from __future__ import annotations

import pytest
import torch
from helpers import VOCAB, greedy_reference, random_prompt, repetitive_prompt

from switchsd.core.config import CopyConfig, EngineConfig
from switchsd.core.events import StepEvent
from switchsd.core.policies import BanditSpec, PolicyState, SwitchSD
from switchsd.core.probe import Probe
from switchsd.drafters.copy import CopyDrafter
from switchsd.drafters.draft_model import DraftModelDrafter
from switchsd.factory import make_engine
from switchsd.methods import build_policy


class Dummy:
    name, path = "dummy", "neural"

    def reset(self, tokens): pass
    def extend(self, tokens, n): pass


@pytest.mark.parametrize("score,match,fires", [(0.9, True, True), (0.9, False, False), (0.1, True, False),
                                               (0.1, False, False), (None, True, False), (0.5, True, True)])
def test_gate_truth_table(score, match, fires):
    copy = CopyDrafter(CopyConfig(kappa=3))
    neural = Dummy()
    pol = SwitchSD(copy, neural, tau=0.5)
    tokens = [1, 2, 3, 4, 1, 2, 3] if match else [1, 2, 3, 4, 5, 6, 7]
    copy.reset(tokens)
    decision = pol.select(PolicyState(tokens, 0, score))
    drafters, gate = decision.drafters, decision.why
    assert gate["copy"] is fires and gate["kgram_match"] is match and gate["tau"] == 0.5
    assert drafters[0] is (copy if fires else neural)
    if fires:
        assert drafters == (copy, neural)  # an empty copy draft falls back to the neural drafter


def event(path, n_new, secs):
    return StepEvent(step=0, path=path, drafter=None, candidates=[], tree_tokens=[0], tree_parents=[-1],
                     accepted_rows=[], accepted=[], accepted_candidate=None, bonus=0, new_tokens=[0] * n_new, position=0,
                     timings={"total": secs})


def test_bandit_arm_statistics():
    b = BanditSpec(Dummy(), Dummy(), c=0.5, warmup=1)
    first = b.select(PolicyState([], 0)).why["arm"]
    b.observe(event(first, 1, 0.1))
    second = b.select(PolicyState([], 1)).why["arm"]
    assert second != first, "warm-up plays every arm"
    b.observe(event(second, 8, 0.1))           # the second arm is 8x better
    assert b.arms[first] == [1, pytest.approx(10.0)] and b.arms[second] == [1, pytest.approx(80.0)]
    picks = []
    for i in range(20):
        arm = b.select(PolicyState([], i)).why["arm"]
        picks.append(arm)
        b.observe(event(arm, 8 if arm == second else 1, 0.1))
    assert picks.count(second) > 15
    ucb = b.ucb()
    n1, s1 = b.arms[first]
    t = sum(n for n, _ in b.arms.values())
    assert ucb[first] == pytest.approx((s1 / n1) / b.r_max + 0.5 * (2 * torch.log(torch.tensor(float(t))) / n1).sqrt().item())
    b.observe(event("vanilla", 1, 0.1))        # plain steps are not attributed to an arm
    assert sum(n for n, _ in b.arms.values()) == t


def tiny_probe(model, layer=1, sub="attn", seed=0):
    g = torch.Generator().manual_seed(seed)
    d = model.config.hidden_size
    return Probe(torch.randn(d, generator=g, dtype=torch.float32), layer, sub, 0.5,
                 {"hidden_size": d, "num_layers": model.config.num_hidden_layers})


@pytest.mark.parametrize("method", ["switchsd", "banditspec"])
def test_switchsd_and_bandit_greedy_equal_vanilla(tiny_model, method):
    from helpers import perturbed
    draft_model = perturbed(tiny_model, 0.15)        # agrees often: the neural path's accepts are checked too
    probe = tiny_probe(tiny_model)
    paths, accepted = set(), {"copy": 0, "neural": 0}
    for seed in range(6):
        ids = repetitive_prompt(seed, n=14, reps=3) if seed % 2 == 0 else random_prompt(seed, 9)
        for tau in (0.0, 0.5):
            drafter = DraftModelDrafter(draft_model, VOCAB, gamma=3)
            pol = build_policy(method, (), CopyConfig(kappa=3), drafter, tau=tau)
            eng = make_engine(tiny_model, pol, EngineConfig(max_new_tokens=24, budget=12, stop_at_eos=False), (),
                         probe=probe if method == "switchsd" else None)
            res = eng.run(ids)
            assert res.token_ids == greedy_reference(tiny_model, ids, 24, eos=None)
            paths |= {e.path for e in res.events}
            for e in res.events:
                if e.path in accepted:
                    accepted[e.path] += len(e.accepted)
            if method == "switchsd":
                for e in res.events:
                    assert e.probe_score is not None and e.gate is not None
                    if e.gate["choice"] == "lookup":     # short prompt lookup (<= 3 continuations), priced by cost
                        assert e.path == "copy" and e.drafter == "pld" and 1 <= len(e.candidates) <= 3
                    elif e.path == "copy":                # the copy path proper needs probe AND kappa-gram
                        assert e.gate["copy"] and e.probe_score >= tau and e.gate["kgram_match"]
    assert {"copy", "neural"} <= paths
    assert accepted["copy"] > 0 and accepted["neural"] > 5, accepted         # both paths' accepts checked


def test_oracle_accepts_everything(tiny_model):
    from switchsd.core.policies import Fixed
    from switchsd.drafters.oracle import OracleDrafter
    ids = random_prompt(4, 10)
    cfg = EngineConfig(max_new_tokens=30, budget=8, stop_at_eos=False)
    want = greedy_reference(tiny_model, ids, 30, eos=None)
    res = make_engine(tiny_model, Fixed([OracleDrafter(ids + want)]), cfg, ()).run(ids)
    assert res.token_ids == want
    for e in res.events:
        assert len(e.accepted) == len(e.tree_tokens) - 1, "the oracle's drafts are all accepted at T=0"
    assert res.stats["tok_per_fwd"] == pytest.approx(30 / len(res.events)) and res.stats["tok_per_fwd"] > 7
