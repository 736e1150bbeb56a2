"""The model's linear layers in their native 4-bit layout, through torch's CPU int4 weight-only kernel.

A GGUF Q4_1 block holds 32 weights of one output row as w = d * q + m (q in 0..15; d, m float16); Q4_0 as
w = d * (q - 8). torch's kernel (`aten._weight_int4pack_mm_for_cpu`, group size 32) computes with
w = (q - 8) * scale + zero per group, so scale = d and zero = m + 8d (Q4_0: zero = 0) hold the same weights.
With float32 activations the scales and zeros are float32: d and m + 8d are exact there, (q - 8) d is exact,
and the kernel's one rounding of (q - 8) d + (m + 8d) gives the float32 value the GGUF de-quantiser gives
(fl(d q + m)), so the weights equal the float32 model's bit for bit (`tests/test_int4.py`). With bfloat16
activations the kernel wants bfloat16 scales and zeros: d and m + 8d are rounded to 8 bits of mantissa.

    swap_to_int4(model, gguf_path)     # q/k/v/o/gate/up/down of every layer -> Int4Linear (in place)

The embedding lookup stays dense. The LM head, when the file holds it as Q8_0 (the offline GGUF's tied embedding),
runs as two int4 products (`Int8Head`: 8-bit codes split into nibbles, the same weights, half the bytes of
bfloat16). The lean forward fuses q|k|v and gate|up of Int4Linear layers into one packed matrix each.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .dense import wide_product

GROUP = 32
PROJ = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down"}


_INT4_MM = getattr(getattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", None), "default", None)  # resolved once


def available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 stored at byte `at` of every block, as float32 (exact)."""
    return blocks[..., at:at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def q4_groups(raw: np.ndarray, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GGUF Q4_0 / Q4_1 blocks of an [N, K] matrix (raw: uint8 [N, K/32 * block bytes]) ->
    codes uint8 [N, K] (0..15), scale and zero float32 [N, K/32] with w = (q - 8) * scale + zero."""
    head = {"Q4_0": 2, "Q4_1": 4}[kind]
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, head + 16)                    # [N, K/32, bytes]
    d = _half(blocks, 0)                                                             # [N, K/32]
    m = _half(blocks, 2) if kind == "Q4_1" else None
    qs = blocks[..., head:]                                                          # [N, K/32, 16]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1)          # low nibbles first
    zero = (m + np.float32(8) * d) if m is not None else np.zeros_like(d)
    return torch.from_numpy(codes.copy()), torch.from_numpy(d), torch.from_numpy(zero.astype(np.float32))


def q8_halves(raw: np.ndarray) -> tuple[tuple, tuple]:
    """GGUF Q8_0 blocks (w = d * q, q int8, d float16 per 32) of an [N, K] matrix as two 4-bit group sets whose
    sum is w: with u = q + 128 = 16 hi + lo, w = 16d (hi - 8) + [d (lo - 8) + 8d]. Exact in float32."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, 34)
    d = _half(blocks, 0)                                                             # [N, K/32]
    u = (blocks[..., 2:].copy().view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(n, -1)
    hi, lo = torch.from_numpy(u >> 4), torch.from_numpy(u & 0x0F)
    d = torch.from_numpy(d)
    return (hi, 16 * d, torch.zeros_like(d)), (lo, d, 8 * d)


class Int8Head:
    """An 8-bit matrix as the sum of two int4 products (`q8_halves`); inputs of more than `wide_rows` rows as one
    dense product over the de-quantised sum."""

    def __init__(self, halves: tuple[tuple, tuple], dtype: torch.dtype, wide_rows: int = 32):
        self.hi, self.lo = (Int4Linear(*h, dtype, 1 << 30) for h in halves)
        self.in_features, self.dtype, self.wide_rows, self._dense = self.hi.in_features, dtype, wide_rows, None

    def dequantized(self) -> torch.Tensor:
        return self.hi.dequantized() + self.lo.dequantized()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() // self.in_features > self.wide_rows:
            if self._dense is None:
                self._dense = wide_product(self.dequantized(), self.dtype)
            return self._dense(x)
        return self.hi(x) + self.lo(x)

    fast = __call__


class Int4Linear(torch.nn.Module):
    """y = x W^T with W held as 4-bit codes in groups of 32 (scale, zero per group), packed for the CPU kernel.
    Activations: float32 (exact scales) or bfloat16 / float16 (scales rounded to that dtype).

    The kernel's cost grows with the rows much faster than a dense product's (16 rows ~5x one row), so inputs of
    more than `wide_rows` rows (prefills; with a low threshold also wide verify forwards: the mixed plan) run
    as a dense product over the same de-quantised weights, made on first use."""
    exact_rows = 1 << 30

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype,
                 wide_rows: int = 32):
        super().__init__()
        self.wide_rows, self._dense = wide_rows, None
        n, k = codes.shape
        if k % GROUP or n % 16:
            raise ValueError(f"int4 needs in_features % {GROUP} == 0 and out_features % 16 == 0, got [{n}, {k}]")
        self.in_features, self.out_features, self.dtype = k, n, dtype
        self.codes, self.scale, self.zero = codes, scale, zero                    # kept for fusing
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
        self.sz = torch.stack([scale.t(), zero.t()], -1).to(dtype).contiguous()  # [K/32, N, 2]

    @classmethod
    def fuse(cls, parts: list["Int4Linear"]) -> "Int4Linear":
        """One matrix [W1; W2; ...] (e.g. q|k|v): codes, scales and zeros stacked along the output rows."""
        return cls(torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]),
                   torch.cat([p.zero for p in parts]), parts[0].dtype, parts[0].wide_rows)

    def dequantized(self) -> torch.Tensor:
        """W [N, K] float32, as the kernel sees it (an identity matrix through the kernel in float32)."""
        sz = self.sz.float()
        w = (self.codes.float() - 8) * sz[..., 0].t().repeat_interleave(GROUP, 1) \
            + sz[..., 1].t().repeat_interleave(GROUP, 1)
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:                          # [..., K] -> [..., N]
        if x.dim() == 2 and x.shape[0] <= self.wide_rows:        # the lean forward's [T, K]: straight to the kernel
            return _INT4_MM(x.contiguous(), self.packed, GROUP, self.sz)
        rows = x.numel() // self.in_features
        if rows > self.wide_rows:
            if self._dense is None:
                self._dense = wide_product(self.dequantized(), self.dtype)   # [N, K], made on first use
            return self._dense(x)
        y = _INT4_MM(x.reshape(rows, self.in_features).contiguous(), self.packed, GROUP, self.sz)  # [rows, N]
        return y.view(*x.shape[:-1], self.out_features)

    fast = forward                  # the lean forward's name for its fused product (calibrate's matmul floor)
    __call__ = forward              # skip nn.Module's hook machinery: ~200 calls per token


