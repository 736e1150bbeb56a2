"""The lean forward computes transformers' numbers: bit-for-bit equal logits and hidden states for prefills,
one-token steps, masked causal chains and tree-masked verify forwards (tiny float64 Llama, and the real model in
float32 and bfloat16), the same greedy tokens for every method, and a cache that grows and rolls back. A maskless
chain (the engine's verify chains) equals one-token steps bit for bit instead (bfloat16, int4)."""
from __future__ import annotations

import pytest
import torch
from helpers import STANDALONE_METHODS, method_engine, random_prompt, repetitive_prompt
from transformers import GPT2Config, GPT2LMHeadModel

from switchsd.core.config import EngineConfig
from switchsd.core.tree import build_tree, tree_mask, tree_positions
from switchsd.models.forward import HFTarget, LeanTarget, make_target, resolve_forward
from switchsd.models.lean import LeanLlama, StaticKVCache, supports

SITES = [(0, "attn"), (1, "mlp")]


def _both(model, sites=SITES):
    hf, lean = HFTarget(model, sites), LeanTarget(model, sites)
    hf.attach()
    return hf, lean


def _same_step(hf, lean, ch, cl, ids, pos=None, mask=None, rows=None):
    a = hf.forward(ids, ch, pos, mask, logit_rows=rows)
    b = lean.forward(ids, cl, pos, mask, logit_rows=rows)
    assert torch.equal(a, b), f"logits differ by {(a - b).abs().max().item()}"
    for site in hf.last:
        assert torch.equal(hf.last[site], lean.last[site]), f"hidden state {site} differs"
    assert len(ch) == len(cl)
    return a


@torch.inference_mode()
def _check_model(model, prompt, vocab):
    """transformers' numbers from the lean forward's single-call attention (its row-by-row verify attention,
    `RowKeys`, computes vanilla's one-token steps instead: tested below)."""
    lean_fw = LeanLlama.of(model)
    exact, lean_fw.row_exact = lean_fw.row_exact, False
    try:
        _check_steps(model, prompt, vocab)
    finally:
        lean_fw.row_exact = exact


def _check_steps(model, prompt, vocab):
    hf, lean = _both(model)
    ch, cl = hf.new_cache(4), lean.new_cache(4)       # the lean cache starts too small: it must grow
    dev = next(model.parameters()).device
    last = _same_step(hf, lean, ch, cl, torch.tensor([prompt[:-1]], device=dev), rows=-1)   # prefill
    tok = prompt[-1]
    for _ in range(4):                                                                       # one-token steps
        last = _same_step(hf, lean, ch, cl, torch.tensor([[tok]], device=dev))
        tok = int(last[-1].argmax())
    chain = [tok, 3, 4, 5]                                            # a causal chain, masked as transformers does
    link = build_tree(tok, [[3, 4, 5]], budget=16)
    _same_step(hf, lean, ch, cl, torch.tensor([chain], device=dev), tree_positions(link, len(ch), dev),
               tree_mask(link, len(ch), next(model.parameters()).dtype, dev))
    ch.crop(len(ch) - 3), cl.crop(len(cl) - 3)
    tree = build_tree(chain[1], [[5, 6, 7], [5, 8], [9 % vocab]], budget=16)              # a masked tree
    prefix = len(ch)
    mask = tree_mask(tree, prefix, next(model.parameters()).dtype, dev, pad=2)
    pos = tree_positions(tree, prefix, dev, pad=2)
    ids = torch.tensor([tree.tokens + [tree.tokens[0]] * 2], device=dev)
    _same_step(hf, lean, ch, cl, ids, pos, mask, rows=len(tree.tokens))
    keep = [0] + tree.path_to(len(tree.tokens) - 1)                                        # non-contiguous
    ch.keep(prefix, keep), cl.keep(prefix, keep)
    _same_step(hf, lean, ch, cl, torch.tensor([[11]], device=dev))


def test_lean_equals_transformers_tiny(tiny_model):
    _check_model(tiny_model, random_prompt(3, 12), tiny_model.config.vocab_size)


@pytest.mark.real
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lean_equals_transformers_real(real_lm, dtype):
    """Prefills longer than the fast-path width (45 tokens) run the original matrices; verify forwards the
    fused, packed ones; both give transformers' numbers bit for bit."""
    from switchsd.models.loading import load_model
    lm = real_lm if dtype == "float32" else load_model(dtype=dtype, device="cpu")
    prompt = lm.encode("Write a Python function that reverses a linked list, then explain it.", chat=True)
    assert len(prompt) > LeanLlama.of(lm.model).exact_rows
    _check_model(lm.model, prompt, lm.model.config.vocab_size)


