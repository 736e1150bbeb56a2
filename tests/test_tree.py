"""Token trie construction, the 4-D tree mask / positions, the tree forward and KV-cache rollback.

The forward tests compare every verify row's logits with a plain full forward of prefix + that row's path, and
every rolled-back cache with a fresh prefill: a wrong mask entry, position id or gathered KV row shows up as a
numeric difference far above float64 round-off.
"""
from __future__ import annotations

import pytest
import torch
from helpers import assert_cache_matches, random_prompt
from hypothesis import given, settings
from hypothesis import strategies as st

from switchsd.core.config import EngineConfig
from switchsd.core.policies import Fixed
from switchsd.core.tree import TokenTree, build_tree, tree_mask, tree_positions
from switchsd.factory import make_engine

P = 99  # pending token


def node_paths(tree: TokenTree) -> set[tuple[int, ...]]:
    return {tuple(tree.tokens[r] for r in tree.path_to(row)) for row in range(1, len(tree.tokens))}


# -------------------------------------------------------------------------------------------- build_tree
def test_build_tree_merges_shared_prefixes():
    tree = build_tree(P, [[5, 6, 7], [5, 6, 8], [5, 9], [10], [5, 6, 7]], budget=32)
    assert tree.tokens == [P, 5, 6, 7, 8, 9, 10]
    assert tree.parents == [-1, 0, 1, 2, 2, 1, 0]
    assert tree.depths == [0, 1, 2, 3, 3, 2, 1]
    assert tree.children == [[1, 6], [2, 5], [3, 4], [], [], [], []]
    assert tree.cand_rows == [[1, 2, 3], [1, 2, 4], [1, 5], [6], [1, 2, 3]]
    assert tree.n_nodes == 6 and not tree.is_chain
    assert tree.path_to(4) == [1, 2, 4] and tree.path_to(0) == []
    # no token is verified twice: (parent, token) pairs are unique
    pairs = list(zip(tree.parents[1:], tree.tokens[1:]))
    assert len(pairs) == len(set(pairs))


def test_build_tree_first_candidate_is_contiguous():
    """Rows 1..len(first candidate) hold the first candidate, so accepting it needs no KV gather."""
    tree = build_tree(P, [[1, 2, 3, 4], [1, 5], [6, 7]], budget=32)
    assert tree.cand_rows[0] == [1, 2, 3, 4]


def test_build_tree_budget_counts_pending_row():
    assert build_tree(P, [[1, 2, 3]], budget=1).tokens == [P]
    assert build_tree(P, [[1, 2, 3]], budget=1).cand_rows == []
    tree = build_tree(P, [[1, 2, 3]], budget=3)
    assert tree.tokens == [P, 1, 2] and tree.cand_rows == [[1, 2]]
    # a full trie still lets later candidates walk shared nodes (recorded, truncated), never add nodes
    tree = build_tree(P, [[1, 2, 3], [1, 2, 4], [5]], budget=4)
    assert tree.tokens == [P, 1, 2, 3]
    assert tree.cand_rows == [[1, 2, 3], [1, 2]]


def test_build_tree_max_depth_and_empty():
    assert build_tree(P, [[1, 2, 3, 4], [1, 5, 6]], budget=32, max_depth=2).tokens == [P, 1, 2, 5]
    assert build_tree(P, [[1, 2, 3]], budget=32, max_depth=0).tokens == [P]
    tree = build_tree(P, [], budget=32)
    assert tree.tokens == [P] and tree.is_chain and tree.cand_rows == []
    assert build_tree(P, [[], [3]], budget=32).cand_rows == [[1]]


def test_build_tree_sampled_draws_are_never_merged():
    """Rows carrying a q are separate rejection-sampling trials: two draws of token 1 stay two rows."""
    qa = [torch.full((4,), 0.25), torch.full((4,), 0.25)]
    qb = [torch.tensor([1.0, 0, 0, 0]), torch.tensor([0, 1.0, 0, 0])]
    tree = build_tree(P, [[1, 2], [1, 3]], budget=32, q=[qa, qb])
    assert tree.tokens == [P, 1, 2, 1, 3]
    assert tree.parents == [-1, 0, 1, 0, 3]
    assert tree.q[0] is None and tree.q[1] is qa[0] and tree.q[2] is qa[1]
    assert tree.q[3] is qb[0] and tree.q[4] is qb[1]
    assert build_tree(P, [[1, 2]], budget=32).q == [None, None, None]


@settings(max_examples=60, deadline=None)
@given(cands=st.lists(st.lists(st.integers(0, 3), max_size=5), max_size=6), budget=st.integers(1, 40),
       max_depth=st.none() | st.integers(0, 5))
