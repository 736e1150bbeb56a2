"""The exactness tests again, on CUDA (skipped without a GPU): every exact method (SMC-SD, approximate and T > 0
only, is left out), each with the drafter or probe it needs, equals greedy decoding; EAGLE-3 also under
`device_map`. tests/test_variants.py runs every SwitchSD variant by name on the CPU."""
import pytest
import torch
from helpers import make_tiny_model

from switchsd.core.config import CopyConfig, EngineConfig
from switchsd.core.probe import Probe
from switchsd.drafters.draft_model import DraftModelDrafter
from switchsd.drafters.eagle3 import Eagle3Drafter
from switchsd.drafters.eagle3_model import load_eagle3
from switchsd.factory import make_engine
from switchsd.methods import APPROXIMATE, METHODS, NEEDS_PROBE, build_policy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
H, V = 32, 64


def _tiny_target(dtype):
    """6 layers (EAGLE-3's fused layers 2, 3, 3 exist), vocab 64, eos 63."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, eos_token_id=63)
    return LlamaForCausalLM(cfg).to("cuda", dtype).eval().requires_grad_(False)


def _reference(model, ids, n):
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([out], device="cuda")).logits[0, -1]
            out.append(int(logits.argmax()))
    return out[len(ids):]


def _neural(method, model, tmp_path):
    """The neural drafter a method needs: a random EAGLE-3 head in the published layout, or a small model."""
    kind = "sps" if "sps" in method else "eagle3"
    if kind == "sps":
        draft = make_tiny_model(seed=7, vocab=V).to("cuda")
        return DraftModelDrafter(draft, V, gamma=3)
    from test_eagle3 import write_head
    write_head(tmp_path / "head")
    return Eagle3Drafter(load_eagle3(str(tmp_path / "head"), model), model)


EXACT = [m for m in METHODS if m not in APPROXIMATE]     # SMC-SD samples (T > 0 only): no greedy reference


@pytest.mark.parametrize("method", EXACT)
def test_tiny_float64_cuda_matches_reference(method, tmp_path):
    model = _tiny_target(torch.float64)
    g = torch.Generator().manual_seed(1)
    base = torch.randint(0, 60, (12,), generator=g).tolist()
    ids = base + base + base[:6]  # repeats so the copy drafters fire
    want = _reference(model, ids, 30)
    needs_neural = method not in ("vanilla", "copy", "pld", "copyspec")
    neural = _neural(method, model, tmp_path) if needs_neural else None
    probe = (Probe(torch.randn(H, generator=g), 3, "attn", 0.5, {"hidden_size": H, "num_layers": 6})
             if method in NEEDS_PROBE else None)
    policy = build_policy(method, (), CopyConfig(kappa=3), neural, tau=0.5 if probe else None)
    cfg = EngineConfig(max_new_tokens=30, budget=16, stop_at_eos=False)
    got = make_engine(model, policy, cfg, (), probe=probe).run(ids).token_ids
    assert got == want


@pytest.mark.real
@pytest.mark.parametrize("device_map", [None, "auto"])
def test_real_model_cuda_float32_all_methods_equal_vanilla(device_map):
    """Built as the CLIs build them (shipped probe and EAGLE-3 head); with device_map the fused features may
    come from different GPUs."""
    from switchsd.factory import DEFAULT_HEADS, DEFAULT_PROBES, Drafters, build_engine
    from switchsd.models.loading import load_model
    lm = load_model(dtype="float32", device="cuda", device_map=device_map)
    if not (DEFAULT_PROBES[lm.name].exists() and DEFAULT_HEADS[lm.name].exists()):
        pytest.skip("needs the shipped probe and EAGLE3 head")
    ids = lm.encode('Repeat this JSON exactly: {"name": "Alice", "age": 30, "tags": ["a", "b", "c"]}', chat=True)
    drafters = Drafters(lm)
    cfg = EngineConfig(max_new_tokens=64, budget=32)
    methods = [m for m in EXACT if "sps" not in m]            # no draft model ships for the offline target
    outs = {m: build_engine(m, lm, drafters, cfg).run(ids) for m in methods}
    for m in methods:
        assert outs[m].token_ids == outs["vanilla"].token_ids, m
    assert outs["copy"].stats["tok_per_fwd"] > 1.5


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("forward", ["hf", "lean"])
def test_families_on_cuda_every_copy_method_equals_vanilla(family, forward):
    """The families users bring (tests/families.py: Llama-3 rope scaling, Qwen2 biases, Qwen3 q/k norms, Mistral),
    made on the spot (no Hub), in float64 on CUDA through transformers' and the lean forward."""
    from families import make_family
    from helpers import repetitive_prompt
    model = make_family(family).to("cuda")
    prompt = repetitive_prompt(1, n=16, reps=3)
    cfg = EngineConfig(max_new_tokens=24, budget=16, forward=forward)
    want = make_engine(model, build_policy("vanilla", (1,)), cfg, (1,)).run(prompt).token_ids
    assert want == _reference(model, prompt, 24)[:len(want)]
    for method in ("copy", "pld", "copyspec", "samd", "lookahead"):
        got = make_engine(model, build_policy(method, (1,)), cfg, (1,)).run(prompt).token_ids
        assert got == want, (family, forward, method)
