"""Offered load: a request stream (Poisson arrivals, or all at once) served by one decoding mode, with the
per-request times (arrival, first token, finish) and the per-step trace (who was busy when).

Modes (`run_mode`):
    vanilla       batched plain decoding
    sd            batched speculative decoding with a method of the factory (default SwitchSD, per-row gate)
    sps           batched SD with a draft model drafting in THIS process, between verify steps
    psd           MineDraft's batch-parallel SD: two sub-batches; while the target verifies one, the drafter
                  process drafts the other (drafter pinned to its own core, one thread; the target likewise)
    pearl         one batch; the drafter process drafts the next block optimistically during each verify
A `-1core` suffix (e.g. `sps-1core`) runs the mode on one core (target and any drafter share it): the baseline of
MineDraft's one-extra-device comparison.
"""
from __future__ import annotations

import contextlib
import os
import random
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from ..core.config import EngineConfig
from ..core.policies import Fixed
from ..factory import make_engine
from .drafting import BatchDrafter, DrafterProcess, ExternalDrafter, load_draft
from .engine import BatchedEngine


@dataclass
class Req:
    rid: int
    ids: list[int]
    arrival: float                      # seconds after the run starts
    first: float | None = None          # first token committed
    finish: float | None = None
    tokens: list[int] = field(default_factory=list)


def arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """Poisson arrivals at `rate` requests/s (exponential gaps, seeded); rate <= 0: all at t = 0."""
    if rate <= 0:
        return [0.0] * n
    r, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += r.expovariate(rate)
    return out


@contextlib.contextmanager
def cores(threads: int, core: int | None = None):
    """torch threads (and CPU affinity when `core` is given) for the duration of a run."""
    old_threads = torch.get_num_threads()
    old_aff = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    torch.set_num_threads(threads)
    if core is not None and old_aff is not None:
        os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        if core is not None and old_aff is not None:
            os.sched_setaffinity(0, old_aff)


class Trace:
    def __init__(self):
        self.t0 = time.perf_counter()
        self.spans: list[dict] = []         # {"who": "target" | "drafter", "start", "end", "rows", "sub"}

    def add(self, who: str, start: float, end: float, rows: int = 0, sub: int = 0) -> None:
        self.spans.append({"who": who, "start": start - self.t0, "end": end - self.t0, "rows": rows, "sub": sub})

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def busy(self) -> dict:
        """Mean drafter time D and verify time V per step, and the overlap model (D + V) / max(D, V)."""
        dur = {w: [s["end"] - s["start"] for s in self.spans if s["who"] == w] for w in ("target", "drafter")}
        D = sum(dur["drafter"]) / len(dur["drafter"]) if dur["drafter"] else 0.0
        V = sum(dur["target"]) / len(dur["target"]) if dur["target"] else 0.0
        return {"D": D, "V": V, "model_gain": (D + V) / max(D, V) if D and V else None}


def _record(reqs: dict, trace: Trace, events) -> None:
    t = trace.now()
    for rid, e in events:
        r = reqs[rid]
        if r.first is None:
            r.first = t
        r.tokens += e.new_tokens
        if e.finished:
            r.finish = t


def _admit_arrivals(pending: list[Req], trace: Trace, submit) -> None:
    now = trace.now()
    while pending and pending[0].arrival <= now:
        r = pending.pop(0)
        submit(r)


def _idle_until(pending: list[Req], trace: Trace) -> None:
    if pending:
        time.sleep(max(0.0, pending[0].arrival - trace.now()))


def _ready(be: BatchedEngine, pending: list[Req], trace: Trace) -> bool:
    """Admit the arrived requests; False (after idling until the next arrival) when no row is active."""
    _admit_arrivals(pending, trace, lambda r: be.submit(r.rid, r.ids))
    be.admit()
    if not be.rows:
        _idle_until(pending, trace)
        return False
    return True


def _verify(be: BatchedEngine, trace: Trace, by_id: dict, sub: int = 0) -> list:
    """One batched verify step, traced; the requests' times and tokens recorded."""
    t0 = time.perf_counter()
    events = be.step()
    trace.add("target", t0, time.perf_counter(), len(events), sub)
    _record(by_id, trace, events)
    return events


