"""The GGUF block types past Q4_0 / Q4_1 (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) x Q8 activations on CPU, batch-invariant.

    lin = gguf_linear(raw, "Q6_K")       # raw: the GGUF tensor's bytes [N, row bytes] -> a linear of the right kind
    y = lin(x)                           # x float32 [R, K] -> y [R, N]; row r equals lin(x[r:r+1]) bit for bit

Every type is read exactly as unsigned codes with float32 scales (w = dw * (code - off) [+ mw]): `decode` here,
`dequantized` equals gguf-py's de-quantisation bit for bit. The product's arithmetic is spelled out in qx.c and, in
numpy, in `reference`; tests/test_qx.py checks both. Q4_0 / Q4_1 run q4q8.c's kernel, Q8_0 its 8-bit one.
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch

from .build import load
from .q4q8 import PATHS, QK, Q4Q8Linear, Q8Linear, _apply, check_path, gguf_blocks, gguf_q8_blocks, quantize_reference

HIGH, SUB16, MINS, SUPER, BYTES = 1, 2, 4, 8, 16
# type -> (kind: flags | offset << 8, bytes per block, weights per block); Q5_0 / Q5_1 codes as whole bytes
TYPES = {"Q5_0": (HIGH | BYTES | 16 << 8, 22, 32), "Q5_1": (HIGH | MINS | BYTES, 24, 32), "Q4_K": (MINS | SUPER, 144, 256),
         "Q5_K": (HIGH | MINS | SUPER, 176, 256), "Q6_K": (HIGH | SUB16 | SUPER | 32 << 8, 210, 256)}
# every block type the C forward reads (F16 / BF16: an f16 file's matrices as they are, float32 activations)
READABLE = ("Q4_0", "Q4_1", "Q8_0", *TYPES, "F16", "BF16")
_P, _I = ctypes.c_void_p, ctypes.c_int64


def _lib() -> ctypes.CDLL:
    lib = load("qx")
    if not getattr(lib, "_typed", False):
        lib.qx_pack.argtypes = [_P, _P, _P, _P, _P, _P, _P, _I, _I, ctypes.c_int, _P]
        lib.qx_packed_bytes.argtypes = [_I, _I, ctypes.c_int]
        lib.qx_packed_bytes.restype = _I
        lib.qx_matmul.argtypes = [_P, ctypes.c_int, _P, _I, _I, _I, _P, ctypes.c_int]
        lib.qx_matmul.restype = ctypes.c_int
        lib.f16_pack.argtypes = [_P, _I, _I, _P]
        lib.f16_matmul.argtypes = [_P, ctypes.c_int, _P, _I, _I, _I, _P, ctypes.c_int]
        lib.f16_matmul.restype = ctypes.c_int
        lib._typed = True
    return lib


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 packed bytes [..., 12] -> 8 six-bit scales and 8 mins (llama.cpp's get_scale_min_k4)."""
    s = scales.astype(np.uint8)
    d, m, mh = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([d & 63, (mh & 0x0F) | ((d >> 6) << 4)], -1)
    mn = np.concatenate([m & 63, (mh >> 4) | ((m >> 6) << 4)], -1)
    return sc, mn


