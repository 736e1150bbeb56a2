"""SMC-SD: systematic resampling, and the whole algorithm (core.smc.smc_decode) on small known Markov chains,
where the exact law of the output strings is computable: its total-variation distance to the target shrinks as
the particle count grows, and with q = p the weights never move (no resampling, exact target samples)."""
from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch

from switchsd.core.smc import SMCConfig, ess, smc_decode, systematic_resample

V = 4
P = torch.tensor([[0.6, 0.2, 0.1, 0.1], [0.1, 0.6, 0.2, 0.1], [0.2, 0.1, 0.6, 0.1], [0.25, 0.25, 0.25, 0.25]],
                 dtype=torch.float64)                 # target: next-token law given the previous token
Q = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.1, 0.3, 0.2], [0.3, 0.4, 0.1, 0.2], [0.25, 0.25, 0.25, 0.25]],
                 dtype=torch.float64)                 # a draft that disagrees a lot


def chain_fns(Pm: torch.Tensor, Qm: torch.Tensor, n: int):
    """Batched callables over Markov chains: the state is each particle's previous token."""
    state = {"t": None, "d": None}

    def draft_step(last):
        state["d"] = last.clone()
        return Qm[last]

    def verify(block):
        return Pm[block]                               # p after each block position [N, g+1, V]

    def reorder(anc):
        pass                                           # a Markov chain's state is its last token (carried by SMC)
    return draft_step, verify, reorder


def exact(first: int, length: int) -> dict:
    out = {}
    for seq in itertools.product(range(V), repeat=length):
        p, prev = 1.0, first
        for t in seq:
            p *= float(P[prev, t])
            prev = t
        out[seq] = p
    return out


def tv_of_smc(n: int, Qm: torch.Tensor, trials: int, gamma: int = 2, seed: int = 0) -> float:
    g = torch.Generator().manual_seed(seed)
    counts = Counter()
    for _ in range(trials):
        d, v, r = chain_fns(P, Qm, n)
        res = smc_decode(d, v, r, torch.zeros(n, dtype=torch.long), SMCConfig(n, gamma, 1.0, 1.0, 0.5),
                         max_new_tokens=1 + gamma + 1, eos=(), generator=g)
        counts[tuple(res.tokens[1:])] += 1
    law = exact(0, gamma + 1)
    return 0.5 * sum(abs(counts[s] / trials - law[s]) for s in law)


def test_systematic_resampling_counts_and_ess():
    w = torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64)
    for seed in range(20):
        anc = systematic_resample(w, torch.Generator().manual_seed(seed)).tolist()
        c = Counter(anc)
        assert c[0] == 2 and c[1] == 1 and sum(c.values()) == 4      # offspring within 1 of N * w
    assert ess(torch.zeros(8)) == pytest.approx(8.0) and ess(torch.tensor([0.0, -1e9])) == pytest.approx(1.0)


def test_q_equal_p_is_exact_and_never_resamples():
    d, v, r = chain_fns(P, P, 4)
    res = smc_decode(d, v, r, torch.zeros(4, dtype=torch.long), SMCConfig(4, 3, 1.0, 1.0, 0.5), 20, (),
                     torch.Generator().manual_seed(0))
    assert res.resamples == 0 and res.mean_ess == pytest.approx(4.0) and all(w == 0 for w in res.log_weights)
    assert tv_of_smc(4, P, 4000) < 0.05


def test_error_shrinks_with_more_particles():
    tv = {n: tv_of_smc(n, Q, 4000) for n in (1, 4, 16)}
    assert tv[1] > tv[4] > tv[16] and tv[16] < 0.5 * tv[1], tv


