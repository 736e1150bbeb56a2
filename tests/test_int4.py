"""The int4 path: GGUF Q4_0 / Q4_1 blocks read into torch's CPU int4 kernel hold exactly the GGUF's de-quantised
weights (float32 activations), the kernel and its fused copies compute those weights' products, and the engine's
greedy output on an int4 model equals that model's own one-row vanilla decoding for every method (tiny random
Llama quantised to Q4_1 groups, and the real offline model from its own GGUF groups)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import (
    STANDALONE_METHODS,
    drafted_accepted,
    make_tiny_model,
    method_engine,
    random_prompt,
    repetitive_prompt,
)

from switchsd.models import int4
from switchsd.models.int4 import GROUP, Int4Linear, q4_groups, quantize_to_int4

pytestmark = pytest.mark.skipif(not int4.available(), reason="no CPU int4 kernel in this torch build")


def _blocks(kind: str, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random GGUF blocks [n, k/32 * bytes] and the float32 weights GGUF's reference de-quantiser gives them."""
    r = np.random.default_rng(seed)
    nb = k // GROUP
    d = r.uniform(1e-3, 0.05, (n, nb)).astype(np.float16)
    m = (-8 * d.astype(np.float32) * r.uniform(0.5, 1.5, (n, nb))).astype(np.float16)
    q = r.integers(0, 16, (n, nb, GROUP)).astype(np.uint8)
    qs = (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)                      # low nibbles: the first 16
    parts = [d[..., None].view(np.uint8)] + ([m[..., None].view(np.uint8)] if kind == "Q4_1" else []) + [qs]
    raw = np.concatenate(parts, -1).reshape(n, -1)
    from gguf import GGMLQuantizationType, dequantize
    w = dequantize(raw, GGMLQuantizationType[kind]).astype(np.float32).reshape(n, k)
    return raw, w


@pytest.mark.parametrize("kind", ["Q4_1", "Q4_0"])
def test_gguf_blocks_into_the_kernel_are_the_gguf_weights_bit_for_bit(kind):
    raw, w = _blocks(kind, 48, 128)
    codes, scale, zero = q4_groups(raw, kind)
    lin = Int4Linear(codes, scale, zero, torch.float32)
    ref = torch.from_numpy(w)
    assert torch.equal(lin.dequantized(), ref)
    assert torch.equal(lin(torch.eye(128)).t(), ref)                          # what the kernel multiplies by
    x = torch.randn(5, 128, dtype=torch.float64)
    assert torch.allclose(lin(x.float()).double(), x @ ref.double().t(), atol=1e-4)
    wide = Int4Linear(codes, scale, zero, torch.float32, wide_rows=2)       # > 2 rows: dense, same weights
    assert torch.allclose(wide(x.float()), lin(x.float()), atol=1e-5) and wide._dense is not None
    assert torch.equal(wide._dense.weight, ref)
    # bfloat16 activations: scales and zeros rounded to bfloat16, products within that rounding
    lb = Int4Linear(codes, scale, zero, torch.bfloat16)
    y = lb(x.bfloat16()).double()
    assert (y - x @ ref.double().t()).abs().max() < 0.05 * (x @ ref.double().t()).abs().max()
    wb = Int4Linear(codes, scale, zero, torch.bfloat16, wide_rows=2)         # the dense fallback in bfloat16
    assert (wb(x.bfloat16()).double() - y).abs().max() < 0.05 * y.abs().max() and wb._dense is not None


def test_wide_bfloat16_products_run_in_float32_where_bf16_is_emulated(monkeypatch):
    from switchsd.models import dense
    raw, w = _blocks("Q4_1", 48, 128)
    x = torch.randn(40, 128).bfloat16()                                      # > 32 rows: a prefill's width
    for native in (True, False):
        monkeypatch.setattr(dense, "cpu_has_native_bf16", lambda: native)
        lin = Int4Linear(*q4_groups(raw, "Q4_1"), torch.bfloat16)
        ref = x.float() @ lin.dequantized().t()          # the kernel's weights (bfloat16 scales and zeros)
        y = lin(x)
        assert y.dtype == torch.bfloat16 and y.shape == (40, 48)
        if native:     # oneDNN's bfloat16 product over bfloat16-rounded weights
            assert (y.float() - ref).abs().max() < 0.05 * ref.abs().max()
        else:          # float32 arithmetic over the same weights, rounded once at the end
            assert ((y.float() - ref).abs() <= 1e-5 + 2 ** -8 * ref.abs()).all()      # one bf16 rounding each


def test_q8_blocks_as_two_int4_halves_are_the_gguf_weights():
    from gguf import GGMLQuantizationType, dequantize

    from switchsd.models.int4 import Int8Head, q8_halves
    r = np.random.default_rng(3)
    d = r.uniform(1e-3, 0.05, (48, 4, 1)).astype(np.float16)
    q = r.integers(-128, 128, (48, 4, 32)).astype(np.int8)
    raw = np.concatenate([d.view(np.uint8), q.view(np.uint8)], -1).reshape(48, -1)
    ref = torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q8_0).astype(np.float32).reshape(48, 128))
    head = Int8Head(q8_halves(raw), torch.float32)
    assert torch.equal(head.dequantized(), ref)
    x = torch.randn(3, 128, dtype=torch.float64)
    assert torch.allclose(head(x.float()).double(), x @ ref.double().t(), atol=1e-4)


