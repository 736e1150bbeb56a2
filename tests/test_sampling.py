"""Sampling is lossless: the committed tokens of one step are distributed exactly as the target's p.

`verify.accept_sampling` is driven directly with synthetic prefix-dependent target distributions over a small
vocabulary (V = 8), so many thousands of trials are cheap. A chi-square goodness-of-fit test must accept the
rule (p-value > 1e-3) and must reject deliberately wrong rules (p-value < 1e-6): the negative controls show the
test has the power to catch a real deviation. All generators are seeded, so results are reproducible.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import pytest
import torch
from helpers import chisq_pvalue, looping_prompt, method_engine

from switchsd.core.config import CopyConfig, SamplingConfig
from switchsd.core.tree import TokenTree, build_tree
from switchsd.core.verify import accept_sampling, target_probs

V = 8
P0 = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.10, 0.05, 0.05, 0.05], dtype=torch.float64)
PASS, REJECT = 1e-3, 1e-6


def _dist(prefix: tuple, salt: int, scale: float = 0.8) -> torch.Tensor:
    seed = salt
    for t in prefix:
        seed = seed * 131 + t + 1
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * scale, 0)


def target(prefix: tuple) -> torch.Tensor:
    """p(. | prefix): P0 at the root, a different (smooth) distribution after every prefix."""
    return P0.clone() if not prefix else _dist(prefix, salt=7)


def draft_q(prefix: tuple) -> torch.Tensor:
    """The draft model's q(. | prefix): deliberately different from p."""
    return _dist(prefix, salt=99, scale=1.2)


def prefix_of(tree: TokenTree, row: int) -> tuple:
    return tuple(tree.tokens[r] for r in tree.path_to(row))


def committed(tree: TokenTree, rule, gen: torch.Generator, target_fn=target, depth: int = 1) -> tuple:
    """Run one verification step; return the first `depth` committed tokens. When the step commits fewer
    tokens, the remaining ones are drawn from p as the next (plain) step would."""
    rows, bonus = rule(tree, lambda r: target_fn(prefix_of(tree, r)), gen)
    toks = [tree.tokens[r] for r in rows] + [bonus]
    while len(toks) < depth:
        toks.append(int(torch.multinomial(target_fn(tuple(toks)), 1, generator=gen)))
    return tuple(toks[:depth])


def expected(depth: int, target_fn=target) -> dict:
    if depth == 1:
        p = target_fn(())
        return {(x,): float(p[x]) for x in range(V)}
    p1 = target_fn(())
    return {(a, b): float(p1[a] * target_fn((a,))[b]) for a in range(V) for b in range(V)}


def pvalue(make_tree: Callable[[torch.Generator], TokenTree], rule=accept_sampling, n: int = 30000,
           depth: int = 1, seed: int = 0, target_fn=target) -> float:
    gen = torch.Generator().manual_seed(seed)
    counts = Counter(committed(make_tree(gen), rule, gen, target_fn, depth) for _ in range(n))
    return chisq_pvalue(counts, expected(depth, target_fn))


# ---------------------------------------------------------------------------- deliberately wrong rules
def rule_accept_always(tree, probs_at, gen):
    """Treat a deterministic draft as certain: walk first children, never reject."""
    row, rows = 0, []
    while tree.children[row]:
        row = tree.children[row][0]
        rows.append(row)
    return rows, int(torch.multinomial(probs_at(row), 1, generator=gen))


def make_flawed(flaw: str):
    """accept_sampling with one mistake: 'no_renormalise' (residual left unnormalised, so later siblings are
    accepted too rarely), 'swap_pq' (ratio q/p and residual max(q - p, 0): p and q confused),
    'resample_from_p' (on rejection the bonus comes from p, the rejected draft's mass left in: max(p - q, 0) for a
    sampled draft, p with the token zeroed for a point mass)."""
    def rule(tree, probs_at, gen):
        row, accepted = 0, []
        while True:
            p = probs_at(row).clone()
            moved = False
            for child in tree.children[row]:
                x, q = tree.tokens[child], tree.q[child]
                if flaw == "swap_pq" and q is not None:
                    ratio = torch.clamp(q[x] / p[x], max=1.0)
                else:
                    ratio = p[x] if q is None else torch.clamp(p[x] / q[x], max=1.0)
                if torch.rand((), generator=gen, dtype=p.dtype) < ratio:
                    accepted.append(child)
                    row, moved = child, True
                    break
                if q is None:
                    if flaw != "resample_from_p":
                        p[x] = 0.0
                elif flaw == "swap_pq":
                    p = torch.clamp(q - p, min=0.0)
                elif flaw != "resample_from_p":
                    p = torch.clamp(p - q, min=0.0)
                if flaw != "no_renormalise":
                    p = p / p.sum()
            if not moved:
                return accepted, int(torch.multinomial(p, 1, generator=gen))
    return rule


