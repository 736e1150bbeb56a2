"""The q4q8 format (switchsd/models/q4q8.py, one C call per forward): a verify forward's rows, chains and trees, equal
bit for bit the one-row steps of vanilla decoding, so every method's greedy output equals q4q8 vanilla's; the
forward stays close to the dense model it quantises; the offline model decodes in it."""
from __future__ import annotations

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

from switchsd.core.tree import build_tree, tree_mask, tree_positions
from switchsd.models.q4q8 import Q4Q8Llama

SITES = [(0, "attn"), (1, "mlp")]


def _tiny(seed: int = 0):
    model = make_tiny_model(seed)
    model._switchsd_q4q8 = Q4Q8Llama.quantized(model)
    model._switchsd_format = "q4q8"
    return model


def _steps(fwd: Q4Q8Llama, prompt: list[int], tokens: list[int]):
    """Logits and captured states of one-row steps over `tokens` after `prompt`."""
    cache = fwd.new_cache(64)
    fwd.forward(torch.tensor([prompt]), cache)
    out, caps = [], []
    for t in tokens:
        lg, cap = fwd.forward(torch.tensor([[t]]), cache, sites=SITES)
        out.append(lg)
        caps.append(torch.cat([cap[s][0] for s in SITES], -1))
    return torch.cat(out), torch.cat(caps)


def test_a_chain_forward_is_its_one_row_steps_bit_for_bit():
    fwd = _tiny()._switchsd_q4q8
    prompt, chain = random_prompt(1, 10), random_prompt(2, 9)
    ref, ref_caps = _steps(fwd, prompt, chain)
    cache = fwd.new_cache(64)
    fwd.forward(torch.tensor([prompt]), cache)
    lg, cap = fwd.forward(torch.tensor([chain]), cache, sites=SITES)
    assert torch.equal(lg, ref)
    assert torch.equal(torch.cat([cap[s][0] for s in SITES], -1), ref_caps)


def test_a_tree_forward_is_each_paths_one_row_steps_bit_for_bit():
    fwd = _tiny(1)._switchsd_q4q8
    prompt = random_prompt(3, 12)
    pending = prompt[-1]
    cands = [[5, 6, 7], [5, 9], [11, 12, 13, 14]]
    tree = build_tree(pending, cands, 32, None, max_depth=8)
    cache = fwd.new_cache(64)
    fwd.forward(torch.tensor([prompt[:-1]]), cache)
    start = len(cache)
    mask = tree_mask(tree, start, torch.float32, torch.device("cpu"), 0)
    pos = tree_positions(tree, start, torch.device("cpu"), 0)
    lg, _ = fwd.forward(torch.tensor([tree.tokens]), cache, pos, mask)
    for rows in tree.cand_rows:
        path = [0] + list(rows)
        ref, _ = _steps(fwd, prompt[:-1], [tree.tokens[r] for r in path])
        assert torch.equal(lg[path], ref), path


def test_bit_checks_bite():
    """The negative control: the same chain one row later (a shifted position) changes the logits' bits, so the
    equalities above see a row computed with other inputs."""
    fwd = _tiny()._switchsd_q4q8
    prompt, chain = random_prompt(1, 10), random_prompt(2, 4)
    ref, _ = _steps(fwd, prompt, chain)
    cache = fwd.new_cache(64)
    fwd.forward(torch.tensor([prompt + [7]]), cache)
    lg, _ = fwd.forward(torch.tensor([chain]), cache)
    assert not torch.equal(lg, ref)


def test_close_to_the_dense_model():
    """Quantisation moves the logits (4-bit weights, 8-bit activations) but keeps them near the dense model's."""
    model = _tiny()
    prompt = random_prompt(4, 16)
    cache = model._switchsd_q4q8.new_cache(64)
    lg, _ = model._switchsd_q4q8.forward(torch.tensor([prompt]), cache)
    with torch.inference_mode():
        dense = model(torch.tensor([prompt])).logits[0].float()
    err = (lg - dense).abs().max() / dense.abs().max()
    assert 0 < err < 0.25, err


@pytest.mark.parametrize("method", [m for m in STANDALONE_METHODS if m not in ("oracle",)])
def test_tiny_q4q8_model_every_method_equals_its_own_vanilla(method):
    model = _tiny()
    drafted = accepted = 0
    for seed, prompt in enumerate([random_prompt(3, 12), repetitive_prompt(4)]):
        ref = method_engine(model, "vanilla", max_new_tokens=24).run(prompt).token_ids
        gen = method_engine(model, method, max_new_tokens=24).run(prompt)
        assert gen.token_ids == ref, f"{method} parts from vanilla on prompt {seed}"
        d, a = drafted_accepted(gen)
        drafted, accepted = drafted + d, accepted + a
    if method != "vanilla":          # an equality with nothing drafted would prove nothing
        assert drafted > 0 and accepted > 0, (method, drafted, accepted)


