"""The exactness tests again, on CUDA (skipped without a GPU)."""
import pytest
import torch

from switchsd.core.config import EngineConfig
from switchsd.core.engine import Engine
from switchsd.core.methods import METHODS, build_policy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _tiny(dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, eos_token_id=63)
    return LlamaForCausalLM(cfg).to("cuda", dtype).eval()


def _reference(model, ids, n):
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([out], device="cuda")).logits[0, -1]
            out.append(int(logits.argmax()))
    return out[len(ids):]


@pytest.mark.parametrize("method", METHODS)
def test_tiny_float64_cuda_matches_reference(method):
    model = _tiny(torch.float64)
    g = torch.Generator().manual_seed(1)
    base = torch.randint(0, 60, (12,), generator=g).tolist()
    ids = base + base + base[:6]  # repeats so the copy drafters fire
    want = _reference(model, ids, 30)
    cfg = EngineConfig(max_new_tokens=30, budget=16, stop_at_eos=False)
    got = Engine(model, build_policy(method), cfg, ()).run(ids).token_ids
    assert got == want


@pytest.mark.real
def test_real_model_cuda_float32_all_methods_equal_vanilla():
    from switchsd.target.models import load_model
    lm = load_model(dtype="float32", device="cuda")
    ids = lm.encode('Repeat this JSON exactly: {"name": "Alice", "age": 30, "tags": ["a", "b", "c"]}', chat=True)
    eos = lm.eos_ids()
    outs = {}
    for m in METHODS:
        outs[m] = Engine(lm.model, build_policy(m, eos), EngineConfig(max_new_tokens=64, budget=32), eos).run(ids)
    for m in METHODS:
        assert outs[m].token_ids == outs["vanilla"].token_ids, m
    assert outs["copy"].stats["tok_per_fwd"] > 1.5