def _skip_unless_rows_consistent(lean: LeanLlama) -> None:
    """Bit-for-bit row equality needs this CPU's 16-bit matrix products to give a row the same rounding whatever
    the number of rows beside it. On some CPUs (seen on an AMD EPYC with AVX-512 BF16, 2026-12-02) a bfloat16
    product over K = 1536 (the MLP's down projection) splits its reduction differently for 2+ rows than for one:
    there no forward can make a verify row equal a one-token step (float32 and int4 are unaffected)."""
    g = torch.Generator().manual_seed(0)
    for lin in lean.layers[0][1:]:
        if not hasattr(lin, "fast") or lin.dtype not in (torch.bfloat16, torch.float16):
            continue
        x = torch.randn(1, 32, lin.in_features, generator=g).to(lin.dtype)
        one = torch.cat([lin.fast(x[:, i:i + 1]) for i in range(32)], 1)
        if not torch.equal(lin.fast(x), one):
            pytest.skip(f"this CPU's {lin.dtype} matrix product rounds a row differently when other rows are "
                        f"present (K = {lin.in_features}): bit-for-bit verify rows cannot hold here")


@pytest.mark.real
@pytest.mark.parametrize("fmt", ["bfloat16", "int4"])
@torch.inference_mode()
def test_verify_tree_rows_equal_one_token_steps_bit_for_bit(fmt):
    """A tree-masked verify forward (two branches, pad rows) attends row by row over each row's own keys: every
    real row's logits are those of one-token steps along its branch, bit for bit."""
    from switchsd.models.int4 import available
    from switchsd.models.loading import load_model
    if fmt == "int4" and not available():
        pytest.skip("no CPU int4 kernel in this torch build")
    lean = LeanTarget(load_model(dtype=fmt, device="cpu").model)
    _skip_unless_rows_consistent(lean.lean)
    ids = torch.randint(0, 49152, (1, 80), generator=torch.Generator().manual_seed(2))
    tree = build_tree(int(ids[0, -1]), [[11, 12, 13], [11, 14], [15]], budget=16)

    def cache():
        c = lean.new_cache(8)
        lean.forward(ids[:, :-1], c, logit_rows=-1)
        return c

    c = cache()
    n = len(c)
    got = lean.forward(torch.tensor([tree.tokens + [tree.tokens[0]] * 2]), c, tree_positions(tree, n, "cpu", 2),
                       tree_mask(tree, n, lean.lean.dtype, "cpu", 2), logit_rows=len(tree.tokens))
    for r in range(len(tree.tokens)):
        path = [0] + tree.path_to(r) if r else [0]
        c = cache()
        for row in path:
            want = lean.forward(torch.tensor([[tree.tokens[row]]]), c)
        assert torch.equal(got[r], want[0]), (r, (got[r].float() - want[0].float()).abs().max())


@pytest.mark.real
@pytest.mark.parametrize("fmt", ["bfloat16", "int4"])
@torch.inference_mode()
def test_verify_chain_equals_one_token_steps_bit_for_bit(fmt):
    """A maskless chain (how the engine verifies chains) attends row by row, so each row's logits and hidden
    states are the one-token step's at that position bit for bit, in bfloat16 and int4 too (one masked call over
    every row rounds some rows differently: the reduction over keys depends on their count)."""
    from switchsd.models.int4 import available
    from switchsd.models.loading import load_model
    if fmt == "int4" and not available():
        pytest.skip("no CPU int4 kernel in this torch build")
    lean = LeanTarget(load_model(dtype=fmt, device="cpu").model, [(4, "attn"), (20, "mlp")])
    _skip_unless_rows_consistent(lean.lean)
    ids = torch.randint(0, 49152, (1, 90), generator=torch.Generator().manual_seed(1))
    outs = []
    for chained in (False, True):
        cache = lean.new_cache(8)
        lean.forward(ids[:, :80], cache, logit_rows=-1)
        if chained:
            logits = lean.forward(ids[:, 80:], cache)
            hidden = dict(lean.last)
        else:
            steps = [(lean.forward(ids[:, j:j + 1], cache), dict(lean.last)) for j in range(80, 90)]
            logits = torch.cat([lg for lg, _ in steps])
            hidden = {k: torch.cat([h[k] for _, h in steps], 1) for k in steps[0][1]}
        outs.append((logits, hidden))
    (a, ha), (b, hb) = outs
    assert torch.equal(a, b), (a.float() - b.float()).abs().max()
    assert all(torch.equal(ha[k], hb[k]) for k in ha)


