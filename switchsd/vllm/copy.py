"""SwitchSD's copy drafter as a vLLM proposer: the continuation of the kappa-gram's most recent earlier occurrence,
as one chain (vLLM verifies one chain per request), a point mass for vLLM's rejection sampler as its n-gram drafts.

    vllm serve MODEL --speculative-config '{"method": "custom_class", "model": "switchsd.vllm.copy.CopyProposer",
                                            "num_speculative_tokens": 8}'

Stateless per step (vLLM hands over each request's tokens, not its id): one vectorised scan of the context for the
last kappa tokens. `copy_chain` equals the first candidate of `switchsd.drafters.copy.CopyDrafter` (tested).
Imports numpy only, so it loads in vLLM's own environment.
"""
from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np

KAPPA = 3             # the cost gate's kappa-gram (switchsd.core.config.GateConfig.kappa)
LOGGER = "vllm.switchsd"    # under vLLM's logger, whose handlers print INFO (a logger outside "vllm." stays silent)
COUNTS_ENV = "SWITCHSD_VLLM_COUNTS"     # a file that holds a proposer's running counts as JSON (benchmarks read it)


def write_counts(counts: dict) -> None:
    """The running counts to $SWITCHSD_VLLM_COUNTS (replaced whole, so a reader never sees half a file)."""
    global _counts_failed
    path = os.environ.get(COUNTS_ENV)
    if path and not _counts_failed:
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(counts, f)
            os.replace(path + ".tmp", path)
        except OSError as e:                  # serving goes on; the counts stay in the log
            _counts_failed = True
            from vllm.logger import init_logger
            init_logger(LOGGER).warning("%s=%s cannot be written (%s): counts only in the log", COUNTS_ENV, path, e)


_counts_failed = False


def copy_chain(context: np.ndarray, kappa: int, k: int) -> list[int]:
    """context int [n] (tokens so far, the last one pending); the <= k tokens that followed the most recent
    earlier occurrence of its last `kappa` tokens (an occurrence followed by nothing is skipped), or []."""
    n = int(context.shape[0])
    if n <= kappa or k < 1:
        return []
    gram = context[n - kappa:]
    windows = np.lib.stride_tricks.sliding_window_view(context[:n - 1], kappa)       # [n - kappa, kappa]
    hits = np.flatnonzero((windows == gram).all(1))
    for s in hits[::-1]:                                     # most recent first; s + kappa <= n - 1 < n
        if s == n - kappa:
            continue
        return [int(t) for t in context[s + kappa:s + kappa + k]]
    return []


class CopyProposer:
    """vLLM `custom_class` proposer: `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)` ->
    per request, a chain of <= num_speculative_tokens copied tokens (empty: no draft this step). Counts its steps
    and logs them every LOG_EVERY calls, as vLLM logs its own acceptance."""
    LOG_EVERY = 200
    _last: "CopyProposer | None" = None            # the latest instance in this process (its counts: last_counts)

    def __init__(self, vllm_config):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.kappa = int(os.environ.get("SWITCHSD_KAPPA", KAPPA))
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
        write_counts(self.counts)
        return out


def _log(counts: dict) -> None:
    from vllm.logger import init_logger
    s = max(1, counts["steps"])
    init_logger(LOGGER).info("SwitchSD copy proposer: %d request-steps, copy %.1f%%, none %.1f%%, "
                               "%.2f tokens per copy draft", counts["steps"], 100 * counts["copy"] / s,
                               100 * counts["none"] / s, counts["drafted_tokens"] / max(1, counts["copy"]))
