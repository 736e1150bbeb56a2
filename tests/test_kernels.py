"""The q4q8 kernel (switchsd/kernels/q4q8.c): Q4_1 weights x Q8 activations. Its output equals the arithmetic
spelled out in numpy (`reference`) bit for bit, on random and real blocks, for every row count 1..32 and on every
instruction-set path this CPU has; a k-row call equals k one-row calls (batch-invariant); GGUF blocks read into it
are the GGUF's own weights."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from switchsd.kernels import q4q8
from switchsd.kernels.q4q8 import Q4Q8Linear, gguf_blocks, reference

PATHS = q4q8.available_paths() + ["auto"]          # every path this CPU has (portable, avx2, vnni), and auto


def _random(n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    dw = (torch.rand(n, k // 32, generator=g) * 0.05 + 1e-4).half()
    mw = (-torch.rand(n, k // 32, generator=g) * 0.4).half()
    return codes, dw, mw


def _ref(lin_args, x: torch.Tensor) -> torch.Tensor:
    codes, dw, mw = lin_args
    return torch.from_numpy(reference(codes.numpy(), dw.numpy(), mw.numpy(), x.numpy()))


@pytest.mark.parametrize("path", PATHS)
def test_every_row_count_equals_the_reference_bit_for_bit(path):
    args = _random(96, 320)
    lin = Q4Q8Linear(*args, path=path)
    g = torch.Generator().manual_seed(1)
    for rows in range(1, 33):
        x = torch.randn(rows, 320, generator=g) * (1 + rows)
        x[0, :32] = 0                                    # an all-zero block: scale 0, no division by it
        assert torch.equal(lin(x), _ref(args, x)), rows


@pytest.mark.parametrize("path", PATHS)
def test_a_k_row_call_is_k_one_row_calls(path):
    args = _random(64, 1536, seed=2)
    lin = Q4Q8Linear(*args, path=path)
    x = torch.randn(32, 1536, generator=torch.Generator().manual_seed(3))
    one = torch.cat([lin(x[i:i + 1]) for i in range(32)])
    for rows in (2, 5, 8, 16, 32):
        assert torch.equal(lin(x[:rows]), one[:rows]), rows


def test_paths_agree_and_fused_outputs_keep_their_arithmetic():
    a, b = _random(48, 576, seed=4), _random(16, 576, seed=5)
    parts = [Q4Q8Linear(*a), Q4Q8Linear(*b)]
    fused = Q4Q8Linear.fuse(parts)
    x = torch.randn(7, 576, generator=torch.Generator().manual_seed(6))
    assert torch.equal(fused(x), torch.cat([parts[0](x), parts[1](x)], 1))
    assert torch.equal(Q4Q8Linear(*a, path="portable")(x), parts[0](x))


def test_the_bit_check_bites():
    """The negative control: the same sum in another order (the weights' minimum term added once at the end
    instead of block by block) differs in the last bits, so the checks above would see a change of order."""
    codes, dw, mw = _random(64, 576, seed=7)
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(8))
    q8, dx, sx = q4q8.quantize_reference(x.numpy())
    nb = 576 // 32
    isum = np.einsum("nbk,rbk->rnb", codes.numpy().reshape(64, nb, 32).astype(np.int32),
                     q8.reshape(4, nb, 32).astype(np.int32))
    acc = np.zeros((4, 64), np.float32)
    mins = np.zeros((4, 64), np.float32)
    for b in range(nb):
        acc = acc + (dw.numpy()[None, :, b].astype(np.float32) * dx[:, None, b]) * isum[:, :, b].astype(np.float32)
        mins = mins + mw.numpy()[None, :, b].astype(np.float32) * sx[:, None, b]
    other = torch.from_numpy(acc + mins)
    y = Q4Q8Linear(codes, dw, mw)(x)
    assert torch.allclose(y, other, atol=1e-3) and not torch.equal(y, other)


def test_close_to_the_float_product():
    args = _random(64, 576, seed=9)
    lin = Q4Q8Linear(*args)
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(10))
    exact = x.double() @ lin.dequantized().double().t()
    assert (lin(x).double() - exact).abs().max() < 0.02 * exact.abs().max()


def test_gguf_blocks_are_the_gguf_weights():
    from gguf import GGMLQuantizationType, dequantize
    r = np.random.default_rng(11)
    for kind in ("Q4_1", "Q4_0"):
        d = r.uniform(1e-3, 0.05, (16, 4)).astype(np.float16)
        m = (-8 * d.astype(np.float32)).astype(np.float16)
        qs = r.integers(0, 256, (16, 4, 16)).astype(np.uint8)
        parts = [d[..., None].view(np.uint8)] + ([m[..., None].view(np.uint8)] if kind == "Q4_1" else []) + [qs]
        raw = np.concatenate(parts, -1).reshape(16, -1)
        w = dequantize(raw, GGMLQuantizationType[kind]).astype(np.float32).reshape(16, 128)
        assert torch.equal(Q4Q8Linear(*gguf_blocks(raw, kind)).dequantized(), torch.from_numpy(w)), kind


@pytest.mark.real
def test_real_blocks_equal_the_reference():
    """The offline model's own Q4_1 blocks (layer 0's gate projection), 1..32 rows of its hidden states' scale."""
    from gguf import GGUFReader

    from switchsd.models.loading import ModelLoadError, gguf_path
    try:
        path = gguf_path(None)
    except ModelLoadError as e:  # pragma: no cover - depends on the environment
        pytest.skip(str(e))
    t = next(t for t in GGUFReader(str(path)).tensors if t.name == "blk.0.ffn_gate.weight")
    args = gguf_blocks(np.asarray(t.data), t.tensor_type.name)
    for path_name in PATHS:
        lin = Q4Q8Linear(*args, path=path_name)
        x = torch.randn(32, args[0].shape[1], generator=torch.Generator().manual_seed(12)) * 3
        for rows in (1, 2, 3, 8, 17, 32):
            assert torch.equal(lin(x[:rows]), _ref(args, x[:rows])), (path_name, rows)