@pytest.mark.real
def test_real_model_q4q8_decodes_and_methods_equal_its_vanilla():
    from switchsd.core.config import EngineConfig
    from switchsd.factory import Drafters, build_engine
    from switchsd.models.loading import ModelLoadError, load_model
    try:
        lm = load_model(dtype="q4q8", device="cpu")
    except ModelLoadError as e:  # pragma: no cover - depends on the environment
        pytest.skip(str(e))
    assert lm.precision == "q4q8"
    cfg = EngineConfig(max_new_tokens=48)
    drafters = Drafters(lm)
    ids = lm.encode("Repeat exactly: def add(a, b): return a + b  # the quick brown fox", chat=True)
    ref = build_engine("vanilla", lm, drafters, cfg).run(ids).token_ids
    assert "def add" in lm.tokenizer.decode(ref)
    for method in ("switchsd", "eagle3", "pld", "copyspec", "switchsd-paper", "eagle3@chain3"):
        gen = build_engine(method, lm, drafters, cfg).run(ids)
        assert gen.token_ids == ref, method
        if method in ("switchsd", "eagle3"):
            continue           # their cost gates may keep every step plain on a loaded machine: that is their job
        drafted, accepted = drafted_accepted(gen)
        assert drafted > 0 and accepted > 0, (method, gen.stats["paths"])


@pytest.mark.parametrize("hidden,heads,q8,path", [(128, 2, False, "auto"), (256, 2, False, "auto"),
                                                   (96, 3, False, "auto"), (128, 2, True, "auto"),
                                                   (96, 3, False, "avx2")])
def test_the_vector_and_portable_paths_compute_the_same_bits(hidden, heads, q8, path):
    """The vector attention (AVX2, 512-bit), SwiGLU and products against the portable C paths, whole forwards (a
    prefill, then a chain over the cached prefix): the same operations in the same order, so the same logits and
    states. Heads of 64, 128 (two 64-output passes) and 32 (a part pass); not 8, which would let the next product's
    8-bit rounding hide a changed sum (a planted change of the AVX2 dot product's reduction tree passes there and
    fails here). With `q8` the o projection and the head are Q8_0 blocks, the head's 72 outputs an odd number of
    column groups (the 512-bit pair kernel takes the others). One kv head: on 512-bit vectors the heads and rows
    share it in groups (their key lists differ at the ends). The `avx2` case runs the AVX2 path on a CPU whose
    best is 512-bit (a mul-then-add planted in either path's fused sums fails its case)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from switchsd.kernels import q4q8
    from switchsd.kernels.q4q8 import Q8Linear
    if q4q8.best_path() == "portable" or path not in q4q8.available_paths() + ["auto"]:
        pytest.skip(f"this CPU lacks the {path} path")
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=72 if q8 else 64, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
                      num_key_value_heads=1, intermediate_size=256, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval()
    fast, slow = Q4Q8Llama.quantized(model, path), Q4Q8Llama.quantized(model, "portable")
    if q8:
        def with_q8(fwd, path):
            q8_ = lambda lin: [Q8Linear.quantize(lin.weight.detach().float(), path)]      # noqa: E731
            layers = [[mats[0], q8_(block.self_attn.o_proj), mats[2], mats[3]]
                      for mats, block in zip(fwd.layers, model.model.layers)]
            return Q4Q8Llama(model, layers, q8_(model.lm_head), path)
        fast, slow = with_q8(fast, path), with_q8(slow, "portable")
    prompt, chain = random_prompt(5, 60), random_prompt(6, 7)
    outs = []
    for fwd in (fast, slow):
        cache = fwd.new_cache(80)
        a, _ = fwd.forward(torch.tensor([prompt]), cache)
        b, cap = fwd.forward(torch.tensor([chain]), cache, sites=SITES)
        outs.append((a, b, cap[SITES[0]], cap[SITES[1]]))
    for x, y in zip(*outs):
        assert torch.equal(x, y)


def test_a_long_prefill_in_chunks_is_the_same_rows(monkeypatch):
    """Prefills longer than CHUNK run in causal chunks: logits and states equal one call's, bit for bit."""
    import switchsd.models.q4q8 as mod
    fwd = _tiny(3)._switchsd_q4q8
    prompt = random_prompt(7, 50)
    whole = fwd.new_cache(64)
    lg, cap = fwd.forward(torch.tensor([prompt]), whole, sites=SITES)
    monkeypatch.setattr(mod, "CHUNK", 16)
    parts = fwd.new_cache(64)
    lg2, cap2 = fwd.forward(torch.tensor([prompt]), parts, sites=SITES)
    last, _ = fwd.forward(torch.tensor([prompt[:20]]), fwd.new_cache(64), logit_rows=-1)
    assert torch.equal(lg, lg2) and all(torch.equal(cap[s], cap2[s]) for s in SITES)
    assert torch.equal(whole.k[:, :, :, :50], parts.k[:, :, :, :50]) and len(parts) == 50
    assert torch.equal(last, lg[19:20])