def test_fused_matrix_computes_the_parts():
    raws = [q4_groups(_blocks("Q4_1", n, 64, seed=s)[0], "Q4_1") for s, n in enumerate((32, 16, 16))]
    parts = [Int4Linear(*g, torch.float32) for g in raws]
    fused = Int4Linear.fuse(parts)
    x = torch.randn(3, 7, 64)
    assert torch.equal(fused(x), torch.cat([p(x) for p in parts], -1))
    with pytest.raises(ValueError, match="in_features"):
        Int4Linear(torch.zeros(8, 40, dtype=torch.uint8), torch.ones(8, 1), torch.zeros(8, 1), torch.float32)


def _tiny_int4():
    model, dense = make_tiny_model().float(), make_tiny_model().float()
    assert quantize_to_int4(model) == 14
    assert int4.is_int4(model)
    x = torch.tensor([random_prompt(1, 10)])
    with torch.inference_mode():     # the swapped layers run (4-bit groups are lossy: the logits move)
        assert not torch.allclose(model(x).logits, dense(x).logits, atol=1e-3)
    return model


@pytest.mark.parametrize("method", [m for m in STANDALONE_METHODS if m not in ("oracle",)])
def test_tiny_int4_model_every_method_equals_its_own_vanilla(method):
    model = _tiny_int4()
    drafted = accepted = 0
    for seed, prompt in enumerate([random_prompt(3, 12), repetitive_prompt(4)]):
        ref = method_engine(model, "vanilla", max_new_tokens=24).run(prompt).token_ids
        gen = method_engine(model, method, max_new_tokens=24).run(prompt)
        assert gen.token_ids == ref, f"{method} parts from vanilla on prompt {seed}"
        d, a = drafted_accepted(gen)
        drafted, accepted = drafted + d, accepted + a
    if method != "vanilla":          # an equality with nothing drafted would prove nothing
        assert drafted > 0 and accepted > 0, (method, drafted, accepted)


def test_int4_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        quantize_to_int4(make_tiny_model())                                   # float64
    from switchsd.models.loading import ModelLoadError, load_model
    with pytest.raises(ModelLoadError, match="GGUF"):
        load_model("some/hub-model", "int4", "cpu")


@pytest.mark.real
def test_real_model_int4_is_the_gguf_and_decodes_like_its_own_vanilla(real_lm):
    """The offline model from its own Q4_1 groups (float32 activations): every swapped matrix equals the float32
    model's (de-quantised by transformers from the same file) bit for bit, and SwitchSD's and EAGLE-3's greedy
    outputs equal int4 vanilla's."""
    from switchsd.core.config import EngineConfig
    from switchsd.factory import Drafters, build_engine
    from switchsd.models.loading import load_model
    lm = load_model(dtype="int4-float32", device="cpu")
    assert lm.precision == "int4-float32"
    dense = dict(real_lm.model.named_modules())
    swapped = [(n, m) for n, m in lm.model.named_modules() if isinstance(m, Int4Linear)]
    assert len(swapped) == 7 * 30
    for n, m in swapped:
        assert torch.equal(m.dequantized(), dense[n].weight), n
    head = lm.model._switchsd_int8_head                       # the tied Q8_0 embedding as the LM head
    assert torch.equal(head.dequantized(), real_lm.model.lm_head.weight)
    cfg = EngineConfig(max_new_tokens=32)
    drafters = Drafters(lm)
    ids = lm.encode("Repeat exactly: def add(a, b): return a + b  # the quick brown fox", chat=True)
    ref = build_engine("vanilla", lm, drafters, cfg).run(ids).token_ids
    for method in ("switchsd", "eagle3", "switchsd-paper", "eagle3@chain3"):
        gen = build_engine(method, lm, drafters, cfg).run(ids)
        assert gen.token_ids == ref, method
        if method in ("switchsd", "eagle3"):
            continue           # their cost gates may keep every step plain in this format: that is their job
        drafted, accepted = drafted_accepted(gen)
        assert drafted > 0 and accepted > 0, (method, gen.stats["paths"])    # fixed gates draft: a real check


@pytest.mark.real
def test_real_model_int4_chain_methods_equal_int4_vanilla():
    """The default format (bfloat16 activations): methods that verify chains (copy, PLD) give int4 vanilla's
    tokens exactly, their chains verified row by row as vanilla's steps compute them (tests/test_lean.py)."""
    from switchsd.core.config import EngineConfig
    from switchsd.factory import Drafters, build_engine
    from switchsd.models.loading import load_model
    lm = load_model(dtype="int4", device="cpu")
    cfg = EngineConfig(max_new_tokens=48)
    drafters = Drafters(lm)
    ids = lm.encode("Repeat this list exactly, twice: alpha, beta, gamma, delta, epsilon, zeta, eta, theta.",
                    chat=True)
    ref = build_engine("vanilla", lm, drafters, cfg).run(ids).token_ids
    for method in ("pld", "copy"):
        res = build_engine(method, lm, drafters, cfg).run(ids)
        assert res.token_ids == ref, method
        assert res.stats["tok_per_fwd"] > 1.1, method                  # the chains were drafted and accepted


