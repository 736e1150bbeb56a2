"""SwitchSD's default gate (and EAGLE-3's, SPS's): the cost model that picks, every step, what runs.

`CostAware.select` scores a plain step, the copy trie cut at each depth, prompt lookup and a neural chain of each
length by expected committed tokens per millisecond on this device, and picks the best; `observe` learns each
path's acceptance, the drafters' times and the verify times from every step. Lossless: it only chooses drafts.
"""
from __future__ import annotations

import math
import operator
import time
from itertools import accumulate

from .acceptance import DECAY, PRIORS, Acceptance, worth
from .config import GateConfig
from .costs import Calibration, EmaTimer, VerifyCost, VerifyScale
from .drafting import DraftRequest
from .policies import Decision, PolicyState


class CostAware:
    """SwitchSD's default gate: the paper's probe AND kappa-gram rule says when copying is plausible; a cost model
    decides what runs. Every step it scores each option by expected committed tokens per second,

        (1 + expected accepted draft tokens) / (verify ms of its rows + the drafter's own ms),

    over: a plain step; the copy trie cut at each depth d (when plausible); a neural chain of each length
    1..gamma (or the configured tree). Expected acceptance is learnt online per path (`Acceptance`, the estimate
    vLLM's gate shares: switchsd/core/acceptance.py), for the
    copy path per probe-score bucket; verify ms come from the device's calibrated curve (`VerifyCost`, padded
    envelope), rescaled by what the verify forwards of each row count actually take (`VerifyScale`); drafter ms
    are measured (`EmaTimer`).
    When the best option is a plain step, the neural drafter is re-tried (a burst of `BURST` chain-1 steps) once
    every K plain steps, K chosen so that such probes (and the head's resumption) cost at most `explore` of the
    time. The neural drafter's acceptance is priced one standard error above its estimate (`_optimistic`), its
    evidence fades on plain steps as the copy paths' does, and its time per draft comes only from drafts that
    follow another in the same sequence (`resume_ms` keeps the rest).
    A `lookup` drafter (prompt lookup: continuations of the last 1-2 tokens' earlier occurrences, <= 10 tokens,
    up to 3 distinct ones as a trie, most recent first) is one more option at every step, priced by its own
    acceptance, learnt per probe-score bucket: short accidental repeats (names, code tokens, formulas) pay on devices where a few more
    verify rows cost little, while the long multi-candidate copy path stays reserved for copy intent (probe AND
    kappa-gram).
    With `confidence` (GateConfig.confidence) a neural drafter that offers `confident_chain` drafts its chain
    first, one token at a time while the next token could still pay for its verify row, and each chain cut
    is priced by its own tokens' probabilities (`Calibration`, learnt online) instead of the path's average:
    the head's confident steps are drafted and its unsure ones run plain.
    Lossless: it only chooses drafts."""

    def __init__(self, copier, neural, tau: float | None, cost: VerifyCost, explore: float = GateConfig.explore,
                 buckets: int = 4, lookup=None, confidence: bool = False, neural_margin: float = 0.0,
                 neural_guess: float = 0.25):
        self.copy, self.neural, self.lookup = copier, neural, lookup if copier is not None else None
        self.cost, self.explore = cost, float(explore)
        self.tau = None if tau is None else float(tau)
        self.drafters = [d for d in (copier, neural, self.lookup) if d is not None]
        lo = self.tau if self.tau is not None else 0.0
        self.edges = [lo + (1 - lo) * i / buckets for i in range(1, buckets)]
        self.copy_acc = [Acceptance(prior=PRIORS["copy"]) for _ in range(buckets)]
        self.look_edges = [i / (2 * buckets) for i in range(1, 2 * buckets)]  # probe-score buckets over [0, 1]
        self.lookup_acc = [Acceptance(prior=PRIORS["lookup"]) for _ in range(2 * buckets)]
        # the prior weighs a burst's worth of drafts: one early miss must not shut the head out for `every` steps
        self.neural_acc = Acceptance(prior=PRIORS["neural"], weight=float(self.BURST))
        self.confidence = confidence and hasattr(neural, "confident_chain")
        self.calib = Calibration()
        base = cost.ms(1)
        self.copy_ms = EmaTimer(guess_ms=0.002 * base)
        self.lookup_ms = EmaTimer(guess_ms=0.002 * base)
        # the neural drafter's ms per token until its first timed draft replaces it: `neural_guess` of a step
        self.neural_ms = EmaTimer(guess_ms=neural_guess * base)
        self.resume_ms = EmaTimer()          # a first draft after other steps (0 until the first burst's is timed)
        self.neural_margin = float(neural_margin)
        self.scale = VerifyScale()           # measured verify time / calibrated curve, per row count
        self._curve: dict[tuple[int, int], float] = {}
        self.plain_run = 0                   # plain steps since the neural drafter last ran
        self._neural_last = False            # the last step's draft was the neural drafter's
        self._burst = 0                      # chain-1 re-tries left in the current burst
        self._chosen: dict = {}
        # a neural-only gate that chose a plain step re-prices every REPRICE steps, or at once on new evidence
        # (a draft's outcome); in between, nothing it weighs changes but the verify scale's slow drift
        self._plain: tuple | None = None     # (key, Decision, steps left, explore threshold)

    # -- options ---------------------------------------------------------------------------------------------
    def _curve_ms(self, rows: int, limit: int | None = None) -> float:
        key = (rows, limit)       # the curve is fixed: look each size up once, not ~100 times per step
        if key not in self._curve:
            self._curve[key] = self.cost.ms(rows, limit)
        return self._curve[key]

    def _verify_ms(self, rows: int, limit: int) -> float:
        return self.scale.get(rows) * self._curve_ms(rows, limit)

    def _neural_tree(self):
        """The neural drafter's tree config when it drafts trees, else None (it drafts chains)."""
        tree = getattr(self.neural, "tree", None)
        return tree if tree is not None and not getattr(self.neural, "chain", True) and tree.top_k > 1 else None

    def _neural_shapes(self, max_len: int, rows: int) -> list[tuple[int, int]]:
        """(depth, verify rows) of each neural shape on offer."""
        tree = self._neural_tree()
        if tree is not None:
            return [(min(tree.depth, max_len), min(tree.total_tokens + 1, rows))]
        g = min(getattr(self.neural, "gamma", 1), max_len, rows - 1)
        return [(n, n + 1) for n in range(1, g + 1)]

    @staticmethod
    def _cuts(drafter, state: PolicyState, limit: int) -> list[tuple[int, int]]:
        """(depth, trie rows) of `drafter`'s candidates cut at each depth (empty: nothing to propose)."""
        draft = drafter.propose(DraftRequest(tokens=state.tokens, max_len=state.max_len, budget=limit - 1))
        if not draft:
            return []
        out, prefixes = [], set()
        for d in range(1, max(len(c) for c in draft.candidates) + 1):
            prefixes.update(tuple(c[:d]) for c in draft.candidates if len(c) >= d)
            out.append((d, min(1 + len(prefixes), limit)))
        return out

    def _optimistic(self, reach: list[float]) -> list[float]:
        """The neural chain's reach, its first token's acceptance raised by one standard error of its estimate: with
        little evidence (a few early misses) the head is tried again; with much, the estimate itself decides."""
        if not reach:
            return reach
        p, n = reach[0], self.neural_acc.seen() + self.neural_acc.weight
        up = min(1.0, p + math.sqrt(p * (1 - p) / n)) / p if p > 0 else 1.0
        return [r * up for r in reach]

    def _neural_price(self, reach: list[float], g: int, rows: int, limit: int, extra_ms: float = 0.0,
                      drafted: bool = False) -> tuple[float, float]:
        """(expected committed tokens, ms) of a neural draft g deep verified in `rows` rows (`extra_ms`: time spent
        whatever runs; `drafted`: the chain exists already, its head time sunk): the one pricing `select` and
        `outlook` share."""
        ms = self._verify_ms(rows, limit) + (0.0 if drafted else self.neural_ms.get(g)) + extra_ms
        return 1.0 + sum(reach[:g]), ms

    def _confident_chain(self, state: PolicyState, gmax: int, limit: int, V) -> list[float]:
        """Draft the neural chain token by token (the drafter holds it for this step's `propose`) while a longer
        chain could still beat both a plain step and the best cut so far. Token i's chance of being reached and
        accepted, reach_i, is the product of `Calibration` estimates of the probabilities the head gave tokens
        1..i; the bound takes every further token at reach_i (reach only falls) and counts one head step each.
        Returns the drafted tokens' probabilities."""
        reach, total, best, step_ms = [1.0], 0.0, 1.0 / V(1), self.neural_ms.get(1)

        def keep(i: int, c: float) -> bool:
            nonlocal total, best
            reach.append(reach[-1] * self.calib.p(c))
            total += reach[-1]
            best = max(best, (1 + total) / V(i + 1))
            return any((1 + total + (d - i) * reach[-1]) / (V(d + 1) + (d - i) * step_ms) > best
                       for d in range(i + 1, gmax + 1))

        _, confs = self.neural.confident_chain(DraftRequest(tokens=state.tokens, max_len=gmax, budget=limit - 1),
                                               keep)
        return confs

    REPRICE = 16
    # a re-try of the neural drafter is a burst of this many chain-1 steps: the first resumes the head (it feeds
    # the positions it missed), the rest measure what it accepts and costs while it drafts step after step
    BURST = 8

    def select(self, state: PolicyState) -> Decision:
        if state.step == 0:                  # a new sequence: the head's first draft feeds its whole context
            self._neural_last = False
        replay = self._replay_plain(state)
        if replay is not None:
            return replay
        limit = max(1, state.rows)
        score, tau = state.probe_score, self.tau
        match = self.copy is not None and self.copy.has_match(state.tokens)
        plausible = match and score is not None and tau is not None and score >= tau
        bucket = sum(score >= e for e in self.edges) if plausible else None
        V = lambda rows: self._verify_ms(rows, limit)            # noqa: E731
        shapes = self._neural_shapes(state.max_len, limit) if self.neural is not None and state.max_len > 0 \
            and limit > 1 else []
        confs, sunk = None, 0.0
        if self.confidence and shapes and self._neural_tree() is None:      # chains: draft first, then price
            t = time.perf_counter()
            confs = self._confident_chain(state, shapes[-1][0], limit, V)
            sunk = 1000 * (time.perf_counter() - t)      # spent whatever runs next: every option carries it
            if confs:
                self.neural_ms.add(len(confs), sunk)
            shapes = [(g, g + 1) for g in range(1, len(confs) + 1)]
        copy_cuts = self._cuts(self.copy, state, limit) if plausible and state.max_len > 0 and limit > 1 else []
        low, l_cuts = None, []
        if self.lookup is not None and state.max_len > 0 and limit > 1:
            low = sum(score >= e for e in self.look_edges) if score is not None else 0
            l_cuts = self._cuts(self.lookup, state, limit)
        options = self._options(V, limit, sunk, shapes, confs, copy_cuts, bucket, l_cuts, low)
        best, explore, every = self._explore(max(options, key=lambda o: o[0]), options, shapes, V)
        value, choice, d, g, rows = best
        # paths that could have drafted but did not: their evidence fades (re-tried once it no longer says no)
        if copy_cuts and choice not in ("copy", "copy+neural"):
            self.copy_acc[bucket].fade(DECAY)
        if low is not None and l_cuts and choice != "lookup":
            self.lookup_acc[low].fade(DECAY)
        self._chosen = {"choice": choice, "bucket": bucket, "low": low, "confs": confs}
        top = sorted(options, key=lambda o: -o[0])[:4]
        gate = {"mode": "cost", "probe": score, "tau": tau, "kgram_match": match, "copy": plausible,
                "choice": choice, "copy_depth": d, "neural_depth": g, "explore": explore,
                "expected_tok_s": {_label(c, cd, ng): round(1000 * v, 1) for v, c, cd, ng, _ in top},
                "rows": rows}
        if confs is not None:
            gate["neural_conf"] = [round(c, 3) for c in confs]
        drafters = {"plain": (), "copy": (self.copy,), "neural": (self.neural,), "lookup": (self.lookup,),
                    "copy+neural": (self.copy, self.neural)}[choice]
        decision = Decision(drafters, max_len=max(d, g), rows=rows, merge=choice == "copy+neural", why=gate)
        if choice == "plain" and every is not None and self.copy is None and self.lookup is None and not self.confidence:
            key = (min(state.max_len, getattr(self.neural, "gamma", 1)), state.rows)
            self._plain = (key, decision, self.REPRICE - 1, every)
        return decision

    def _replay_plain(self, state: PolicyState) -> Decision | None:
        """A neural-only gate's last plain decision again while nothing it weighs has changed (REPRICE)."""
        memo = self._plain
        if memo is None:
            return None
        key = (min(state.max_len, getattr(self.neural, "gamma", 1)), state.rows)
        if memo[0] == key and memo[2] > 0 and self.plain_run + 1 < memo[3]:
            self.plain_run += 1
            self.neural_acc.fade(DECAY)
            self._plain = (key, memo[1], memo[2] - 1, memo[3])
            return memo[1]
        self._plain = None
        return None

    def _options(self, V, limit: int, sunk: float, shapes, confs, copy_cuts, bucket, l_cuts, low) -> list[tuple]:
        """Every option on offer, priced: (expected tokens per ms, choice, copy depth, neural depth, verify rows)."""
        options = [(1.0 / (V(1) + sunk), "plain", 0, 0, 1)]
        if l_cuts:
            l_reach = self.lookup_acc[low].reach(len(l_cuts))
            l_ms = self.lookup_ms.get(1) + sunk
            for d, rows in l_cuts:
                options.append((worth(l_reach, d, V(rows) + l_ms), "lookup", d, 0, rows))
        c_ms = self.copy_ms.get(1) + sunk
        c_reach = self.copy_acc[bucket].reach(len(copy_cuts)) if copy_cuts else []
        csum = list(accumulate(c_reach, initial=0.0))            # csum[d]: expected copy tokens at depth d
        for d, rows in copy_cuts:
            options.append((worth(c_reach, d, V(rows) + c_ms), "copy", d, 0, rows))
        n_reach = (list(accumulate((self.calib.p(c) for c in confs), operator.mul)) if confs is not None else
                   self._optimistic(self.neural_acc.reach(max((g for g, _ in shapes), default=0))))
        nsum = list(accumulate(n_reach, initial=0.0))
        both = list(accumulate((c * n for c, n in zip(c_reach, n_reach)), initial=0.0))
        damp = 1.0 / (1.0 + self.neural_margin)    # a neural draft must beat the rest by this share
        for g, rows in shapes:
            n_ms = self.neural_ms.get(g) if confs is None else 0.0      # drafted already: `sunk`, in c_ms too
            tokens, ms = self._neural_price(n_reach, g, rows, limit, sunk, drafted=confs is not None)
            options.append((damp * tokens / ms, "neural", 0, g, rows))
            for d, c_rows in copy_cuts:    # both drafts in one verify forward (misses taken as independent)
                e = csum[d] + nsum[g] - both[min(d, g)]
                rows_b = min(c_rows + rows - 1, limit)
                options.append((damp * (1 + e) / (V(rows_b) + c_ms + n_ms), "copy+neural", d, g, rows_b))
        return options

    def _explore(self, best: tuple, options: list[tuple], shapes, V) -> tuple[tuple, bool, float | None]:
        """(the option to run, whether it is a re-try, the re-try period): a plain best re-tries the neural drafter
        in bursts of BURST chain-1 steps once every `every` plain steps (at most `explore` of the time)."""
        explore, every = False, None
        if best[1] == "plain" and shapes:         # (confidence mode: its calibration learns from these too)
            self.plain_run += 1
            self.neural_acc.fade(DECAY)   # as the copy paths': a head shut out by a bad stretch is re-priced later
            probe_cost = (V(2) + self.neural_ms.get(1)) / V(1) - 1
            resume = self.resume_ms.get(1) / V(1)             # the burst's first draft feeds what the head missed
            every = min(500, max(4, (self.BURST * probe_cost + resume) / self.explore))
            if self.plain_run >= every or self._burst > 0:
                best = next(o for o in options if o[1] == "neural" and o[3] == 1)
                self._burst = self._burst - 1 if self._burst > 0 else self.BURST - 1
                explore, self.plain_run = True, 0
        elif best[1] == "neural":
            self._burst = max(0, self._burst - 1)
        else:
            self._burst = 0
        return best, explore, every

    def outlook(self) -> dict | None:
        """Why the neural drafter does or does not pay here, from what the gate has learnt so far: for each chain
        length g, the expected tokens a step commits (1 + expected accepted) against the break-even, what that
        step costs in plain steps ((verify ms of g+1 rows + the head's ms) / verify ms of one row), times the
        margin a neural draft must clear. None without a neural drafter."""
        if self.neural is None:
            return None
        v1 = self._verify_ms(1, 1 << 30)
        g_max = max(1, getattr(self.neural, "gamma", 1))
        reach = self._optimistic(self.neural_acc.reach(g_max))      # as `select` prices it
        chains = []
        for g in range(1, g_max + 1):
            tokens, cost = self._neural_price(reach, g, g + 1, 1 << 30)
            chains.append({"gamma": g, "expected_tokens": tokens,
                           "break_even_tokens": (1 + self.neural_margin) * cost / v1})
        best = max(chains, key=lambda c: c["expected_tokens"] / c["break_even_tokens"])
        return {"p_first": self.neural_acc.p(1), "verify_ms_1": v1, "verify_ratio_2": self._verify_ms(2, 1 << 30) / v1,
                "head_ms_1": self.neural_ms.get(1), "margin": self.neural_margin, "best": best, "chains": chains,
                "evidence": self.neural_acc.seen()}

    # -- learning --------------------------------------------------------------------------------------------
    def observe(self, event) -> None:
        rows = len(event.tree_tokens)
        verify_ms = 1000 * event.timings.get("verify", 0.0)
        if verify_ms > 0:
            self.scale.update(rows, verify_ms / self._curve_ms(rows))
        steady, self._neural_last = self._neural_last, False
        if not event.candidates:
            return
        draft_ms = 1000 * event.timings.get("draft", 0.0)
        sources = event.sources or [event.path] * len(event.candidates)
        self._neural_last = "neural" in sources
        got = event.accepted_rows and [event.tree_tokens[r] for r in event.accepted_rows]
        for path in set(sources):
            cands = [c for c, s in zip(event.candidates, sources) if s == path]
            depth = max(len(c) for c in cands)
            acc = max(_common(c, got or []) for c in cands)
            if path == "copy" and self._chosen.get("choice") == "lookup":
                self.lookup_acc[self._chosen.get("low") or 0].update(depth, acc)
                self.lookup_ms.add(1, draft_ms)
            elif path == "copy":
                b = self._chosen.get("bucket")
                self.copy_acc[b if b is not None else -1].update(depth, acc)
                self.copy_ms.add(1, draft_ms if len(set(sources)) == 1 else 0.1 * draft_ms)
            elif path == "neural":
                confs = self._chosen.get("confs")
                for i in range(min(depth, acc + 1, len(confs or []))):    # positions reached: hit or first miss
                    self.calib.update(confs[i], i < acc)
                self.neural_acc.update(depth, acc)
                # the head's cost while it drafts step after step; a first draft after other steps also feeds
                # the positions it missed (up to its catch-up window), a bounded cost paid once per resumption
                if confs is None and steady:      # one stalled draft (a page fault, the OS) moves it at most 2x
                    known = self.neural_ms.ms.get(depth)
                    self.neural_ms.add(depth, draft_ms if known is None else min(draft_ms, 2 * known))
                elif confs is None:
                    self.resume_ms.add(1, draft_ms)
                self.plain_run, self._plain = 0, None


def _label(choice: str, copy_depth: int, neural_depth: int) -> str:
    return {"plain": "plain", "copy": f"copy{copy_depth}", "neural": f"chain{neural_depth}",
            "lookup": f"lookup{copy_depth}"}.get(
        choice, f"copy{copy_depth}+chain{neural_depth}")


def _common(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
