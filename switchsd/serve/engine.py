"""The batched engine: B requests decoded together, one target forward per step for all of them.

    eng = BatchedEngine(lm, make_decoder, cfg, max_batch=8)
    eng.submit(rid, prompt_ids)                 # queued; joins the batch at the next step with a free slot
    for rid, event in eng.step(): ...           # one batched verify forward; StepEvents of every active row

Every row keeps its own Decoder (switchsd.core.engine.Decoder: policy, drafters, acceptance, EOS / length
cuts), so each request runs exactly the single-request algorithm (vanilla, copy, EAGLE-3, SwitchSD with its
per-row gate); only the target forward is shared. Requests join between steps (their prefill is one forward
of their own) and leave when they finish (the last row moves into the freed slot).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..core.config import EngineConfig
from ..core.engine import Decoder, Request, check_prompt
from ..core.events import StepEvent
from ..models.forward import own_forward
from .batched import BatchedKV, batch_inputs, batched_forward


@dataclass
class Row:
    rid: object
    decoder: Decoder
    req: Request
    generator: torch.Generator | None


class BatchedEngine:
    def __init__(self, model, make_decoder: Callable[[], Decoder], cfg: EngineConfig, max_batch: int = 8,
                 max_length: int | None = None, sites: Sequence = ()):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model, self.make_decoder, self.cfg, self.max_batch = model, make_decoder, cfg, max_batch
        self.lean = own_forward(model)
        self.max_length = max_length or int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.sites = list(sites)
        self.cache = BatchedKV(self.lean, max_batch, 256)
        self.rows: list[Row] = []                 # row i sits in cache slot i
        self.waiting: list[tuple[object, list[int], torch.Generator | None]] = []
        self.batch_sizes: list[int] = []          # active rows per verify step

    @property
    def active(self) -> int:
        return len(self.rows)

    def submit(self, rid, prompt_ids: Sequence[int], generator: torch.Generator | None = None) -> None:
        tokens = check_prompt(prompt_ids, self.max_length)
        if not self.cfg.sampling.greedy and generator is None:
            generator = torch.Generator().manual_seed(0)
        self.waiting.append((rid, tokens, generator))

    @torch.inference_mode()
    def admit(self) -> None:
        """Prefill waiting requests into free slots (one forward each)."""
        while self.waiting and len(self.rows) < self.max_batch:
            rid, tokens, gen = self.waiting.pop(0)
            slot = len(self.rows)
            self.cache.lens[slot] = 0
            last = None
            if len(tokens) > 1:
                ids = torch.tensor(tokens[:-1], device=self.lean.device)[None]
                pos = torch.arange(len(tokens) - 1, device=self.lean.device)[None]
                _, cap = batched_forward(self.lean, ids, self.cache, pos, None, self.sites, rows=[1], first_slot=slot)
                last = {s: v[0] for s, v in cap.items()}
            dec = self.make_decoder()
            self.rows.append(Row(rid, dec, dec.start(tokens, last), gen))

    @torch.inference_mode()
    def step(self) -> list[tuple[object, StepEvent]]:
        """Admit waiting requests, then one batched verify forward over every active row."""
        self.admit()
        if not self.rows:
            return []
        plans = [row.decoder.plan(row.req) for row in self.rows]
        if any(p.draft.extra is not None for p in plans):
            raise ValueError("the batched engine does not run drafters with unverified rows (lookahead)")
        trees = [p.tree for p in plans]
        b = len(self.rows)
        lens = self.cache.lens[:b]
        ids, pos, mask = batch_inputs(trees, lens, self.lean.dtype, self.lean.device)
        sizes = [len(t.tokens) for t in trees]
        prefixes = list(lens)
        logits, cap = batched_forward(self.lean, ids, self.cache, pos, mask, self.sites, rows=sizes)
        self.batch_sizes.append(b)
        out, done, start = [], [], 0
        for r, (row, plan) in enumerate(zip(self.rows, plans)):
            n = sizes[r]
            last = {s: v[r] for s, v in cap.items()}
            event = row.decoder.settle(row.req, plan, logits[start:start + n], last, row.generator,
                                       lambda keep, r=r: self.cache.keep(r, prefixes[r], keep))
            start += n
            out.append((row.rid, event))
            if event.finished:
                done.append(r)
        for r in sorted(done, reverse=True):            # compact: the last row fills the hole
            last_slot = len(self.rows) - 1
            if r != last_slot:
                self.cache.move(last_slot, r)
                self.rows[r] = self.rows[last_slot]
            self.rows.pop()
        return out

    def run_all(self, prompts: dict, generators: dict | None = None) -> dict:
        """Decode every prompt (all submitted at once); returns {rid: list of StepEvents}."""
        for rid, ids in prompts.items():
            self.submit(rid, ids, (generators or {}).get(rid))
        events: dict = {rid: [] for rid in prompts}
        while self.rows or self.waiting:
            for rid, e in self.step():
                events[rid].append(e)
        return events


def tokens_of(events: Sequence[StepEvent]) -> list[int]:
    return [t for e in events for t in e.new_tokens]
