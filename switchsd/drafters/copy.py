"""Context-copy drafters over an incrementally updated n-gram index of prompt + output.

- CopyDrafter (SwitchSD's copy path): the kappa-gram ending at the current token; up to W candidates of up to
  D tokens from its earlier occurrences, most recent first. Verified together as a trie.
- PLDDrafter (prompt lookup decoding, transformers' semantics): n-gram sizes max..1, earliest occurrence
  with a non-empty continuation, `num_tokens` tokens, one chain, cut before EOS.
- CopySpecDrafter (CopySpec): the `ngram`-gram's earliest occurrence, copy `num_tokens` tokens.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from ..core.config import CopyConfig
from ..core.drafting import Draft, DraftRequest


class NGramIndex:
    """n-gram -> start positions (ascending). `extend` costs O(new tokens); nothing is ever rescanned."""

    def __init__(self, n: int):
        self.n = n
        self.starts: dict[tuple[int, ...], list[int]] = defaultdict(list)
        self.indexed = 0  # tokens[:indexed] have been indexed

    def reset(self, tokens: Sequence[int]) -> None:
        self.starts.clear()
        self.indexed = 0
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Index every n-gram ending in tokens[self.indexed:]."""
        n = self.n
        for end in range(max(self.indexed + 1, n), len(tokens) + 1):
            self.starts[tuple(tokens[end - n:end])].append(end - n)
        self.indexed = len(tokens)

    def occurrences(self, gram: Sequence[int]) -> list[int]:
        return self.starts.get(tuple(gram), [])


class CopyDrafter:
    name = "copy"
    path = "copy"

    def __init__(self, cfg: CopyConfig = CopyConfig()):
        self.cfg = cfg
        self.index = NGramIndex(cfg.kappa)

    def reset(self, tokens: Sequence[int]) -> None:
        self.index.reset(tokens)

    def extend(self, tokens: Sequence[int], n_new: int) -> None:
        self.index.extend(tokens)

    def has_match(self, tokens: Sequence[int]) -> bool:
        """External evidence for the gate: the kappa-gram ending at the current token occurred earlier."""
        k = self.cfg.kappa
        occ = self.index.occurrences(tokens[-k:]) if len(tokens) >= k else []
        return len(occ) > 1 or (len(occ) == 1 and occ[0] != len(tokens) - k)

    def propose(self, req: DraftRequest) -> Draft:
        tokens, k = req.tokens, self.cfg.kappa
        L = len(tokens)
        if L < k or req.max_len < 1:
            return Draft([])
        gram = tuple(tokens[L - k:])
        depth = min(self.cfg.max_draft_len, req.max_len)
        cands, sources, seen = [], [], set()
        for s in reversed(self.index.occurrences(gram)):  # most recent first
            if s == L - k:  # the current kappa-gram itself
                continue
            cand = tuple(tokens[s + k: s + k + depth])
            if not cand or cand in seen:
                continue
            seen.add(cand)
            cands.append(list(cand))
            sources.append(s + k)
            if len(cands) >= self.cfg.max_candidates:
                break
        return Draft(cands, match={"ngram": list(gram), "sources": sources} if cands else None)


class PLDDrafter:
    """Prompt lookup: the continuation (<= num_tokens) of an earlier occurrence of the last n tokens, n from
    max_ngram down to 1. transformers' semantics by default: the earliest occurrence, one chain.
    `candidates` > 1: up to that many distinct continuations (a trie), the most recent occurrences first."""
    name = "pld"
    path = "copy"

    def __init__(self, max_ngram: int = 2, num_tokens: int = 10, eos_ids: Sequence[int] = (), candidates: int = 1):
        self.max_ngram, self.num_tokens, self.eos = max_ngram, num_tokens, set(eos_ids)
        self.candidates = max(1, int(candidates))
        self.indices = {n: NGramIndex(n) for n in range(1, max_ngram + 1)}

    def reset(self, tokens: Sequence[int]) -> None:
        for idx in self.indices.values():
            idx.reset(tokens)

    def extend(self, tokens: Sequence[int], n_new: int) -> None:
        for idx in self.indices.values():
            idx.extend(tokens)

    def _continuation(self, tokens: Sequence[int], s: int, n: int, max_len: int) -> list[int]:
        L = len(tokens)
        cand = list(tokens[s + n:min(s + n + self.num_tokens, L, s + n + max_len)])
        cut = next((i for i, t in enumerate(cand) if t in self.eos), None)
        return cand[:cut] if cut is not None else cand

    def propose(self, req: DraftRequest) -> Draft:
        tokens, L = req.tokens, len(req.tokens)
        for n in range(min(self.max_ngram, L - 1), 0, -1):
            gram = tokens[L - n:]
            occ = [s for s in self.indices[n].occurrences(gram) if s + n < L]    # earliest first
            if not occ:
                continue
            if self.candidates == 1:
                cand = self._continuation(tokens, occ[0], n, req.max_len)
                return Draft([cand], match={"ngram": list(gram), "sources": [occ[0] + n]}) if cand else Draft([])
            cands, sources, seen = [], [], set()
            for s in reversed(occ):                                            # most recent first
                cand = self._continuation(tokens, s, n, req.max_len)
                if cand and tuple(cand) not in seen:
                    seen.add(tuple(cand))
                    cands.append(cand)
                    sources.append(s + n)
                    if len(cands) == self.candidates:
                        break
            return Draft(cands, match={"ngram": list(gram), "sources": sources}) if cands else Draft([])
        return Draft([])


class CopySpecDrafter:
    name = "copyspec"
    path = "copy"

    def __init__(self, ngram: int = 3, num_tokens: int = 10):
        self.ngram, self.num_tokens = ngram, num_tokens
        self.index = NGramIndex(ngram)

    def reset(self, tokens: Sequence[int]) -> None:
        self.index.reset(tokens)

    def extend(self, tokens: Sequence[int], n_new: int) -> None:
        self.index.extend(tokens)

    def propose(self, req: DraftRequest) -> Draft:
        tokens, g = req.tokens, self.ngram
        L = len(tokens)
        occ = self.index.occurrences(tokens[L - g:]) if L >= g else []
        if not occ or occ[0] + g >= L:  # no earlier occurrence: the first one is the suffix itself
            return Draft([])
        s = occ[0] + g
        cand = list(tokens[s: s + min(self.num_tokens, req.max_len)])
        return Draft([cand], match={"ngram": list(tokens[L - g:]), "sources": [s]}) if cand else Draft([])