def test_studio_offers_the_4bit_formats_only_for_gguf_models_on_cpu():
    from app.resources import Resources, UserError
    assert Resources(device="cpu").four_bit_formats() == ["q4q8", "int4"]
    assert Resources(model_name="some/hub-model", device="cpu").four_bit_formats() == []
    assert Resources(device="cuda").four_bit_formats() == []
    for fmt in ("int4", "q4q8"):
        with pytest.raises(UserError, match=fmt):
            Resources(model_name="some/hub-model", device="cpu").lm(fmt)


def test_int4_attends_in_float32_where_bfloat16_is_emulated(monkeypatch):
    """Without native bfloat16 the int4 format keeps keys/values and attends in float32 (SDPA's emulated
    bfloat16 kernel is ~4x slower); decode steps and verify rows share that arithmetic, so every method still
    gives the model's own vanilla tokens. Dense formats keep their dtype (transformers' arithmetic)."""
    from switchsd.models import dense
    from switchsd.models.lean import LeanLlama
    monkeypatch.setattr(dense, "cpu_has_native_bf16", lambda: True)
    assert dense.attention_dtype(torch.bfloat16, "cpu") == torch.bfloat16
    monkeypatch.setattr(dense, "cpu_has_native_bf16", lambda: False)
    assert dense.attention_dtype(torch.bfloat16, "cpu") == torch.float32
    assert dense.attention_dtype(torch.bfloat16, "cuda") == torch.bfloat16
    assert dense.attention_dtype(torch.float64, "cpu") == torch.float64
    assert LeanLlama(make_tiny_model().to(torch.bfloat16)).att_dtype == torch.bfloat16
    model = make_tiny_model().to(torch.bfloat16)
    quantize_to_int4(model)
    lean = LeanLlama.of(model)
    assert lean.att_dtype == torch.float32 and lean.new_cache(8).k.dtype == torch.float32
    prompt = repetitive_prompt(4)
    ref = method_engine(model, "vanilla", max_new_tokens=24).run(prompt).token_ids
    for method in (m for m in STANDALONE_METHODS if m != "oracle"):
        assert method_engine(model, method, max_new_tokens=24).run(prompt).token_ids == ref, method


def test_batched_engine_runs_the_float32_attention_cache(monkeypatch):
    """The batched engine and the serving drafter on the int4 format where bfloat16 is emulated: their caches
    hold float32 keys/values (`LeanLlama.att_dtype`) while the activations are bfloat16; a batched prefill's
    logits match the one-row forward's, and batched vanilla decoding gives each request's own vanilla tokens."""
    from switchsd.core.config import EngineConfig
    from switchsd.models import dense
    from switchsd.models.lean import LeanLlama
    from switchsd.serve.batched import BatchedKV, batched_forward
    from switchsd.serve.drafting import BatchDrafter
    from switchsd.serve.engine import BatchedEngine, tokens_of
    monkeypatch.setattr(dense, "cpu_has_native_bf16", lambda: False)
    model = make_tiny_model().to(torch.bfloat16)
    quantize_to_int4(model)
    lean = LeanLlama.of(model)
    assert lean.att_dtype == torch.float32 and lean.dtype == torch.bfloat16
    prompt = random_prompt(2, 11)
    ids = torch.tensor([prompt])
    cache = BatchedKV(lean, 2, 16)
    assert cache.k.dtype == torch.float32
    got, _ = batched_forward(lean, ids, cache, torch.arange(11)[None], None, first_slot=1)
    want, _ = lean.forward(ids, lean.new_cache(16))
    assert torch.allclose(got.float(), want.float(), atol=1e-2, rtol=1e-2)
    cfg = EngineConfig(max_new_tokens=12)
    ps = {0: prompt, 1: repetitive_prompt(4), 2: random_prompt(5, 7)}
    single = {i: method_engine(model, "vanilla", max_new_tokens=12).run(p).token_ids for i, p in ps.items()}
    be = BatchedEngine(model, lambda: method_engine(model, "vanilla", max_new_tokens=12).decoder, cfg, max_batch=2)
    out = {i: tokens_of(e) for i, e in be.run_all(ps).items()}
    assert all(len(out[i]) == len(single[i]) for i in ps)
    agree = sum(a == b for i in ps for a, b in zip(out[i], single[i])) / sum(map(len, single.values()))
    assert agree > 0.8, (out, single)                  # bf16 batched rows may break a near-tie differently
    drafts = BatchDrafter(model, 3, 2).draft({0: ps[0], 1: ps[1]})
    assert sorted(drafts) == [0, 1] and all(len(d) == 3 for d in drafts.values())
