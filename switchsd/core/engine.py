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
from typing import Callable, Iterator, Protocol, Sequence

import torch

from .config import EngineConfig
from .costs import VerifyCost
from .drafting import Draft, DraftRequest, Extra, merge_drafts
from .events import StepEvent, summarize
from .policies import Policy, PolicyState
from .rules import parse_rule
from .tree import TokenTree, build_tree, tree_mask, tree_positions, with_extra
from .verify import accept_greedy, accept_rule, accept_sampling, greedy_tokens, target_probs


class Target(Protocol):
    """The target's forward as the engine drives it (implemented in switchsd/models/forward.py)."""
    last: dict                      # site -> [1, m, d] hidden states of the last forward

    def new_cache(self, capacity: int): ...
    def forward(self, ids: torch.Tensor, cache, position_ids: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, logit_rows: int | None = None) -> torch.Tensor: ...
    def attach(self) -> None: ...
    def close(self) -> None: ...


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


@dataclass
class Request:
    """One request's decoding state between steps: tokens[-1] is the pending token."""
    tokens: list[int]
    n_gen: int = 0
    step: int = 0
    hidden: dict | None = None      # site -> [d] at the last cached position (the probe reads it)


@dataclass
class Plan:
    tree: TokenTree
    draft: Draft                    # the merged draft (its kappa-gram match, if a copy drafter drafted)
    parts: list                     # (drafter, its draft) in the order they were merged
    owner: list[int]                # candidate -> index in parts
    gate: dict | None
    score: float | None
    t0: float
    t1: float