def test_eos_stops_a_particle_and_its_weight():
    """With resampling off, each particle's final log-weight is the sum over its own drafted tokens, up to and
    including an EOS, of log p - log q, and nothing follows an EOS. (Planted: counting the drafted tokens after
    an EOS into the weight, or the bonus token, breaks the weight check.)"""
    g, eos = 2, 3
    n = 24
    Pe, Qe = P.clone(), Q.clone()         # after an EOS, p and q disagree: a token counted there would show
    Pe[eos] = torch.tensor([0.7, 0.1, 0.1, 0.1], dtype=torch.float64)
    Qe[eos] = torch.tensor([0.1, 0.1, 0.1, 0.7], dtype=torch.float64)
    d, v, r = chain_fns(Pe, Qe, n)
    res = smc_decode(d, v, r, torch.zeros(n, dtype=torch.long), SMCConfig(n, g, 1.0, 1.0, 0.0), 400, eos=(eos,),
                     generator=torch.Generator().manual_seed(1))
    assert res.resamples == 0 and len(res.particles) == n
    ends = {(len(s) - 1) % (g + 1) for s in res.particles}      # where each EOS fell: 1, 2 drafted, 0 the bonus
    assert ends == {0, 1, 2}, ends                              # every case is checked below
    for s, logw in zip(res.particles, res.log_weights):
        assert s[-1] == eos and eos not in s[:-1]                      # every particle stopped at its EOS
        # s = [first, x1, x2, bonus, x1, x2, bonus, ...]: drafted tokens sit at positions 1, 2 (mod 3)
        want = sum(float(Pe[s[k - 1], s[k]].log() - Qe[s[k - 1], s[k]].log())
                   for k in range(1, len(s)) if k % (g + 1) != 0)
        assert logw == pytest.approx(want, abs=1e-9)
    assert len({round(w, 6) for w in res.log_weights}) > 1              # the weights moved: a real check


@pytest.mark.real
def test_smc_engine_on_the_real_model(real_lm):
    """The target as its own draft (float32): weights never move, so the batched caches, positions and the
    block alignment are right; a self-draft of the first layers runs and reports ESS and resampling."""
    from switchsd.core.smc import SMCEngine, self_draft
    from switchsd.drafters.particles import ModelParticles
    ids = real_lm.encode("Count: one two three four", chat=True)
    eng = SMCEngine(real_lm.model, ModelParticles(real_lm.model, 0.7), SMCConfig(4, 3, 0.7, 0.7), 16, real_lm.eos_ids())
    res = eng.run(ids, torch.Generator().manual_seed(0))
    assert res.stats["resamples"] == 0 and res.stats["mean_ess"] == pytest.approx(4.0, abs=1e-6)
    assert 0 < len(res.token_ids) <= 16 and res.stats["tok_per_fwd"] > 3
    eng = SMCEngine(real_lm.model, ModelParticles(self_draft(real_lm.model, 10), 0.7), SMCConfig(4, 3, 0.7, 0.7), 12,
                    real_lm.eos_ids())
    res = eng.run(ids, torch.Generator().manual_seed(0))
    assert 0 < len(res.token_ids) <= 12 and res.stats["mean_ess"] <= 4.0


@pytest.mark.real
def test_smc_is_a_method_of_the_factory(real_lm):
    """`smc` builds through the one factory (the CLI, bench and studio path): the EAGLE-3 head drafts by default,
    variants set gamma and particles, it refuses greedy decoding, truncation and --verify with a clear message,
    and its events are labelled approximate."""
    from switchsd.core.config import EngineConfig, SamplingConfig
    from switchsd.drafters.particles import Eagle3Particles, ModelParticles
    from switchsd.factory import Drafters, SetupError, build_engine
    drafters = Drafters(real_lm)
    cfg = EngineConfig(max_new_tokens=12, sampling=SamplingConfig(0.7))
    eng = build_engine("smc@chain3+p2", real_lm, drafters, cfg)
    assert isinstance(eng.drafter, Eagle3Particles) and (eng.cfg.gamma, eng.cfg.n_particles) == (3, 2)
    assert eng.approximate and eng.cfg.target_temperature == 0.7
    res = eng.run(real_lm.encode("Count: one two three", chat=True), torch.Generator().manual_seed(0))
    assert 0 < len(res.token_ids) <= 12 and [t for e in res.events for t in e.new_tokens] == res.token_ids
    assert all(e.path == "smc" and "approximate" in e.rule for e in res.events)
    assert res.events[0].gate["particles"] == 2 and 1.0 <= res.stats["mean_ess"] <= 2.0
    eng = build_engine("smc", real_lm, drafters, cfg, smc=SMCConfig(2, 2, self_draft_layers=6))
    assert isinstance(eng.drafter, ModelParticles)
    for bad, msg in ((EngineConfig(), "temperature > 0"),
                     (EngineConfig(sampling=SamplingConfig(0.7, top_k=5)), "top-k"),
                     (EngineConfig(sampling=SamplingConfig(0.7), verify="minp:p_base=0.3"), "--verify")):
        with pytest.raises(SetupError, match=msg):
            build_engine("smc", real_lm, drafters, bad)
    with pytest.raises(SetupError, match="bad smc variant"):
        build_engine("smc@tree2x2x4", real_lm, drafters, cfg)
    with pytest.raises(SetupError):
        build_engine("eagle3+p4", real_lm, drafters, cfg)           # particles belong to smc only