def decode(raw: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """GGUF blocks of an [N, K] matrix (raw uint8 [N, row bytes]) -> codes uint8 [N, K], dw float32 [N, K / sub],
    mw float32 [N, K / 32] or None, with w = dw * (code - off) + mw exactly."""
    b = blocks(raw, kind)
    return b["codes"], b["dw"], b["mw"]


def blocks(raw: np.ndarray, kind: str) -> dict:
    """`decode`'s codes, dw and mw, and the scales as the file holds them (what the kernel stores): Q5_0 / Q5_1
    dw16, mw16 (float16); the K types d, dmin (float16 [N, K / 256]), sc (int8 or uint8 [N, K / sub]), m (uint8)."""
    flags, size, per = TYPES[kind]
    n = raw.shape[0]
    b = np.ascontiguousarray(raw).reshape(n, -1, size)                          # [N, blocks, bytes]
    nb = b.shape[1]
    f16 = lambda x: np.ascontiguousarray(x).view(np.float16)[..., 0]          # noqa: E731
    if kind in ("Q5_0", "Q5_1"):
        at = 2 if kind == "Q5_0" else 4
        qh = b[..., at:at + 4].copy().view(np.uint32)                            # [N, nb, 1]
        qs = b[..., at + 4:]
        low = np.concatenate([qs & 0x0F, qs >> 4], -1)                           # [N, nb, 32]
        high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        dw16, mw16 = f16(b[..., 0:2]), f16(b[..., 2:4]) if kind == "Q5_1" else None
        return {"codes": (low | (high << 4)).reshape(n, -1), "dw": dw16.astype(np.float32), "dw16": dw16,
                "mw": None if mw16 is None else mw16.astype(np.float32), "mw16": mw16}
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = f16(b[..., 0:2]), f16(b[..., 2:4])                             # [N, nb]
        sc, mn = _scale_min_k4(b[..., 4:16])                                     # [N, nb, 8]
        qs = b[..., -128:].reshape(n, nb, 4, 32)
        codes = np.stack([qs & 0x0F, qs >> 4], 3).reshape(n, nb, 8, 32)          # sub-block 2c: low, 2c + 1: high
        if kind == "Q5_K":
            qh = b[..., 16:48]                                                   # [N, nb, 32]: bit i for sub-block i
            codes = codes | (((qh[:, :, None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1) << 4)
        dw = (d.astype(np.float32)[..., None] * sc.astype(np.float32)).reshape(n, -1)
        mw = -(dmin.astype(np.float32)[..., None] * mn.astype(np.float32)).reshape(n, -1)
        return {"codes": codes.reshape(n, -1).astype(np.uint8), "dw": dw, "mw": mw, "d": d, "dmin": dmin,
                "sc": sc.reshape(n, -1).astype(np.uint8), "m": mn.reshape(n, -1).astype(np.uint8)}
    if kind == "Q6_K":
        ql, qh = b[..., 0:128].reshape(n, nb, 2, 1, 64), b[..., 128:192].reshape(n, nb, 2, 1, 32)
        sc = b[..., 192:208].copy().view(np.int8)                                # [N, nb, 16]
        d = f16(b[..., 208:210])
        low = ((ql >> np.array([0, 4], np.uint8)[:, None]) & 0x0F).reshape(n, nb, 8, 32)
        high = ((qh >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3).reshape(n, nb, 8, 32)
        codes = (low | (high << 4)).reshape(n, -1)
        dw = (d.astype(np.float32)[..., None] * sc.astype(np.float32)).reshape(n, -1)
        return {"codes": codes.astype(np.uint8), "dw": dw, "mw": None, "d": d, "dmin": None,
                "sc": sc.reshape(n, -1), "m": None}
    raise ValueError(f"unknown block type {kind}")


# bytes a block, weights a block, where its float16 scales sit; the scales' order (random_blocks)
BLOCKS = {"Q4_0": (18, 32, [0]), "Q4_1": (20, 32, [0, 2]), "Q5_0": (22, 32, [0]), "Q5_1": (24, 32, [0, 2]),
          "Q8_0": (34, 32, [0]), "Q4_K": (144, 256, [0, 2]), "Q5_K": (176, 256, [0, 2]), "Q6_K": (210, 256, [208])}
SCALE = {"Q4_0": 2e-2, "Q4_1": 2e-2, "Q5_0": 1e-2, "Q5_1": 1e-2, "Q8_0": 2e-3, "Q4_K": 1e-3, "Q5_K": 5e-4,
         "Q6_K": 2e-4}


def random_blocks(kind: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid GGUF blocks of `kind` for an [n, k] matrix (raw uint8 [n, row bytes]), weights of order 0.1: the
    tests' and the AMX self-test's matrices."""
    size, per, halves = BLOCKS[kind]
    b = rng.integers(0, 256, size=(n, k // per, size), dtype=np.uint8)
    for at in halves:
        d = (rng.uniform(0.5, 1.0, size=(n, k // per)) * SCALE[kind]).astype(np.float16)
        if kind in ("Q4_1", "Q5_1") and at == 2:
            d = -d * 8                                   # the min: centre the weights
        if kind in ("Q4_K", "Q5_K") and at == 2:
            d = d * 0.25                                 # dmin * m: about half the codes' range (centred)
        b[..., at:at + 2] = d.view(np.uint8).reshape(n, k // per, 2)
    if kind == "Q8_0":
        b[..., 2:] = np.where(b[..., 2:] == 128, 129, b[..., 2:])
    return b.reshape(n, -1)


def sub_size(kind: int) -> int:
    return 16 if kind & SUB16 else 32


def dequantize(codes: np.ndarray, dw: np.ndarray, mw: np.ndarray | None, kind: int) -> np.ndarray:
    """W float32 [N, K] from a decoded matrix (the GGUF's values exactly)."""
    n, k = codes.shape
    sub = sub_size(kind)
    w = dw.astype(np.float32).repeat(sub, 1) * (codes.astype(np.float32) - np.float32(kind >> 8))
    return w + mw.astype(np.float32).repeat(QK, 1) if mw is not None else w


def reference(codes: np.ndarray, dw: np.ndarray, mw: np.ndarray | None, kind: int, x: np.ndarray) -> np.ndarray:
    """qx.c's arithmetic in numpy (float32 operations, one rounding each): y float32 [R, N]."""
    n, k = codes.shape
    nb, sub, off = k // QK, sub_size(kind), kind >> 8
    q8, dx, sx = quantize_reference(x)
    qs = q8.reshape(-1, k // sub, sub).astype(np.int64).sum(-1)                 # [R, K / sub]
    isum = np.einsum("njs,rjs->rnj", codes.reshape(n, k // sub, sub).astype(np.int64),
                     q8.reshape(-1, k // sub, sub).astype(np.int64)) - off * qs[:, None, :]
    dw = dw.astype(np.float32)
    acc = np.zeros((x.shape[0], n), dtype=np.float32)
    per = QK // sub
    for b in range(nb):
        for j in range(per):
            acc = acc + (dw[None, :, b * per + j] * dx[:, None, b]) * isum[:, :, b * per + j].astype(np.float32)
        if mw is not None:
            acc = acc + mw.astype(np.float32)[None, :, b] * sx[:, None, b]
    return acc


class QxLinear:
    """y = x W^T with W as codes and scales (`blocks`), activations quantised to Q8 per row."""

    def __init__(self, b: dict, kind: int, path: str = "auto"):
        """b: `blocks`' dict (numpy arrays or tensors)."""
        t = {k: None if v is None else torch.as_tensor(np.ascontiguousarray(v)) for k, v in b.items()}
        n, k = t["codes"].shape
        if k % (256 if kind & SUPER else QK) or n % 8:
            raise ValueError(f"qx needs in_features % {256 if kind & SUPER else QK} == 0 and out_features % 8 == 0, "
                             f"got [{n}, {k}]")
        if t["dw"].shape != (n, k // sub_size(kind)) or (t["mw"] is not None) != bool(kind & MINS):
            raise ValueError(f"scales must be [{n}, {k // sub_size(kind)}] (and mins exactly when the kind has them)")
        if kind & MINS and kind >> 8:
            raise ValueError("a kind with mins has no code offset")
        self.in_features, self.out_features, self.kind, self.path = k, n, kind, check_path(path)
        self.b = t
        self.codes, self.dw, self.mw = t["codes"], t["dw"].float(), None if t["mw"] is None else t["mw"].float()
        self.lib = _lib()
        self.packed = torch.empty(self.lib.qx_packed_bytes(n, k, kind), dtype=torch.uint8)
        ptr = lambda name: 0 if t.get(name) is None else t[name].data_ptr()           # noqa: E731
        self.lib.qx_pack(ptr("codes"), ptr("dw16"), ptr("mw16"), ptr("d"), ptr("sc"), ptr("dmin"), ptr("m"),
                         n, k, kind, self.packed.data_ptr())

    @classmethod
    def fuse(cls, parts: list["QxLinear"]) -> "QxLinear":
        """One matrix [W1; W2; ...] of one kind: outputs stacked; each output's arithmetic unchanged."""
        keys = parts[0].b.keys()
        b = {k: None if parts[0].b[k] is None else torch.cat([p.b[k] for p in parts]) for k in keys}
        return cls(b, parts[0].kind, next(k for k, v in PATHS.items() if v == parts[0].path))

    def dequantized(self) -> torch.Tensor:
        return torch.from_numpy(dequantize(self.codes.numpy(), self.dw.numpy(),
                                           None if self.mw is None else self.mw.numpy(), self.kind))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:                      # [..., K] -> [..., N] float32
        return _apply(self, lambda w, xp, r, n, k, y, path: self.lib.qx_matmul(w, self.kind, xp, r, n, k, y, path), x)


class F16Linear:
    """y = x W^T with W as the file's float16 (or bfloat16) values and float32 activations: per output, k in
    order, acc = acc + float(w) * x (`f16_reference`), the same for any number of rows."""

    def __init__(self, bits, bf16: bool = False, path: str = "auto"):
        bits = (bits if isinstance(bits, torch.Tensor) else torch.from_numpy(np.array(bits))).view(torch.int16)
        n, k = bits.shape
        if n % 16:
            raise ValueError(f"an F16 matrix needs out_features % 16 == 0, got [{n}, {k}]")
        self.in_features, self.out_features, self.bf16, self.path = k, n, bool(bf16), check_path(path)
        self.bits = bits.contiguous()
        self.lib = _lib()
        self.packed = torch.empty(n * k, dtype=torch.int16)
        self.lib.f16_pack(self.bits.data_ptr(), n, k, self.packed.data_ptr())

    @classmethod
    def fuse(cls, parts: list["F16Linear"]) -> "F16Linear":
        return cls(torch.cat([p.bits for p in parts]), parts[0].bf16,
                   next(k for k, v in PATHS.items() if v == parts[0].path))

    @property
    def kind(self) -> int:
        return -4 if self.bf16 else -3

    def dequantized(self) -> torch.Tensor:
        return self.bits.view(torch.bfloat16 if self.bf16 else torch.float16).float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:                      # [..., K] -> [..., N] float32
        return _apply(self, lambda w, xp, r, n, k, y, path: self.lib.f16_matmul(w, int(self.bf16), xp, r, n, k, y,
                                                                                path), x)


def f16_reference(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """F16Linear's arithmetic in numpy: w float32 [N, K] (the file's values), x float32 [R, K] -> [R, N]."""
    acc = np.zeros((x.shape[0], w.shape[0]), dtype=np.float32)
    for j in range(w.shape[1]):
        acc = acc + (w[None, :, j] * x[:, None, j]).astype(np.float32)
    return acc


Linear = Q4Q8Linear | Q8Linear | QxLinear | F16Linear


def bytes_layout() -> bool:
    """Whether K-type codes are kept as whole bytes (SWITCHSD_QX_BYTES=1). Off by default: measured here on a matrix
    held in the cache, bytes made Q4_K's one-row product slower and its 8-row one no faster, Q6_K's 8-row one
    faster and its one-row one slower; a model read from DRAM pays for every extra bit."""
    from .. import envs
    return bool(envs.get("SWITCHSD_QX_BYTES"))


def gguf_linear(raw: np.ndarray, kind: str, path: str = "auto", as_bytes: bool = False) -> Linear:
    """A GGUF matrix's blocks (raw uint8 [N, row bytes]) as the product that reads its type exactly (`as_bytes`: a
    K type's codes as whole bytes)."""
    if kind in ("Q4_0", "Q4_1"):
        return Q4Q8Linear(*gguf_blocks(raw, kind), path)
    if kind == "Q8_0":
        return Q8Linear(*gguf_q8_blocks(raw), path)
    if kind in TYPES:
        flags = TYPES[kind][0] | (BYTES if as_bytes and TYPES[kind][0] & SUPER else 0)
        return QxLinear(blocks(raw, kind), flags, path)
    if kind in ("F16", "BF16"):
        return F16Linear(np.ascontiguousarray(raw).view(np.uint16), kind == "BF16", path)
    raise ValueError(f"block type {kind} (the C forward reads {', '.join(READABLE)})")


def same_kind(a: Linear, b: Linear) -> bool:
    return type(a) is type(b) and getattr(a, "kind", None) == getattr(b, "kind", None)


def release(lin: Linear) -> None:
    """Drop a built linear's unpacked copies (codes, scales, 16-bit values): its product reads `packed` alone.
    For a model's matrices once fused; `dequantized` and `fuse` need the copies."""
    for name in ("b", "codes", "dw", "mw", "bits"):
        if hasattr(lin, name):
            setattr(lin, name, None)


def fuse(parts: list[Linear]) -> list[Linear]:
    """Consecutive parts of one kind fused into one matrix (q|k|v, gate|up); parts of other kinds kept apart."""
    out: list[list[Linear]] = []
    for p in parts:
        if out and same_kind(out[-1][-1], p):
            out[-1].append(p)
        else:
            out.append([p])
    return [g[0] if len(g) == 1 else type(g[0]).fuse(g) for g in out]
