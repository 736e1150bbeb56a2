"""StepEvent: everything one decode step did. Apps, benchmarks and tests consume the same stream.

Definitions (as in the paper's Table 1 and Spec-Bench):
- tok_per_fwd (tokens per forward): committed tokens per target forward, bonus included (vanilla = 1.0); prefill not counted.
- per path: % of iterations, and MAL = mean accepted *draft* tokens per step of that path (bonus excluded).
- Tok/s: new tokens / wall time of the whole generation (prefill included).
- per path, acceptance at draft position k (1-based): of the steps whose draft reached depth k with its first k-1
  tokens accepted (`tried[k-1]`), the share that accepted the k-th too (`hit[k-1]`): EAGLE's per-position rate.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import torch


@dataclass
class StepEvent:
    step: int
    path: str                       # "vanilla" | "copy" | "neural" | ...
    drafter: str | None             # drafter name, None for a plain step
    candidates: list[list[int]]     # candidates as verified (after budget / length truncation)
    tree_tokens: list[int]          # verify rows: [pending] + trie nodes
    tree_parents: list[int]         # parent row of each verify row (-1 for the pending row)
    accepted_rows: list[int]        # trie rows accepted, root to leaf
    accepted: list[int]             # accepted draft tokens
    accepted_candidate: int | None  # index in `candidates` whose prefix was accepted (None: nothing accepted)
    bonus: int | None               # the target's own token (None if cut by EOS / max_new_tokens)
    new_tokens: list[int]           # tokens committed this step (accepted + bonus, after cuts)
    position: int                   # index in the full sequence of new_tokens[0]
    probe_score: float | None = None
    gate: dict | None = None        # policy's reasons (probe vs tau, kappa-gram present...)
    match: dict | None = None       # kappa-gram match: {"ngram": [...], "sources": [start of each candidate]}
    timings: dict = field(default_factory=dict)  # seconds: draft, verify, total (+ prefill on step 0)
    finished: str | None = None     # "eos" | "max_new_tokens" | "context_limit" on the last step
    hidden: dict | None = field(default=None, repr=False)  # site -> [d] at the last processed position
    sources: list[str] | None = None  # path ("copy" | "neural") of each candidate, when several drafters drafted
    rule: str | None = None         # the verification rule's label when it is not the lossless one ("... (lossy)")
    accept_probs: list | None = None  # per tree row: the rule's acceptance probability of that drafted token
    overshoot: list | None = None   # per verified node: mass emitted above p on {q > p} (EngineConfig.record_overshoot)

    @property
    def n_verified(self) -> int:
        return len(self.tree_tokens)

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "hidden"}
        return d


def draft_depth(parents: list[int]) -> int:
    """Depth of the deepest drafted node of a verify tree (row 0 = the pending token, parents before children)."""
    depth = [0] * len(parents)
    for i, p in enumerate(parents):
        if p >= 0:
            depth[i] = depth[p] + 1
    return max(depth, default=0)


def add_counts(into: list[int], counts: Iterable[int]) -> None:
    """into[k] += counts[k], growing `into` as needed (per-position counters of different lengths)."""
    for k, n in enumerate(counts):
        if k == len(into):
            into.append(0)
        into[k] += n


def summarize(events: Iterable[StepEvent], wall_s: float | None = None) -> dict:
    """Stats of one generation. `wall_s` defaults to the sum of step and prefill timings."""
    events = list(events)
    n_tokens = sum(len(e.new_tokens) for e in events)
    steps = len(events)
    if wall_s is None:
        wall_s = sum(e.timings.get("total", 0.0) + e.timings.get("prefill", 0.0) for e in events)
    paths: dict[str, dict] = {}
    for e in events:
        p = paths.setdefault(e.path, {"steps": 0, "accepted": 0, "drafted": 0, "zero": 0, "tried": [], "hit": []})
        p["steps"] += 1
        reach = min(draft_depth(e.tree_parents), len(e.accepted) + 1)   # positions tried: up to the first miss
        add_counts(p["tried"], [1] * reach)
        add_counts(p["hit"], [1] * min(reach, len(e.accepted)))
        p["zero"] += not e.accepted     # drafts of which nothing was accepted (the speculation tax)
        p["accepted"] += len(e.accepted)
        p["drafted"] += len(e.tree_tokens) - 1
    for p in paths.values():
        p["pct"] = 100.0 * p["steps"] / steps if steps else 0.0
        p["mal"] = p["accepted"] / p["steps"] if p["steps"] else 0.0
    return {
        "new_tokens": n_tokens,
        "steps": steps,
        "tok_per_fwd": n_tokens / steps if steps else 0.0,
        "wall_s": wall_s,
        "tok_s": n_tokens / wall_s if wall_s > 0 else 0.0,
        "draft_s": sum(e.timings.get("draft", 0.0) for e in events),
        "verify_s": sum(e.timings.get("verify", 0.0) for e in events),
        "paths": paths,
    }


def hidden_to_list(h: dict | None) -> dict | None:
    if h is None:
        return None
    return {f"{k[0]}:{k[1]}": v.float().tolist() for k, v in h.items() if isinstance(v, torch.Tensor)}
