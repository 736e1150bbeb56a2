"""The verification rules of the lab (switchsd/core/rules.py) as pure functions: limits that make them lossless,
the truncation and overshoot properties, and Monte-Carlo frequencies against each rule's analytic output law
(chi-square, with a negative control that must be rejected)."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from switchsd.core.rules import RULES, Rule, entropy, overshoot_mass, overshoot_ratio, parse_rule, sample_position

V = 12


def dists(seed: int, sharp: float = 1.5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * sharp, -1)
    q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * sharp, -1)
    return p, q


ALL = [Rule("lossless"), Rule("minp", {"p_base": 0.3}), Rule("eta", {"eps": 0.1}), Rule("lenience", {"l": 0.5}),
       Rule("cos", {"lam": 0.4}), Rule("cos-contrastive", {"mu": 0.5}), Rule("capped", {"lam": 0.4, "c": 2.0}),
       Rule("easd", {"tq": 1.0, "tp": 1.0, "n": 4, "rho": 0.25})]


@pytest.mark.parametrize("rule", ALL, ids=lambda r: r.name)
def test_output_is_a_distribution(rule):
    for seed in range(20):
        p, q = dists(seed)
        out = rule.output(p, q)
        assert (out >= -1e-12).all() and abs(float(out.sum()) - 1) < 1e-9


@pytest.mark.parametrize("rule", [Rule("lossless"), Rule("lenience", {"l": 1.0}), Rule("cos", {"lam": 1.0}),
                                  Rule("capped", {"lam": 1.0, "c": 3.0}),
                                  Rule("easd", {"tq": float("inf"), "tp": float("inf")})], ids=lambda r: r.label)
def test_limits_that_are_lossless(rule):
    assert not rule.lossy
    for seed in range(20):
        p, q = dists(seed)
        assert torch.allclose(rule.output(p, q), p, atol=1e-12)


def test_lossy_rules_say_so():
    assert all(r.lossy for r in ALL if r.name != "lossless") and "(lossy)" in Rule("minp").label


def test_minp_limits_and_truncation_yield():
    for seed in range(10):
        p, q = dists(seed)
        assert (Rule("minp", {"p_base": 0.0}).accept_prob(p, q) == 1).all()            # everything passes
        only = Rule("minp", {"p_base": 1.0}).accept_prob(p, q)
        assert only.sum() == 1 and int(only.argmax()) == int(p.argmax())              # only the argmax
        for rule in (Rule("minp", {"p_base": 0.4}), Rule("eta", {"eps": 0.08})):
            A = rule.allowed(p).double()
            assert torch.allclose(rule.accepted(p, q), q * A / (q * A).sum())       # paper Eq. 9: q 1_A / Z_A
            assert torch.equal(rule.residual(p, q), p)                               # a rejection draws from p


def test_eta_set_matches_its_definition():
    p, q = dists(3)
    thr = min(0.1, float(torch.exp(-entropy(p))))
    assert torch.equal(Rule("eta", {"eps": 0.1}).allowed(p), p >= thr)


def test_lenience_caps_the_overshoot_and_the_ensemble_does_not():
    p = torch.tensor([0.5, 0.3, 0.199999, 1e-6], dtype=torch.float64)
    q = torch.tensor([0.1, 0.1, 0.3, 0.5], dtype=torch.float64)
    for l in (0.2, 0.4, 0.6, 0.8):
        rule = Rule("lenience", {"l": l})
        out = rule.output(p, q)
        over = q > p
        assert (out[over] <= p[over] / l + 1e-12).all()                              # P <= p / l on {q > p}
        assert overshoot_ratio(rule, p, q) <= 1 / l + 1e-9
    assert overshoot_ratio(Rule("cos", {"lam": 0.6}), p, q) > 1e4                    # mass 0.4 q on p ~ 0
    assert overshoot_ratio(Rule("capped", {"lam": 0.6, "c": 2.0}), p, q) <= 3.0 + 1e-9  # c + 1 by construction
    for seed in range(20):                                                              # and on random pairs
        p2, q2 = dists(seed, sharp=3.0)
        assert overshoot_ratio(Rule("capped", {"lam": 0.2, "c": 2.0}), p2, q2) <= 3.0 + 1e-9


def test_overshoot_mass_bounds():
    """Mass emitted above p on {q > p}: 0 for the lossless limits; at most (1/l - 1) p(over) for lenience and
    c p(over) for capped (their caps); CoS's ensemble puts ~(1 - lam) q(x) on a token with p ~ 0."""
    p = torch.tensor([0.5, 0.3, 0.199999, 1e-6], dtype=torch.float64)
    q = torch.tensor([0.1, 0.1, 0.3, 0.5], dtype=torch.float64)
    assert overshoot_mass(Rule("cos", {"lam": 0.6}), p, q) > 0.4 * 0.5 * 0.9
    for seed in range(20):
        p2, q2 = dists(seed, sharp=3.0)
        over = float(p2[q2 > p2].sum())
        for lossless in (Rule("lossless"), Rule("lenience", {"l": 1.0}), Rule("cos", {"lam": 1.0})):
            assert overshoot_mass(lossless, p2, q2) < 1e-12
        for l in (0.2, 0.6):
            assert overshoot_mass(Rule("lenience", {"l": l}), p2, q2) <= (1 / l - 1) * over + 1e-12
        assert overshoot_mass(Rule("capped", {"lam": 0.2, "c": 2.0}), p2, q2) <= 2.0 * over + 1e-12
        # the definition, computed directly
        out = Rule("cos", {"lam": 0.4}).output(p2, q2)
        direct = sum(float(out[x] - p2[x]) for x in range(V) if q2[x] > p2[x] and out[x] > p2[x])
        assert overshoot_mass(Rule("cos", {"lam": 0.4}), p2, q2) == pytest.approx(direct, abs=1e-12)


