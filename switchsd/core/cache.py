"""An explicit KV cache: the target's keys/values for every committed token except the pending one.

Wraps transformers' DynamicCache (passed as `cache=` to the model). After a verify forward the cache holds
prefix + all verify rows; `keep(prefix_len, rows)` rolls it back to prefix + the accepted path:
a crop when the path is a contiguous run of rows (chains, the first candidate), a gather otherwise.
"""
from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache


def check_grew(cache: "KVCache", before: int, added: int) -> None:
    """transformers versions that ignore `cache=` would silently recompute from scratch: refuse them."""
    if len(cache) != before + added:
        raise RuntimeError(f"the KV cache holds {len(cache)} positions after a forward of {added} new tokens on "
                           f"{before}: this transformers version ignored cache= (requirements.txt pins a "
                           "tested one)")


class KVCache:
    def __init__(self, config):
        self.hf = DynamicCache(config=config)

    def __len__(self) -> int:
        return int(self.hf.get_seq_length())

    def crop(self, length: int) -> None:
        """Drop everything after the first `length` positions."""
        extra = len(self) - length
        if extra > 0:
            self.hf.crop(-extra)

    def keep(self, prefix_len: int, rows: Sequence[int]) -> None:
        """Keep positions [0, prefix_len) plus prefix_len + r for r in `rows` (ascending), drop the rest."""
        rows = list(rows)
        if rows == list(range(len(rows))):
            self.crop(prefix_len + len(rows))
            return
        for layer in self.hf.layers:
            # keys/values: [batch, kv_heads, seq, head_dim]
            idx = torch.tensor(rows, device=layer.keys.device) + prefix_len
            k = len(rows)
            layer.keys[:, :, prefix_len:prefix_len + k] = layer.keys.index_select(2, idx)
            layer.values[:, :, prefix_len:prefix_len + k] = layer.values.index_select(2, idx)
        self.crop(prefix_len + len(rows))

    def layer_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.keys, layer.values) for layer in self.hf.layers]