def test_a_batched_forward_is_each_sequences_own_forward_bit_for_bit():
    """Serving's ragged batch (slots of other lengths, trees padded with filler rows) in one C call: each sequence's
    rows equal its own single-sequence forward bit for bit; a row read from another slot would not."""
    from switchsd.serve.batched import BatchedKV, batch_inputs, batched_forward
    fwd = _tiny(2)._switchsd_q4q8
    prompts = [random_prompt(10 + i, 5 + 3 * i) for i in range(3)]
    cands = [[[5, 6, 7], [5, 9]], [[11]], [[1, 2, 3, 4], [8]]]
    cache = BatchedKV(fwd, 4, 8)                           # grows while the prompts are written
    for s, p in enumerate(prompts):
        cache.lens[s] = 0
        batched_forward(fwd, torch.tensor([p[:-1]]), cache, torch.arange(len(p) - 1)[None], None, rows=[1],
                        first_slot=s)
    trees = [build_tree(p[-1], c, 32, None, max_depth=8) for p, c in zip(prompts, cands)]
    ids, pos, mask = batch_inputs(trees, cache.lens[:3], torch.float32, "cpu")
    lg, cap = batched_forward(fwd, ids, cache, pos, mask, SITES, rows=[len(t.tokens) for t in trees])
    at = 0
    for r, (p, tree) in enumerate(zip(prompts, trees)):
        own = fwd.new_cache(64)
        fwd.forward(torch.tensor([p[:-1]]), own)
        start = len(own)
        ref, ref_cap = fwd.forward(torch.tensor([tree.tokens]), own, tree_positions(tree, start, torch.device("cpu"), 0),
                                   tree_mask(tree, start, torch.float32, torch.device("cpu"), 0), SITES)
        n = len(tree.tokens)
        assert torch.equal(lg[at:at + n], ref), r
        assert all(torch.equal(cap[s][r, :n], ref_cap[s][0]) for s in SITES), r
        if r:                                              # negative control: the rows differ between sequences
            assert not torch.equal(lg[at], lg[0])
        at += n


@pytest.mark.parametrize("method", ["vanilla", "copyspec"])
def test_the_serving_engine_runs_q4q8_and_equals_single_requests(method):
    from helpers import EOS

    from switchsd.core.config import CopyConfig, EngineConfig
    from switchsd.factory import make_engine
    from switchsd.methods import build_policy
    from switchsd.serve.engine import BatchedEngine, tokens_of
    model = _tiny(4)
    cfg = EngineConfig(max_new_tokens=20, budget=12)
    make = lambda: make_engine(model, build_policy(method, (EOS,), CopyConfig(kappa=2)), cfg, (EOS,))  # noqa: E731
    ps = {i: repetitive_prompt(i, n=8 + 3 * i, reps=2) if i % 2 else random_prompt(i, 5 + 4 * i) for i in range(5)}
    be = BatchedEngine(model, lambda: make().decoder, cfg, max_batch=3)
    assert be.lean is model._switchsd_q4q8
    got = {i: tokens_of(e) for i, e in be.run_all(ps).items()}
    for i, ids in ps.items():
        assert got[i] == method_engine(model, "vanilla", max_new_tokens=20).run(ids).token_ids, (method, i)


def test_regeneration_runs_q4q8_and_answers_greedily():
    from helpers import EOS

    from switchsd.models.loading import LoadedModel
    from switchsd.training.regen import Regenerator

    class Tok:
        eos_token_id = EOS
    model = _tiny(5)
    prompts = [(f"p{i}", random_prompt(20 + i, n)) for i, n in enumerate([5, 9, 3])]
    gen = Regenerator(LoadedModel(model=model, tokenizer=Tok(), name="tiny"), layers=(1, 1, 1), slots=2,
                      max_new_tokens=10, max_prompt=32)
    assert gen.lean is model._switchsd_q4q8
    got = dict(gen.run(prompts))
    for key, prompt in prompts:
        s = got[key]
        assert s["ids"].tolist() == prompt + method_engine(model, "vanilla", max_new_tokens=10).run(prompt).token_ids


