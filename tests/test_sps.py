"""SPS (small draft model): greedy == vanilla with two tiny random models sharing a vocabulary; lazy sync of the
draft cache; the sampled output distribution equals the target's (chi-square), with a negative control."""
from __future__ import annotations

import pytest
import torch
from helpers import VOCAB, chisq_pvalue, greedy_reference, make_tiny_model, perturbed, random_prompt, repetitive_prompt

from switchsd.core.config import CopyConfig, EngineConfig, NeuralConfig, SamplingConfig
from switchsd.drafters.draft_model import DraftModelDrafter
from switchsd.factory import make_engine
from switchsd.methods import build_policy


@pytest.fixture(scope="module")
def pair():
    target = make_tiny_model(seed=0, logit_scale=30.0)
    draft = make_tiny_model(seed=1, logit_scale=30.0)
    return target, draft


@pytest.fixture(scope="module")
def spread_pair():
    """Flatter models for the sampling tests: the draft's first token is accepted about half the time, so both
    the accept branch and the residual branch shape the output (logit scale 30 accepted ~5%)."""
    return make_tiny_model(seed=0, logit_scale=10.0), make_tiny_model(seed=2, logit_scale=10.0)


def sps_engine(target, draft, method="sps", sampling=SamplingConfig(), max_new=30, gamma=4, seed=0):
    d = DraftModelDrafter(draft, VOCAB, gamma=gamma, sampling=sampling,
                          generator=torch.Generator().manual_seed(seed + 1))
    cfg = EngineConfig(max_new_tokens=max_new, budget=16, sampling=sampling, stop_at_eos=False)
    return make_engine(target, build_policy(method, (), CopyConfig(), d, neural_cfg=NeuralConfig(shape="chain")), cfg, ())


@pytest.mark.parametrize("method", ["sps", "copyspec"])
def test_sps_greedy_equals_vanilla(pair, method):
    target, _ = pair
    draft = perturbed(target, 0.15)
    accepted = drafted = 0
    for seed in range(5):
        ids = repetitive_prompt(seed) if seed % 2 else random_prompt(seed, 7)
        res = sps_engine(target, draft, method).run(ids)
        assert res.token_ids == greedy_reference(target, ids, 30, eos=None)
        neural = [e for e in res.events if e.path == "neural"]
        accepted += sum(len(e.accepted) for e in neural)
        drafted += sum(len(e.tree_tokens) - 1 for e in neural)
    # the neural path was exercised on both sides: accepted drafts (whose equality is what matters) and rejections
    assert drafted > 0 and 0.2 * drafted < accepted < drafted, (accepted, drafted)


def test_sps_self_draft_accepts_everything(pair):
    """The target as its own draft model: every drafted token is accepted at T=0 (the cache sync is right)."""
    target, _ = pair
    res = sps_engine(target, target, gamma=4, max_new=25).run(random_prompt(3, 9))
    for e in res.events[:-1]:
        assert len(e.accepted) == len(e.tree_tokens) - 1
    assert res.stats["tok_per_fwd"] > 3.5


def first_token_distribution(target, prompt):
    with torch.no_grad():
        return torch.softmax(target(input_ids=torch.tensor([prompt])).logits[0, -1].float(), -1)


def _first_tokens(target, draft, n: int) -> tuple[dict, int, int]:
    """The first committed token of n T=1 runs, plus how many first draft tokens were drafted and accepted."""
    prompt = random_prompt(11, 8)
    s = SamplingConfig(temperature=1.0)
    counts: dict[int, int] = {}
    drafted = accepted = 0
    for seed in range(n):
        eng = sps_engine(target, draft, sampling=s, max_new=2, seed=seed)
        ev = next(iter(eng.generate(prompt, torch.Generator().manual_seed(10_000 + seed))))
        drafted += len(ev.tree_tokens) > 1
        accepted += len(ev.accepted) > 0
        counts[ev.new_tokens[0]] = counts.get(ev.new_tokens[0], 0) + 1
    return counts, drafted, accepted


def test_sps_sampling_matches_target_distribution(spread_pair):
    """T=1: the first committed token over many seeds follows the target's p, although the draft's q differs
    (about half of the first draft tokens accepted: both branches of the rule at work)."""
    target, draft = spread_pair
    p = first_token_distribution(target, random_prompt(11, 8))
    counts, drafted, accepted = _first_tokens(target, draft, 3000)
    assert drafted == 3000, "every first step must carry a sampled draft"
    assert 0.3 < accepted / drafted < 0.7, accepted / drafted
    assert chisq_pvalue(counts, {i: float(p[i]) for i in range(VOCAB)}) > 1e-3


def _residual_is_the_target(tree, probs_at, generator):
    """A planted bug: after a rejection, sample from p itself instead of the residual max(p - q, 0)."""
    row, accepted = 0, []
    while True:
        p = probs_at(row)
        child = next(iter(tree.children[row]), None)
        if child is None:
            return accepted, int(torch.multinomial(p, 1, generator=generator))
        x, q = tree.tokens[child], tree.q[child]
        if torch.rand((), generator=generator, dtype=p.dtype) >= torch.clamp(p[x] / q[x], max=1.0):
            return accepted, int(torch.multinomial(p, 1, generator=generator))
        accepted.append(child)
        row = child


def _always_accept(tree, probs_at, generator):
    """A planted bug: every draft token accepted."""
    rows = tree.path_to(len(tree.tokens) - 1) if len(tree.tokens) > 1 else []
    return rows, int(torch.multinomial(probs_at(rows[-1] if rows else 0), 1, generator=generator))


@pytest.mark.parametrize("wrong", [_always_accept, _residual_is_the_target], ids=["always-accept", "residual-is-p"])
def test_sampling_negative_control_detects_wrong_rule(spread_pair, monkeypatch, wrong):
    """Same experiment with a wrong acceptance rule: the test above must reject it."""
    import switchsd.core.engine as engine_mod
    target, draft = spread_pair
    p = first_token_distribution(target, random_prompt(11, 8))
    monkeypatch.setattr(engine_mod, "accept_sampling", wrong)
    counts, _, _ = _first_tokens(target, draft, 3000)
    assert chisq_pvalue(counts, {i: float(p[i]) for i in range(VOCAB)}) < 1e-6
