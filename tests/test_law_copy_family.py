"""At T > 0 the copy family (CopySpec, SAM-Decoding, Lookahead) samples the target's own law: the joint law of the
first three generated tokens, over many seeds, on a tiny model with a vocabulary of 8, against the exact law from
the model's own forwards (chi-square, p > 1e-3). The same test rejects two planted bugs (p < 1e-6): the cache not
rolled back after a rejection (rejected draft tokens stay in the context), and a rejection that does not remove
the rejected token's mass from the target's law (the bonus drawn from p instead of the residual)."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from helpers import chisq_pvalue, greedy_reference, method_engine, repetitive_prompt
from test_sampling import make_flawed

from switchsd.core import engine as engine_mod
from switchsd.core.cache import KVCache
from switchsd.core.config import CopyConfig, SamplingConfig
from switchsd.models.lean import StaticKVCache

V = 8
# seeds per method: Lookahead's pool drafts carry little of the target's mass when rejected, so a residual bug
# moves its law less; 10,000 runs give the test the power to see it
RUNS = {"copyspec": 2500, "samd": 2500, "lookahead": 10000}
PASS, REJECT = 1e-3, 1e-6
METHODS = ("copyspec", "samd", "lookahead")


@pytest.fixture(scope="module")
def setup():
    from helpers import make_tiny_model
    model = make_tiny_model(seed=3, vocab=V, eos=V - 1, logit_scale=12.0)     # peaked: drafts are often accepted
    with torch.no_grad():           # sharp attention: what the context holds moves the law, so a stale row shows
        for block in model.model.layers:
            block.self_attn.q_proj.weight.mul_(8.0)
            block.self_attn.k_proj.weight.mul_(8.0)
            block.self_attn.v_proj.weight.mul_(3.0)
    base = repetitive_prompt(7, n=12, reps=2, tail=4, vocab=V)
    prompt = base + greedy_reference(model, base, 12, eos=None)     # the context holds the likely continuation
    return model, prompt, _law(model, prompt)


@torch.no_grad()
def _law(model, prompt) -> dict[tuple, float]:
    """Exact p(x1, x2, x3) at temperature 1: one batched forward per depth."""
    law = {(): 1.0}
    for _ in range(3):
        keys = list(law)
        logits = model(input_ids=torch.tensor([prompt + list(k) for k in keys])).logits[:, -1]
        p = torch.softmax(logits.double(), -1)
        law = {k + (x,): law[k] * float(p[i, x]) for i, k in enumerate(keys) for x in range(V)}
    return law


def _runs(model, prompt, method: str) -> tuple[Counter, int, int]:
    eng = method_engine(model, method, max_new_tokens=3, eos=(), copy=CopyConfig(kappa=2),
                        sampling=SamplingConfig(temperature=1.0), stop_at_eos=False)
    triples, drafted, rejected = Counter(), 0, 0
    for i in range(RUNS[method]):
        gen = eng.run(prompt, generator=torch.Generator().manual_seed(i))
        triples[tuple(gen.token_ids[:3])] += 1
        for e in gen.events:
            drafted += e.n_verified - 1
            rejected += (e.n_verified - 1) > len(e.accepted)
    return triples, drafted, rejected


def _pvalues(triples: Counter, law: dict) -> list[float]:
    """p-values of the first token, the first two and all three."""
    out = []
    for n in (1, 2, 3):
        counts, probs = Counter(), Counter()
        for k, c in triples.items():
            counts[k[:n]] += c
        for k, p in law.items():
            probs[k[:n]] += p
        out.append(chisq_pvalue(counts, dict(probs)))
    return out


def _no_rollback(self, prefix_len, rows) -> None:
    """Planted bug: the verify forward's rows all stay in the cache, rejected ones included."""


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_the_copy_family_samples_the_target_law(setup, method):
    model, prompt, law = setup
    triples, drafted, rejected = _runs(model, prompt, method)
    assert drafted > RUNS[method] // 2 and rejected > RUNS[method] // 5, (drafted, rejected)   # something to test
    assert min(_pvalues(triples, law)) > PASS, _pvalues(triples, law)


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["no-rollback", "no-residual"])
@pytest.mark.parametrize("method", METHODS)
def test_the_law_test_rejects_a_planted_bug(setup, method, bug, monkeypatch):
    model, prompt, law = setup
    if bug == "no-rollback":
        monkeypatch.setattr(KVCache, "keep", _no_rollback)
        monkeypatch.setattr(StaticKVCache, "keep", _no_rollback)
    else:
        monkeypatch.setattr(engine_mod, "accept_sampling", make_flawed("resample_from_p"))
    triples, _, _ = _runs(model, prompt, method)
    assert min(_pvalues(triples, law)) < REJECT, _pvalues(triples, law)
