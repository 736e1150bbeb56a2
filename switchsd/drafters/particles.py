"""Particle drafters for SMC-SD (switchsd/core/smc.py): N particles drafted side by side, each with its own state,
and the FULL draft law q over the target vocabulary at every drafted position (SMC weights by p / q).

The protocol (`ParticleDrafter`), driven by SMCEngine once per cycle:
    start(prompt, first, hidden)   the target has processed the prompt (hidden: its output_hidden_states, batch 1);
                                   first [N]: each particle's pending token
    draft(cur [N]) -> q [N, V]     advance every particle by its token cur; q of the next token (float32, CPU)
    observe(block, hidden)         the target verified block [N, gamma+1] = (pending, gamma drafts); hidden: the
                                   target's hidden states over it ([N, gamma+1, H] per layer) when `needs_hidden`
    reorder(anc [N])               systematic resampling: particle i continues ancestor anc[i]

`ModelParticles`: a draft model (an SPS model sharing the tokenizer, or `self_draft`: the target's first layers).
`Eagle3Particles`: the EAGLE-3 head (a trained drafter), fed the target's fused features of every verified
position (every drafted token is kept in SMC, so the features of the whole block enter its stable cache).
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch

from ..core.config import SamplingConfig
from ..core.verify import target_probs
from .eagle3 import target_dist
from .eagle3_model import Eagle3Head


class ParticleDrafter(Protocol):
    needs_hidden: bool

    def start(self, prompt: Sequence[int], first: torch.Tensor, hidden) -> None: ...
    def draft(self, cur: torch.Tensor) -> torch.Tensor: ...
    def observe(self, block: torch.Tensor, hidden) -> None: ...
    def reorder(self, anc: torch.Tensor) -> None: ...


class ModelParticles:
    """A causal LM drafting for N particles with one batched KV cache."""
    needs_hidden = False

    def __init__(self, model, temperature: float):
        self.model, self.sampling = model, SamplingConfig(temperature)
        self.dev = next(model.parameters()).device

    @torch.inference_mode()
    def start(self, prompt: Sequence[int], first: torch.Tensor, hidden) -> None:
        from transformers import DynamicCache
        self.cache = DynamicCache(config=self.model.config)
        self.model(input_ids=torch.tensor([list(prompt)], device=self.dev), cache=self.cache, use_cache=True,
                   logits_to_keep=1)
        self.cache.batch_repeat_interleave(first.shape[0])     # every particle holds the prompt
        self.pos = len(prompt)

    @torch.inference_mode()
    def draft(self, cur: torch.Tensor) -> torch.Tensor:
        n = cur.shape[0]
        pos = torch.full((n, 1), self.pos, device=self.dev)
        out = self.model(input_ids=cur[:, None].to(self.dev), position_ids=pos, cache=self.cache, use_cache=True,
                         logits_to_keep=1).logits[:, -1]                                  # [N, V]
        self.pos += 1
        return target_probs(out.float(), self.sampling).cpu()

    def observe(self, block: torch.Tensor, hidden) -> None:
        self.draft(block[:, -1])         # the model has seen pending .. x_{gamma-1}; x_gamma enters its cache

    def reorder(self, anc: torch.Tensor) -> None:
        self.cache.reorder_cache(anc.to(self.dev))


class Eagle3Particles:
    """The EAGLE-3 head for N particles. Alignment as in Eagle3Drafter: the head's input at index t pairs the
    target's fused features g_t with token x_{t+1} (rotary position t) and predicts x_{t+2}. Pairs with target
    features form a stable K/V per particle [N, kvh, S, hd]; draft-time pairs (the head's own output as the
    feature) sit in a temporary K/V dropped at `observe`."""
    needs_hidden = True

    def __init__(self, head: Eagle3Head, target, temperature: float):
        self.head, self.sampling = head, SamplingConfig(temperature)
        self.embed = target.get_input_embeddings()
        self.layers = head.config.layers_for(target.config.num_hidden_layers)   # hidden_states indices
        self.vocab = target.config.vocab_size
        self.dev = head.fc.weight.device

    def _fused(self, hidden) -> torch.Tensor:
        """hidden_states -> fused features [B, T, 3Ht] (low | mid | high) on the head's device."""
        return torch.cat([hidden[i].to(self.dev) for i in self.layers], -1)

    def _emb(self, toks: torch.Tensor) -> torch.Tensor:
        return self.embed(toks.to(self.embed.weight.device)).to(self.dev)

    @torch.inference_mode()
    def start(self, prompt: Sequence[int], first: torch.Tensor, hidden) -> None:
        n = first.shape[0]
        self.k = self.v = self.tk = self.tv = None
        self.pending_g = self._fused(hidden).expand(n, -1, -1)                     # [N, T, 3Ht]: g_0 .. g_{T-1}
        self.pending_x = torch.tensor(list(prompt[1:]), device=self.dev)[None].expand(n, -1)   # x_1 .. x_{T-1}
        self.out = None

    @torch.inference_mode()
    def draft(self, cur: torch.Tensor) -> torch.Tensor:
        cur = cur.to(self.dev)
        if self.pending_g is not None:       # the cycle's first draft: the verified pairs, then the pending token
            toks = torch.cat([self.pending_x, cur[:, None]], 1)                       # [N, n]
            h = self.head.fc(self.pending_g.to(self.head.fc.weight.dtype))           # [N, n, H]
            S = 0 if self.k is None else self.k.shape[2]
            pos = torch.arange(S, S + toks.shape[1], device=self.dev)
            out, k, v = self.head.step(self._emb(toks), h, pos, self.k, self.v, None)
            self.k = k if self.k is None else torch.cat([self.k, k], 2)
            self.v = v if self.v is None else torch.cat([self.v, v], 2)
            self.pending_g = self.pending_x = None
        else:                                # a later draft: the head's own output stands in for the features
            S, t = self.k.shape[2], 0 if self.tk is None else self.tk.shape[2]
            pk = self.k if self.tk is None else torch.cat([self.k, self.tk], 2)
            pv = self.v if self.tv is None else torch.cat([self.v, self.tv], 2)
            out, k, v = self.head.step(self._emb(cur[:, None]), self.out[:, None],
                                       torch.tensor([S + t], device=self.dev), pk, pv, None)
            self.tk = k if self.tk is None else torch.cat([self.tk, k], 2)
            self.tv = v if self.tv is None else torch.cat([self.tv, v], 2)
        self.out = out[:, -1]                                                          # [N, H]
        return target_dist(self.head, self.out, self.sampling, self.vocab).float().cpu()   # [N, V]

    def observe(self, block: torch.Tensor, hidden) -> None:
        self.tk = self.tv = None
        self.pending_g = self._fused(hidden)                # g at the block's positions [N, gamma+1, 3Ht]
        self.pending_x = block[:, 1:].to(self.dev)          # paired with x_1 .. x_gamma (the bonus comes as cur)

    def reorder(self, anc: torch.Tensor) -> None:
        a = anc.to(self.dev)
        self.k, self.v, self.out = self.k[a], self.v[a], self.out[a]
        if self.pending_g is not None:
            self.pending_g, self.pending_x = self.pending_g[a], self.pending_x[a]
