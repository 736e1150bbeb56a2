"""SAM-Decoding (drafters/sam.py, policies.SAMD): the suffix automaton against a brute-force longest earlier match
on random token streams, its drafts, and exactness of `samd` against vanilla greedy decoding."""
from __future__ import annotations

import random

import pytest
from helpers import greedy_reference, random_prompt, repetitive_prompt

from switchsd.core.config import EngineConfig, LookupConfig
from switchsd.core.drafting import DraftRequest
from switchsd.drafters.sam import SAMDrafter, SuffixAutomaton
from switchsd.factory import make_engine
from switchsd.methods import build_policy


def brute(text: list[int]) -> tuple[int, int]:
    """(length, earliest end) of the longest suffix of text that occurs ending before its last position."""
    m = len(text)
    for n in range(m - 1, 0, -1):
        suf = text[m - n:]
        for e in range(n - 1, m - 1):
            if text[e - n + 1:e + 1] == suf:
                return n, e
    return 0, -1


@pytest.mark.parametrize("vocab", [2, 3, 5, 12])
def test_automaton_matches_brute_force(vocab):
    r = random.Random(vocab)
    for trial in range(30):
        sam, text = SuffixAutomaton(), []
        for _ in range(r.randint(1, 60)):
            # runs and copies as well as noise: repeats are what the automaton is for
            c = r.choice(text[-8:]) if text and r.random() < 0.3 else r.randrange(vocab)
            sam.push(c)
            text.append(c)
            n, e = brute(text)
            assert sam.length == n, (trial, text)
            if n:
                assert sam.first[sam.cur] == e, (trial, text)
                assert sam.len[sam.link[sam.cur]] < n <= sam.len[sam.cur]


def test_automaton_is_linear_in_states():
    r = random.Random(0)
    sam = SuffixAutomaton()
    sam.extend([r.randrange(4) for _ in range(3000)])
    assert len(sam.len) <= 2 * 3000                      # at most 2n - 1 states


def test_draft_is_the_continuation_of_the_earliest_occurrence():
    text = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 8, 9, 3, 4, 5, 6, 7]
    d = SAMDrafter(n_predicts=3)
    d.reset(text)
    assert d.match_len == 3                                # [5, 6, 7] occurred earlier
    draft = d.propose(DraftRequest(tokens=text, max_len=10, budget=10))
    assert draft.candidates == [[8, 9, 1]] and draft.match["sources"] == [3]
    assert d.propose(DraftRequest(tokens=text, max_len=2, budget=10)).candidates == [[8, 9]]
    # the continuation is too short: climb to a shorter match with an earlier occurrence (SAMD's rule)
    t2 = [1, 2, 3, 9, 9, 9, 1, 2, 3, 4, 1, 2, 3]
    d.reset(t2)
    assert d.match_len == 3 and d.propose(DraftRequest(tokens=t2, max_len=10, budget=10)).candidates[0][:3] == [9, 9, 9]
    d.reset([1, 2, 3])
    assert d.match_len == 0 and not d.propose(DraftRequest(tokens=[1, 2, 3], max_len=5, budget=5))


def engine(model, neural=None, max_new=40):
    policy = build_policy("samd", (1,), lookup=LookupConfig(samd_n_predicts=12), neural=neural)
    return make_engine(model, policy, EngineConfig(max_new_tokens=max_new, budget=16), (1,))


def test_samd_alone_greedy_equals_vanilla_and_copies(tiny_model):
    accepted = 0
    for seed in range(6):
        ids = repetitive_prompt(seed, n=12, reps=3) if seed % 2 else random_prompt(seed, 15)
        res = engine(tiny_model).run(ids)
        assert res.token_ids == greedy_reference(tiny_model, ids, 40)
        accepted += sum(len(e.accepted) for e in res.events if e.drafter == "samd")
        steps = [e for e in res.events if e.gate]
        assert all(e.gate["max_len"] == min(12, 1 + 4 * e.gate["match_len"]) for e in steps)
    assert accepted > 10


def test_samd_with_a_neural_fallback(tiny_model):
    """Match >= 5: the automaton drafts; shorter: the auxiliary drafter (here SPS with the target itself, so
    its drafts are all accepted: the fallback path is exercised, not just present)."""
    from switchsd.drafters.draft_model import DraftModelDrafter
    ids = repetitive_prompt(3, n=12, reps=3)
    res = engine(tiny_model, DraftModelDrafter(tiny_model, 64, gamma=3)).run(ids)
    assert res.token_ids == greedy_reference(tiny_model, ids, 40)
    by = {e.drafter for e in res.events}
    assert {"samd", "sps"} <= by
    for e in res.events:
        assert (e.drafter == "samd") == e.gate["samd_copy"] or not e.new_tokens
        if e.drafter == "sps":
            assert e.gate["match_len"] < 5 and len(e.accepted) >= 1


def test_parse_and_config():
    with pytest.raises(ValueError, match="samd_len_threshold"):
        LookupConfig(samd_len_threshold=0)
    with pytest.raises(ValueError, match="samd_alpha"):
        LookupConfig(samd_alpha=0)


@pytest.mark.real
def test_samd_real_model_equals_vanilla(real_lm):
    from switchsd.factory import Drafters, build_engine
    d = Drafters(real_lm)
    cfg = EngineConfig(max_new_tokens=48)
    ids = real_lm.encode("Repeat this list exactly: apples, pears, plums, cherries, grapes, figs. Then say done.",
                         chat=True)
    van = build_engine("vanilla", real_lm, d, cfg).run(ids).token_ids
    res = build_engine("samd", real_lm, d, cfg).run(ids)
    assert res.token_ids == van
    assert {e.drafter for e in res.events} >= {"samd", "eagle3"}