# --------------------------------------------------------------------------------- tree constructors
def fixed(cands):
    tree = build_tree(V - 1, cands, budget=64)
    return lambda gen: tree


DET_SIBLINGS = [[0], [1], [5]]                       # three point-mass siblings (0 and 1 are likely under p)
DET_TREE = [[0, 3], [0, 4], [1, 2], [6], [1, 7, 7]]  # shared prefixes, depth 2-3


def sampled_chain(gen: torch.Generator, depth: int = 2) -> TokenTree:
    """One chain x1 ~ q(.), x2 ~ q(.|x1): standard speculative sampling."""
    toks, qs = [], []
    for _ in range(depth):
        q = draft_q(tuple(toks))
        toks.append(int(torch.multinomial(q, 1, generator=gen)))
        qs.append(q)
    return build_tree(V - 1, [toks], budget=64, q=[qs])


Q_IID = torch.tensor([0.40, 0.05, 0.05, 0.05, 0.05, 0.10, 0.10, 0.20], dtype=torch.float64)


def iid_siblings(gen: torch.Generator, k: int = 4) -> TokenTree:
    """k i.i.d. draws from one q as siblings (SpecInfer's multi-draft setting). Duplicates are common."""
    xs = torch.multinomial(Q_IID, k, replacement=True, generator=gen).tolist()
    return build_tree(V - 1, [[x] for x in xs], budget=64, q=[[Q_IID] for _ in xs])


# ------------------------------------------------------------------------------------------------ tests
def test_deterministic_siblings_first_token_follows_p():
    assert pvalue(fixed(DET_SIBLINGS)) > PASS


def test_deterministic_tree_joint_of_two_tokens_follows_p():
    tree = fixed(DET_TREE)(None)
    assert not tree.is_chain and max(tree.depths) == 3
    assert pvalue(fixed(DET_TREE), depth=2, seed=1) > PASS


def test_sampled_chain_joint_follows_p():
    assert pvalue(sampled_chain, depth=2, seed=2) > PASS


def test_iid_sampled_siblings_follow_p():
    """SpecInfer's rule is lossless for i.i.d. sibling draws *in draw order, duplicates included*.
    build_tree merges duplicate draws into one trie node, so accept_sampling skips the residual update
    p <- norm(max(p - q, 0)) of every repeated draw: the committed token is biased (by ~0.017 here)."""
    assert pvalue(iid_siblings, n=30000, seed=3) > PASS


def test_draft_token_with_zero_target_probability_is_never_committed():
    """top-k style p with zeros: a point-mass draft on a zero-probability token must always be rejected."""
    def sparse(prefix):
        p = target(prefix)
        p[[2, 3, 4]] = 0.0
        return p / p.sum()
    assert pvalue(fixed([[3], [0], [4, 1]]), n=10000, seed=4, target_fn=sparse) > PASS


def test_certain_target_commits_argmax():
    """One-hot p (e.g. top_k=1): whatever the draft, the committed tokens are the argmax path."""
    onehot = lambda prefix: torch.nn.functional.one_hot(torch.tensor(len(prefix) % V), V).double()
    gen = torch.Generator().manual_seed(5)
    for cands in ([[0], [1]], [[1, 2]], [[3], [0, 1, 2, 5]], []):
        tree = build_tree(V - 1, cands, budget=64)
        for _ in range(50):
            assert committed(tree, accept_sampling, gen, onehot, depth=3) == (0, 1, 2)


@pytest.mark.parametrize("case,rule,depth", [
    ("det_siblings", rule_accept_always, 1),
    ("det_siblings", make_flawed("no_renormalise"), 1),
    ("det_tree", rule_accept_always, 2),
    ("sampled_chain", make_flawed("swap_pq"), 2),
    ("sampled_chain", make_flawed("resample_from_p"), 2),
])
def test_negative_controls_are_rejected(case, rule, depth):
    make_tree = {"det_siblings": fixed(DET_SIBLINGS), "det_tree": fixed(DET_TREE), "sampled_chain": sampled_chain}[case]
    assert pvalue(make_tree, rule=rule, n=20000, depth=depth, seed=6) < REJECT


def test_flawed_rule_copy_is_faithful_without_flaw():
    """The negative-control rule minus its flaw is the real rule: it must pass (else the controls prove nothing)."""
    assert pvalue(fixed(DET_SIBLINGS), rule=make_flawed("none"), n=20000, seed=7) > PASS
    assert pvalue(sampled_chain, rule=make_flawed("none"), n=20000, depth=2, seed=8) > PASS