def test_build_tree_properties(cands, budget, max_depth):
    tree = build_tree(P, cands, budget, max_depth=max_depth)
    n1 = len(tree.tokens)
    assert n1 <= max(budget, 1)
    assert all(0 <= tree.parents[r] < r for r in range(1, n1)), "parents precede children"
    assert all(tree.depths[r] == tree.depths[tree.parents[r]] + 1 for r in range(1, n1))
    pairs = list(zip(tree.parents[1:], tree.tokens[1:]))
    assert len(pairs) == len(set(pairs)), "a (parent, token) pair was verified twice"
    limit = max_depth if max_depth is not None else 99
    prefixes = {tuple(c[:i]) for c in cands for i in range(1, min(len(c), limit) + 1)}
    assert node_paths(tree) <= prefixes
    if budget > sum(len(c) for c in cands):      # unconstrained: exactly every prefix becomes one node
        assert node_paths(tree) == prefixes
        assert len(tree.cand_rows) == sum(1 for c in cands if c[:limit])
    for rows in tree.cand_rows:
        assert rows == tree.path_to(rows[-1])
    # the mask agrees with an independent ancestor walk
    prefix_len = 3
    mask = tree_mask(tree, prefix_len, torch.float64, "cpu")
    assert mask.shape == (1, 1, n1, prefix_len + n1)
    for r in range(n1):
        anc, a = set(), r
        while a >= 0:
            anc.add(a)
            a = tree.parents[a]
        visible = (mask[0, 0, r] == 0).tolist()
        assert visible[:prefix_len] == [True] * prefix_len
        assert visible[prefix_len:] == [c in anc for c in range(n1)]


def test_tree_mask_and_positions():
    tree = build_tree(P, [[5, 6], [7]], budget=32)  # rows: 0=P, 1=5, 2=6 (child of 1), 3=7
    m = tree_mask(tree, 2, torch.float32, "cpu")[0, 0]
    hid = torch.finfo(torch.float32).min
    expect_visible = [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 0, 0, 1],
    ]
    assert m.tolist() == [[0.0 if v else hid for v in row] for row in expect_visible]
    assert tree_positions(tree, 10, "cpu").tolist() == [[10, 11, 12, 11]]


# ------------------------------------------------------------------------------- tree forward and cache
def _engine(model, forward="hf"):
    return make_engine(model, Fixed([]), EngineConfig(max_new_tokens=8, forward=forward))


@torch.no_grad()
def _prefilled(model, eng, tokens):
    cache = eng.target.new_cache(8)    # small on purpose: the lean cache must grow
    if len(tokens) > 1:
        eng._prefill(cache, tokens[:-1])
    return cache


FORWARDS = ["hf", "lean"]   # transformers' forward + DynamicCache, the lean forward + StaticKVCache
TREES = [
    [[5, 6, 7], [5, 6, 8], [5, 9], [10, 11]],  # branching trie
    [[3, 4, 5, 6]],                            # a chain (no mask: causal + cache)
    [[2], [3], [4], [2, 7, 7, 7]],             # wide root
]


@pytest.mark.parametrize("forward", FORWARDS)
@pytest.mark.parametrize("cands", TREES)
@pytest.mark.parametrize("prompt_len", [1, 9])
def test_tree_forward_equals_per_path_forward(tiny_model, cands, prompt_len, forward):
    prompt = random_prompt(40, prompt_len)
    eng = _engine(tiny_model, forward)
    cache = _prefilled(tiny_model, eng, prompt)
    tree = build_tree(prompt[-1], cands, budget=32)
    with torch.no_grad():
        logits = eng._forward(cache, tree)
        assert len(cache) == prompt_len - 1 + len(tree.tokens)
        for r in range(len(tree.tokens)):
            seq = prompt + [tree.tokens[x] for x in tree.path_to(r)]
            ref = tiny_model(input_ids=torch.tensor([seq])).logits[0, -1]
            assert torch.allclose(logits[r], ref, atol=1e-10, rtol=0), f"row {r} of {cands}"


@pytest.mark.parametrize("forward", FORWARDS)
@pytest.mark.parametrize("cands", TREES)
def test_kvcache_keep_every_path_matches_fresh_prefill(tiny_model, cands, forward):
    """Roll back to every root-to-node path (contiguous crops and non-contiguous gathers)."""
    prompt = random_prompt(41, 9)
    eng = _engine(tiny_model, forward)
    tree = build_tree(prompt[-1], cands, budget=32)
    non_contiguous = 0
    for target_row in range(len(tree.tokens)):
        cache = _prefilled(tiny_model, eng, prompt)
        prefix = len(cache)
        with torch.no_grad():
            eng._forward(cache, tree)
        path = tree.path_to(target_row)
        keep = [0] + path
        non_contiguous += keep != list(range(len(keep)))
        cache.keep(prefix, keep)
        assert len(cache) == prefix + len(keep)
        committed = prompt + [tree.tokens[r] for r in path]
        assert_cache_matches(tiny_model, cache.layer_tensors(), committed)
        # the rolled-back cache must also be *usable*: a next pending token (the bonus, say 17) verified
        # against it gives the same logits as a full forward
        nxt = build_tree(17, [[18]], budget=2)
        with torch.no_grad():
            got = eng._forward(cache, nxt)[1]
            ref = tiny_model(input_ids=torch.tensor([committed + [17, 18]])).logits[0, -1]
        assert torch.allclose(got, ref, atol=1e-10, rtol=0)
    if not tree.is_chain:
        assert non_contiguous > 0


def test_kvcache_crop_and_len(tiny_model):
    prompt = random_prompt(42, 12)
    eng = _engine(tiny_model)
    cache = _prefilled(tiny_model, eng, prompt)
    assert len(cache) == 11
    cache.crop(20)
    assert len(cache) == 11
    cache.crop(5)
    assert len(cache) == 5
    assert_cache_matches(tiny_model, cache.layer_tensors(), prompt[:5])
