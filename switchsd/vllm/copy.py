"""SwitchSD's copy drafter as a vLLM proposer: the continuation of the kappa-gram's most recent earlier occurrence,
as one chain (vLLM verifies one chain per request), a point mass for vLLM's rejection sampler as its n-gram drafts.

    vllm serve MODEL --speculative-config '{"method": "custom_class", "model": "switchsd.vllm.copy.CopyProposer",
                                            "num_speculative_tokens": 8}'

Stateless per step (vLLM hands over each request's tokens, not its id): one vectorised scan of the context for the
last kappa tokens. vLLM verifies one chain per request where the engine's copy drafter verifies a trie of up to W
continuations (`switchsd.drafters.copy.CopyDrafter`), so `copy_match` picks one of them: the occurrence with the
longest matching context, and where its continuation runs into the present, the chain repeats itself (tested).
Imports numpy only, so it loads in vLLM's own environment.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Callable, Sequence

import numpy as np

from switchsd import envs
from switchsd.core.config import GateConfig

KAPPA = GateConfig.kappa     # the copy method's kappa-gram: the engine's cost gate's
MAX_MATCH = 24        # the longest context match that picks among a kappa-gram's occurrences (suffix decoding's depth)
SPEC_FACTOR = 2       # the gate's copy chains: at most this many times their match length (suffix decoding: 1)
KEY_MATCH = 3         # the gate's records: match lengths 1, 2 and 3 or more apart
MAX_HITS = 64         # of the most recent occurrences
LOGGER = "vllm.switchsd"    # under vLLM's logger, whose handlers print INFO (a logger outside "vllm." stays silent)
COUNTS_ENV = "SWITCHSD_VLLM_COUNTS"     # a file that holds a proposer's running counts as JSON (benchmarks read it)


FLUSH_S = 0.5        # the counts file is rewritten at most this often
_flush = {"snapshot": None, "path": None, "thread": None, "failed": False}
_flush_lock = threading.Lock()


def write_counts(snapshot: Callable[[], dict]) -> None:
    """Note new counts: `snapshot()` returns them (JSON-able). A daemon thread writes the newest to
    $SWITCHSD_VLLM_COUNTS at most every FLUSH_S, replaced whole (a reader never sees half a file), so a step pays
    for a flag, not a file (a write per step was 0.7% of a worker's time), and the file holds the final counts
    FLUSH_S after the last step."""
    path = envs.get(COUNTS_ENV)
    if not path or _flush["failed"]:
        return
    with _flush_lock:
        _flush["snapshot"], _flush["path"] = snapshot, path
        if _flush["thread"] is None:
            _flush["thread"] = threading.Thread(target=_flusher, name="switchsd-counts", daemon=True)
            _flush["thread"].start()


def _flusher() -> None:
    while not _flush["failed"]:
        time.sleep(FLUSH_S)
        with _flush_lock:
            snapshot, path, _flush["snapshot"] = _flush["snapshot"], _flush["path"], None
        if snapshot is None:
            continue
        try:
            text = json.dumps(snapshot())
        except RuntimeError:            # a dict grew under the dump (the serving thread): next time
            with _flush_lock:
                _flush["snapshot"] = _flush["snapshot"] or snapshot
            continue
        try:
            with open(path + ".tmp", "w") as f:
                f.write(text)
            os.replace(path + ".tmp", path)
        except OSError as e:                  # serving goes on; the counts stay in the log
            _flush["failed"] = True
            from vllm.logger import init_logger
            init_logger(LOGGER).warning("%s=%s cannot be written (%s): counts only in the log", COUNTS_ENV, path, e)


def copy_chain(context: np.ndarray, kappa: int, k: int) -> list[int]:
    """context int [n] (tokens so far, the last one pending); the <= k tokens that followed the earlier occurrence
    of its last `kappa` tokens whose preceding context matches the present's longest (`copy_match`), or []."""
    return copy_match(context, kappa, k)[0]


def copy_match(context: np.ndarray, kappa: int, k: int, max_match: int = MAX_MATCH,
               max_hits: int = MAX_HITS) -> tuple[list[int], int, int]:
    """(the copy chain, its source's distance from the present, the match length).

    Of the last `max_hits` earlier occurrences of the kappa-gram (an occurrence followed by nothing is skipped),
    the one whose preceding tokens match the present's for the longest stretch (up to `max_match` tokens in all,
    the most recent among equals: suffix decoding's longest match, here on the request's own tokens); its
    continuation is the chain. Where that continuation runs into the present (a repeating stretch: "0 0 0", a
    period-p loop), the chain goes on as the draft itself, LZ77's overlapping copy: token j is what stands j places
    after the source in context + chain, so a loop is drafted k tokens deep, not cut at the present."""
    n = int(context.shape[0])
    if n <= kappa or k < 1:
        return [], 0, 0
    gram = context[n - kappa:]
    windows = np.lib.stride_tricks.sliding_window_view(context[:n - 1], kappa)       # [n - kappa, kappa]
    hits = np.flatnonzero((windows == gram).all(1))
    hits = hits[hits != n - kappa][-max_hits:]              # ascending; s + kappa <= n - 1
    if not len(hits):
        return [], 0, 0
    back = np.arange(1, max_match - kappa + 1)              # [m]: tokens before the gram, 1 back, 2 back ...
    here, there = n - kappa - back, hits[:, None] - back     # [m], [H, m]
    same = (there >= 0) & (here >= 0) & (context[np.maximum(there, 0)] == context[np.maximum(here, 0)])
    longer = np.cumprod(same, axis=1).sum(1)                # [H]: how far each occurrence's context matches
    best = int(np.flatnonzero(longer == longer.max())[-1])
    src = int(hits[best]) + kappa
    chain = [int(t) for t in context[src:src + k]]
    gap = n - src                                           # >= 1
    while len(chain) < k:                                   # context + chain at src + j, j >= gap: chain[j - gap]
        chain.append(chain[len(chain) - gap])
    return chain, gap, kappa + int(longer[best])


def copy_path(seq: np.ndarray, req_id: str, kappa: int, k: int, counts: "CopyCounts | None",
              factor: int = SPEC_FACTOR) -> tuple[list[int], str, bool]:
    """A request's copy chain and the key of its record: (<= k tokens, key, from the counts?). The chain follows
    the kappa-gram's earlier occurrence (`copy_match`), at most `factor` times as long as the context it matched
    (0: no cap; a chain that matched 2 tokens drafts <= 4: a short match is an uncertain source, and a drafted row costs
    compute on a CPU), else the longest context the counts saw continued (`CopyCounts.chain`, which caps its
    drafts at the match; counts None: none). key: the match length, capped at KEY_MATCH, "r" added where the
    chain repeats itself (a loop): "3", "3r", "1"."""
    chain, gap, match = copy_match(seq, kappa, k)
    if factor:
        chain = chain[:factor * match]                      # match >= kappa >= 1 wherever there is a chain
    backed_off = False
    if not chain and counts is not None:
        chain, match = counts.chain(req_id, seq, k)
        backed_off = bool(chain)
    loop = "r" if chain and not backed_off and len(chain) > gap else ""
    return chain, f"{min(match, KEY_MATCH)}{loop}", backed_off


class CopyCounts:
    """Next-token counts after every n-gram (n = 1..max_n): each request's own (prompt and output) and one table
    shared by the requests' outputs. Where the kappa-gram never occurred before, the copy path drafts from them: the
    longest context seen before picks the most frequent next token, token by token, while the draft's running
    probability (the product of each token's share of its counts) stays >= `min_prob`, and a draft is at most as
    long as the match it starts from; of the own and the shared draft, the one with the higher summed probability
    (suffix decoding's rule, with n-gram tables in place of suffix trees). A request's own table is dropped past
    `max_requests` newer ones; the shared table starts afresh past `max_grams` entries."""

    def __init__(self, max_n: int = 6, min_prob: float = 0.1, max_requests: int = 256, max_grams: int = 2_000_000):
        self.max_n, self.min_prob, self.max_requests, self.max_grams = max_n, min_prob, max_requests, max_grams
        self.shared: dict[bytes, dict[int, int]] = {}              # n-gram (int64 bytes) -> next token -> count
        self.own: dict[str, dict[bytes, dict[int, int]]] = {}     # request id -> its own table (oldest first)
        self.indexed: dict[str, int] = {}                          # request id -> its tokens counted so far

    def add(self, req_id: str, seq: np.ndarray, prompt_len: int) -> None:
        """seq int [n]: the request's committed tokens; each (n-gram, next token) pair is counted once."""
        seq = np.asarray(seq, dtype=np.int64)
        if req_id not in self.own and len(self.own) >= self.max_requests:
            old = next(iter(self.own))
            del self.own[old], self.indexed[old]
        if len(self.shared) > self.max_grams:
            self.shared = {}
        own = self.own.setdefault(req_id, {})
        done = self.indexed.get(req_id, 1)
        for j in range(done, len(seq)):                            # token j follows the n-grams ending at j - 1
            t = int(seq[j])
            for n in range(1, min(self.max_n, j) + 1):
                key = seq[j - n:j].tobytes()
                _bump(own, key, t)
                if j >= prompt_len:
                    _bump(self.shared, key, t)
        self.indexed[req_id] = max(done, len(seq))

    def chain(self, req_id: str, seq: np.ndarray, k: int) -> tuple[list[int], int]:
        """(<= k tokens, the length of the match they start from)."""
        best: tuple[list[int], int, float] = ([], 0, 0.0)
        for table in (self.own.get(req_id), self.shared):
            if table:
                draft = self._walk(table, seq, k)
                if draft[2] > best[2]:
                    best = draft
        return best[0], best[1]

    def _walk(self, table: dict, seq: np.ndarray, k: int) -> tuple[list[int], int, float]:
        tail = np.asarray(seq[-self.max_n:], dtype=np.int64)
        ctx = np.empty(len(tail) + k, dtype=np.int64)             # the context, then the draft as it grows
        ctx[:len(tail)] = tail
        end = len(tail)
        out: list[int] = []
        match, prob, score = 0, 1.0, 0.0
        while len(out) < k:
            for n in range(min(self.max_n, end), 0, -1):           # the longest context seen before
                c = table.get(ctx[end - n:end].tobytes())
                if c:
                    break
            else:
                break
            if not out:
                match, k = n, min(k, n)
            t, best = max(c.items(), key=lambda kv: kv[1])
            prob *= best / sum(c.values())
            if prob < self.min_prob:
                break
            out.append(t)
            score += prob
            ctx[end] = t
            end += 1
        return out, match, score


def _bump(table: dict, key: bytes, token: int) -> None:
    c = table.get(key)
    if c is None:
        table[key] = {token: 1}
    else:
        c[token] = c.get(token, 0) + 1


class CopyProposer:
    """vLLM `custom_class` proposer: `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)` ->
    per request, a chain of <= num_speculative_tokens copied tokens (empty: no draft this step). Counts its steps
    and logs them every LOG_EVERY calls, as vLLM logs its own acceptance."""
    LOG_EVERY = 200
    _last: "CopyProposer | None" = None            # the latest instance in this process (its counts: last_counts)

    def __init__(self, vllm_config):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.kappa = envs.get("SWITCHSD_KAPPA") or KAPPA
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.counts = {"steps": 0, "copy": 0, "none": 0, "drafted_tokens": 0}
        self.calls = 0
        CopyProposer._last = self

    @classmethod
    def last_counts(cls) -> dict | None:
        return dict(cls._last.counts) if cls._last is not None else None

    def load_model(self, *args, **kwargs) -> None:       # nothing to load
        pass

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings=None) -> list[list[int]]:
        out = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            chain = [] if not len(sampled) or n >= self.max_model_len else \
                copy_chain(token_ids_cpu[i, :n], self.kappa, min(self.k, self.max_model_len - n))
            out.append(chain)
            if len(sampled):
                self.counts["steps"] += 1
                self.counts["copy" if chain else "none"] += 1
                self.counts["drafted_tokens"] += len(chain)
        self.calls += 1
        if self.calls % self.LOG_EVERY == 0:
            _log(self.counts)
        write_counts(lambda: self.counts)
        return out


def _log(counts: dict) -> None:
    from vllm.logger import init_logger
    s = max(1, counts["steps"])
    init_logger(LOGGER).info("SwitchSD copy proposer: %d request-steps, copy %.1f%%, none %.1f%%, "
                               "%.2f tokens per copy draft", counts["steps"], 100 * counts["copy"] / s,
                               100 * counts["none"] / s, counts["drafted_tokens"] / max(1, counts["copy"]))
