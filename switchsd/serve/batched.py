"""Many requests in one target forward: a slotted KV cache with a length per row, and the lean forward over a
ragged batch (every row its own prefix length, its own verify tree, padded to the widest row).

    cache = BatchedKV(lean, slots=16, capacity=1024)
    logits, last = batched_forward(lean, ids, cache, pos, mask, sites)     # ids [b, T]: rows 0..b-1 of the cache

Active requests always occupy slots 0..b-1 (a finishing row is replaced by the last one, `move`), so every
forward reads contiguous views of the cache. Row r's new keys/values are written at [len_r, len_r + T); the mask
lets each real query see its own prefix and its tree ancestors only, so a row's outputs do not depend on the
other rows (exactness vs one-request decoding holds up to the float rounding of a wider matrix product: the
tests check greedy identity in float32).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
import torch.nn.functional as F

from ..core.tree import TokenTree, tree_mask, tree_positions
from ..models.lean import LeanLlama, grow

Site = tuple[int, str]


class BatchedKV:
    """k, v: [layers, slots, kv_heads, capacity, head_dim]; lens[s]: valid positions of slot s."""

    def __init__(self, lean: LeanLlama, slots: int, capacity: int):
        shape = (lean.n_layers, slots, lean.kv_heads, max(1, capacity), lean.head_dim)
        with torch.inference_mode():
            self.k = torch.zeros(shape, dtype=lean.att_dtype, device=lean.device)
            self.v = torch.zeros(shape, dtype=lean.att_dtype, device=lean.device)
        self.lens = [0] * slots

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def reserve(self, n: int) -> None:
        grow(self, n, max(self.lens))

    @torch.inference_mode()
    def keep(self, slot: int, prefix: int, rows: Sequence[int]) -> None:
        """Slot `slot` keeps [0, prefix) plus prefix + r for r in rows (ascending): the committed path."""
        rows = list(rows)
        if rows != list(range(len(rows))):
            idx = torch.tensor(rows, device=self.k.device) + prefix
            n = len(rows)
            self.k[:, slot, :, prefix:prefix + n] = self.k[:, slot].index_select(2, idx)
            self.v[:, slot, :, prefix:prefix + n] = self.v[:, slot].index_select(2, idx)
        self.lens[slot] = prefix + len(rows)

    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """Slot src's keys/values into slot dst (compaction when a row leaves)."""
        n = self.lens[src]
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.lens[dst] = n


