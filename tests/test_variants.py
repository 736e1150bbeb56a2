"""Every SwitchSD variant, built by name as the command line, the benchmark and the studio build it
(`factory.build_engine`), on a tiny float64 model on the CPU: its text equals greedy decoding, and it drafted and
had draft tokens accepted (an equality with nothing drafted would prove nothing)."""
from __future__ import annotations

import pytest
import torch
from helpers import drafted_accepted, greedy_reference, make_tiny_model

from switchsd.core.config import EngineConfig
from switchsd.core.probe import Probe
from switchsd.factory import Drafters, build_engine
from switchsd.models.loading import LoadedModel

H, V, LAYERS = 32, 64, 6
VARIANTS = ["switchsd", "switchsd-paper", "switchsd@chain2", "switchsd@chain1+k3", "switchsd@tree2x3x8",
            "switchsd+k4+t0.2", "switchsd+conf", "switchsd-sps", "switchsd-sps-paper", "switchsd-sps@chain3"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from test_eagle3 import write_head
    from transformers import LlamaConfig, LlamaForCausalLM
    tmp = tmp_path_factory.mktemp("variants")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, eos_token_id=63)
    model = LlamaForCausalLM(cfg).to(torch.float64).eval().requires_grad_(False)
    write_head(tmp / "head")                                  # a random head in the published EAGLE-3 layout
    Probe(torch.randn(H, generator=torch.Generator().manual_seed(3)), 3, "attn", 0.0,   # tau 0: fires at every
          {"hidden_size": H, "num_layers": LAYERS}).save(tmp / "probe.safetensors")   # kappa-gram match
    draft = make_tiny_model(seed=7, vocab=V)              # the SPS drafter, loaded by name like a user's model
    draft.save_pretrained(tmp / "draft")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0").save_pretrained(tmp / "draft")
    lm = LoadedModel(model, tokenizer=None, name="tiny")
    base = torch.randint(0, 60, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    ids = base + base + base[:6]                             # repeats, so the copy path fires
    return lm, Drafters(lm, str(tmp / "head"), str(tmp / "draft"), str(tmp / "probe.safetensors")), ids


@pytest.mark.parametrize("method", VARIANTS)
def test_every_switchsd_variant_by_name_equals_greedy_and_drafts(setup, method):
    lm, drafters, ids = setup
    want = greedy_reference(lm.model, ids, 30, eos=None)
    res = build_engine(method, lm, drafters, EngineConfig(max_new_tokens=30, budget=16, stop_at_eos=False),
                       cost=None).run(ids)
    assert res.token_ids == want, method
    drafted, accepted = drafted_accepted(res)
    assert drafted > 0 and accepted > 0, (method, drafted, accepted)
