"""The lean forward's decode and verify steps with their layer loop run by TorchScript's interpreter, not Python.

A one-token step of a 135M model on two CPU cores is ~60 small ATen calls a layer around 4 matrix products; from
Python each call pays ~1-2 us of argument parsing and dispatch, a third of the int4 step. `decode_layers` makes the
very same calls, in the same order and with the same arguments as `LeanLlama.forward` (RMSNorm in float32 as
sum / d, rotary with a signed sine, the fused products, SDPA in one call or row by row as `RowKeys`), so a step's
logits and hidden states are bit for bit the Python loop's (`tests/test_lean.py` checks it on tiny and real models,
in every format). TorchScript does not fuse on CPU (its fuser is off there by default and is not turned on here):
no op changes its arithmetic.

TorchScript is deprecated upstream in favour of `torch.compile`, which measured slower here
(torch.compile measured 0.36-0.71x eager on this step). `ScriptedStep.make` returns None where scripting
fails, and the Python loop runs; `SWITCHSD_SCRIPTED=0` turns it off.
"""
from __future__ import annotations

import warnings
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from .. import envs

INT4, PACKED, DENSE = 0, 1, 2            # how a layer's matrix is multiplied (`_product`)


def _product(x: torch.Tensor, kind: int, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    """x [T, K] -> [T, N]: the int4 kernel (w packed codes, b scales and zeros), oneDNN over a packed 16-bit
    matrix, or F.linear; the same call as Int4Linear / lean._Linear make for T rows."""
    if kind == 0:                                   # INT4 (TorchScript reads no module constants)
        assert b is not None
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), w, 32, b)
    if kind == 1:                                   # PACKED
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    return F.linear(x, w, b)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm arithmetic (normalise in float32, round, then scale), its mean as sum / d (what `mean`
    does on CPU): bit for bit the seven-op form and F.rms_norm, half the time of F.rms_norm's CPU composite."""
    h = x.to(torch.float32)
    r = (h * h).sum(-1, keepdim=True).div_(h.size(-1)).add_(eps).rsqrt_()
    return w * (h * r).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding with a signed sine (lean._rotary's tables): transformers' x cos + rotate_half(x) sin."""
    return x * cos + torch.roll(x, x.size(-1) // 2, dims=-1) * sin_signed


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: Optional[torch.Tensor], causal: bool,
            scale: float, gqa: bool, start: int, row_n: List[int], row_idx: List[Optional[torch.Tensor]],
            exact: int) -> torch.Tensor:
    """q [1, H, T, hd] over keys/values [1, KV, S, hd]: one SDPA call, or (row_n non-empty) `lean.RowKeys.attend`'s
    calls row by row (row j over the cached prefix and its first row_n[j] rows, or the rows row_idx[j])."""
    if len(row_n) == 0:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal and mask is None,
                                              scale=scale, enable_gqa=gqa)
    out: List[torch.Tensor] = []
    for j in range(len(row_n)):
        idx = row_idx[j]
        if idx is None:
            k, v = keys[:, :, :start + row_n[j]], values[:, :, :start + row_n[j]]
        else:
            k = torch.cat([keys[:, :, :start], keys.index_select(2, idx)], dim=2)
            v = torch.cat([values[:, :, :start], values.index_select(2, idx)], dim=2)
        out.append(F.scaled_dot_product_attention(q[:, :, j:j + 1], k, v, scale=scale, enable_gqa=gqa))
    if exact < q.size(2):
        m = mask
        if m is not None:
            m = m[:, :, exact:]
        out.append(F.scaled_dot_product_attention(q[:, :, exact:], keys, values, attn_mask=m, scale=scale,
                                                  enable_gqa=gqa))
    return torch.cat(out, dim=2)


def decode_layers(x: torch.Tensor, norms: List[torch.Tensor], kinds: List[int], ws: List[torch.Tensor],
                  bs: List[Optional[torch.Tensor]], K: List[torch.Tensor], V: List[torch.Tensor], cos: torch.Tensor,
                  sin: torch.Tensor, start: int, H: int, KV: int, hd: int, eps: float, scale: float, gqa: bool,
                  want: List[bool], mask: Optional[torch.Tensor], causal: bool, row_n: List[int],
                  row_idx: List[Optional[torch.Tensor]], exact: int, qk_norms: List[torch.Tensor]
                  ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Every decoder layer for the rows x [T, d] at positions start..start+T. Per layer i: norms [2i, 2i+1];
    matrices 4i.. (q|k|v, o, gate|up, down) as (kinds, ws, bs); K[i], V[i] [KV, capacity, hd], written at the
    rows' positions; cos, sin [T, 1, hd]; attention as `_attend`. Returns x and the residual streams where
    want[2i] (after attention) or want[2i+1] (after the MLP), in layer order."""
    T = x.size(0)
    end = start + T
    captured: List[torch.Tensor] = []
    for i in range(len(K)):
        j = 4 * i
        heads = _product(_rms(x, norms[2 * i], eps), kinds[j], ws[j], bs[j]).view(T, H + 2 * KV, hd)
        if len(qk_norms) > 0:                             # Qwen3: each q and k head RMS-normed (LeanLlama.qk_normed)
            qk = torch.cat([_rms(heads[:, :H], qk_norms[2 * i], eps), _rms(heads[:, H:H + KV], qk_norms[2 * i + 1], eps)],
                           -2)
        else:
            qk = heads[:, :H + KV]
        qk = _rotate(qk, cos, sin)
        Ki, Vi = K[i], V[i]                               # in the attention dtype (`dense.attention_dtype`)
        q = qk[:, :H].transpose(0, 1)[None].to(Ki.dtype)                                  # [1, H, T, hd]
        Ki[:, start:end] = qk[:, H:].transpose(0, 1)
        Vi[:, start:end] = heads[:, H + KV:].transpose(0, 1)
        att = _attend(q, Ki[None, :, :end], Vi[None, :, :end], mask, causal and T > 1, scale, gqa, start, row_n,
                      row_idx, exact)
        x = x + _product(att.to(x.dtype).transpose(1, 2).reshape(T, H * hd), kinds[j + 1], ws[j + 1], bs[j + 1])
        if want[2 * i]:
            captured.append(x)
        g, u = _product(_rms(x, norms[2 * i + 1], eps), kinds[j + 2], ws[j + 2], bs[j + 2]).chunk(2, dim=-1)
        x = x + _product(F.silu(g) * u, kinds[j + 3], ws[j + 3], bs[j + 3])
        if want[2 * i + 1]:
            captured.append(x)
    return x, captured


_SCRIPT: list = []                        # [the scripted decode_layers or None], made once per process


def _scripted():
    if not _SCRIPT:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)     # torch.jit.script's notice
                _SCRIPT.append(torch.jit.script(decode_layers))
        except Exception as e:                                          # noqa: BLE001 (any scripting failure)
            warnings.warn(f"TorchScript unavailable ({type(e).__name__}: {e}); the lean step runs in Python")
            _SCRIPT.append(None)
    return _SCRIPT[0]


