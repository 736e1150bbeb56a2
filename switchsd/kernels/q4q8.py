"""Q4_1 weights x Q8 activations on CPU: a batch-invariant product whose verify rows share the weight work.

    lin = Q4Q8Linear(codes, dw, mw)      # codes uint8 [N, K] (0..15); dw, mw float16 [N, K/32]: w = dw * q + mw
    y = lin(x)                           # x float32 [R, K] -> y float32 [R, N]; row r equals lin(x[r:r+1]) bit for bit

The arithmetic (llama.cpp's for Q4_1 x Q8_1, float32 scales) is spelled out in q4q8.c and, in numpy, in
`reference`; `tests/test_kernels.py` checks the kernel against it bit for bit.
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch

from .build import load

QK = 32
GROUP_COLS = 8
BLOCK_BYTES = QK * GROUP_COLS // 2 + 2 * GROUP_COLS * 2
# vnni: AVX-512 VNNI (vpdpbusd on 256-bit vectors); vnni512: on 512-bit ones (qx.c's kernels; the others take vnni)
PATHS = {"auto": 0, "portable": 1, "avx2": 2, "vnni": 3, "vnni512": 4, "amx": 5}
PATH_NAMES = {1: "portable", 2: "avx2", 3: "vnni", 4: "vnni512", 5: "amx"}

_P = ctypes.c_void_p
_I = ctypes.c_int64


def _lib() -> ctypes.CDLL:
    lib = load("q4q8")
    if not getattr(lib, "_typed", False):
        lib.q4q8_pack.argtypes = [_P, _P, _P, _I, _I, _P]
        lib.q4q8_matmul.argtypes = [_P, _P, _I, _I, _I, _P, ctypes.c_int]
        lib.q4q8_matmul.restype = ctypes.c_int
        lib.q4q8_best_path.restype = ctypes.c_int
        lib.q8_pack.argtypes = [_P, _P, _I, _I, _P]
        lib.q8_matmul.argtypes = [_P, _P, _I, _I, _I, _P, ctypes.c_int]
        lib.q8_matmul.restype = ctypes.c_int
        lib.q4q8_path_ok.argtypes = [ctypes.c_int]
        lib.q4q8_path_ok.restype = ctypes.c_int
        lib._typed = True
    return lib


def best_path() -> str:
    return PATH_NAMES[_lib().q4q8_best_path()]


def available_paths() -> list[str]:
    """The paths this CPU runs, portable first (all return the same bits)."""
    return [name for code, name in PATH_NAMES.items() if _lib().q4q8_path_ok(code)]


def check_path(path: str) -> int:
    """The C code of path `path`, or ValueError naming what this CPU offers."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {sorted(PATHS)}, got {path!r}")
    if path != "auto" and path not in available_paths():
        raise ValueError(f"this CPU lacks the {path!r} path; it has {available_paths()}")
    return PATHS[path]


def _apply(lin, matmul, x: torch.Tensor) -> torch.Tensor:
    """x [..., K] (any float dtype) -> [..., N] float32 through the C product `matmul` over `lin.packed`."""
    if x.shape[-1] != lin.in_features:
        raise ValueError(f"expected [..., {lin.in_features}], got {tuple(x.shape)}")
    rows = x.numel() // lin.in_features
    if rows == 0:
        raise ValueError(f"no rows to multiply: got {tuple(x.shape)}")
    x2 = x.reshape(rows, lin.in_features).float().contiguous()     # a strided view is copied, not misread
    if not torch.isfinite(x2).all():        # a NaN has no 8-bit block: it would come back as arbitrary numbers
        raise ValueError("the activations hold NaN or inf")
    y = torch.empty(rows, lin.out_features, dtype=torch.float32)
    if matmul(lin.packed.data_ptr(), x2.data_ptr(), rows, lin.out_features, lin.in_features, y.data_ptr(),
              lin.path) < 0:
        raise MemoryError("out of memory for the activations' 8-bit blocks")
    return y.view(*x.shape[:-1], lin.out_features)