def run_batched(model, make_decoder, cfg: EngineConfig, reqs: list[Req], max_batch: int, sites=(),
                drafter: BatchDrafter | None = None) -> Iterator[Trace]:
    """vanilla / sd / sps: one batched engine; with `drafter`, it drafts every active row before each verify.
    Yields the trace after every step (the studio draws it as it grows); `drain` runs it to the end."""
    be = BatchedEngine(model, make_decoder, cfg, max_batch, sites=sites)
    by_id = {r.rid: r for r in reqs}
    pending = sorted(reqs, key=lambda r: r.arrival)
    trace = Trace()
    while pending or be.rows or be.waiting:
        if not _ready(be, pending, trace):
            continue
        if drafter is not None:
            t0 = time.perf_counter()
            drafts = drafter.draft({row.rid: row.req.tokens for row in be.rows})
            for row in be.rows:
                row.decoder.policy.drafters[0].put(drafts[row.rid])
            trace.add("drafter", t0, time.perf_counter(), len(be.rows))
        _verify(be, trace, by_id)
        yield trace


def run_psd(model, make_decoder, cfg: EngineConfig, reqs: list[Req], sub_batch: int, proc: DrafterProcess
            ) -> Iterator[Trace]:
    """MineDraft's schedule: sub-batch S's drafts were made while S' = the other was verified; each step sends
    S''s rows to the drafter, verifies S, then collects S''s drafts. Cold start (no drafts for S yet): S is
    drafted first, synchronously (a plain SD step). Each sub-batch holds up to `sub_batch` requests."""
    subs = [BatchedEngine(model, make_decoder, cfg, sub_batch), BatchedEngine(model, make_decoder, cfg, sub_batch)]
    by_id = {r.rid: r for r in reqs}
    pending = sorted(reqs, key=lambda r: r.arrival)
    trace = Trace()
    ready: list[dict | None] = [None, None]
    S = 0

    def submit(r: Req) -> None:        # balance the two sub-batches
        load = [len(b.rows) + len(b.waiting) for b in subs]
        subs[load.index(min(load))].submit(r.rid, r.ids)

    def rows_of(b: BatchedEngine) -> dict:
        return {row.rid: row.req.tokens for row in b.rows}

    while pending or any(b.rows or b.waiting for b in subs):
        _admit_arrivals(pending, trace, submit)
        for b in subs:
            b.admit()
        if not subs[S].rows:
            S = 1 - S
            if not subs[S].rows:
                _idle_until(pending, trace)
                continue
        O = 1 - S
        if ready[S] is None:                                  # cold start: a plain SD step for S
            proc.submit(S, rows_of(subs[S]))
            ready[S] = proc.collect()
            trace.add("drafter", *proc.busy[-1], len(ready[S]), S)
        sent = bool(subs[O].rows)
        if sent:                                              # the drafter drafts O while the target verifies S
            proc.submit(O, rows_of(subs[O]))
        for row in subs[S].rows:
            row.decoder.policy.drafters[0].put(ready[S].get(row.rid, []))
        _verify(subs[S], trace, by_id, S)
        ready[S] = None
        if sent:
            ready[O] = proc.collect()
            trace.add("drafter", *proc.busy[-1], len(ready[O]), O)
        S = O
        yield trace