def test_lenience_output_matches_the_papers_piecewise_form():
    for seed in range(10):
        p, q = dists(seed)
        l = 0.5
        out = Rule("lenience", {"l": l}).output(p, q)
        tv = float((p - q).clamp_min(0).sum())
        tv_l = 0.5 * float((q - p / l).abs().sum())
        delta = (tv_l + 0.5 - 1 / (2 * l)) / tv
        want = torch.where(q <= p, delta * p + (1 - delta) * q, torch.where(q <= p / l, q, p / l))
        assert torch.allclose(out, want, atol=1e-12)


def test_easd_with_infinite_thresholds_reproduces_sd_under_one_seed():
    easd, sd = Rule("easd", {"tq": float("inf"), "tp": float("inf")}), Rule("lossless")
    for seed in range(5):
        p, q = dists(seed)
        a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        assert [sample_position(easd, p, q, a) for _ in range(200)] == [sample_position(sd, p, q, b)
                                                                          for _ in range(200)]


def test_easd_fires_only_when_both_are_uncertain_and_agree():
    flat = torch.full((V,), 1 / V, dtype=torch.float64)
    peaked = torch.zeros(V, dtype=torch.float64).index_fill_(0, torch.tensor([0]), 1.0)
    rule = Rule("easd", {"tq": 1.0, "tp": 1.0, "n": 4, "rho": 0.5})
    assert rule.easd_fires(flat, flat) and not rule.easd_fires(flat, peaked) and not rule.easd_fires(peaked, flat)
    out = rule.output(flat, flat)                     # every accepted token is re-drawn from p without itself
    assert torch.allclose(out, flat)                  # (a uniform p stays uniform)
    p, q = dists(1, sharp=0.3)
    assert not torch.allclose(Rule("easd", {"tq": 0.0, "tp": 0.0, "n": 4, "rho": 0.0}).output(p, q), p)


def test_copy_drafts_are_point_masses():
    """A copy draft: q = one-hot(x). Lossless accepts x with p(x); min-p iff x is allowed; lenience with
    min(1, p(x)/l); EASD never fires (H(q) = 0)."""
    p, _ = dists(2)
    x = int(p.argsort()[V // 2])
    q = torch.zeros(V, dtype=torch.float64).index_fill_(0, torch.tensor([x]), 1.0)
    assert float(Rule("lossless").accept_prob(p, q)[x]) == pytest.approx(float(p[x]))
    assert float(Rule("lenience", {"l": 0.5}).accept_prob(p, q)[x]) == pytest.approx(min(1.0, 2 * float(p[x])))
    assert not Rule("easd", {"tq": 0.0, "tp": 0.0, "rho": 0.0}).easd_fires(p, q)
    assert torch.allclose(Rule("lossless").output(p, q), p)


@pytest.mark.parametrize("rule", ALL, ids=lambda r: r.name)
def test_monte_carlo_frequencies_match_the_analytic_law(rule):
    p, q = dists(7, sharp=1.0)
    g = torch.Generator().manual_seed(123)
    n = 6000
    counts = torch.zeros(V)
    for _ in range(n):
        counts[sample_position(rule, p, q, g)[0]] += 1
    expected = rule.output(p, q).numpy() * n
    keep = expected > 5
    obs, exp = counts.numpy()[keep], expected[keep]
    assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
    if rule.lossy:      # negative control: the same samples against the target's own law must be rejected
        ctrl = p.numpy() * n
        k2 = ctrl > 5
        o2, e2 = counts.numpy()[k2], ctrl[k2]
        assert chisquare(o2, e2 * o2.sum() / e2.sum()).pvalue < 1e-3


def test_parse_rule_and_bad_knobs():
    assert parse_rule("lenience:l=0.6") == Rule("lenience", {"l": 0.6})
    assert parse_rule("easd:tq=2,tp=1.5").get("n") == RULES["easd"]["params"]["n"][0]
    for bad, msg in [("nope", "unknown verification rule"), ("lenience:x=1", "takes l"),
                     ("lenience:l=0", r"must be in"), ("minp:p_base=nan", "must be in"), ("cos:lam", "bad rule knob"),
                     ("cos:lam=abc", "must be a number")]:
        with pytest.raises(ValueError, match=msg):
            parse_rule(bad)