class Decoder:
    """The per-request half of a step, shared by Engine (one request) and serve.BatchedEngine (many):
    the policy's choice and the draft (`plan`), then, given the target's logits over the plan's tree, the
    acceptance, the EOS / length cuts, the drafters' update and the StepEvent (`settle`)."""

    def __init__(self, policy: Policy, cfg: EngineConfig, eos: set[int], max_length: int,
                 probe: ProbeScorer | None = None):
        self.policy, self.cfg, self.eos, self.max_length, self.probe = policy, cfg, eos, max_length, probe
        self.rule = parse_rule(cfg.verify)
        # drafters that read target hidden states (EAGLE3: three fused layers) declare `sites`
        self.feature_drafters = [d for d in policy.drafters if getattr(d, "sites", ())]
        # sites kept per step (event.hidden, the probe's input): the captured ones and the probe's, not the drafters'
        self.kept = set(cfg.capture) | ({probe.site} if probe is not None else set())

    def start(self, tokens: list[int], last: dict | None) -> Request:
        """After the prefill of tokens[:-1]; `last`: the hidden states at those positions ({site: [P-1, d]})."""
        req = Request(tokens)
        for d in self.policy.drafters:
            d.reset(tokens)
        if len(tokens) > 1 and last is not None:
            req.hidden = self._kept(last, -1)
            self.feed(last, slice(None))
        return req

    def _kept(self, last: dict, row: int) -> dict | None:
        """{site: [d]} at `row` for the kept sites (None when none is kept)."""
        return {k: v[row].detach().clone() for k, v in last.items() if k in self.kept} or None

    def feed(self, last: dict, rows: list[int] | slice) -> None:
        """Give feature-reading drafters the target's hidden states at the newly cached positions."""
        if isinstance(rows, list) and rows == list(range(rows[0], rows[0] + len(rows))):
            rows = slice(rows[0], rows[0] + len(rows))          # contiguous (a plain step's [0]): views, no copies
        for d in self.feature_drafters:
            d.add_features({s: last[s][rows] for s in d.sites})        # site -> [n_new, d]

    def plan(self, req: Request) -> Plan:
        cfg, tokens = self.cfg, req.tokens
        t0 = time.perf_counter()
        max_len = min(cfg.max_new_tokens - req.n_gen, self.max_length - len(tokens)) - 1
        score = None
        if self.probe is not None and req.hidden is not None:
            score = float(self.probe.score(req.hidden[self.probe.site]))
        decision = self.policy.select(PolicyState(tokens, req.step, score, max(max_len, 0), cfg.budget))
        budget = cfg.budget
        if decision.max_len is not None:            # the policy may cap this step's draft
            max_len = min(max_len, decision.max_len)
        if decision.rows is not None:
            budget = max(1, min(budget, decision.rows))
        draft, parts, owner = Draft([]), [], []
        if max_len > 0 and budget > 1:
            req_ = DraftRequest(tokens=tokens, max_len=max_len, budget=budget - 1)
            for d in decision.drafters:
                proposal = d.propose(req_)
                if proposal:
                    parts.append((d, proposal))
                    if not decision.merge:       # else: verify every drafter's candidates together
                        break
            if parts:
                draft, owner = merge_drafts([p for _, p in parts])
        tree = build_tree(tokens[-1], draft.candidates, budget, draft.q, max_depth=max(max_len, 0))
        return Plan(tree, draft, parts, owner, decision.why, score, t0, time.perf_counter())

    def settle(self, req: Request, plan: Plan, logits: torch.Tensor, last: dict, generator: torch.Generator | None,
               keep_cache: Callable[[list[int]], None]) -> StepEvent:
        """logits [n+1, V] over the plan's tree rows; last: this forward's hidden states {site: [m, d]}.
        `keep_cache(keep)` rolls the caller's cache back to the committed rows."""
        cfg, sampling, tree = self.cfg, self.cfg.sampling, plan.tree
        accept_probs = overshoot = None
        if sampling.greedy:
            rows, bonus = accept_greedy(tree, greedy_tokens(logits).tolist())
        elif self.rule.name == "lossless":
            rows, bonus = accept_sampling(tree, lambda r: target_probs(logits[r], sampling).cpu(), generator)
        else:
            overshoot = [] if cfg.record_overshoot else None
            rows, bonus, accept_probs = accept_rule(tree, lambda r: target_probs(logits[r], sampling).cpu(),
                                                    generator, self.rule, overshoot)
        # commit, with EOS / length cuts
        tokens = req.tokens
        new = [tree.tokens[r] for r in rows] + [bonus]
        finished = None
        cut = next((i for i, t in enumerate(new) if t in self.eos), None)
        if cut is not None:
            new, finished = new[:cut + 1], "eos"
        if req.n_gen + len(new) >= cfg.max_new_tokens:
            new, finished = new[:cfg.max_new_tokens - req.n_gen], finished or "max_new_tokens"
        if len(tokens) + len(new) >= self.max_length:
            finished = finished or "context_limit"
        keep = [0] + rows[:len(new) - 1]
        keep_cache(keep)
        hidden = self._kept(last, keep[-1]) if last else None
        position = len(tokens)
        tokens.extend(new)
        req.n_gen += len(new)
        for d in self.policy.drafters:
            d.extend(tokens, len(new))
        if last:
            self.feed(last, keep)
        t2 = time.perf_counter()
        timings = {"draft": plan.t1 - plan.t0, "verify": t2 - plan.t1, "total": t2 - plan.t0}
        parts, owner = plan.parts, plan.owner
        won = next((c for c, cr in enumerate(tree.cand_rows) if rows and cr[:len(rows)] == rows), None)
        # the drafter credited with the step: the one whose candidate was accepted, else the first
        chosen = parts[owner[tree.cand_index[won]]][0] if won is not None else parts[0][0] if parts else None
        event = StepEvent(
            step=req.step, path=chosen.path if chosen else "vanilla", drafter=chosen.name if chosen else None,
            candidates=[[tree.tokens[r] for r in cr] for cr in tree.cand_rows],
            tree_tokens=list(tree.tokens), tree_parents=list(tree.parents), accepted_rows=rows,
            accepted=[tree.tokens[r] for r in rows[:len(new)]],   # committed draft tokens
            accepted_candidate=won,
            sources=[parts[owner[i]][0].path for i in tree.cand_index] if len(parts) > 1 else None,
            bonus=bonus if len(new) == len(rows) + 1 else None,
            new_tokens=new, position=position, probe_score=plan.score, gate=plan.gate,
            match=plan.draft.match if parts else None, timings=timings, finished=finished, hidden=hidden,
            rule=None if self.rule.name == "lossless" else self.rule.label, accept_probs=accept_probs,
            overshoot=overshoot)
        req.hidden = hidden
        req.step += 1
        self.policy.observe(event)
        return event


