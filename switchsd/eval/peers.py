"""What transformers users already have, as benchmark rows (llama.cpp's rows: `switchsd.eval.llama_server`).

- `hf`: `model.generate` (greedy, or sampling with the same temperature / top-k / top-p);
- `hf-pld`: `generate(..., prompt_lookup_num_tokens=10)` (prompt lookup decoding);
- `hf-assisted`: `generate(..., assistant_model=DRAFT)` (assisted generation with a small draft model);

A peer runs like an Engine (`run(ids, generator) -> Generation`, wall time around the call, stop at EOS), so
the benchmark times it the same way, with transformers' default attention kernel (SDPA) even where our
engine runs another one that calibrate found faster on this device. Target forwards are counted with a forward pre-hook on the model (for
tokens per forward); the step-level events of our engine do not exist here, so `events` is empty.
"""
from __future__ import annotations

import time
from typing import Sequence

import torch

from ..core.config import EngineConfig
from ..core.engine import Generation

HF_PEERS = ("hf", "hf-pld", "hf-assisted")
PLD_TOKENS = 10
DEFAULT_ATTENTION = "sdpa"     # what from_pretrained picks when not told otherwise


class HFPeer:
    def __init__(self, kind: str, model, cfg: EngineConfig, eos_ids: Sequence[int], assistant=None):
        if kind not in HF_PEERS:
            raise ValueError(f"unknown peer {kind!r}; choose from {', '.join(HF_PEERS)}")
        if kind == "hf-assisted" and assistant is None:
            raise ValueError("hf-assisted needs a draft model (--draft MODEL)")
        self.kind, self.model, self.cfg, self.assistant = kind, model, cfg, assistant
        self.eos = sorted(int(e) for e in eos_ids) if cfg.stop_at_eos else []

    def _kwargs(self) -> dict:
        s = self.cfg.sampling
        kw = dict(max_new_tokens=self.cfg.max_new_tokens, do_sample=not s.greedy, num_beams=1,
                  eos_token_id=self.eos or None, pad_token_id=(self.eos or [0])[0],
                  temperature=None, top_k=None, top_p=None)
        if not s.greedy:
            kw.update(temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p if s.top_p < 1 else None)
        if self.kind == "hf-pld":
            kw["prompt_lookup_num_tokens"] = PLD_TOKENS
        elif self.kind == "hf-assisted":
            kw["assistant_model"] = self.assistant
        return kw

    @torch.inference_mode()
    def run(self, prompt_ids: Sequence[int], generator: torch.Generator | None = None) -> Generation:
        dev = next(self.model.parameters()).device
        x = torch.tensor([list(prompt_ids)], device=dev)
        if generator is not None:       # transformers samples from the global RNG
            torch.manual_seed(int(generator.initial_seed()))
        calls = [0]
        handle = self.model.register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
        attn = getattr(self.model.config, "_attn_implementation", None)
        if attn not in (None, DEFAULT_ATTENTION):     # the peer runs as transformers loads it by default
            self.model.set_attn_implementation(DEFAULT_ATTENTION)
        try:
            t0 = time.perf_counter()
            out = self.model.generate(x, attention_mask=torch.ones_like(x), **self._kwargs())
            if dev.type == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        finally:
            handle.remove()
            if attn not in (None, DEFAULT_ATTENTION):
                self.model.set_attn_implementation(attn)
        new = [int(t) for t in out[0, x.shape[1]:]]
        if self.eos:     # generate pads finished rows; keep up to and including the first EOS
            cut = next((i for i, t in enumerate(new) if t in self.eos), None)
            new = new[:cut + 1] if cut is not None else new
        steps = max(calls[0], 1)     # the prefill forward yields the first token here
        stats = {"new_tokens": len(new), "steps": steps, "target_forwards": calls[0], "tok_per_fwd": len(new) / steps,
                 "wall_s": wall, "tok_s": len(new) / wall if wall > 0 else 0.0, "draft_s": 0.0, "verify_s": wall,
                 "paths": {self.kind: {"steps": steps, "accepted": max(len(new) - steps, 0), "drafted": 0,
                                       "zero": 0, "pct": 100.0, "mal": max(len(new) - steps, 0) / steps}}}
        return Generation(list(prompt_ids), new, [], stats)

    def close(self) -> None:
        pass
