"""Lookahead Decoding (Fu et al. 2024, arXiv 2402.02057; read from hao-ai-lab/LookaheadDecoding `lade/`; notes:
../shared/research/copy_baselines.md section 5): no draft model. Every verify forward also carries a 2-D Jacobi
window (the lookahead branch, unverified rows); its trajectories fill an n-gram pool, and the pool's n-grams that
start with the pending token are verified in the same forward.

Window (N levels of Jacobi iterates, W columns; Spec-Bench: N = 5, W = 7, G = 7): cell (level l, column c) sits
at position pending + l + c; cell (0, 0) is the pending token itself, so level 0 holds W - 1 tokens and levels
1 .. N-2 hold W. Cell (l, c) sees the prefix, the pending token, level-0 cells 1..c and the cells of column c in
levels 1..l: one chain of consecutive positions, so its output is the model's guess for position
pending + l + c + 1. After the forward the last level's outputs form a new level; each column's diagonal
(key = its level-0 token, value = its tokens in levels 1..N-2 + the new one) enters the pool (an LRU list of at
most G n-grams per key); the levels shift by one (as in the reference, also when several tokens were committed).

Verification: the pool's n-grams keyed by the pending token (oldest first, at most G), N - 1 tokens each, merged
into the engine's token trie (greedy: identical to vanilla). Differences from the reference, none of which can
change the output: the window starts with every level filled with tokens drawn from the prompt (the reference
fills levels 1..N-2 with N-2 warm-up Jacobi steps); a fully accepted n-gram also commits the bonus token (the
reference drops it); the guesses are capped by the engine's verification budget.
"""
from __future__ import annotations

import random
from collections import OrderedDict
from typing import Sequence

import torch

from ..core.drafting import Draft, DraftRequest, Extra
from ..core.verify import greedy_tokens


class LookaheadDrafter:
    name, path = "lookahead", "lookahead"

    def __init__(self, level: int = 5, window: int = 7, guess: int = 7, seed: int = 0):
        if level < 3 or window < 2 or guess < 1:
            raise ValueError(f"lookahead needs N >= 3, W >= 2, G >= 1; got N={level}, W={window}, G={guess}")
        self.N, self.W, self.G = level, window, guess
        self.rng = random.Random(seed)
        self.sees = self._sees()
        self.rel = [c for c in range(1, window)] + [l + c for l in range(1, level - 1) for c in range(window)]
        self.reset([])

    def _row(self, l: int, c: int) -> int:
        """Extra-row index of cell (l, c) (cell (0, 0) is the pending token: not an extra row)."""
        return c - 1 if l == 0 else (self.W - 1) + (l - 1) * self.W + c

    def _sees(self) -> torch.Tensor:
        N, W = self.N, self.W
        E = (W - 1) + (N - 2) * W
        sees = torch.zeros(E, 1 + E, dtype=torch.bool)
        for l in range(N - 1):
            for c in range(W):
                if l == 0 and c == 0:
                    continue
                r = self._row(l, c)
                sees[r, 0] = True                                      # the pending token
                for c0 in range(1, c + 1):                             # level-0 cells 1..c
                    sees[r, 1 + self._row(0, c0)] = True
                for l1 in range(1, l + 1):                             # column c of levels 1..l
                    sees[r, 1 + self._row(l1, c)] = True
        return sees

    def reset(self, tokens: Sequence[int]) -> None:
        src = list(tokens) or [0]
        pick = lambda n: [self.rng.choice(src) for _ in range(n)]          # noqa: E731
        self.levels = [pick(self.W - 1)] + [pick(self.W) for _ in range(self.N - 2)]
        self.pool: dict[int, OrderedDict] = {}
        self.key = None

    def extend(self, tokens: Sequence[int], n_new: int) -> None:
        pass

    def guesses(self, key: int) -> list[list[int]]:
        return [list(g) for g in self.pool.get(key, {})]

    def _remember(self, key: int, gram: tuple[int, ...]) -> None:
        lru = self.pool.setdefault(key, OrderedDict())
        if gram in lru:
            lru.move_to_end(gram)
            return
        if len(lru) >= self.G:
            lru.popitem(last=False)
        lru[gram] = None

    def absorb(self, logits: torch.Tensor) -> None:
        """The window's outputs [E, V]: new level from the last level's rows, n-grams into the pool, shift."""
        last = logits[-self.W:]                                           # level N-2, columns 0..W-1
        new = greedy_tokens(last).tolist()
        lv = self.levels
        for c in range(self.W):
            key = self.key if c == 0 else lv[0][c - 1]
            self._remember(key, tuple(lv[l][c] for l in range(1, self.N - 1)) + (new[c],))
        self.levels = [lv[1][1:]] + lv[2:] + [new]

    def propose(self, req: DraftRequest) -> Draft:
        self.key = int(req.tokens[-1])
        cands = [g[:req.max_len] for g in self.guesses(self.key)] if req.max_len > 0 else []
        window = [t for level in self.levels for t in level]
        return Draft([c for c in cands if c], extra=Extra(window, self.rel, self.sees, self.absorb))
