"""The GGUF block types past Q4: decoding equals gguf-py's de-quantisation, the C product equals its numpy reference
bit for bit on every path, and a k-row call equals k one-row calls."""
import numpy as np
import pytest
import torch

from switchsd.kernels import qx
from switchsd.kernels.q4q8 import available_paths

gguf = pytest.importorskip("gguf")


def random_blocks(kind: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random valid GGUF blocks of type `kind` for an [n, k] matrix: random bytes, float16 scales set to sane values."""
    _, size, per = qx.TYPES[kind] if kind in qx.TYPES else {"Q8_0": (0, 34, 32), "Q4_0": (0, 18, 32),
                                                             "Q4_1": (0, 20, 32)}[kind]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(n, k // per, size), dtype=np.uint8)
    where = {"Q5_0": [0], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "Q8_0": [0], "Q4_0": [0],
             "Q4_1": [0, 2]}[kind]
    for at in where:
        b[..., at:at + 2] = (rng.uniform(0.5, 2.0, size=(n, k // per)) * 1e-3).astype(np.float16).view(np.uint8) \
            .reshape(n, k // per, 2)
    if kind == "Q8_0":
        b[..., 2:] = np.where(b[..., 2:] == 128, 129, b[..., 2:])                 # Q8_0 codes are -127..127
    return b.reshape(n, -1)


@pytest.mark.parametrize("kind", sorted(qx.TYPES))
def test_decode_equals_gguf_dequantisation(kind):
    raw = random_blocks(kind, 16, 512)
    codes, dw, mw = qx.decode(raw, kind)
    ours = qx.dequantize(codes, dw, mw, qx.TYPES[kind][0])
    theirs = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).reshape(16, 512)
    assert ours.dtype == np.float32 and np.array_equal(ours, theirs.astype(np.float32))


@pytest.mark.parametrize("kind", sorted(qx.TYPES))
def test_product_equals_reference_and_one_row_calls(kind):
    n, k = 24, 512
    raw = random_blocks(kind, n, k, seed=1)
    codes, dw, mw = qx.decode(raw, kind)
    x = torch.randn(11, k, generator=torch.Generator().manual_seed(2))
    want = qx.reference(codes, dw, mw, qx.TYPES[kind][0], x.numpy())
    for path, as_bytes in [(p, b) for p in available_paths() for b in (False, True)]:
        lin = qx.gguf_linear(raw, kind, path, as_bytes)
        y = lin(x)
        assert np.array_equal(y.numpy(), want), (kind, path, as_bytes, np.abs(y.numpy() - want).max())
        for rows in (1, 2, 3, 5, 8, 11):
            assert torch.equal(lin(x[:rows]), y[:rows])
        assert torch.equal(torch.cat([lin(x[r:r + 1]) for r in range(11)]), y)
    scale = np.abs(want).max()
    exact = x.numpy() @ qx.dequantize(codes, dw, mw, qx.TYPES[kind][0]).T
    assert np.abs(want - exact).max() < 0.05 * scale             # activation rounding only


def test_fused_parts_keep_each_outputs_arithmetic():
    a, b = qx.gguf_linear(random_blocks("Q4_K", 16, 256, 3), "Q4_K"), qx.gguf_linear(random_blocks("Q4_K", 8, 256, 4), "Q4_K")
    c = qx.gguf_linear(random_blocks("Q6_K", 8, 256, 5), "Q6_K")
    parts = qx.fuse([a, b, c])
    assert len(parts) == 2 and parts[0].out_features == 24
    x = torch.randn(3, 256)
    assert torch.equal(torch.cat([p(x) for p in parts], 1), torch.cat([a(x), b(x), c(x)], 1))


def test_unreadable_block_type_is_one_line():
    with pytest.raises(ValueError, match="block type IQ2_XS"):
        qx.gguf_linear(np.zeros((8, 66), np.uint8), "IQ2_XS")


@pytest.mark.parametrize("bf16", [False, True])
def test_f16_product_equals_reference_and_one_row_calls(bf16):
    """An f16 / bf16 file's matrices as they are: the product equals its numpy reference (k in order, two roundings
    a step) on every path, and a k-row call equals k one-row calls."""
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(80, 200, generator=g) * 0.1)   # 5 groups of 16: a pass of four and one alone
    w = w.to(torch.bfloat16 if bf16 else torch.float16)
    x = torch.randn(9, 200, generator=g)
    want = qx.f16_reference(w.float().numpy(), x.numpy())
    for path in available_paths():
        lin = qx.F16Linear(w.view(torch.int16), bf16, path)
        y = lin(x)
        assert np.array_equal(y.numpy(), want), path
        assert torch.equal(torch.cat([lin(x[r:r + 1]) for r in range(9)]), y)
    assert torch.equal(lin.dequantized(), w.float())