# ------------------------------------------------------------------------------------------ target_probs
def test_target_probs_filters():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 16, generator=g, dtype=torch.float64)
    amax = logits.argmax(-1)

    p = target_probs(logits, SamplingConfig(temperature=1.0))
    assert torch.allclose(p, torch.softmax(logits, -1))
    p = target_probs(logits, SamplingConfig(temperature=2.0))
    assert torch.allclose(p, torch.softmax(logits / 2, -1))
    p = target_probs(logits, SamplingConfig(temperature=1e-4))
    assert torch.allclose(p, torch.nn.functional.one_hot(amax, 16).double(), atol=1e-6)

    p = target_probs(logits, SamplingConfig(temperature=1.0, top_k=1))
    assert torch.equal(p, torch.nn.functional.one_hot(amax, 16).double())
    p = target_probs(logits, SamplingConfig(temperature=1.0, top_k=4))
    top = torch.topk(logits, 4, -1).indices
    for r in range(3):
        assert set(torch.nonzero(p[r]).flatten().tolist()) == set(top[r].tolist())
        assert torch.allclose(p[r, top[r]], torch.softmax(logits[r, top[r]], -1))
    assert torch.allclose(target_probs(logits, SamplingConfig(temperature=1.0, top_k=16)),
                          torch.softmax(logits, -1))

    p = target_probs(logits, SamplingConfig(temperature=1.0, top_p=1e-6))
    assert torch.equal(p, torch.nn.functional.one_hot(amax, 16).double())
    # top_p keeps the smallest most-likely set whose mass reaches top_p
    full = torch.softmax(logits, -1)
    for top_p in (0.3, 0.5, 0.9):
        p = target_probs(logits, SamplingConfig(temperature=1.0, top_p=top_p))
        for r in range(3):
            order = torch.argsort(full[r], descending=True)
            m = int((torch.cumsum(full[r, order], 0) < top_p).sum()) + 1
            keep = set(order[:m].tolist())
            assert set(torch.nonzero(p[r]).flatten().tolist()) == keep
            assert torch.allclose(p[r, order[:m]], full[r, order[:m]] / full[r, order[:m]].sum())
    assert torch.allclose(target_probs(logits, SamplingConfig(temperature=1.0, top_p=1.0)), full)


def test_target_probs_half_precision_is_upcast():
    logits = torch.randn(10, dtype=torch.float64)
    for dt in (torch.float16, torch.bfloat16):
        p = target_probs(logits.to(dt), SamplingConfig(temperature=0.7))
        assert p.dtype == torch.float32 and abs(float(p.sum()) - 1) < 1e-5


def test_sampling_config_validation():
    for bad in (dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)
    assert SamplingConfig().greedy and not SamplingConfig(temperature=0.5).greedy


# ------------------------------------------------------------------------- end to end on the tiny model
@torch.no_grad()
def _model_dists(model, prompt):
    """Exact p(x1) and p(x2 | x1) for every x1 (one batched forward), at temperature 1."""
    p1 = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1], -1)
    V_ = p1.shape[0]
    batch = torch.tensor([prompt + [x] for x in range(V_)])
    p2 = torch.softmax(model(input_ids=batch).logits[:, -1], -1)
    return p1, p2


@pytest.mark.slow
@pytest.mark.parametrize("method,kappa,runs", [("copy", 2, 3000), ("pld", 5, 2000)])
def test_engine_sampling_matches_vanilla_distribution(tiny_model, peaked_model, method, kappa, runs):
    """seed-3 looping prompt: at step 0 the copy drafter (kappa 2) proposes two sibling candidates whose first
    tokens have p ~0.37 and ~0.35 (a branching trie), PLD one chain. Over many seeds the first two generated
    tokens must follow the model's exact p(x1) p(x2 | x1)."""
    prompt = looping_prompt(tiny_model, 3)  # greedy of peaked_model == greedy of tiny_model (logits x30)
    eng = method_engine(peaked_model, method, max_new_tokens=3, eos=(), copy=CopyConfig(kappa=kappa),
                      sampling=SamplingConfig(temperature=1.0))
    first, pairs, accepted = Counter(), Counter(), 0
    for i in range(runs):
        gen = eng.run(prompt, generator=torch.Generator().manual_seed(i))
        ev0 = gen.events[0]
        assert ev0.path == "copy", "setup: the draft must fire at step 0"
        if method == "copy":
            assert len(set(ev0.tree_parents)) < len(ev0.tree_parents), "setup: step 0 must verify a tree"
        accepted += len(ev0.accepted) > 0
        first[(gen.token_ids[0],)] += 1
        pairs[tuple(gen.token_ids[:2])] += 1
    assert accepted > runs * 0.2, "setup: drafts must be accepted often for the test to have power"
    p1, p2 = _model_dists(peaked_model, prompt)
    V_ = p1.shape[0]
    assert chisq_pvalue(first, {(x,): float(p1[x]) for x in range(V_)}) > PASS
    joint = {(a, b): float(p1[a] * p2[a, b]) for a in range(V_) for b in range(V_)}
    assert chisq_pvalue(pairs, joint) > PASS