def batch_inputs(trees: Sequence[TokenTree], lens: Sequence[int], dtype, device
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row verify trees -> ids [b, T], position ids [b, T], additive mask [b, 1, T, max(len) + T].
    Row r's tree is padded to T with filler rows (they see their prefix and themselves; no real row sees them)
    and its mask hides every key past its own len_r + T."""
    b, T = len(trees), max(len(t.tokens) for t in trees)
    S = max(lens) + T
    ids = torch.zeros(b, T, dtype=torch.long)
    pos = torch.zeros(b, T, dtype=torch.long)
    mask = torch.full((b, 1, T, S), torch.finfo(dtype).min, dtype=dtype)
    for r, (tree, n) in enumerate(zip(trees, lens)):
        pad = T - len(tree.tokens)
        ids[r] = torch.tensor(tree.tokens + [tree.tokens[0]] * pad)
        pos[r] = tree_positions(tree, n, "cpu", pad)[0]
        mask[r, :, :, :n + T] = tree_mask(tree, n, dtype, "cpu", pad)[0]
    return ids.to(device), pos.to(device), mask.to(device)


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """One query row per slot as grouped matmuls, no K/V copies: q [b, H, 1, hd], keys/values [b, KV, S, hd],
    mask [b, 1, 1, S] additive -> [b, H, 1, hd]. On CPU, SDPA's kernel spends ~10 ms per layer on 32 one-token
    rows over 400 keys; these products well under one (measured for the regeneration loop)."""
    b, H, _, hd = q.shape
    q = q.to(keys.dtype)
    KV, S = keys.shape[1], keys.shape[2]
    g = H // KV
    # keys as the left operand keep their cache layout (a transposed right operand is copied first)
    s_ = keys @ q.view(b, KV, g, hd).transpose(-1, -2)                           # [b, KV, S, g]
    if s_.dtype in (torch.bfloat16, torch.float16):
        s_ = s_.float()
    w = torch.softmax(s_ * scale + mask.view(b, 1, S, 1), -2).to(q.dtype).transpose(-1, -2).contiguous()
    return (w @ values).view(b, H, 1, hd)                                         # w [b, KV, g, S]


@torch.inference_mode()
def batched_forward(lean: LeanLlama, ids: torch.Tensor, cache: BatchedKV, pos: torch.Tensor,
                    mask: torch.Tensor | None, sites: Iterable[Site] = (), rows: Sequence[int] | None = None,
                    first_slot: int = 0, grouped: bool = False) -> tuple[torch.Tensor, dict[Site, torch.Tensor]]:
    """ids, pos [b, T] for slots first_slot .. first_slot+b-1, each appended after its own len; mask [b, 1, T, S]
    (S = max len + T) or None (causal; only for rows of equal len, e.g. one prefill). `rows[r]`: the real rows
    of row r (logits are computed for those only). `grouped`: one-token rows (T = 1, with a mask) attend by
    grouped matmuls (`grouped_attention`) instead of SDPA. Returns (logits [sum(rows), V] in row order,
    {site: [b, T, d]}). The caller rolls each slot back with `cache.keep`; lens advance by T here."""
    if getattr(lean, "kind", None) == "q4q8":           # one C call, every row computed alone (models.q4q8)
        return lean.forward_batched(ids, cache, pos, mask, sites, rows, first_slot)
    b, T = ids.shape
    sl = slice(first_slot, first_slot + b)
    lens = cache.lens[sl]
    S = max(lens) + T
    cache.reserve(S)
    cos, sin = lean._rotary(pos)                                                 # [b, T, 1, hd]
    want = {(int(a), str(c)) for a, c in sites}
    captured: dict[Site, torch.Tensor] = {}
    dev = ids.device
    rr = torch.arange(first_slot, first_slot + b, device=dev)[:, None].expand(b, T)
    pp = torch.tensor(lens, device=dev)[:, None] + torch.arange(T, device=dev)[None]      # [b, T] write slots
    causal = mask is None
    if mask is not None and mask.is_floating_point():
        mask = mask.to(lean.att_dtype)
    if causal and (len(set(lens)) != 1 or (T > 1 and lens[0] > 0)):
        raise ValueError("a causal batched forward needs rows of equal length (and, for T > 1, no cached "
                         "prefix): pass a mask")
    x = F.embedding(ids, lean.embed)                                             # [b, T, d]
    H, KV, hd = lean.heads, lean.kv_heads, lean.head_dim
    for i, (n1, qkv, *_) in enumerate(lean.layers):
        heads = qkv(lean._rms(x, n1)).view(b, T, H + 2 * KV, hd)
        qk = lean._rotate(lean.qk_normed(i, heads), cos, sin)
        q = qk[:, :, :H].transpose(1, 2)                                         # [b, H, T, hd]
        # the cache holds the attention's dtype (`LeanLlama.att_dtype`: float32 for int4 where bf16 is emulated)
        cache.k[i][rr, :, pp] = qk[:, :, H:].to(cache.k.dtype)                   # [b, T, KV, hd]
        cache.v[i][rr, :, pp] = heads[:, :, H + KV:].to(cache.v.dtype)
        keys, values = cache.k[i, sl, :, :S], cache.v[i, sl, :, :S]           # [b, KV, S, hd]
        if grouped and T == 1 and mask is not None:
            x = lean._after_attention(i, x, grouped_attention(q, keys, values, mask, lean.scale), want, captured)
        else:
            x = lean.finish_layer(i, x, q, keys, values, mask, causal and T > 1 and lens[0] == 0, want, captured)
    for r in range(b):
        cache.lens[first_slot + r] += T
    if rows is None:
        x = x.reshape(b * T, -1)
    else:
        x = torch.cat([x[r, :n] for r, n in enumerate(rows)])                   # [sum rows, d]
    return lean.head(lean._rms(x, lean.norm)), captured