def quantize_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A dense [N, K] weight in Q4_1's form (per group of 32: d = (max - min) / 15, m = min, both float16):
    codes, scale, zero as q4_groups gives them. Lossy; for models without a 4-bit file (tests, tiny models)."""
    g = w.float().reshape(w.shape[0], -1, GROUP)                                  # [N, K/32, 32]
    lo, hi = g.amin(-1), g.amax(-1)
    d = ((hi - lo) / 15).half().float()
    m = lo.half().float()
    q = torch.where(d[..., None] > 0, ((g - m[..., None]) / d[..., None].clamp_min(1e-30)).round(), 0)
    return q.clamp(0, 15).to(torch.uint8).reshape(w.shape), d, m + 8 * d


def _swap(model, groups, wide_rows: int = 32) -> int:
    """Every decoder layer's q/k/v/o/gate/up/down Linear -> Int4Linear(*groups(layer index, name, Linear))."""
    p = next(model.parameters())
    if not available():
        raise ValueError("this torch build has no CPU int4 kernel (aten._weight_int4pack_mm_for_cpu)")
    if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"int4 needs float32, bfloat16 or float16 activations, got {p.dtype}")
    if p.device.type != "cpu":
        raise ValueError("the int4 kernel used here runs on CPU")
    n = 0
    for i, layer in enumerate(model.model.layers):
        for attr in PROJ:
            owner, leaf = attr.split(".")
            old = getattr(getattr(layer, owner), leaf)
            if getattr(old, "bias", None) is not None:
                raise ValueError(f"layer {i} {attr} has a bias (the int4 path supports bias-free Llama layers)")
            codes, scale, zero = groups(i, attr, old)
            if tuple(old.weight.shape) != tuple(codes.shape):
                raise ValueError(f"layer {i} {attr}: 4-bit shape {tuple(codes.shape)} does not match the model's "
                                 f"{tuple(old.weight.shape)}")
            setattr(getattr(layer, owner), leaf, Int4Linear(codes, scale, zero, p.dtype, wide_rows))
            n += 1
    return n


def swap_to_int4(model, gguf_path: str | Path, wide_rows: int = 32) -> int:
    """Replace every decoder layer's q/k/v/o/gate/up/down Linear of a Llama-architecture `model` (already loaded
    from the same GGUF, dense) by an Int4Linear from the GGUF's own Q4_0 / Q4_1 groups. Returns the number of
    matrices swapped; raises ValueError when a tensor is missing or not 4-bit, or the file does not match."""
    from .ggufread import architecture, reader, rotary_rows
    tensors = {t.name: t for t in reader(gguf_path).tensors}
    arch = architecture(gguf_path)
    cfg = model.config

    def groups(i: int, attr: str, old):
        short = PROJ[attr]
        name = f"blk.{i}.{short}.weight"
        t = tensors.get(name)
        if t is None:
            raise ValueError(f"{gguf_path}: no tensor {name}")
        kind = t.tensor_type.name
        if kind not in ("Q4_0", "Q4_1"):
            raise ValueError(f"{name} is {kind}, not Q4_0 / Q4_1")
        codes, scale, zero = q4_groups(np.asarray(t.data), kind)
        perm = rotary_rows(arch, short, codes.shape[0], cfg)
        if perm is not None:
            codes, scale, zero = codes[perm], scale[perm], zero[perm]
        return codes, scale, zero

    n = _swap(model, groups, wide_rows)
    model._switchsd_int4 = str(gguf_path)
    head = tensors.get("output.weight")                              # an untied head, else the tied embedding
    head = head if head is not None else tensors.get("token_embd.weight")
    lm_head = getattr(model, "lm_head", None)
    if head is not None and head.tensor_type.name == "Q8_0" and lm_head is not None \
            and tuple(lm_head.weight.shape) == (int(head.shape[1]), int(head.shape[0])) \
            and lm_head.weight.shape[1] % GROUP == 0 and lm_head.weight.shape[0] % 16 == 0:
        model._switchsd_int8_head = Int8Head(q8_halves(np.asarray(head.data)), next(model.parameters()).dtype,
                                             wide_rows)
    return n


def quantize_to_int4(model) -> int:
    """Quantise a dense model's decoder layers to Q4_1-style groups (`quantize_groups`) and swap them in: a lossy
    model of its own, for tests of the int4 path on tiny random models."""
    n = _swap(model, lambda i, attr, old: quantize_groups(old.weight))
    model._switchsd_int4 = "quantized"
    return n


def is_int4(model) -> bool:
    return getattr(model, "_switchsd_int4", None) is not None
