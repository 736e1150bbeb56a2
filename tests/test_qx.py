"""The GGUF block types past Q4: decoding equals gguf-py's de-quantisation, the C product equals its numpy reference
bit for bit on every path, and a k-row call equals k one-row calls."""
import numpy as np
import pytest
import torch

from switchsd.kernels import qx
from switchsd.kernels.q4q8 import available_paths

gguf = pytest.importorskip("gguf")


def random_blocks(kind: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    return qx.random_blocks(kind, n, k, np.random.default_rng(seed))


@pytest.mark.parametrize("kind", sorted(qx.TYPES))
def test_decode_equals_gguf_dequantisation(kind):
    raw = random_blocks(kind, 16, 512)
    codes, dw, mw = qx.decode(raw, kind)
    ours = qx.dequantize(codes, dw, mw, qx.TYPES[kind][0])
    theirs = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).reshape(16, 512)
    assert ours.dtype == np.float32 and np.array_equal(ours, theirs.astype(np.float32))


@pytest.fixture
def tiles_from_one_row():
    """Path 5 (AMX, where the CPU has it and its self-test passed) on the tiles at every row count, not only from the
    row count where they are faster."""
    from switchsd.kernels.build import amx_rows
    if amx_rows():
        qx._lib().kernels_amx_allow(1)
    yield
    qx._lib().kernels_amx_allow(amx_rows())


@pytest.mark.parametrize("kind", sorted(qx.TYPES))
def test_product_equals_reference_and_one_row_calls(kind, tiles_from_one_row):
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


@pytest.mark.parametrize("kind", sorted(qx.TYPES))
def test_largest_codes_and_activations_keep_exact_sums(kind):
    """Every code at its largest and every activation at +-127: the integer block sums at their bound (the AVX2
    path adds pair sums in int16 before widening them) still equal the reference on every path."""
    flags = qx.TYPES[kind][0]
    b = qx.blocks(random_blocks(kind, 16, 512, seed=6), kind)
    b["codes"] = np.full_like(b["codes"], 63 if flags & qx.SUB16 else 31 if flags & qx.HIGH else 15)
    x = torch.ones(4, 512)
    x[1] = -1.0
    x[2, ::2] = -1.0
    x[3] = torch.linspace(-1, 1, 512)
    want = qx.reference(b["codes"], b["dw"], b["mw"], flags, x.numpy())
    for path in available_paths():
        for as_bytes in (False, True) if flags & qx.SUPER else (False,):
            lin = qx.QxLinear(b, flags | (qx.BYTES if as_bytes else 0), path)
            assert np.array_equal(lin(x).numpy(), want), (kind, path, as_bytes)
            assert torch.equal(torch.cat([lin(x[r:r + 1]) for r in range(4)]), lin(x))


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


def test_a_faulting_amx_self_test_keeps_the_vector_paths(tmp_path, monkeypatch):
    """The AMX path runs only after its self-test in a child process matched the vector path: a child that dies on a
    fault (here a stand-in killed by SIGSEGV) leaves the tiles off, with the reason kept beside the kernels."""
    import ctypes

    from switchsd.kernels import build
    monkeypatch.setenv("SWITCHSD_KERNEL_DIR", str(tmp_path))
    if not ctypes.CDLL(str(build._build("q4q8"))).kernels_amx_unit():
        pytest.skip("this CPU has no AMX tiles")
    faulting = tmp_path / "python"
    faulting.write_text("#!/bin/sh\nkill -SEGV $$\n")
    faulting.chmod(0o755)
    python = build.sys.executable
    monkeypatch.setattr(build.sys, "executable", str(faulting))
    assert build.amx_rows.__wrapped__() == 0
    [verdict] = tmp_path.glob("amx-*.txt")
    assert verdict.read_text().startswith("failed") and "exit -11" in verdict.read_text()
    lib = ctypes.CDLL(str(build._build("q4q8")))
    lib.kernels_amx_allow(build.amx_rows.__wrapped__())
    assert not lib.q4q8_path_ok(5) and lib.q4q8_best_path() == 4
    monkeypatch.setattr(build.sys, "executable", python)
    verdict.unlink()
    build.amx_rows.__wrapped__()
    assert verdict.read_text().startswith("rows ")                   # the real self-test passes on this CPU
