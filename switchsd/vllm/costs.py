"""The SwitchSD gate's cost model in vLLM: what each drafting path earned on this server and what its steps cost,
measured from the target forward's own rows and the clock, so that the gate picks per request and step the draft
with the most expected tokens per second on this machine. Acceptance by position and an option's worth are the
engine's gate's own (switchsd/core/acceptance.py); numpy and pure Python only."""
from __future__ import annotations

import numpy as np

from switchsd.core.acceptance import HALF_LIFE, PRIOR_WEIGHT, PRIORS, Acceptance, worth


class PathCosts:
    """What each path earned on this server and what its steps cost, as running counts. Per tag (copy by probe
    state and match length, "copy:high:3"; "neural"): acceptance by draft position (`Acceptance`: among drafts
    that reached position j, how many had token j accepted, with the shared prior). Per step (EAGLE-3 drafted or not, rows verified): its mean time, read through a line over the rows
    (`step_times`). `choose` takes, of a copy chain's
    lengths, EAGLE-3's draft and no draft, the one with the most expected tokens per second (`worth`: 1 + the
    expected accepted tokens, over its step's time). The acceptance record forgets: a draft's weight halves with every `half_life` drafts verified since (any path's),
    so the record follows what the server is serving now, and a path that looked poor on the first requests and so
    was never drafted again drifts back to its prior and is tried again (None: never forget)."""
    EMA = 0.05                  # the running means of a request's rows and tokens per step (`observe`)

    def __init__(self, max_len: int = 32, half_life: float | None = HALF_LIFE):
        self.max_len = max_len
        self.record: dict[str, Acceptance] = {}    # tag -> its acceptance by position (faded by `_age` lazily)
        self.decay = 0.5 ** (1 / half_life) if half_life else 1.0     # each record's weight per draft verified
        self.clock = 0                              # drafts verified so far (every path)
        self.seen: dict[str, int] = {}             # tag -> the clock when its record was last credited
        self.rows_per_request, self.tokens_per_request = 1.0, 1.0      # per request and step, running means
        self._fit: tuple | None = None              # the step-time line and EAGLE-3's means, until a step is timed
        self.time: dict[tuple[bool, int], list[float]] = {}    # (EAGLE-3 drafted, rows) -> [seconds, steps] (`set_time`)
        self.pending: tuple[bool, int] | None = None           # the last planned step's kind

    def credit(self, tag: str, verified: int, accepted: int) -> None:
        """One verified draft of `tag`: `verified` tokens drafted, the first `accepted` of them accepted."""
        self.clock += 1
        acc = self.record.get(tag)
        if acc is None:
            acc = self.record[tag] = self._fresh(tag)
        acc.fade(self._age(tag))
        self.seen[tag] = self.clock
        acc.update(min(verified, self.max_len), accepted)

    @staticmethod
    def _fresh(tag: str) -> Acceptance:
        return Acceptance(prior=PRIORS[tag.split(":")[0]], weight=PRIOR_WEIGHT, decay=1.0)

    def _age(self, tag: str) -> float:
        """What tag's record weighs now: decay ** (drafts verified since it was last credited). Read-only, so the
        counts file's thread may call it (`summary`)."""
        return self.decay ** (self.clock - self.seen.get(tag, self.clock))

    def rates(self, tag: str, n: int) -> np.ndarray:
        """[n]: P(at least j of a draft's tokens accepted), j = 1..n."""
        acc = self.record.get(tag) or self._fresh(tag)
        return np.array(acc.reach(n, self._age(tag)))

    def planned(self, eagle: bool, rows: int | None) -> None:
        """The next step's kind: EAGLE-3 drafted or not, every request's rows (None: a step not to time, a prompt
        read in it)."""
        self.pending = (eagle, rows) if rows is not None else None

    def step(self, seconds: float) -> None:
        """The time since the last plan: the step it planned (its drafting, the target forward verifying it)."""
        if self.pending is not None:
            t = self.time.setdefault(self.pending, [0.0, 0])
            t[0] += seconds
            t[1] += 1
            self._fit = None
        self.pending = None

    def set_time(self, eagle: bool, rows: int, seconds: float, steps: int = 1) -> None:
        """Set a step kind's measured time (tests, replays): `steps` steps that took `seconds` in all."""
        self.time[(eagle, rows)] = [seconds, steps]
        self._fit = None

    def step_time(self, eagle: bool, rows: int) -> float:
        """Expected seconds of such a step. Steps without EAGLE-3: a line through the mean time of each measured
        row count, weighted by its steps (one noisy or stale row count cannot price itself out of ever being
        drafted, and so out of ever being measured again), flat with one row count measured; with EAGLE-3: its
        own mean at that row count, else the nearest measured one moved along the line, else the line. 1 s when
        nothing is measured."""
        return self.step_times(eagle, [rows])[0]

    def step_times(self, eagle: bool, rows: list[int]) -> list[float]:
        if self._fit is None:
            self._fit = self._line()
        fit = self._fit
        if fit is None:
            return [1.0] * len(rows)
        mr, mt, slope, own = fit
        line = [mt + slope * (r - mr) for r in rows]
        if not eagle or not own:
            return line
        out = []
        for r in rows:
            near = min(own, key=lambda x: (abs(x - r), x))
            out.append(own[near] + slope * (r - near))
        return out

    def _line(self) -> tuple[float, float, float, dict[int, float]] | None:
        """(mean rows, mean seconds, seconds per row, EAGLE-3 steps' mean seconds by rows) of the timed steps, or
        None when none is timed: fitted once per timed step, not once per request."""
        plain = [(r, v[0] / v[1], v[1]) for (e, r), v in self.time.items() if not e and v[1]]
        if not plain:
            plain = [(r, v[0] / v[1], v[1]) for (e, r), v in self.time.items() if v[1]]
        if not plain:
            return None
        w = sum(n for _, _, n in plain)
        mr, mt = sum(r * n for r, _, n in plain) / w, sum(t * n for _, t, n in plain) / w
        var = sum(n * (r - mr) ** 2 for r, _, n in plain)
        slope = max(0.0, sum(n * (r - mr) * (t - mt) for r, t, n in plain) / var) if var > 0 else 0.0
        own = {r: v[0] / v[1] for (e, r), v in self.time.items() if e and v[1]}
        return mr, mt, slope, own

    def observe(self, requests: int, rows: int, tokens: int) -> None:
        """A verified step: its requests, their rows in the target forward, the tokens they emitted."""
        a = self.EMA
        self.rows_per_request += a * (rows / requests - self.rows_per_request)
        self.tokens_per_request += a * (tokens / requests - self.tokens_per_request)

    def choose(self, tag: str, chain: int, neural_k: int, others: int = 0) -> int | None:
        """How many of a copy chain's `chain` tokens to draft (0: no draft), or None: EAGLE-3's draft instead, for
        one of `others` + 1 requests in a step. Every request's rows share the step, so a drafted row pays when it
        raises the step's expected tokens per second: the other requests bring their usual rows and tokens
        (`observe`), and where many requests share a step (compute-bound) only drafts likely to be accepted pay."""
        rows0, tok0 = others * self.rows_per_request, others * self.tokens_per_request
        times = self.step_times(False, [rows0 + 1 + n for n in range(chain + 1)])
        reach = list(self.rates(tag, chain)) if chain else []
        best, choice = worth(reach, 0, times[0], tok0 + 1), 0
        for n in range(1, chain + 1):
            w = worth(reach, n, times[n], tok0 + 1)
            if w > best:
                best, choice = w, n
        if neural_k and worth(list(self.rates("neural", neural_k)), neural_k,
                              self.step_time(True, rows0 + neural_k + 1), tok0 + 1) > best:
            return None
        return choice

    def summary(self) -> dict:
        """Per tag: its verified drafts, weighted by age, and acceptance rates of positions 1..5; per step kind and
        rows: mean ms."""
        return {"rates": {t: [round(self.record[t].seen(self._age(t)), 1)] + [round(x, 3) for x in self.rates(t, 5)]
                          for t in sorted(self.record)},
                "step_ms": {f"{'eagle' if e else 'copy'}:{r}": round(1000 * v[0] / v[1], 1)
                            for (e, r), v in sorted(self.time.items())}}
