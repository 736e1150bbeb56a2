"""The families users bring, on every forward: Llama-3.x (llama3 rope scaling, tied head), Qwen2 (q/k/v biases),
Qwen3 (per-head q/k norms), Mistral (untied head), and every GGUF block type in the C forward.

- the lean forward equals transformers' bit for bit (float64), steps, chains and trees;
- the C forward over a Q4_K_M-like mix equals a float64 forward of its de-quantised weights with the kernel's
  activation quantisation (each block type's product is tests/test_qx.py's, bit for bit), and over every block type
  its verify rows equal one-row steps bit for bit;
- every method's tokens equal vanilla's at T = 0 on the transformers, lean and C forwards;
- the T > 0 law of one chain method and one tree method on a Qwen3 model (test_law_families below)."""
import pytest
import torch
from families import FAMILIES, gguf_forward, make_family
from helpers import drafted_accepted, method_engine, random_prompt, repetitive_prompt
from test_lean import _check_model
from test_q4q8 import reference_forward

from switchsd.core.config import EngineConfig
from switchsd.factory import make_engine
from switchsd.kernels.qx import READABLE
from switchsd.methods import build_policy
from switchsd.models.lean import supports

METHODS = ("copy", "pld", "copyspec", "samd", "lookahead")


@pytest.mark.parametrize("family", FAMILIES)
def test_lean_equals_transformers(family):
    model = make_family(family)
    assert supports(model) is None
    _check_model(model, random_prompt(3, 12), model.config.vocab_size)


@pytest.mark.parametrize("family", FAMILIES)
def test_c_forward_of_each_family_is_a_float64_forward(family):
    """A Q4_K_M-like mix (Q4_K, Q6_K, Q5_0 / Q8_0 fallbacks) on each family (biases, q/k norms, llama3 rope): the
    float64 forward's logits within 1e-2 of their scale, a flipped rotary sign beyond 0.3. (The reference norms in
    float64, the kernel in float32: an activation within a float32 rounding of an 8-bit grid boundary can land on
    the neighbouring code in one of them, which moves later rows by ~1e-3 of the scale; a wrong bias, norm or
    rotation moves them by the scale itself.)"""
    model = make_family(family)
    fwd = gguf_forward(model, ["Q4_K", "Q4_K", "Q6_K"])
    ids = random_prompt(11, 20)
    lg, _ = fwd.forward(torch.tensor([ids]), fwd.new_cache(64))
    ref = reference_forward(fwd, ids)
    scale = ref.abs().max()
    assert (lg.double() - ref).abs().max() / scale < 1e-2
    assert (lg.double() - reference_forward(fwd, ids, rotary_sign=-1.0)).abs().max() / scale > 0.3


@pytest.mark.parametrize("family", FAMILIES)
def test_c_forward_verify_rows_equal_one_row_steps(family):
    model = make_family(family)
    fwd = gguf_forward(model, READABLE)                      # every block type the C forward reads, in turn
    prompt, chain = random_prompt(5, 14), random_prompt(6, 7)
    cache = fwd.new_cache(64)
    fwd.forward(torch.tensor([prompt]), cache)
    wide, _ = fwd.forward(torch.tensor([chain]), cache)
    cache = fwd.new_cache(64)
    fwd.forward(torch.tensor([prompt]), cache)
    steps = torch.cat([fwd.forward(torch.tensor([[t]]), cache)[0] for t in chain])
    assert torch.equal(wide, steps)


@pytest.mark.parametrize("family", FAMILIES)
def test_c_forward_vector_paths_are_the_portable_bits(family):
    """The vector paths (the CPU's best: norms of several rows or heads side by side, SwiGLU and attention on 8 or 16
    lanes, the products' pair kernels) against the portable C path on each family, a prefill and a chain, Qwen3's
    per-head q/k norms included: the same logits and states, bit for bit."""
    from switchsd.kernels import q4q8
    if q4q8.best_path() == "portable":
        pytest.skip("this CPU has no vector path")
    prompt, chain = random_prompt(5, 21), random_prompt(6, 7)
    outs = []
    for path in ("auto", "portable"):
        fwd = gguf_forward(make_family(family), ["Q4_K", "Q4_K", "Q6_K"], path)
        cache = fwd.new_cache(64)
        a, _ = fwd.forward(torch.tensor([prompt]), cache)
        b, _ = fwd.forward(torch.tensor([chain]), cache)
        outs.append((a, b))
    for x, y in zip(*outs):
        assert torch.equal(x, y)


