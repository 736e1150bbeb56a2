"""SPS drafter: a small causal LM sharing the target's tokenizer drafts gamma tokens autoregressively
(argmax at T = 0; sampled, with their distributions q, at T > 0 — verified by standard speculative sampling).

Its KV cache is rolled back and synced lazily: at `propose` the cache is cropped to the longest prefix it
shares with the committed tokens, and every committed token it has not seen (accepted drafts, tokens
committed by other drafters' steps, the bonus) is fed in ONE batched forward — the forward that also gives
the first draft token.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..core.cache import KVCache, check_grew
from ..core.config import SamplingConfig
from ..core.drafting import Draft, DraftRequest
from ..core.verify import greedy_tokens, target_probs


class DraftModelDrafter:
    name = "sps"
    path = "neural"

    def __init__(self, model, target_vocab: int, gamma: int = 5, sampling: SamplingConfig = SamplingConfig(),
                 generator: torch.Generator | None = None):
        self.model, self.gamma, self.sampling = model, gamma, sampling
        self.vocab = target_vocab
        self.generator = generator or torch.Generator().manual_seed(0)
        self.reset([])

    def reset(self, tokens: Sequence[int]) -> None:
        self.cache = KVCache(self.model.config)
        self.seen: list[int] = []      # tokens whose K/V are in self.cache
        self.tokens = tokens

    def extend(self, tokens: Sequence[int], n_new: int) -> None:
        self.tokens = tokens

    def _q(self, logits: torch.Tensor) -> torch.Tensor:
        q = target_probs(logits, self.sampling).float().cpu()
        if q.shape[-1] != self.vocab:  # pad / trim the draft vocab to the target's
            out = torch.zeros(self.vocab)
            n = min(self.vocab, q.shape[-1])
            out[:n] = q[:n]
            q = out / out.sum()
        return q

    @torch.inference_mode()
    def propose(self, req: DraftRequest) -> Draft:
        n = min(self.gamma, req.max_len)
        if n < 1:
            return Draft([])
        tokens = req.tokens
        common = 0
        for a, b in zip(self.seen, tokens):
            if a != b:
                break
            common += 1
        common = min(common, len(tokens) - 1)   # always feed at least the pending token
        self.cache.crop(common)
        self.seen = list(tokens[:common])
        dev = next(self.model.parameters()).device
        feed = list(tokens[common:])
        out_toks, qs = [], []
        for i in range(n):
            x = torch.tensor(feed, device=dev)[None]
            pos = torch.arange(len(self.seen), len(self.seen) + len(feed), device=dev)[None]
            before = len(self.cache)
            logits = self.model(input_ids=x, position_ids=pos, cache=self.cache.hf, use_cache=True,
                                logits_to_keep=1).logits[0, -1]
            check_grew(self.cache, before, len(feed))
            self.seen += feed
            if self.sampling.greedy:
                tok = int(greedy_tokens(logits))
                if tok >= self.vocab:
                    break
            else:
                q = self._q(logits)
                tok = int(torch.multinomial(q, 1, generator=self.generator))
                qs.append(q)
            out_toks.append(tok)
            feed = [tok]
        return Draft([out_toks], q=[qs] if qs else None)