class Q4Q8Linear:
    """y = x W^T with W in Q4_1 blocks (w = dw * q + mw per 32 along K), activations quantised to Q8 per row."""

    def __init__(self, codes: torch.Tensor, dw: torch.Tensor, mw: torch.Tensor, path: str = "auto"):
        n, k = codes.shape
        if k % QK or n % GROUP_COLS:
            raise ValueError(f"q4q8 needs in_features % {QK} == 0 and out_features % {GROUP_COLS} == 0, got [{n}, {k}]")
        if dw.shape != (n, k // QK) or mw.shape != (n, k // QK):
            raise ValueError(f"scales must be [{n}, {k // QK}], got {tuple(dw.shape)} and {tuple(mw.shape)}")
        self.in_features, self.out_features, self.path = k, n, check_path(path)
        self.codes, self.dw, self.mw = codes.to(torch.uint8).contiguous(), dw.half().contiguous(), mw.half().contiguous()
        self.packed = torch.empty(n // GROUP_COLS * (k // QK) * BLOCK_BYTES, dtype=torch.uint8)
        _lib().q4q8_pack(self.codes.data_ptr(), self.dw.data_ptr(), self.mw.data_ptr(), n, k, self.packed.data_ptr())
        self.lib = _lib()

    @classmethod
    def quantize(cls, weight: torch.Tensor, path: str = "auto") -> "Q4Q8Linear":
        """A float matrix [N, K] to Q4_1 blocks (llama.cpp's: per 32 along K, d = (max - min) / 15, m = min,
        q = min(15, trunc((w - min) / d + 0.5)); d and m stored as float16)."""
        w = weight.detach().float().reshape(weight.shape[0], -1, QK)
        lo, hi = w.amin(-1), w.amax(-1)                                              # [N, K/32]
        d = (hi - lo) / 15
        inv = torch.where(d > 0, 1 / d.clamp_min(1e-30), 0)
        q = ((w - lo[..., None]) * inv[..., None] + 0.5).trunc().clamp(0, 15)
        return cls(q.to(torch.uint8).reshape(weight.shape), d.half(), lo.half(), path)

    @classmethod
    def fuse(cls, parts: list["Q4Q8Linear"]) -> "Q4Q8Linear":
        """One matrix [W1; W2; ...] (e.g. q|k|v): outputs stacked; each output's arithmetic unchanged."""
        return cls(torch.cat([p.codes for p in parts]), torch.cat([p.dw for p in parts]),
                   torch.cat([p.mw for p in parts]), next(k for k, v in PATHS.items() if v == parts[0].path))

    def dequantized(self) -> torch.Tensor:
        """W [N, K] float32 (dw * q + mw, as the GGUF de-quantiser gives it)."""
        nb = self.in_features // QK
        return (self.dw.float().repeat_interleave(QK, 1) * self.codes.float()
                + self.mw.float().repeat_interleave(QK, 1)).reshape(self.out_features, nb * QK)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:                      # [..., K] -> [..., N] float32
        return _apply(self, self.lib.q4q8_matmul, x)


class Q8Linear:
    """y = x W^T with W in Q8_0 blocks (w = dw * q, q int8 in -127..127, per 32 along K), activations quantised to Q8
    per row: per output, blocks in order, acc = acc + (dw * dx) * sum(q * q8)."""

    def __init__(self, codes: torch.Tensor, dw: torch.Tensor, path: str = "auto"):
        n, k = codes.shape
        if k % QK or n % GROUP_COLS:
            raise ValueError(f"q8 needs in_features % {QK} == 0 and out_features % {GROUP_COLS} == 0, got [{n}, {k}]")
        if dw.shape != (n, k // QK):
            raise ValueError(f"scales must be [{n}, {k // QK}], got {tuple(dw.shape)}")
        if int(codes.min()) < -127:
            raise ValueError("Q8_0 codes must lie in -127..127")
        self.in_features, self.out_features, self.path = k, n, check_path(path)
        self.codes, self.dw = codes.to(torch.int8).contiguous(), dw.half().contiguous()
        self.packed = torch.empty(n // GROUP_COLS * (k // QK) * (QK * GROUP_COLS + 2 * GROUP_COLS), dtype=torch.uint8)
        self.lib = _lib()
        self.lib.q8_pack(self.codes.data_ptr(), self.dw.data_ptr(), n, k, self.packed.data_ptr())

    @classmethod
    def quantize(cls, weight: torch.Tensor, path: str = "auto") -> "Q8Linear":
        """A float matrix [N, K] to Q8_0 blocks (llama.cpp's: d = max |w| / 127 per 32 along K, q = round(w / d))."""
        w = weight.detach().float().reshape(weight.shape[0], -1, QK)
        d = w.abs().amax(-1) / 127                                                   # [N, K/32]
        q = torch.where(d[..., None] > 0, w / d[..., None].clamp_min(1e-30), 0).round().clamp(-127, 127)
        return cls(q.to(torch.int8).reshape(weight.shape), d.half(), path)

    @classmethod
    def fuse(cls, parts: list["Q8Linear"]) -> "Q8Linear":
        """One matrix [W1; W2; ...]: outputs stacked; each output's arithmetic unchanged."""
        return cls(torch.cat([p.codes for p in parts]), torch.cat([p.dw for p in parts]),
                   next(k for k, v in PATHS.items() if v == parts[0].path))

    def dequantized(self) -> torch.Tensor:
        return self.dw.float().repeat_interleave(QK, 1) * self.codes.float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:                      # [..., K] -> [..., N] float32
        return _apply(self, self.lib.q8_matmul, x)


def q8_reference(codes: np.ndarray, dw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Q8Linear's arithmetic in numpy: y float32 [R, N]."""
    n, k = codes.shape
    nb = k // QK
    q8, dx, _ = quantize_reference(x)
    isum = np.einsum("nbk,rbk->rnb", codes.reshape(n, nb, QK).astype(np.int32), q8.reshape(-1, nb, QK).astype(np.int32))
    dw = dw.astype(np.float32)
    acc = np.zeros((x.shape[0], n), dtype=np.float32)
    for b in range(nb):
        acc = acc + (dw[None, :, b] * dx[:, None, b]) * isum[:, :, b].astype(np.float32)
    return acc


def gguf_q8_blocks(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF Q8_0 blocks of an [N, K] matrix -> codes int8 [N, K], dw float16 [N, K/32] (w = dw * q)."""
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, 34)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    codes = blocks[..., 2:].copy().view(np.int8).reshape(n, -1)
    return torch.from_numpy(codes.copy()), torch.from_numpy(d.copy())


def quantize_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x float32 [R, K] -> q8 int8 [R, K], dx, sx float32 [R, K/32], in numpy's float32 arithmetic."""
    r, k = x.shape
    xb = x.astype(np.float32).reshape(r, k // QK, QK)
    d = np.abs(xb).max(-1) / np.float32(127)                                      # [R, nb]
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(xb * inv[..., None]), -127, 127).astype(np.int8)         # round half to even, as rintf
    sx = (d * q.astype(np.int32).sum(-1).astype(np.float32)).astype(np.float32)
    return q.reshape(r, k), d.astype(np.float32), sx


def reference(codes: np.ndarray, dw: np.ndarray, mw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The kernel's arithmetic in numpy (float32 operations, one rounding each): y float32 [R, N]."""
    n, k = codes.shape
    nb = k // QK
    q8, dx, sx = quantize_reference(x)
    isum = np.einsum("nbk,rbk->rnb", codes.reshape(n, nb, QK).astype(np.int32),
                     q8.reshape(-1, nb, QK).astype(np.int32))                    # [R, N, nb], exact
    dw, mw = dw.astype(np.float32), mw.astype(np.float32)
    acc = np.zeros((x.shape[0], n), dtype=np.float32)
    for b in range(nb):
        acc = acc + (dw[None, :, b] * dx[:, None, b]) * isum[:, :, b].astype(np.float32)
        acc = acc + mw[None, :, b] * sx[:, None, b]
    return acc


def gguf_blocks(raw: np.ndarray, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GGUF Q4_1 / Q4_0 blocks of an [N, K] matrix (raw uint8 [N, K/32 * block bytes]) -> codes uint8 [N, K],
    dw, mw float16 [N, K/32] with w = dw * q + mw (Q4_0: mw = -8 d). Read by `int4.q4_groups` (scale d and zero
    m + 8d, both exact in float32), so zero - 8 d is m exactly."""
    from ..models.int4 import q4_groups
    codes, d, zero = q4_groups(raw, kind)
    return codes, d.half(), (zero - 8 * d).half()