def _engine(model, method, forward):
    cfg = EngineConfig(max_new_tokens=24, budget=16, forward=forward)
    return make_engine(model, build_policy(method, eos_ids=(1,)), cfg, eos_ids=(1,))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("forward", ["hf", "lean", "c"])
def test_every_method_equals_vanilla(family, forward):
    model = make_family(family, dtype=torch.float32 if forward == "c" else torch.float64)
    if forward == "c":
        gguf_forward(model, ["Q4_K", "Q4_K", "Q6_K"])
    fw = "auto" if forward == "c" else forward
    drafted = 0
    for seed in (1, 2):
        prompt = repetitive_prompt(seed, n=16, reps=3)
        want = _engine(model, "vanilla", fw).run(prompt).token_ids
        for method in METHODS:
            gen = _engine(model, method, fw).run(prompt)
            assert gen.token_ids == want, (family, forward, method)
            drafted += drafted_accepted(gen)[0]
    assert drafted > 0
    target = _engine(model, "vanilla", fw).target
    assert target.kind == ("hf" if forward == "hf" else "lean")
    assert (getattr(target, "lean", None) is getattr(model, "_switchsd_q4q8", 0)) == (forward == "c")


def test_unsupported_rope_is_named():
    model = make_family("llama3")
    model.config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
    assert "dynamic" in supports(model)


def test_method_engine_runs_on_qwen3():
    """helpers.method_engine (the suite's usual entry) runs a Qwen3 model as it runs Llama ones."""
    model = make_family("qwen3")
    prompt = repetitive_prompt(3, n=16, reps=3)
    assert method_engine(model, "copy", max_new_tokens=16).run(prompt).token_ids == \
        method_engine(model, "vanilla", max_new_tokens=16).run(prompt).token_ids


@pytest.fixture(scope="module")
def qwen3_law():
    """A Qwen3 model with a vocabulary of 8, peaked and with sharp attention (as test_law_copy_family's Llama)."""
    import test_law_copy_family as law
    from families import SIZES
    from helpers import greedy_reference
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(3)
    cfg = Qwen3Config(**{**SIZES, "vocab_size": law.V, "hidden_size": 32, "intermediate_size": 64,
                         "eos_token_id": law.V - 1}, head_dim=8, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).double().eval()
    model.requires_grad_(False)
    with torch.no_grad():
        model.model.norm.weight.mul_(12.0)
        for block in model.model.layers:
            block.self_attn.q_proj.weight.mul_(8.0)
            block.self_attn.k_proj.weight.mul_(8.0)
            block.self_attn.v_proj.weight.mul_(3.0)
            block.self_attn.q_norm.weight.mul_(3.0)
            block.self_attn.k_norm.weight.mul_(3.0)
    base = repetitive_prompt(7, n=12, reps=2, tail=4, vocab=law.V)
    prompt = base + greedy_reference(model, base, 12, eos=None)
    return model, prompt, law._law(model, prompt)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["copyspec", "lookahead"])      # a chain method and a multi-branch one
def test_law_on_qwen3(qwen3_law, method, monkeypatch):
    """T = 1: the joint law of the first three tokens equals the Qwen3 target's (p > 1e-3); with the rejected mass
    left in the residual (a planted bug) it is rejected (p < 1e-6)."""
    import test_law_copy_family as law
    from test_sampling import make_flawed

    from switchsd.core import engine as engine_mod
    model, prompt, exact = qwen3_law
    monkeypatch.setitem(law.RUNS, method, 2500)
    triples, drafted, rejected = law._runs(model, prompt, method)
    assert drafted > 1000 and rejected > 100, (drafted, rejected)
    assert min(law._pvalues(triples, exact)) > law.PASS, law._pvalues(triples, exact)
    monkeypatch.setattr(engine_mod, "accept_sampling", make_flawed("resample_from_p"))
    triples, _, _ = law._runs(model, prompt, method)
    assert min(law._pvalues(triples, exact)) < law.REJECT, law._pvalues(triples, exact)
