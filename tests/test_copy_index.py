"""The n-gram index and the three context-copy drafters (CopyDrafter, PLDDrafter, CopySpecDrafter).

Each drafter is also compared with a brute-force scan of the context (hypothesis, random token streams fed in
random chunk sizes), so an index that misses or misorders occurrences after incremental `extend`s fails.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from switchsd.core.config import CopyConfig
from switchsd.core.drafting import Draft, Drafter, DraftRequest
from switchsd.drafters.copy import CopyDrafter, CopySpecDrafter, NGramIndex, PLDDrafter


def req(tokens, max_len=100, budget=31):
    return DraftRequest(tokens=list(tokens), max_len=max_len, budget=budget)


def fed(drafter, tokens, chunks=(1,)):
    """reset on a prefix, then extend in chunks (as the engine does after each commit)."""
    tokens = list(tokens)
    first = chunks[0] if chunks else len(tokens)
    drafter.reset(tokens[:first])
    i, c = first, 1
    while i < len(tokens):
        step = chunks[c % len(chunks)] if len(chunks) > 1 else 1
        step = max(1, step)
        drafter.extend(tokens[:i + step], min(step, len(tokens) - i))
        i += step
        c += 1
    return drafter


def from_scratch(n, tokens):
    idx = NGramIndex(n)
    idx.reset(tokens)
    return idx


# ------------------------------------------------------------------------------------------ NGramIndex
def test_ngram_index_from_scratch():
    idx = from_scratch(2, [1, 2, 1, 2, 3])
    assert idx.occurrences([1, 2]) == [0, 2]
    assert idx.occurrences([2, 1]) == [1]
    assert idx.occurrences([2, 3]) == [3]
    assert idx.occurrences([3, 1]) == []
    assert from_scratch(3, [1, 2]).occurrences([1, 2]) == []  # shorter than n: nothing indexed


def test_ngram_index_incremental_extend_equals_from_scratch():
    """Regression (fixed): an extend() that started at end = max(indexed, n) re-indexed the n-gram ending at the
    previous length, so every extend duplicated one start (e.g. (3, 4): [2, 2]); it starts at max(indexed + 1, n)."""
    tokens = [1, 2, 3, 4, 5, 6, 7]
    idx = NGramIndex(2)
    idx.reset(tokens[:4])
    idx.extend(tokens[:6])
    idx.extend(tokens)
    assert dict(idx.starts) == dict(from_scratch(2, tokens).starts)


@settings(max_examples=40, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), min_size=0, max_size=40), n=st.integers(1, 4),
       cuts=st.lists(st.integers(0, 40), max_size=6))
def test_ngram_index_incremental_property(tokens, n, cuts):
    idx = NGramIndex(n)
    bounds = sorted(set(min(c, len(tokens)) for c in cuts)) + [len(tokens)]
    idx.reset(tokens[:bounds[0]])
    for b in bounds[1:]:
        if b > idx.indexed:
            idx.extend(tokens[:b])
    assert dict(idx.starts) == dict(from_scratch(n, tokens).starts)


# ------------------------------------------------------------------------------------------ CopyDrafter
def copy_drafter(kappa=2, W=10, D=20, tokens=None):
    d = CopyDrafter(CopyConfig(kappa=kappa, max_candidates=W, max_draft_len=D))
    if tokens is not None:
        d.reset(tokens)
    return d


def test_copy_drafter_satisfies_protocol():
    for d in (copy_drafter(), PLDDrafter(), CopySpecDrafter()):
        assert d.path == "copy" and isinstance(d.name, str)
        assert all(callable(getattr(d, m)) for m in Drafter.__annotations__.keys() - {"name", "path"} | {"reset", "extend", "propose"})
    assert not Draft([]) and not Draft([[], []]) and Draft([[], [1]])


def test_copy_recency_order_most_recent_first():
    #         0  1  2  3  4  5  6  7  8  9 10 11
    tokens = [1, 2, 10, 11, 1, 2, 20, 21, 1, 2, 30, 1, 2]
    d = copy_drafter(tokens=tokens)
    draft = d.propose(req(tokens))
    assert draft.candidates[0] == [30, 1, 2]                # occurrence at 8 (most recent, context end)
    assert draft.candidates[1][:3] == [20, 21, 1]           # occurrence at 4
    assert draft.candidates[2][:3] == [10, 11, 1]           # occurrence at 0
    assert len(draft.candidates) == 3
    assert draft.match == {"ngram": [1, 2], "sources": [10, 6, 2]}


def test_copy_W_cap_and_D_cap_and_max_len():
    tokens = []
    for t in range(10, 22):           # 12 occurrences of (1, 2), each followed by a different token
        tokens += [1, 2, t, t + 50, t + 100]
    tokens += [1, 2]
    d = copy_drafter(W=3, D=2, tokens=tokens)
    draft = d.propose(req(tokens))
    assert draft.candidates == [[21, 71], [20, 70], [19, 69]]  # W = 3 most recent, D = 2 tokens
    d = copy_drafter(W=3, D=20, tokens=tokens)
    assert d.propose(req(tokens, max_len=1)).candidates == [[21], [20], [19]]   # req.max_len caps depth
    # with a large D each continuation runs to the end of the context: 5, 10 and 15 tokens
    assert [len(c) for c in d.propose(req(tokens)).candidates] == [5, 10, 15]
    assert [len(c) for c in copy_drafter(W=3, D=7, tokens=tokens).propose(req(tokens)).candidates] == [5, 7, 7]
    assert not d.propose(req(tokens, max_len=0))


def test_copy_kappa_respected():
    # (3, 4, 5) occurred earlier, but with kappa = 4 the 4-gram (9, 3, 4, 5) did not
    tokens = [3, 4, 5, 6, 7, 9, 3, 4, 5]
    assert copy_drafter(kappa=3, tokens=tokens).propose(req(tokens)).candidates == [[6, 7, 9, 3, 4, 5]]
    d = copy_drafter(kappa=4, tokens=tokens)
    assert not d.propose(req(tokens)) and not d.has_match(tokens)
    assert copy_drafter(kappa=3, tokens=tokens).has_match(tokens)
    # a context shorter than kappa
    assert not copy_drafter(kappa=5, tokens=[1, 2]).propose(req([1, 2]))


def test_copy_duplicate_continuations_deduplicated():
    tokens = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 5, 1, 2]
    d = copy_drafter(D=2, tokens=tokens)
    assert d.propose(req(tokens)).candidates == [[5, 1], [3, 4]]  # (3, 4) from two occurrences, once


def test_copy_overlapping_matches():
    tokens = [7] * 7
    d = copy_drafter(kappa=3, D=10, tokens=tokens)
    # occurrences of (7,7,7) start at 0..3; 4 is the suffix itself; continuations are runs of 7 of length
    # 4, 3, 2, 1 (each reaching the context's end) - all distinct, most recent (shortest) first
    assert d.propose(req(tokens)).candidates == [[7], [7, 7], [7, 7, 7], [7, 7, 7, 7]]
    assert d.has_match(tokens)


def test_copy_continuation_reaching_context_end():
    """The most recent occurrence overlaps the suffix: its continuation ends with the current last token."""
    tokens = [4, 8, 1, 2, 1, 2]
    d = copy_drafter(tokens=tokens)
    draft = d.propose(req(tokens))
    assert draft.candidates[0] == [1, 2]      # from the occurrence at 2: shorter than D, includes tokens[-1]
    assert draft.candidates == [[1, 2]]


def test_copy_has_match():
    d = copy_drafter(kappa=2, tokens=[1, 2, 3])
    assert not d.has_match([1, 2, 3])          # (2, 3) only as the suffix itself
    d = copy_drafter(kappa=2, tokens=[2, 3, 1, 2, 3])
    assert d.has_match([2, 3, 1, 2, 3])
    assert not copy_drafter(kappa=4, tokens=[1, 2]).has_match([1, 2])


def test_copy_has_match_after_redundant_extend():
    """Regression (fixed, same root cause as the duplicated index entries): an extend() with no new tokens
    re-indexed the suffix gram, so has_match() saw two occurrences of it and reported a match that did not exist."""
    tokens = [1, 2, 3]
    d = copy_drafter(kappa=2, tokens=tokens)
    d.extend(tokens, 0)
    assert not d.has_match(tokens)


def test_copy_incremental_updates():
    d = copy_drafter(kappa=2, tokens=[5, 6, 7])
    tokens = [5, 6, 7, 8, 5, 6]
    d.extend(tokens, 3)
    assert d.propose(req(tokens)).candidates == [[7, 8, 5, 6]]


def brute_copy(tokens, kappa, W, D, max_len):
    L = len(tokens)
    if L < kappa or max_len < 1:
        return []
    gram, depth, out = tokens[L - kappa:], min(D, max_len), []
    for s in range(L - kappa - 1, -1, -1):
        if tokens[s:s + kappa] == gram:
            c = tokens[s + kappa:s + kappa + depth]
            if c and c not in out:
                out.append(c)
            if len(out) == W:
                break
    return out


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=40), kappa=st.integers(1, 4),
       W=st.integers(1, 4), D=st.integers(1, 6), max_len=st.integers(0, 8),
       chunks=st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_copy_equals_brute_force(tokens, kappa, W, D, max_len, chunks):
    d = fed(copy_drafter(kappa=kappa, W=W, D=D), tokens, chunks)
    assert d.propose(req(tokens, max_len=max_len)).candidates == brute_copy(tokens, kappa, W, D, max_len)


# ------------------------------------------------------------------------------------------- PLDDrafter
def test_pld_bigram_then_unigram_fallback():
    tokens = [1, 2, 9, 9, 3, 2, 8, 1, 2]
    d = fed(PLDDrafter(), tokens)
    assert d.propose(req(tokens)).candidates == [[9, 9, 3, 2, 8, 1, 2]]    # bigram (1, 2) at 0
    tokens = [5, 2, 9, 9, 3, 2, 8, 1, 2]                                   # bigram (1, 2) only as suffix
    d = fed(PLDDrafter(), tokens)
    draft = d.propose(req(tokens))
    assert draft.candidates == [[9, 9, 3, 2, 8, 1, 2]]                     # unigram (2) at 1: earliest
    assert draft.match == {"ngram": [2], "sources": [2]}


def test_pld_earliest_occurrence_and_10_tokens():
    tokens = [1, 2] + list(range(10, 30)) + [1, 2] + [40, 41] + [1, 2]
    d = fed(PLDDrafter(), tokens)
    assert d.propose(req(tokens)).candidates == [list(range(10, 20))]      # earliest, num_tokens = 10
    assert d.propose(req(tokens, max_len=3)).candidates == [[10, 11, 12]]


def test_pld_cut_before_eos():
    tokens = [1, 2, 7, 0, 8, 1, 2]
    assert fed(PLDDrafter(eos_ids=[0]), tokens).propose(req(tokens)).candidates == [[7]]
    tokens = [1, 2, 0, 8, 1, 2]
    assert not fed(PLDDrafter(eos_ids=[0]), tokens).propose(req(tokens))  # empty after the cut: no draft
    assert fed(PLDDrafter(), tokens).propose(req(tokens)).candidates == [[0, 8, 1, 2]]


def test_pld_no_match():
    tokens = [1, 2, 3, 4, 5]
    assert not fed(PLDDrafter(), tokens).propose(req(tokens))
    assert not fed(PLDDrafter(), [1]).propose(req([1]))


def brute_pld(tokens, max_ngram, num_tokens, eos, max_len):
    """transformers' PromptLookupCandidateGenerator semantics."""
    L = len(tokens)
    for n in range(max_ngram, 0, -1):
        if n > L - 1:
            continue
        for s in range(0, L - n + 1):
            if tokens[s:s + n] == tokens[L - n:]:
                start, end = s + n, min(s + n + num_tokens, L, s + n + max_len)
                if start < end:
                    c = tokens[start:end]
                    cut = next((i for i, t in enumerate(c) if t in eos), None)
                    return c[:cut] if cut is not None else c
    return []


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), min_size=1, max_size=40), max_ngram=st.integers(1, 3),
       num_tokens=st.integers(1, 6), max_len=st.integers(1, 8), chunks=st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_pld_equals_brute_force(tokens, max_ngram, num_tokens, max_len, chunks):
    d = fed(PLDDrafter(max_ngram=max_ngram, num_tokens=num_tokens, eos_ids=[0]), tokens, chunks)
    want = brute_pld(tokens, max_ngram, num_tokens, {0}, max_len)
    got = d.propose(req(tokens, max_len=max_len)).candidates
    assert got == ([want] if want else [])