@torch.inference_mode()
def _steps_both_ways(lean_fw: LeanLlama, prompt: torch.Tensor, n: int, sites) -> list[torch.Tensor]:
    outs = []
    for scripted in (lean_fw.step, None):
        step, lean_fw.step = lean_fw.step, scripted
        try:
            cache = lean_fw.new_cache(8)
            lg, _ = lean_fw.forward(prompt, cache, logit_rows=-1)
            got = []
            for k in range(n):                                   # captures on some steps only (EAGLE-3, probe)
                lg, cap = lean_fw.forward(lg[-1:].argmax(-1)[None], cache, sites=sites if k % 2 else ())
                got += [lg] + [cap[s] for s in sorted(cap)]
            outs.append(got)
        finally:
            lean_fw.step = step
    return outs


@pytest.mark.parametrize("fmt", ["tiny", pytest.param("int4", marks=pytest.mark.real)])
def test_scripted_step_is_the_python_loop_bit_for_bit(tiny_model, fmt):
    """One-token steps run their layer loop in TorchScript (switchsd/models/scripted.py): the same ops as the
    Python loop, so logits and captured hidden states are equal bit for bit (float64 tiny model; the real model
    in int4; float32 and bfloat16 are covered against transformers above)."""
    if fmt == "int4":
        from switchsd.models.int4 import available
        from switchsd.models.loading import load_model
        if not available():
            pytest.skip("no CPU int4 kernel in this torch build")
        model = load_model(dtype="int4", device="cpu").model
    else:
        model = tiny_model
    lean_fw = LeanLlama.of(model)
    assert lean_fw.step is not None, "the scripted step should be available on CPU"
    prompt = torch.tensor([random_prompt(5, 20, model.config.vocab_size)])
    sites = [(0, "attn"), (1, "mlp"), (model.config.num_hidden_layers - 1, "mlp")]
    a, b = _steps_both_ways(lean_fw, prompt, 12, sites)
    assert len(a) == len(b) > 12
    for x, y in zip(a, b):
        assert torch.equal(x, y), (x.float() - y.float()).abs().max()


@pytest.mark.parametrize("method", STANDALONE_METHODS)
def test_every_method_same_tokens_on_both_forwards(tiny_model, method):
    prompt = repetitive_prompt(5)
    outs = []
    for forward in ("hf", "lean"):
        eng = method_engine(tiny_model, method, max_new_tokens=24)
        eng.target = make_target(tiny_model, eng.sites, forward)
        assert eng.target.kind == forward
        outs.append(eng.run(prompt).token_ids)
    assert outs[0] == outs[1]


def test_static_cache_grows_and_keeps():
    c = StaticKVCache(layers=2, kv_heads=1, head_dim=2, capacity=2, dtype=torch.float32, device="cpu")
    with torch.inference_mode():
        c.reserve(5)
        c.k[:, :, :, :5] = torch.arange(5.0)[None, None, None, :, None]
        c.length = 5
        c.reserve(40)                                  # grows, the valid prefix moves along
        assert c.capacity >= 40 and c.k[0, 0, 0, :5, 0].tolist() == [0, 1, 2, 3, 4]
        c.keep(1, [0, 2, 3])                           # positions 1, 3, 4 kept after the prefix 0
        assert len(c) == 4 and c.k[1, 0, 0, :4, 1].tolist() == [0, 1, 3, 4]
        c.crop(2)
        assert len(c) == 2 and c.layer_tensors()[0][0].shape == (1, 1, 2, 2)


def test_unsupported_models_fall_back_with_a_reason():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=32, n_positions=16))
    assert "gpt2" in supports(gpt2)
    assert resolve_forward(gpt2, "auto") == "hf"
    with pytest.raises(ValueError, match="lean forward does not support"):
        resolve_forward(gpt2, "lean")
    with pytest.raises(ValueError, match="forward must be"):
        resolve_forward(gpt2, "fast")
    with pytest.raises(ValueError, match="forward must be"):
        EngineConfig(forward="fast")


def test_engine_uses_the_lean_forward_by_default(tiny_model):
    eng = method_engine(tiny_model, "vanilla")
    assert eng.target.kind == "lean"