def run_pearl(model, make_decoder, cfg: EngineConfig, reqs: list[Req], max_batch: int, proc: DrafterProcess,
              gamma: int) -> Iterator[Trace]:
    """PEARL (MineDraft's `force_pearl`): one batch; while the target verifies this step's drafts, the drafter
    drafts the NEXT block optimistically, as if every draft were accepted: gamma + 1 tokens, the first being its
    guess of the target's bonus. A row keeps that next block only when all its drafts were accepted and the bonus
    matches the guess; the other rows are drafted again, synchronously, before the next verify."""
    be = BatchedEngine(model, make_decoder, cfg, max_batch)
    by_id = {r.rid: r for r in reqs}
    pending = sorted(reqs, key=lambda r: r.arrival)
    trace = Trace()
    ready: dict = {}                                       # rid -> draft for its current pending token
    while pending or be.rows or be.waiting:
        if not _ready(be, pending, trace):
            continue
        missing = {row.rid: row.req.tokens for row in be.rows if row.rid not in ready}
        if missing:                                        # cold start, or the optimistic block missed
            proc.submit(0, missing)
            ready.update(proc.collect())
            trace.add("drafter", *proc.busy[-1], len(missing))
        drafts = {row.rid: ready.pop(row.rid) for row in be.rows}
        proc.submit(0, {row.rid: row.req.tokens + drafts[row.rid] for row in be.rows}, gamma + 1)
        for row in be.rows:
            row.decoder.policy.drafters[0].put(drafts[row.rid])
        events = _verify(be, trace, by_id)
        nxt = proc.collect()
        trace.add("drafter", *proc.busy[-1], len(nxt))
        for rid, e in events:
            guess = nxt[rid]
            if not e.finished and e.accepted == drafts[rid] and e.bonus == guess[0]:
                ready[rid] = guess[1:]                     # all accepted and the bonus guessed: keep the block
        yield trace


def external_decoder(model, cfg: EngineConfig, eos):
    """A row decoder whose drafts come from a BatchDrafter / the drafter process."""
    return lambda: make_engine(model, Fixed([ExternalDrafter()]), cfg, eos).decoder


def drain(steps: Iterator[Trace]) -> Trace:
    trace = None
    for trace in steps:
        pass
    return trace


def run_mode(mode: str, lm, cfg: EngineConfig, reqs: list[Req], max_batch: int, **kw) -> Trace:
    """Serve `reqs` under `mode` to the end (see iter_mode)."""
    return drain(iter_mode(mode, lm, cfg, reqs, max_batch, **kw))


def iter_mode(mode: str, lm, cfg: EngineConfig, reqs: list[Req], max_batch: int, *, method: str = "switchsd",
              draft: str = "self:8", gamma: int = 4, sub_batch: int | None = None, drafters=None) -> Iterator[Trace]:
    """Serve `reqs` under `mode`, yielding the trace after every target step (the requests fill in as they go)."""
    from ..factory import Drafters, build_engine
    base, one = mode.removesuffix("-1core"), mode.endswith("-1core")
    n_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    eos = lm.eos_ids()
    if base in ("vanilla", "sd"):
        m = "vanilla" if base == "vanilla" else method
        drafters = drafters or Drafters(lm)
        sites = build_engine(m, lm, drafters, cfg).sites
        with cores(1 if one else n_cores, 0 if one else None):
            yield from run_batched(lm.model, lambda: build_engine(m, lm, drafters, cfg).decoder, cfg, reqs,
                                   max_batch, sites)
    elif base == "sps":
        bd = BatchDrafter(load_draft(lm, draft), gamma, max_batch)
        with cores(1 if one else n_cores, 0 if one else None):
            bd.draft({-1: reqs[0].ids})                       # warm (pack weights) outside the timed part
            yield from run_batched(lm.model, external_decoder(lm.model, cfg, eos), cfg, reqs, max_batch,
                                   drafter=bd)
    elif base == "pearl":
        proc = DrafterProcess(lm.name, lm.precision, draft, gamma, max_batch,
                              core=1 % n_cores)
        try:
            with cores(1, 0):
                yield from run_pearl(lm.model, external_decoder(lm.model, cfg, eos), cfg, reqs, max_batch, proc,
                                     gamma)
        finally:
            proc.close()
    elif base == "psd":
        if one:
            raise ValueError("psd needs two cores (one for the target, one for the drafter)")
        proc = DrafterProcess(lm.name, lm.precision, draft, gamma, sub_batch or max_batch,
                              core=1 % n_cores)
        try:
            with cores(1, 0):
                yield from run_psd(lm.model, external_decoder(lm.model, cfg, eos), cfg, reqs,
                                   sub_batch or max_batch, proc)
        finally:
            proc.close()
    else:
        raise ValueError(f"unknown mode {mode!r}: vanilla, sd, sps, psd, pearl (and X-1core)")
