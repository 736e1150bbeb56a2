"""Lookahead Decoding (drafters/lookahead.py): the lookahead branch's mask against sequential forwards, the
n-gram pool, and exactness against vanilla greedy decoding with accepted guesses."""
from __future__ import annotations

import pytest
import torch
from helpers import fresh_cache, greedy_reference, looping_prompt, random_prompt

from switchsd.core.config import EngineConfig, LookupConfig
from switchsd.core.drafting import DraftRequest
from switchsd.core.tree import build_tree, tree_mask, tree_positions, with_extra
from switchsd.drafters.lookahead import LookaheadDrafter
from switchsd.factory import make_engine
from switchsd.methods import build_policy


def test_window_rows_and_guesses_equal_sequential_forwards(tiny_model):
    """One forward = prefix cache + pending token + guess trie + the (N-1) x W window. Every window cell's output
    equals a plain forward over its chain (pending, level-0 cells 1..c, column c of levels 1..l); every tree
    row's output equals a plain forward over its path; so the window cannot change what is verified."""
    N, W = 4, 3
    d = LookaheadDrafter(N, W, 3, seed=1)
    prompt = random_prompt(2, 10)
    d.reset(prompt)
    d.pool[prompt[-1]] = {(5, 6, 7): None, (5, 9, 2): None}
    draft = d.propose(DraftRequest(tokens=prompt, max_len=8, budget=16))
    tree = build_tree(prompt[-1], draft.candidates, 16)
    prefix = len(prompt) - 1
    mask = tree_mask(tree, prefix, torch.float64, "cpu")
    pos = tree_positions(tree, prefix, "cpu")
    mask, pos = with_extra(mask, pos, prefix, draft.extra)
    ids = torch.tensor([tree.tokens + draft.extra.tokens])
    cache = fresh_cache(tiny_model, prompt[:-1])
    logits = tiny_model(input_ids=ids, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True).logits[0]

    def plain(chain):
        return tiny_model(input_ids=torch.tensor([prompt[:-1] + chain])).logits[0, -1]
    for r in range(len(tree.tokens)):
        path = [prompt[-1]] + [tree.tokens[x] for x in tree.path_to(r)]
        assert torch.allclose(logits[r], plain(path), atol=1e-10)
    m = len(tree.tokens)
    for l in range(N - 1):
        for c in range(W):
            if l == 0 and c == 0:
                continue
            chain = [prompt[-1]] + d.levels[0][:c] + [d.levels[k][c] for k in range(1, l + 1)]
            assert pos[0, m + d._row(l, c)] == prefix + len(chain) - 1
            assert torch.allclose(logits[m + d._row(l, c)], plain(chain), atol=1e-10), (l, c)


def test_pool_is_an_lru_of_g_ngrams_per_key_and_the_window_shifts():
    d = LookaheadDrafter(3, 2, 2)
    d.reset([4, 4, 4])
    for g in [(1, 2), (3, 4), (1, 2), (5, 6)]:
        d._remember(9, g)
    assert d.guesses(9) == [[1, 2], [5, 6]]              # (1, 2) refreshed, (3, 4) the oldest: dropped
    d.levels = [[11], [21, 22]]                           # N = 3, W = 2: level 0 holds W - 1 cells
    d.key = 7
    logits = torch.zeros(3, 40)
    logits[1, 31] = logits[2, 32] = 1.0                   # the last level's rows -> new level [31, 32]
    d.absorb(logits)
    assert d.guesses(7) == [[21, 31]] and d.guesses(11) == [[22, 32]]
    assert d.levels == [[22], [31, 32]]


def test_lookahead_greedy_equals_vanilla_and_accepts(tiny_model):
    accepted = 0
    for seed in range(6):
        ids = looping_prompt(tiny_model, seed) if seed % 2 else random_prompt(seed, 12)
        eng = make_engine(tiny_model, build_policy("lookahead", (1,)), EngineConfig(max_new_tokens=60, budget=32), (1,))
        res = eng.run(ids)
        assert res.token_ids == greedy_reference(tiny_model, ids, 60)
        accepted += sum(len(e.accepted) for e in res.events)
        assert all(e.path == "lookahead" or not e.candidates for e in res.events)
    assert accepted > 50


def test_lookahead_settings_are_validated():
    with pytest.raises(ValueError, match="lookahead"):
        LookupConfig(lookahead_level=2)
    with pytest.raises(ValueError):
        LookaheadDrafter(5, 1, 7)


@pytest.mark.real
def test_lookahead_real_model_equals_vanilla(real_lm):
    from switchsd.factory import Drafters, build_engine
    d = Drafters(real_lm)
    cfg = EngineConfig(max_new_tokens=48)
    ids = real_lm.encode("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", chat=False)
    van = build_engine("vanilla", real_lm, d, cfg).run(ids).token_ids
    res = build_engine("lookahead", real_lm, d, cfg).run(ids)
    assert res.token_ids == van and len(van) == 48
    assert sum(len(e.accepted) for e in res.events) > 0        # guesses from the Jacobi window were accepted
