"""y = x W^T (+ b) over a weight packed once for oneDNN on CPU in 16-bit floats.

On CPUs in bfloat16 / float16, `F.linear` repacks its weight on every call; `mkldnn._linear_pointwise` over a
weight reordered once (`mkldnn._reorder_linear_weight`) is ~2x faster for decode-sized inputs. float32 (and any
other device) keeps `F.linear`: MKL's one-row path is already at the memory floor.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


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
