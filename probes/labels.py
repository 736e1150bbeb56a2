"""Weak copy labels and the decision alignment.

Label (paper, n_train = 5): token j is copy-mode iff it lies inside a verbatim span of >= n_train tokens that
already occurred earlier in the context (prompt or earlier output). Since every n_train-window of such a span
occurred earlier too, copy[j] <=> some window tokens[a:a+n] with a <= j < a+n has an earlier occurrence s < a
(overlapping occurrences count, e.g. runs of one token).

Decision alignment: when the engine decides, tokens[0..L-1] are committed, the pending token L-1 is not yet
processed, and the last hidden state available is that of position i = L-2 (captured by the previous verify
forward). The copy drafter would propose tokens L, L+1, ... So the probe reads h_i and is trained on
label copy[i + 2]: "are the next tokens to be drafted a copy?". `ALIGN = 2` encodes this.
"""
from __future__ import annotations

from typing import Sequence

ALIGN = 2


def copy_labels(tokens: Sequence[int], n: int = 5) -> list[bool]:
    """copy[j] for every position j of `tokens`."""
    T = len(tokens)
    first: dict[tuple, int] = {}
    copy = [False] * T
    for a in range(T - n + 1):
        w = tuple(tokens[a:a + n])
        s = first.setdefault(w, a)
        if s < a:
            for j in range(a, a + n):
                copy[j] = True
    return copy


def aligned_pairs(tokens: Sequence[int], start: int, n: int = 5) -> tuple[list[int], list[bool]]:
    """(feature positions i, labels copy[i + ALIGN]) for every generated token j = i + ALIGN >= start."""
    copy = copy_labels(tokens, n)
    pos = [j - ALIGN for j in range(max(start, ALIGN), len(tokens))]
    return pos, [copy[i + ALIGN] for i in pos]
