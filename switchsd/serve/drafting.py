"""Drafting for many requests at once, in this process or in a drafter process of its own (PSD).

`BatchDrafter`: a draft model (an SPS model, or `self:L`, the target's first L layers + its LM head) drafting
greedy chains for a set of requests with one batched forward per draft position: each request keeps a slot of
a BatchedKV, synced lazily to its committed tokens (cropped to the prefix it shares with them, the missing
tokens fed in the same forward that gives the first draft token).

`DrafterProcess`: a BatchDrafter per sub-batch in a separate process (pinned to its own core, one torch
thread), driven over a pipe: `submit(sub, rows)` starts drafting for sub-batch `sub` and returns at once;
`collect()` waits for those drafts. It records when it was busy, for the serving traces.

`ExternalDrafter`: the engine-side Drafter that hands a row's Decoder the draft made elsewhere.
"""
from __future__ import annotations

import os
import time
from typing import Sequence

import torch

from ..core.drafting import Draft, DraftRequest
from ..core.tree import build_tree
from ..models.forward import own_forward
from .batched import BatchedKV, batch_inputs, batched_forward


class BatchDrafter:
    def __init__(self, model, gamma: int, slots: int = 8):
        self.lean, self.gamma = own_forward(model), gamma
        self.cache = BatchedKV(self.lean, slots, 256)
        self.rids: list = []                         # slot i holds request rids[i]
        self.seen: list[list[int]] = []              # tokens whose K/V are in slot i

    @torch.inference_mode()
    def _slots_for(self, rids: Sequence) -> None:
        """Put `rids` in slots 0..len(rids)-1 (the rows of the next forwards); other resident requests keep
        their state in the slots after them until the slots run out (new requests start empty)."""
        rids = list(rids)
        slots = self.cache.k.shape[1]
        if len(rids) > slots:
            raise ValueError(f"{len(rids)} requests for {slots} drafter slots")
        asked = set(rids)
        order = (rids + [r for r in self.rids if r not in asked])[:slots]
        if order == self.rids:
            return
        old = {r: j for j, r in enumerate(self.rids)}
        k, v, lens, seen = self.cache.k.clone(), self.cache.v.clone(), list(self.cache.lens), self.seen
        self.seen = []
        for i, r in enumerate(order):
            j = old.get(r)
            n = 0 if j is None else lens[j]
            if j is not None and j != i:             # moved: its keys/values from the snapshot
                self.cache.k[:, i, :, :n] = k[:, j, :, :n]
                self.cache.v[:, i, :, :n] = v[:, j, :, :n]
            self.cache.lens[i] = n
            self.seen.append([] if j is None else seen[j])
        self.rids = order

    @torch.inference_mode()
    def draft(self, rows: dict, n: int | None = None) -> dict:
        """rows: {rid: committed tokens (pending last)} -> {rid: greedy chain of `n` (default gamma) tokens}."""
        rids = list(rows)
        if not rids:
            return {}
        self._slots_for(rids)
        feeds = []
        for i, r in enumerate(rids):
            toks, seen = rows[r], self.seen[i]
            common = 0
            for a, b in zip(seen, toks):
                if a != b:
                    break
                common += 1
            common = min(common, len(toks) - 1)      # always feed at least the pending token
            self.cache.lens[i] = common
            self.seen[i] = list(toks[:common])
            feeds.append(list(toks[common:]))
        out = {r: [] for r in rids}
        for _ in range(n or self.gamma):
            trees = [build_tree(f[0], [f[1:]], len(f)) for f in feeds]     # a chain: the row's feed
            ids, pos, mask = batch_inputs(trees, self.cache.lens[:len(rids)], self.lean.dtype, self.lean.device)
            sizes = [len(f) for f in feeds]
            logits, _ = batched_forward(self.lean, ids, self.cache, pos, mask, rows=sizes)
            ends = torch.tensor(sizes).cumsum(0) - 1
            nxt = logits[ends].argmax(-1).tolist()
            for i, r in enumerate(rids):
                self.cache.lens[i] = len(self.seen[i]) + sizes[i]            # padded filler rows dropped
                self.seen[i] += feeds[i]
                out[r].append(int(nxt[i]))
            feeds = [[t] for t in nxt]
        return out


class ExternalDrafter:
    """A Drafter whose next draft is set from outside (`put`) before the row's Decoder plans its step."""
    name, path = "sps", "neural"

    def __init__(self):
        self.next: list[int] = []

    def reset(self, tokens) -> None:
        self.next = []

    def extend(self, tokens, n_new: int) -> None:
        pass

    def put(self, draft: list[int]) -> None:
        self.next = list(draft)

    def propose(self, req: DraftRequest) -> Draft:
        d, self.next = self.next[:req.max_len], []
        return Draft([d] if d else [])


def _pin(core: int | None, threads: int) -> None:
    torch.set_num_threads(threads)
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})


def _drafter_main(conn, model_name: str | None, dtype: str, draft: str, gamma: int, slots: int, core: int | None):
    """The drafter process: load the draft model, then serve ("draft", sub, rows) requests until ("stop",)."""
    _pin(core, 1)
    from ..models.loading import load_model
    lm = load_model(model_name, dtype, "cpu")
    drafters = [BatchDrafter(load_draft(lm, draft), gamma, slots) for _ in range(2)]
    drafters[0].draft({-1: lm.encode("warm up", chat=False)})           # pack weights, warm the kernels
    conn.send(("ready",))
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            return
        _, sub, rows, n = msg
        t0 = time.perf_counter()
        out = drafters[sub].draft(rows, n)
        conn.send(("drafts", out, t0, time.perf_counter()))


def load_draft(lm, spec: str):
    """'self:L' -> the target's first L layers + its LM head; anything else: a model id / folder."""
    if spec.startswith("self:"):
        from ..core.smc import self_draft
        return self_draft(lm.model, int(spec.split(":", 1)[1]))
    from ..models.loading import load_model
    return load_model(spec, lm.dtype, "cpu").model


class DrafterProcess:
    """A BatchDrafter per sub-batch in its own process. Timestamps are time.perf_counter (system-wide monotonic
    on Linux, so comparable with this process's)."""

    def __init__(self, model_name: str | None, dtype: str, draft: str, gamma: int, slots: int,
                 core: int | None = 1):
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_drafter_main, args=(child, model_name, dtype, draft, gamma, slots, core),
                                daemon=True)
        self.proc.start()
        msg = self.conn.recv()
        if msg[0] != "ready":
            raise RuntimeError(f"drafter process failed: {msg}")
        self.busy: list[tuple[float, float]] = []

    def submit(self, sub: int, rows: dict, n: int | None = None) -> None:
        self.conn.send(("draft", sub, rows, n))

    def collect(self) -> dict:
        _, out, t0, t1 = self.conn.recv()
        self.busy.append((t0, t1))
        return out

    def close(self) -> None:
        try:
            self.conn.send(("stop",))
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.terminate()