def test_bad_shapes_are_refused():
    codes, dw, mw = _random(16, 64)
    with pytest.raises(ValueError, match="in_features"):
        Q4Q8Linear(codes[:, :40], dw, mw)
    with pytest.raises(ValueError, match="scales"):
        Q4Q8Linear(codes, dw[:, :1], mw)
    with pytest.raises(ValueError, match="path"):
        Q4Q8Linear(codes, dw, mw, path="avx9")
    with pytest.raises(ValueError, match="expected"):
        Q4Q8Linear(codes, dw, mw)(torch.zeros(2, 63))


@pytest.mark.parametrize("path", PATHS)
def test_q8_head_kernel_equals_its_reference_and_is_batch_invariant(path):
    """The 8-bit kernel (the GGUF's Q8_0 head): bit for bit its numpy arithmetic at every row count, and a k-row
    call is k one-row calls."""
    g = torch.Generator().manual_seed(13)
    codes = torch.randint(-127, 128, (72, 192), generator=g, dtype=torch.int8)
    dw = (torch.rand(72, 6, generator=g) * 0.02 + 1e-4).half()
    lin = q4q8.Q8Linear(codes, dw, path=path)
    x = torch.randn(32, 192, generator=g) * 4
    one = torch.cat([lin(x[i:i + 1]) for i in range(32)])
    for rows in range(1, 33):
        ref = torch.from_numpy(q4q8.q8_reference(codes.numpy(), dw.numpy(), x[:rows].numpy()))
        assert torch.equal(lin(x[:rows]), ref), rows
        assert torch.equal(lin(x[:rows]), one[:rows]), rows


def test_q8_gguf_blocks_are_the_gguf_weights():
    from gguf import GGMLQuantizationType, dequantize
    r = np.random.default_rng(14)
    d = r.uniform(1e-3, 0.05, (16, 4)).astype(np.float16)
    q = r.integers(-127, 128, (16, 4, 32)).astype(np.int8)
    raw = np.concatenate([d[..., None].view(np.uint8), q.view(np.uint8)], -1).reshape(16, -1)
    w = dequantize(raw, GGMLQuantizationType.Q8_0).astype(np.float32).reshape(16, 128)
    assert torch.equal(q4q8.Q8Linear(*q4q8.gguf_q8_blocks(raw)).dequantized(), torch.from_numpy(w))
    with pytest.raises(ValueError, match="-127"):
        q4q8.Q8Linear(torch.full((8, 32), -128, dtype=torch.int8), torch.ones(8, 1).half())


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_quantising_a_float_matrix_is_llama_cpp_s_quantiser(kind):
    """`Q4Q8Linear.quantize` / `Q8Linear.quantize` (the EAGLE-3 head's CPU copy) give gguf-py's blocks: the same
    weights bit for bit after de-quantisation, on rows with an all-equal block (d = 0) too."""
    import gguf
    w = torch.randn(16, 96, generator=torch.Generator().manual_seed(3))
    w[3, :32] = 0.25
    lin = (Q4Q8Linear if kind == "Q4_1" else q4q8.Q8Linear).quantize(w)
    t = getattr(gguf.GGMLQuantizationType, kind)
    theirs = gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), t), t).astype(np.float32)
    assert torch.equal(lin.dequantized(), torch.from_numpy(theirs))