# ------------------------------------------------------------------ llama.c against a float64 forward
def _quantised(x: torch.Tensor) -> torch.Tensor:
    """The activations as the kernel multiplies them: the float32 value in 8-bit blocks of 32 (q x d)."""
    from switchsd.kernels.q4q8 import QK, quantize_reference
    q, d, _ = quantize_reference(x.float().numpy())
    return torch.from_numpy(q).double() * torch.from_numpy(d).double().repeat_interleave(QK, 1)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w.double() * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
    ang = pos.double()[:, None] * inv_freq.double()[None]                     # [T, hd / 2]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + sign * rot * sin


def reference_forward(fwd: Q4Q8Llama, ids: list[int], rotary_sign: float = 1.0) -> torch.Tensor:
    """The q4q8 forward in float64 over the de-quantised weights, the activations quantised as the kernel does at
    every product: logits [T, V] of a causal prefill of `ids`."""
    c = fwd.config
    H, KV, hd, eps = fwd.heads, fwd.kv_heads, fwd.head_dim, float(c.rms_norm_eps)
    T, pos = len(ids), torch.arange(len(ids))
    x = fwd.embed[ids].double()                                                  # [T, d]
    W = lambda parts: torch.cat([p.dequantized() for p in parts]).double()       # noqa: E731
    for layer, (w_qkv, w_o, w_gu, w_down) in enumerate(fwd.layers):
        qkv = _quantised(_rms(x, fwd.norms[2 * layer], eps)) @ W(w_qkv).T
        q, k, v = qkv.split([H * hd, KV * hd, KV * hd], -1)
        q, k, v = (t if b is None else t + b.double() for t, b in zip((q, k, v), fwd.biases[layer]))
        if fwd.qk_norms[2 * layer] is not None:                                   # Qwen3: per-head q / k norms
            q = _rms(q.view(T, H, hd), fwd.qk_norms[2 * layer], eps).reshape(T, H * hd)
            k = _rms(k.view(T, KV, hd), fwd.qk_norms[2 * layer + 1], eps).reshape(T, KV * hd)
        q = _rotate(q.view(T, H, hd), pos, fwd.inv_freq, rotary_sign)
        k = _rotate(k.view(T, KV, hd), pos, fwd.inv_freq, rotary_sign)
        k, v = (t.view(T, KV, hd).repeat_interleave(H // KV, 1) for t in (k, v))     # [T, H, hd]
        s = torch.einsum("thd,shd->hts", q, k) * hd ** -0.5
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        att = torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(T, H * hd)
        x = x + _quantised(att) @ W(w_o).T
        gu = _quantised(_rms(x, fwd.norms[2 * layer + 1], eps)) @ W(w_gu).T
        g, u = gu.chunk(2, -1)
        x = x + _quantised(g / (1 + torch.exp(-g)) * u) @ W(w_down).T
    return _quantised(_rms(x, fwd.norm, eps)) @ W(fwd.head).T


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_llama_c_is_a_float64_forward_of_its_dequantised_weights(seed):
    """llama.c (one C call) against the same forward in float64 over the de-quantised weights with the same
    activation quantisation: within 1e-5 of the logits' scale. The check bites: a rotary sign flipped in the
    reference, or its activations left unquantised, is far outside it."""
    fwd = _tiny(seed)._switchsd_q4q8
    ids = random_prompt(10 + seed, 24)
    lg, _ = fwd.forward(torch.tensor([ids]), fwd.new_cache(64))
    ref = reference_forward(fwd, ids)
    scale = ref.abs().max()
    assert (lg.double() - ref).abs().max() / scale < 1e-5
    assert (lg.double() - reference_forward(fwd, ids, rotary_sign=-1.0)).abs().max() / scale > 1e-3


def test_llama_c_refuses_what_it_cannot_read():
    fwd = _tiny()._switchsd_q4q8
    cache = fwd.new_cache(64)
    for bad, msg in ((torch.tensor([[3, 64]]), "outside the vocabulary"), (torch.tensor([[-1, 3]]), "outside"),
                     (torch.zeros(1, 0, dtype=torch.long), "at least one row"),
                     (torch.tensor([[1.0, 2.0]]), "must be integers")):
        with pytest.raises(ValueError, match=msg):
            fwd.forward(bad, cache)
    assert len(cache) == 0, "nothing half-written into the cache"
    lin = fwd.layers[0][1][0]
    for value in (float("nan"), float("inf")):
        x = torch.randn(2, lin.in_features)
        x[1, 3] = value
        with pytest.raises(ValueError, match="NaN or inf"):
            lin(x)
    with pytest.raises(ValueError, match="no rows"):
        lin(torch.zeros(0, lin.in_features))
    wide = torch.randn(3, 2 * lin.in_features)
    strided = wide[:, ::2]                                   # a strided view: read as its values, not its memory
    assert not strided.is_contiguous() and torch.equal(lin(strided), lin(strided.contiguous()))
