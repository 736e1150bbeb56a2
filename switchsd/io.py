"""Packing variable-length sequences into padded batches of at most `tokens_per_batch` tokens."""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def length_batches(items: Sequence[T], length: Callable[[T], int], tokens_per_batch: int) -> list[list[T]]:
    """Sort by length and pack greedily so that (longest in batch) x (batch size) <= tokens_per_batch
    (a longer item than that gets a batch of its own). Deterministic: same items -> same batches."""
    out: list[list[T]] = []
    cur: list[T] = []
    for it in sorted(items, key=length):      # ascending: the newest item is the batch's longest
        if cur and length(it) * (len(cur) + 1) > tokens_per_batch:
            out.append(cur)
            cur = []
        cur.append(it)
    if cur:
        out.append(cur)
    return out
