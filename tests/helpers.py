"""Small helpers shared by the test modules (imported as `helpers`: pytest puts tests/ on sys.path)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from scipy import stats
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from switchsd.core.config import CopyConfig, EngineConfig, SamplingConfig
from switchsd.core.engine import Engine
from switchsd.factory import make_engine
from switchsd.methods import METHODS, build_policy

VOCAB = 64
EOS = 1
FIRST_TOKEN = 2  # random prompts use ids >= 2 (no EOS / bos-like 0 inside prompts unless a test wants it)


def _standalone_methods() -> tuple[str, ...]:
    """Methods in METHODS that run without a neural drafter (those raise ValueError without `neural=`)."""
    out = []
    for m in METHODS:
        try:
            build_policy(m)
        except ValueError:
            continue
        out.append(m)
    return tuple(out)


STANDALONE_METHODS = _standalone_methods()


# ---------------------------------------------------------------------------------------------- models
def make_tiny_model(seed: int = 0, max_pos: int = 256, vocab: int = VOCAB, eos: int = EOS,
                    logit_scale: float = 1.0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=max_pos,
                      eos_token_id=eos, bos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(cfg).to(torch.float64).eval()
    model.requires_grad_(False)
    if logit_scale != 1.0:
        with torch.no_grad():
            model.model.norm.weight.mul_(logit_scale)  # logits = lm_head(norm(h)) scale exactly
    return model


def perturbed(model, scale: float, seed: int = 5):
    """A copy of `model` with every weight jittered by `scale` x its own std: a draft that agrees with the
    target often but not always, so both accepted and rejected drafts are exercised."""
    import copy
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale * (p.std() if p.numel() > 1 else 1.0))
    return out


# --------------------------------------------------------------------------------------------- prompts
def random_prompt(seed: int, n: int, vocab: int = VOCAB) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(FIRST_TOKEN, vocab, (n,), generator=g).tolist()


def repetitive_prompt(seed: int, n: int = 20, reps: int = 2, tail: int = 6, vocab: int = VOCAB) -> list[int]:
    """A random sequence repeated `reps` times, then its first `tail` tokens: the suffix kappa-gram
    (kappa <= tail) occurred earlier, so copy drafters fire at step 0."""
    s = random_prompt(seed, n, vocab)
    return s * reps + s[:tail]


def looping_prompt(model, seed: int, n_loop: int = 20) -> list[int]:
    """repetitive_prompt + the model's own first `n_loop` greedy tokens. Tiny random models fall into short
    greedy loops, so the context already contains the continuation: copy drafts are *accepted* (long)."""
    base = repetitive_prompt(seed)
    return base + greedy_reference(model, base, n_loop, eos=None)


# ----------------------------------------------------------------------------------- reference decoding
@torch.no_grad()
def greedy_reference(model, prompt: Sequence[int], max_new_tokens: int, eos: int | Sequence[int] | None = EOS,
                     max_length: int | None = None) -> list[int]:
    """Plain greedy loop: full forward without a cache, argmax, append. The EOS token is included and stops;
    `max_length` bounds prompt + output."""
    eos_set = set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))
    tokens, out = list(prompt), []
    dev = next(model.parameters()).device
    while len(out) < max_new_tokens and (max_length is None or len(tokens) < max_length):
        t = int(model(input_ids=torch.tensor([tokens], device=dev)).logits[0, -1].argmax())
        tokens.append(t)
        out.append(t)
        if t in eos_set:
            break
    return out


def method_engine(model, method: str, max_new_tokens: int = 40, budget: int = 32, eos: Sequence[int] = (EOS,),
                sampling: SamplingConfig = SamplingConfig(), copy: CopyConfig = CopyConfig(), **kw) -> Engine:
    cfg = EngineConfig(max_new_tokens=max_new_tokens, budget=budget, sampling=sampling,
                       stop_at_eos=kw.pop("stop_at_eos", True))
    return make_engine(model, build_policy(method, eos_ids=eos, copy_cfg=copy), cfg, eos_ids=eos, **kw)


def run_method(model, method: str, prompt: Sequence[int], **kw):
    return method_engine(model, method, **kw).run(prompt)


def drafted_accepted(gen) -> tuple[int, int]:
    """(draft tokens verified, draft tokens accepted) of one generation: an equality with vanilla proves
    something only where both are > 0."""
    return sum(e.n_verified - 1 for e in gen.events), sum(len(e.accepted) for e in gen.events)


def check_event_stream(gen, prompt_len: int, budget: int) -> None:
    """Invariants every event stream must satisfy (independent of the method)."""
    pos = prompt_len
    for i, e in enumerate(gen.events):
        assert e.step == i
        assert e.position == pos, "events must be contiguous in the sequence"
        assert 1 <= len(e.new_tokens) <= len(e.accepted) + 1
        assert e.new_tokens[:len(e.accepted)] == e.accepted[:len(e.new_tokens)]
        assert e.n_verified <= max(budget, 1), "the trie exceeded the verification budget"
        assert (e.finished is not None) == (i == len(gen.events) - 1), "only the last event is finished"
        pos += len(e.new_tokens)
    assert [t for e in gen.events for t in e.new_tokens] == gen.token_ids
    assert gen.stats["steps"] == len(gen.events)


# ---------------------------------------------------------------------------------------------- caches
@torch.no_grad()
def fresh_cache(model, tokens: Sequence[int]) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    if tokens:
        dev = next(model.parameters()).device
        model(input_ids=torch.tensor([list(tokens)], device=dev), cache=cache, use_cache=True)
    return cache


def assert_cache_matches(model, layer_tensors, tokens: Sequence[int], atol: float = 1e-10) -> None:
    """`layer_tensors` (KVCache.layer_tensors()) must equal a fresh prefill of `tokens`."""
    ref = fresh_cache(model, tokens)
    assert len(layer_tensors) == len(ref.layers)
    for li, ((k, v), layer) in enumerate(zip(layer_tensors, ref.layers)):
        if not tokens:
            assert k is None or k.shape[2] == 0
            continue
        assert k.shape == layer.keys.shape, f"layer {li}: keys {tuple(k.shape)} vs {tuple(layer.keys.shape)}"
        assert torch.allclose(k, layer.keys, atol=atol, rtol=0), f"layer {li}: keys differ"
        assert torch.allclose(v, layer.values, atol=atol, rtol=0), f"layer {li}: values differ"


# ------------------------------------------------------------------------------------------ statistics
def chisq_pvalue(counts: dict, probs: dict, min_expected: float = 5.0) -> float:
    """Goodness of fit of observed `counts` (outcome -> n) to `probs` (outcome -> probability).

    Outcomes with expected count < `min_expected` are pooled into one bin. An observed outcome with
    probability 0 is an immediate failure (p-value 0)."""
    n = sum(counts.values())
    for k, c in counts.items():
        if c > 0 and probs.get(k, 0.0) <= 0.0:
            return 0.0
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for k, pk in probs.items():
        e = n * pk
        if e < min_expected:
            pool_o += counts.get(k, 0)
            pool_e += e
        else:
            obs.append(counts.get(k, 0))
            exp.append(e)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    exp = np.asarray(exp, dtype=np.float64)
    exp *= sum(obs) / exp.sum()  # remove float round-off so scipy's sum check passes
    if len(obs) < 2:
        return 1.0
    return float(stats.chisquare(np.asarray(obs, dtype=np.float64), exp).pvalue)