class ScriptedStep:
    """A lean forward's weights laid out for `decode_layers` (the scripted function itself is module state)."""

    def __init__(self, norms, kinds, ws, bs, most_rows: int):
        self.norms, self.kinds, self.ws, self.bs = norms, kinds, ws, bs      # no function kept: deepcopy-able
        self.most_rows = most_rows          # wider forwards (prefills) take other products: the Python loop

    @staticmethod
    def _matrix(lin) -> tuple[int, torch.Tensor, torch.Tensor | None, int] | None:
        """(kind, w, b, most rows) of a fused product: the rows up to which the Python loop takes this very product;
        None when it would not take it even for one row."""
        from .int4 import Int4Linear
        if isinstance(lin, Int4Linear):
            return (INT4, lin.packed, lin.sz, lin.wide_rows) if lin.wide_rows >= 1 else None
        if getattr(lin, "exact_rows", 0) < 1:
            return None
        w = lin.packed if lin.packed is not None else lin.weight
        return (PACKED if lin.packed is not None else DENSE, w, lin.bias, lin.exact_rows)

    @classmethod
    def make(cls, lean) -> "ScriptedStep | None":
        """For a CPU lean forward whose every matrix takes its fast product at one row; None otherwise, or when
        TorchScript is unavailable (a warning says why) or turned off."""
        if not envs.get("SWITCHSD_SCRIPTED") or lean.device.type != "cpu":
            return None
        mats = [cls._matrix(lin) for layer in lean.layers for lin in (layer[1], layer[2], layer[4], layer[5])]
        if any(m is None for m in mats):
            return None
        if _scripted() is None:
            return None
        norms = [t for layer in lean.layers for t in (layer[0], layer[3])]
        return cls(norms, [m[0] for m in mats], [m[1] for m in mats], [m[2] for m in mats],
                   min(m[3] for m in mats))

    def __call__(self, lean, x: torch.Tensor, cache, start: int, cos: torch.Tensor, sin: torch.Tensor,
                 want: list[bool], mask: torch.Tensor | None, rows) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """x [T, d]; cache a StaticKVCache with room for start + T; cos, sin [T, 1, hd]; `rows` a lean.RowKeys or
        None (one call: additive `mask`, else causal)."""
        row_n, row_idx = (rows.row_n, rows.row_idx) if rows is not None else ([], [])
        return _SCRIPT[0](x, self.norms, self.kinds, self.ws, self.bs, list(cache.k[:, 0].unbind(0)),
                       list(cache.v[:, 0].unbind(0)), cos, sin, start, lean.heads, lean.kv_heads, lean.head_dim,
                       float(lean.eps), float(lean.scale), lean.groups > 1, want, mask, True, row_n, row_idx,
                       rows.exact if rows is not None else 0, lean.qk_norms)