class Engine:
    def __init__(self, model, policy: Policy, cfg: EngineConfig, eos_ids: Sequence[int] = (),
                 max_length: int | None = None, probe: ProbeScorer | None = None, cost: VerifyCost | None = None,
                 *, make_target: Callable[[object, list, str], "Target"]):
        """`cost`: the device's verification cost curve; verify forwards are padded to its cheapest size.
        `make_target(model, sites, cfg.forward)`: the target's forward that records `sites` (given by the caller,
        switchsd.factory.make_engine: the lean forward or transformers', switchsd/models/forward.py)."""
        self.model, self.policy, self.cfg, self.probe, self.cost = model, policy, cfg, probe, cost
        self.eos = set(int(e) for e in eos_ids) if cfg.stop_at_eos else set()
        self.max_length = max_length or int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.decoder = Decoder(policy, cfg, self.eos, self.max_length, probe)
        self.sites = engine_sites(cfg, policy, probe)
        self.target = make_target(model, self.sites, cfg.forward)   # transformers' forward or the lean one

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def close(self) -> None:
        self.target.close()

    # -- one target forward over the verify rows ------------------------------------------------------
    def _forward(self, cache, tree: TokenTree, extra: Extra | None = None) -> torch.Tensor:
        prefix, n1 = len(cache), len(tree.tokens)
        pad = self.cost.pad_to(n1, max(n1, self.cfg.budget)) - n1 if self.cost is not None else 0
        ids = torch.tensor(tree.tokens + [tree.tokens[0]] * pad, device=self.device)[None]    # [1, n+1+pad]
        if tree.is_chain and extra is None:      # a chain (pad rows, if any, extend it causally and are dropped)
            mask = None                          # the lean forward then attends row by row, as one-token steps do
            pos = torch.arange(prefix, prefix + n1 + pad, device=self.device)[None]
        else:
            mask = tree_mask(tree, prefix, self.model.dtype, self.device, pad)      # [1, 1, m, prefix+m]
            pos = tree_positions(tree, prefix, self.device, pad)                     # [1, m]
        if extra is None:
            return self.target.forward(ids, cache, pos, mask, logit_rows=n1)         # [n+1, V] (pad rows dropped)
        mask, pos = with_extra(mask, pos, prefix, extra)                              # + E unverified rows
        ids = torch.cat([ids, torch.tensor([extra.tokens], device=self.device)], 1)
        logits = self.target.forward(ids, cache, pos, mask)                          # [m+E, V]
        extra.absorb(logits[n1 + pad:])
        return logits[:n1]

    def _prefill(self, cache, ids: list[int]) -> None:
        """Cache ids (the prompt without its pending last token)."""
        self.target.forward(torch.tensor(ids, device=self.device)[None], cache, logit_rows=-1)

    def _last(self) -> dict:
        """The last forward's hidden states of the one row: {site: [m, d]}."""
        return {k: v[0] for k, v in self.target.last.items()} if self.sites else {}

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
        tokens = check_prompt(prompt_ids, self.max_length)
        if not sampling.greedy and generator is None:
            generator = torch.Generator().manual_seed(0)
        t_start = time.perf_counter()
        cache = self.target.new_cache(min(self.max_length, len(tokens) + cfg.max_new_tokens + cfg.budget + 1))
        if len(tokens) > 1:
            self._prefill(cache, tokens[:-1])
        req = self.decoder.start(tokens, self._last() if len(tokens) > 1 else None)
        prefill_s = time.perf_counter() - t_start
        while True:
            plan = self.decoder.plan(req)
            prefix = len(cache)
            logits = self._forward(cache, plan.tree, plan.draft.extra)   # ONE forward verifies every candidate
            event = self.decoder.settle(req, plan, logits, self._last(), generator,
                                        lambda keep: cache.keep(prefix, keep))
            if event.step == 0:
                event.timings["prefill"] = prefill_s
            event.timings["end"] = time.perf_counter() - t_start     # the step's end on the run's own clock
            yield event
            if event.finished:
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


def check_prompt(prompt_ids: Sequence[int], max_length: int) -> list[int]:
    tokens = [int(t) for t in prompt_ids]
    if not tokens:
        raise ValueError("the prompt is empty")
    if len(tokens) >= max_length:
        raise ValueError(f"the prompt has {len(tokens)} tokens; the model's context is {max_length}")
    return tokens


def engine_sites(cfg: EngineConfig, policy: Policy, probe: ProbeScorer | None) -> list:
    """Hidden-state sites every verify forward records: capture, the probe's, the feature drafters'."""
    sites = list(cfg.capture)
    if probe is not None and probe.site not in sites:
        sites.append(probe.site)
    for d in policy.drafters:
        sites += [s for s in getattr(d, "sites", ()) if s not in sites]
    return sites