# -------------------------------------------------------------------------------------- CopySpecDrafter
def test_copyspec_earliest_occurrence_gamma_3():
    tokens = [1, 2, 3, 10, 11, 1, 2, 3, 20, 21, 1, 2, 3]
    d = fed(CopySpecDrafter(), tokens)
    draft = d.propose(req(tokens))
    assert draft.candidates == [[10, 11, 1, 2, 3, 20, 21, 1, 2, 3]]       # earliest, 10 tokens
    assert draft.match == {"ngram": [1, 2, 3], "sources": [3]}
    assert d.propose(req(tokens, max_len=2)).candidates == [[10, 11]]


def test_copyspec_needs_gamma_overlap():
    tokens = [9, 2, 3, 10, 1, 2, 3]             # (2, 3) repeats but (1, 2, 3) does not
    assert not fed(CopySpecDrafter(), tokens).propose(req(tokens))


def test_copyspec_no_trigger_on_suffix_only():
    tokens = [1, 2, 3]
    assert not fed(CopySpecDrafter(), tokens).propose(req(tokens))
    assert not fed(CopySpecDrafter(), [1, 2]).propose(req([1, 2]))


@settings(max_examples=40, deadline=None)
@given(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=30), max_len=st.integers(1, 12),
       chunks=st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_copyspec_equals_brute_force(tokens, max_len, chunks):
    d = fed(CopySpecDrafter(ngram=3, num_tokens=10), tokens, chunks)
    L, want = len(tokens), []
    for s in range(L - 3):
        if L >= 3 and tokens[s:s + 3] == tokens[L - 3:]:
            want = tokens[s + 3:s + 3 + min(10, max_len)]
            break
    got = d.propose(req(tokens, max_len=max_len)).candidates
    assert got == ([want] if want else [])


def test_pld_candidates_most_recent_distinct_continuations():
    """candidates=1: transformers' prompt lookup (earliest occurrence); more: distinct continuations of the most
    recent occurrences first, each <= num_tokens, cut at EOS, falling back from the 2-gram to the 1-gram."""
    from switchsd.core.drafting import DraftRequest
    from switchsd.drafters.copy import PLDDrafter
    toks = [5, 6, 1, 2, 9, 5, 6, 3, 4, 8, 5, 6, 3, 4, 7, 5, 6]
    one, three = PLDDrafter(num_tokens=3), PLDDrafter(num_tokens=3, candidates=3, eos_ids=[9])
    for d in (one, three):
        d.reset(toks)
    req = DraftRequest(tokens=toks, max_len=10, budget=31)
    assert one.propose(req).candidates == [[1, 2, 9]]                  # earliest, EOS kept by default
    d3 = three.propose(req)
    assert d3.candidates == [[3, 4, 7], [3, 4, 8], [1, 2]]             # recent first, distinct, cut at EOS
    assert d3.match["sources"] == [12, 7, 2]
    assert three.propose(DraftRequest(tokens=toks + [8], max_len=1, budget=31)).candidates == [[5]]  # 1-gram [8]
