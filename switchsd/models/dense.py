"""y = x W^T (+ b) over a weight packed once for oneDNN on CPU in 16-bit floats.

On CPUs in bfloat16 / float16, `F.linear` repacks its weight on every call; `mkldnn._linear_pointwise` over a
weight reordered once (`mkldnn._reorder_linear_weight`) is ~2x faster for decode-sized inputs. float32 (and any
other device) keeps `F.linear`: MKL's one-row path is already at the memory floor.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F


@lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """AVX-512 BF16 or AMX: bfloat16 matrix products run natively (oneDNN); elsewhere they are emulated, which
    costs little in memory-bound one-row products and a lot (~6x float32's time) in compute-bound wide ones."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags for f in (" avx512_bf16", " amx_bf16"))


def attention_dtype(dtype: torch.dtype, device: torch.device | str) -> torch.dtype:
    """The dtype the int4 format's lean forward (and an EAGLE-3 head) keeps keys/values and attends in.
    16-bit activations on a CPU without native 16-bit arithmetic attend in float32: SDPA's CPU kernel in
    emulated bfloat16 costs ~4x its float32 time for one query row (AVX2-only EPYC, 9 heads over 300 keys:
    288 us vs 70 us a layer), and a verify forward calls it once per row and layer. q, keys and values convert
    exactly from their bfloat16 values; decode steps and verify rows share this arithmetic (`lean.RowKeys`)."""
    cpu = torch.device(device).type == "cpu"
    if dtype in (torch.bfloat16, torch.float16) and cpu and not cpu_has_native_bf16():
        return torch.float32
    return dtype


def wide_product(w: torch.Tensor, dtype: torch.dtype):
    """x -> x w^T for wide inputs (prefills) whose result is wanted in `dtype`. A 16-bit product on a CPU
    without native 16-bit arithmetic runs in float32 and rounds back (an 800-token prefill of the offline model:
    ~10 s emulated in bfloat16, ~2 s so, on an AVX2-only CPU); otherwise a `Dense` in `dtype`."""
    if dtype in (torch.bfloat16, torch.float16) and w.device.type == "cpu" and not cpu_has_native_bf16():
        dense = Dense(w, torch.float32)
        return lambda x: dense(x.float()).to(dtype)
    return Dense(w, dtype)


class Dense:
    """w [N, K] rounded to `dtype`; `packed` is the oneDNN copy when there is one (then `weight` is None)."""

    def __init__(self, w: torch.Tensor, dtype: torch.dtype, bias: torch.Tensor | None = None):
        self.weight, self.bias, self.packed = w.to(dtype), bias, None
        if w.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16) and torch.backends.mkldnn.is_available():
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, 1)
                self.weight = None
            except (RuntimeError, AttributeError):
                self.packed = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
