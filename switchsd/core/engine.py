"""The decode loop. One step:

    1. the policy picks drafters (in priority order) and may cap the draft's depth and rows; the first
       non-empty draft wins (none: a plain step)
    2. the candidates are merged into a token trie, capped by the verification budget
    3. ONE target forward verifies every trie node (tree mask + position ids), capturing hidden states; where
       the device's cost curve says a larger forward is cheaper, it is padded with masked rows
    4. the longest accepted path plus the target's bonus token is committed (EOS / max_new_tokens cuts)
    5. the KV cache is rolled back to the committed path; every drafter sees the new tokens
    6. a StepEvent is yielded

Invariant between steps: `cache` holds keys/values of tokens[:-1]; tokens[-1] is the *pending* token,
row 0 of the next verify forward.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

import torch

from .config import EngineConfig
from .costs import VerifyCost
from ..drafters.base import Draft, DraftRequest, merge_drafts
from .events import StepEvent, summarize
from .policies import Policy, PolicyState
from ..target.forward import make_target
from .tree import TokenTree, build_tree, tree_mask, tree_positions
from .rules import parse_rule
from .verify import accept_greedy, accept_rule, accept_sampling, target_probs


class ProbeScorer(Protocol):
    """What the engine needs of a copy-intent probe (switchsd.core.probe.Probe): its site and a score."""
    site: tuple[int, str]

    def score(self, hidden: torch.Tensor) -> float: ...


@dataclass
class Generation:
    prompt_ids: list[int]
    token_ids: list[int]        # new tokens only
    events: list[StepEvent]
    stats: dict


class Engine:
    def __init__(self, model, policy: Policy, cfg: EngineConfig, eos_ids: Sequence[int] = (),
                 max_length: int | None = None, probe: ProbeScorer | None = None, cost: VerifyCost | None = None):
        """`cost`: the device's verification cost curve; verify forwards are padded to its cheapest size."""
        self.model, self.policy, self.cfg, self.probe, self.cost = model, policy, cfg, probe, cost
        self.rule = parse_rule(cfg.verify)
        self.eos = set(int(e) for e in eos_ids) if cfg.stop_at_eos else set()
        self.max_length = max_length or int(getattr(model.config, "max_position_embeddings", 1 << 30))
        sites = list(cfg.capture)
        if probe is not None and probe.site not in sites:
            sites.append(probe.site)
        # drafters that read target hidden states (EAGLE3: three fused layers) declare `sites`
        self.feature_drafters = [d for d in policy.drafters if getattr(d, "sites", ())]
        for d in self.feature_drafters:
            sites += [s for s in d.sites if s not in sites]
        self.sites = sites
        self.target = make_target(model, sites, cfg.forward)   # transformers' forward or the lean one

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def close(self) -> None:
        self.target.close()

    # -- one target forward over the verify rows ------------------------------------------------------
    def _forward(self, cache, tree: TokenTree) -> torch.Tensor:
        prefix, n1 = len(cache), len(tree.tokens)
        pad = self.cost.pad_to(n1, max(n1, self.cfg.budget)) - n1 if self.cost is not None else 0
        ids = torch.tensor(tree.tokens + [tree.tokens[0]] * pad, device=self.device)[None]    # [1, n+1+pad]
        if tree.is_chain and not pad:
            mask = None
            pos = torch.arange(prefix, prefix + n1, device=self.device)[None]
        else:
            mask = tree_mask(tree, prefix, self.model.dtype, self.device, pad)      # [1, 1, m, prefix+m]
            pos = tree_positions(tree, prefix, self.device, pad)                     # [1, m]
        return self.target.forward(ids, cache, pos, mask, logit_rows=n1)             # [n+1, V] (pad rows dropped)

    def _prefill(self, cache, ids: list[int]) -> None:
        x = torch.tensor(ids, device=self.device)[None]                               # [1, P-1]
        self.target.forward(x, cache, logit_rows=-1)

    def _hidden(self, row: int) -> dict | None:
        """Hidden vectors [d] at verify row `row` of the last forward, for every site (copies)."""
        return {k: v[0, row].detach().clone() for k, v in self.target.last.items()} if self.sites else None

    def _feed_features(self, rows: list[int] | slice) -> None:
        """Give feature-reading drafters the target's hidden states at the newly cached positions."""
        for d in self.feature_drafters:
            d.add_features({s: self.target.last[s][0, rows] for s in d.sites})   # site -> [n_new, d]

    # -- the loop --------------------------------------------------------------------------------------
    def generate(self, prompt_ids: Sequence[int], generator: torch.Generator | None = None) -> Iterator[StepEvent]:
        """Decode `prompt_ids`, yielding one StepEvent per target forward. Capture hooks (transformers' forward)
        are attached to the model only while this generator runs."""
        self.target.attach()
        try:
            yield from self._generate(prompt_ids, generator)
        finally:
            self.target.close()

    @torch.inference_mode()
    def _generate(self, prompt_ids: Sequence[int], generator: torch.Generator | None) -> Iterator[StepEvent]:
        cfg, sampling = self.cfg, self.cfg.sampling
        tokens = [int(t) for t in prompt_ids]
        if not tokens:
            raise ValueError("the prompt is empty")
        if len(tokens) >= self.max_length:
            raise ValueError(f"the prompt has {len(tokens)} tokens; the model's context is {self.max_length}")
        if not sampling.greedy and generator is None:
            generator = torch.Generator().manual_seed(0)
        t_start = time.perf_counter()
        cache = self.target.new_cache(min(self.max_length, len(tokens) + cfg.max_new_tokens + cfg.budget + 1))
        hidden = None
        if len(tokens) > 1:
            self._prefill(cache, tokens[:-1])
            hidden = self._hidden(-1)
        for d in self.policy.drafters:
            d.reset(tokens)
        if len(tokens) > 1:
            self._feed_features(slice(None))
        prefill_s = time.perf_counter() - t_start
        n_gen, step = 0, 0
        while True:
            t0 = time.perf_counter()
            # 1. policy and draft
            max_len = min(cfg.max_new_tokens - n_gen, self.max_length - len(tokens)) - 1
            score = None
            if self.probe is not None and hidden is not None:
                score = float(self.probe.score(hidden[self.probe.site]))
            drafters, gate = self.policy.select(PolicyState(tokens, step, score, max(max_len, 0), cfg.budget))
            budget = cfg.budget
            if gate:   # the policy may cap this step's draft
                max_len = min(max_len, gate.get("max_len", max_len))
                budget = max(1, min(budget, gate.get("rows", budget)))
            draft, parts, owner = Draft([]), [], []
            if max_len > 0 and budget > 1:
                req = DraftRequest(tokens=tokens, max_len=max_len, budget=budget - 1)
                merge = bool(gate and gate.get("merge"))    # verify every drafter's candidates together
                for d in drafters:
                    proposal = d.propose(req)
                    if proposal:
                        parts.append((d, proposal))
                        if not merge:
                            break
                if parts:
                    draft, owner = merge_drafts([p for _, p in parts])
            tree = build_tree(tokens[-1], draft.candidates, budget, draft.q, max_depth=max(max_len, 0))
            t1 = time.perf_counter()
            # 2. verify all candidates in one forward
            prefix = len(cache)
            logits = self._forward(cache, tree)
            accept_probs = overshoot = None
            if sampling.greedy:
                rows, bonus = accept_greedy(tree, logits.argmax(-1).tolist())
            elif self.rule.name == "lossless":
                rows, bonus = accept_sampling(tree, lambda r: target_probs(logits[r], sampling).cpu(), generator)
            else:
                overshoot = [] if cfg.record_overshoot else None
                rows, bonus, accept_probs = accept_rule(tree, lambda r: target_probs(logits[r], sampling).cpu(),
                                                        generator, self.rule, overshoot)
            # 3. commit, with EOS / length cuts
            new = [tree.tokens[r] for r in rows] + [bonus]
            finished = None
            cut = next((i for i, t in enumerate(new) if t in self.eos), None)
            if cut is not None:
                new, finished = new[:cut + 1], "eos"
            if n_gen + len(new) >= cfg.max_new_tokens:
                new, finished = new[:cfg.max_new_tokens - n_gen], finished or "max_new_tokens"
            if len(tokens) + len(new) >= self.max_length:
                finished = finished or "context_limit"
            keep = [0] + rows[:len(new) - 1]
            cache.keep(prefix, keep)
            hidden = self._hidden(keep[-1])
            position = len(tokens)
            tokens.extend(new)
            n_gen += len(new)
            for d in self.policy.drafters:
                d.extend(tokens, len(new))
            self._feed_features(keep)
            t2 = time.perf_counter()
            timings = {"draft": t1 - t0, "verify": t2 - t1, "total": t2 - t0}
            if step == 0:
                timings["prefill"] = prefill_s
            won = next((c for c, cr in enumerate(tree.cand_rows) if rows and cr[:len(rows)] == rows), None)
            # the drafter credited with the step: the one whose candidate was accepted, else the first
            chosen = parts[owner[tree.cand_index[won]]][0] if won is not None else parts[0][0] if parts else None
            event = StepEvent(
                step=step, path=chosen.path if chosen else "vanilla", drafter=chosen.name if chosen else None,
                candidates=[[tree.tokens[r] for r in cr] for cr in tree.cand_rows],
                tree_tokens=list(tree.tokens), tree_parents=list(tree.parents), accepted_rows=rows,
                accepted=[tree.tokens[r] for r in rows[:len(new)]],   # committed draft tokens
                accepted_candidate=won,
                sources=[parts[owner[i]][0].path for i in tree.cand_index] if len(parts) > 1 else None,
                bonus=bonus if len(new) == len(rows) + 1 else None,
                new_tokens=new, position=position, probe_score=score, gate=gate,
                match=draft.match if parts else None, timings=timings, finished=finished, hidden=hidden,
                rule=None if self.rule.name == "lossless" else self.rule.label, accept_probs=accept_probs,
                overshoot=overshoot)
            self.policy.observe(event)
            yield event
            step += 1
            if finished:
                return

    def run(self, prompt_ids: Sequence[int], generator: torch.Generator | None = None) -> Generation:
        """Generate to the end; returns tokens, events and stats (wall time measured around the loop)."""
        t0 = time.perf_counter()
        events = list(self.generate(prompt_ids, generator))
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        out = [t for e in events for t in e.new_tokens]
        return Generation(list(prompt_ids), out, events, summarize(events, wall))