def _filtered_dists(model, prompt, sampling: SamplingConfig):
    """Exact p~(x1) and p~(x2 | x1) under temperature, top-k and top-p (the target's law as sampled)."""
    with torch.no_grad():
        l1 = model(input_ids=torch.tensor([prompt])).logits[0, -1]
        V_ = l1.shape[0]
        l2 = model(input_ids=torch.tensor([prompt + [x] for x in range(V_)])).logits[:, -1]
    return target_probs(l1, sampling).double(), target_probs(l2, sampling).double()


def _neural(kind: str, target):
    """A neural drafter that agrees with the target often: SPS with a perturbed copy of it, or EAGLE-3."""
    from helpers import perturbed

    from switchsd.drafters.draft_model import DraftModelDrafter
    draft = perturbed(target, 0.15)
    return lambda sampling, seed: DraftModelDrafter(draft, target.config.vocab_size, gamma=3, sampling=sampling,
                                                    generator=torch.Generator().manual_seed(seed))


def _neural_runs(method: str, sampling: SamplingConfig, runs: int, correlated: bool = False):
    """The first two tokens of `runs` seeded engine runs (tiny model, logits x4, a looping prompt), and how
    often step 0 accepted a draft. `correlated`: the drafter's generator gets the engine's seed (a misuse)."""
    from helpers import make_tiny_model

    from switchsd.core.config import EngineConfig, GateConfig, NeuralConfig
    from switchsd.factory import make_engine
    from switchsd.methods import build_policy
    model = make_tiny_model(seed=0, logit_scale=4.0)
    prompt = looping_prompt(model, 3)
    make = _neural("sps", model)
    first, pairs, accepted = Counter(), Counter(), 0
    for i in range(runs):
        policy = build_policy(method, (), CopyConfig(kappa=2), make(sampling, i if correlated else i + 1_000_003),
                              tau=0.0, neural_cfg=NeuralConfig(shape="chain", gamma=3), gate=GateConfig(mode="paper"))
        eng = make_engine(model, policy, EngineConfig(max_new_tokens=2, budget=8, sampling=sampling, stop_at_eos=False), ())
        gen = eng.run(prompt, generator=torch.Generator().manual_seed(i))
        accepted += len(gen.events[0].accepted) > 0
        first[(gen.token_ids[0],)] += 1
        pairs[tuple(gen.token_ids[:2])] += 1
    p1, p2 = _filtered_dists(model, prompt, sampling)
    V_ = p1.shape[0]
    return (first, pairs, accepted, {(x,): float(p1[x]) for x in range(V_)},
            {(a, b): float(p1[a] * p2[a, b]) for a in range(V_) for b in range(V_)}, model, prompt)


@pytest.mark.slow
@pytest.mark.parametrize("method,temperature,top_k,top_p", [
    ("sps", 0.7, 8, 0.95), ("sps", 1.3, 6, 1.0), ("switchsd-sps-paper", 0.7, 8, 0.95), ("banditspec", 1.3, 0, 0.8)])
def test_neural_sampling_matches_the_filtered_target(method, temperature, top_k, top_p):
    """Sampled drafts (q from the draft model at the same filters) through the whole engine, at T 0.7 / 1.3 with
    top-k / top-p, for SPS, SwitchSD (switching between copy and neural) and BanditSpec: the first two tokens
    follow the filtered target law p~(x1) p~(x2 | x1) (chi-square), drafts are accepted often (the test has
    power), and the same counts are rejected as the unfiltered T = 1 law (negative control)."""
    sampling = SamplingConfig(temperature, top_k, top_p)
    runs = 2500
    first, pairs, accepted, law1, law2, model, prompt = _neural_runs(method, sampling, runs)
    assert accepted > runs * 0.3, f"setup: drafts must be accepted often ({accepted}/{runs})"
    assert chisq_pvalue(first, law1) > PASS
    assert chisq_pvalue(pairs, law2) > PASS
    q1, _ = _filtered_dists(model, prompt, SamplingConfig(1.0))
    assert chisq_pvalue(first, {(x,): float(q1[x]) for x in range(q1.shape[0])}) < REJECT


@pytest.mark.slow
def test_a_drafter_seeded_like_the_verifier_breaks_the_law():
    """Negative control with a real cause: when the drafter's generator carries the engine's seed, the
    acceptance uniform is a function of the draw that picked the draft, and the committed pairs leave the
    target's law (5000 runs: p ~ 1e-13). The factory seeds drafters with seed + 1 for this reason."""
    first, pairs, _, law1, law2, _, _ = _neural_runs("sps", SamplingConfig(0.7, 8), 5000, correlated=True)
    assert chisq_pvalue(pairs, law2) < REJECT
