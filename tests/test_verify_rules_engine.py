"""The lab's verification rules inside the engine's tree verification (verify.accept_rule) and the engine:
lossless limits keep the target's law on every tree shape; each lossy rule's one-position output follows its
analytic law (rules.Rule.output) for sampled and copied drafts, and is rejected as "the target's law"
(negative control); events and configs say which rule ran."""
from __future__ import annotations

import pytest
import torch
from helpers import chisq_pvalue, method_engine, repetitive_prompt
from test_sampling import (
    DET_SIBLINGS,
    DET_TREE,
    P0,
    PASS,
    REJECT,
    V,
    committed,
    draft_q,
    fixed,
    iid_siblings,
    pvalue,
    sampled_chain,
)

from switchsd.core.config import EngineConfig, SamplingConfig
from switchsd.core.rules import Rule
from switchsd.core.tree import build_tree
from switchsd.core.verify import accept_rule
from switchsd.factory import make_engine


def rule_fn(rule: Rule):
    def run(tree, probs_at, gen):
        rows, bonus, _ = accept_rule(tree, probs_at, gen, rule)
        return rows, bonus
    return run


@pytest.mark.parametrize("rule", [Rule("lenience", {"l": 1.0}), Rule("cos", {"lam": 1.0}),
                                  Rule("easd", {"tq": float("inf"), "tp": float("inf")})], ids=lambda r: r.name)
@pytest.mark.parametrize("make,depth", [(fixed(DET_SIBLINGS), 1), (fixed(DET_TREE), 2), (sampled_chain, 2),
                                        (iid_siblings, 1)], ids=["det-siblings", "det-tree", "chain", "iid"])
def test_lossless_limits_keep_the_target_law_on_every_tree(rule, make, depth):
    assert pvalue(make, rule_fn(rule), n=12000, depth=depth) > PASS


def _one_sampled(gen):
    q = draft_q(())
    x = int(torch.multinomial(q, 1, generator=gen))
    return build_tree(V - 1, [[x]], budget=64, q=[[q]])


LOSSY = [Rule("minp", {"p_base": 0.5}), Rule("eta", {"eps": 0.12}), Rule("lenience", {"l": 0.4}),
         Rule("cos", {"lam": 0.3}), Rule("capped", {"lam": 0.3, "c": 1.5}), Rule("cos-contrastive", {"mu": 1.0}),
         Rule("easd", {"tq": 0.5, "tp": 0.5, "n": 3, "rho": 0.3})]


@pytest.mark.parametrize("rule", LOSSY, ids=lambda r: r.name)
def test_lossy_rules_in_the_tree_follow_their_output_law(rule):
    from collections import Counter
    q = draft_q(())
    law = rule.output(P0, q)
    gen = torch.Generator().manual_seed(1)
    counts = Counter(committed(_one_sampled(gen), rule_fn(rule), gen) for _ in range(12000))
    assert chisq_pvalue(counts, {(x,): float(law[x]) for x in range(V)}) > PASS
    assert chisq_pvalue(counts, {(x,): float(P0[x]) for x in range(V)}) < REJECT       # not the target's law


@pytest.mark.parametrize("rule", LOSSY[:4], ids=lambda r: r.name)
@pytest.mark.parametrize("x", [1, 5], ids=["kept-token", "rare-token"])
def test_copy_drafts_under_lossy_rules(rule, x):
    """A copy draft is the point mass q = one-hot(x): its committed law is rule.output(p, one-hot). Where that law
    is not the target's (a truncation rule keeps x = 1, p = 0.2, and then always accepts it; lenience and CoS move
    mass onto x), the counts must also reject the target's law: a verifier that ignored the rule fails here. (A
    truncation rule that cuts x = 5, p = 0.05, gives back exactly the target's law: no control there.)"""
    from collections import Counter
    one_hot = torch.zeros(V, dtype=torch.float64).index_fill_(0, torch.tensor([x]), 1.0)
    law = rule.output(P0, one_hot)
    gen = torch.Generator().manual_seed(2)
    counts = Counter(committed(fixed([[x]])(gen), rule_fn(rule), gen) for _ in range(12000))
    assert chisq_pvalue(counts, {(t,): float(law[t]) for t in range(V)}) > PASS
    if float((law - P0).abs().sum()) / 2 > 0.05:
        assert chisq_pvalue(counts, {(t,): float(P0[t]) for t in range(V)}) < REJECT
        ignored = Counter(committed(fixed([[x]])(gen), rule_fn(Rule()), gen) for _ in range(12000))   # lossless
        assert chisq_pvalue(ignored, {(t,): float(law[t]) for t in range(V)}) < REJECT
    else:
        assert rule.name in ("minp", "eta") and x == 5


def test_accept_probs_are_reported_per_row():
    gen = torch.Generator().manual_seed(0)
    tree = fixed(DET_SIBLINGS)(gen)
    rule = Rule("minp", {"p_base": 0.5})
    _, _, probs = accept_rule(tree, lambda r: P0, gen, rule)
    allowed = rule.allowed(P0)
    first = tree.children[0][0]
    assert probs[0] is None and probs[first] == float(allowed[tree.tokens[first]])


def test_engine_runs_lossy_rules_and_labels_them(tiny_model):
    with pytest.raises(ValueError, match="temperature > 0"):
        EngineConfig(verify="minp:p_base=0.3")                        # greedy decoding has nothing to relax
    with pytest.raises(ValueError, match="unknown verification rule"):
        EngineConfig(verify="nope", sampling=SamplingConfig(0.7))
    ids = repetitive_prompt(0, n=14, reps=3)
    for spec in ("lenience:l=0.5", "minp:p_base=0.3", "easd:tq=0.1,tp=0.1,rho=0"):
        eng = method_engine(tiny_model, "copy", max_new_tokens=20, sampling=SamplingConfig(0.7))
        eng = make_engine(eng.model, eng.policy, EngineConfig(max_new_tokens=20, budget=32, verify=spec,
                                                              sampling=SamplingConfig(0.7)), eng.eos)
        res = eng.run(ids, torch.Generator().manual_seed(0))
        assert len(res.token_ids) == 20 or res.events[-1].finished == "eos"
        drafted = [e for e in res.events if len(e.tree_tokens) > 1]
        assert drafted and all(e.rule and e.rule.endswith("(lossy)") for e in res.events)
        assert all(e.accept_probs[0] is None and any(a is not None for a in e.accept_probs[1:]) for e in drafted)
    # the overshoot mass, when asked for: one value per visited node, none for EASD or by default
    cfg = EngineConfig(max_new_tokens=20, budget=32, verify="cos:lam=0.4", sampling=SamplingConfig(0.7),
                       record_overshoot=True)
    res = make_engine(eng.model, eng.policy, cfg, eng.eos).run(ids, torch.Generator().manual_seed(0))
    drafted = [e for e in res.events if len(e.tree_tokens) > 1]
    assert all(e.overshoot and all(0 <= o <= 1 for o in e.overshoot) for e in drafted)
    assert any(o > 0 for e in drafted for o in e.overshoot)                       # copy drafts overshoot p
    eng = method_engine(tiny_model, "copy", max_new_tokens=8, sampling=SamplingConfig(0.7))
    assert all(e.rule is None for e in eng.run(ids, torch.Generator().manual_seed(0)).events)   # default
