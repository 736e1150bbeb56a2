"""Verification rules at one position, as pure functions of the target distribution p [V] and the draft
distribution q [V] (a copy draft is a point mass: q = one-hot). Besides `lossless` (today's rule, verify.py),
the lossy rules of "Revisiting Lossy Verification in Speculative Decoding" (arXiv 2607.26627) and EASD
(arXiv 2512.23765); notes: ../shared/research/seed_extras.md sections 3-4.

A rule answers three questions about a drafted token x ~ q:
    accept_prob(p, q)  [V]  probability that x is accepted, for every x
    residual(p, q)     [V]  the distribution the replacement is drawn from after a rejection
    output(p, q)       [V]  the law of the token emitted at this position (accepted or replacement):
                            sum_x q(x) a(x) [y = x] + (1 - sum_x q(x) a(x)) residual(y)
and `accepted(p, q)` = q a / sum(q a), the law of the tokens that pass (the paper's "yield" of a truncation
rule, Eq. 9: q 1_A / Z_A). `lossless` and `cos` at lam=1 / `lenience` at l=1 have output = p exactly.

Families (the paper's): truncation (`minp`, `eta`: accept iff x is in a set the target allows; a rejection
draws from p itself), collaborative (`lenience`, `cos`, `cos-contrastive`), overshoot-capped (`capped`, ours,
see below) and EASD (`easd`). `overshoot_ratio` measures the paper's principle: the largest output(x) / p(x)
over the overshoot set {q > p}; lenience bounds it by 1/l, `capped` by c + 1, cos's ensemble does not bound it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

EPS = 1e-30


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats of p [..., V]."""
    return -(p * p.clamp_min(EPS).log()).sum(-1)


def normalise(x: torch.Tensor) -> torch.Tensor:
    s = x.sum(-1, keepdim=True)
    return torch.where(s > 0, x / s.clamp_min(EPS), torch.zeros_like(x))


@dataclass(frozen=True)
class Rule:
    """A verification rule and its knobs. Build with `parse_rule("lenience:l=0.6")`."""
    name: str = "lossless"
    params: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.name not in RULES:
            raise ValueError(f"unknown verification rule {self.name!r}; choose from {', '.join(RULES)}")
        known = RULES[self.name]["params"]
        bad = set(self.params) - set(known)
        if bad:
            raise ValueError(f"rule {self.name} takes {', '.join(known) or 'no knobs'}; got {', '.join(sorted(bad))}")
        for k, v in self.params.items():
            lo, hi = known[k][1]
            ok = isinstance(v, (int, float)) and not math.isnan(v) and lo <= v <= hi
            if not (ok and (math.isfinite(v) or v == hi)):         # inf only where the range allows it
                raise ValueError(f"{self.name}: {k} must be in [{lo}, {hi}], got {v!r}")

    def get(self, key: str) -> float:
        return float(self.params.get(key, RULES[self.name]["params"][key][0]))

    @property
    def lossy(self) -> bool:
        """False only where the output law is the target's for every p, q."""
        if self.name == "lossless":
            return False
        if self.name == "lenience":
            return self.get("l") != 1.0
        if self.name in ("cos", "capped"):
            return self.get("lam") != 1.0
        if self.name == "easd":
            return math.isfinite(self.get("tq")) or math.isfinite(self.get("tp"))
        return True

    @property
    def label(self) -> str:
        knobs = ",".join(f"{k}={v:g}" for k, v in sorted(self.params.items()))
        return self.name + (f":{knobs}" if knobs else "") + (" (lossy)" if self.lossy else "")

    # -- the rule --------------------------------------------------------------------------------------
    def allowed(self, p: torch.Tensor) -> torch.Tensor:
        """Truncation rules: the set A the target allows, as a bool mask [..., V]."""
        if self.name == "minp":
            return p >= self.get("p_base") * p.max(-1, keepdim=True).values
        if self.name == "eta":
            thr = torch.clamp(self.get("delta") * torch.exp(-entropy(p)), max=self.get("eps"))
            return p >= thr[..., None]
        raise ValueError(f"{self.name} is not a truncation rule")

    def target(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Collaborative rules verify losslessly against a mixed target r [..., V]."""
        if self.name == "cos":
            lam = self.get("lam")
            return lam * p + (1 - lam) * q
        if self.name == "cos-contrastive":        # unverified form (the paper's formula could not be read)
            mu = self.get("mu")
            logr = (1 + mu) * p.clamp_min(EPS).log() - mu * q.clamp_min(1e-6).log()
            return normalise(torch.where(p > 0, torch.exp(logr - logr.max(-1, keepdim=True).values), torch.zeros_like(p)))
        if self.name == "capped":
            lam, c = self.get("lam"), self.get("c")
            m = torch.minimum(lam * p + (1 - lam) * q, c * p)           # the ensemble, capped at c x the target
            return m + (1 - m.sum(-1, keepdim=True)).clamp_min(0) * p   # leftover mass goes to the target
        return p

    def accept_prob(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        if self.name in ("minp", "eta"):
            return self.allowed(p).to(p.dtype)
        if self.name == "lenience":
            return torch.clamp(p / (self.get("l") * q).clamp_min(EPS), max=1.0)
        if self.name == "easd":             # standard acceptance, then a second test on the accepted token
            return torch.clamp(p / q.clamp_min(EPS), max=1.0) * (0.0 if self.easd_fires(p, q) else 1.0)
        r = self.target(p, q)
        return torch.clamp(r / q.clamp_min(EPS), max=1.0)

    def residual(self, p: torch.Tensor, q: torch.Tensor, x: int | None = None) -> torch.Tensor:
        """Replacement law after a rejection. EASD: an accepted-then-rejected x is replaced from p without x."""
        if self.name in ("minp", "eta"):
            return p
        if self.name == "lenience":                 # the residual of the UNSCALED q (paper Eq. 7)
            return normalise((p - q).clamp_min(0))
        if self.name == "easd" and x is not None and self.easd_fires(p, q):
            return normalise(p.clone().index_fill_(-1, torch.tensor([x], device=p.device), 0.0))
        r = self.target(p, q)
        return normalise((r - q).clamp_min(0))

    def easd_fires(self, p: torch.Tensor, q: torch.Tensor) -> bool:
        """Both distributions uncertain (entropy above their thresholds) and their top-n sets overlapping."""
        if not (float(entropy(q)) > self.get("tq") and float(entropy(p)) > self.get("tp")):
            return False
        n = int(self.get("n"))
        both = set(q.topk(n).indices.tolist()) & set(p.topk(n).indices.tolist())
        return len(both) / n >= self.get("rho")

    def output(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The exact law of the emitted token [V] (one position, x ~ q)."""
        if self.name == "easd" and self.easd_fires(p, q):
            passed = torch.minimum(p, q)                          # x accepted by the standard test ...
            out = (1 - passed.sum()) * normalise((p - q).clamp_min(0))
            for x in torch.nonzero(passed > 0).flatten().tolist():   # ... then replaced from p without x
                out = out + passed[x] * self.residual(p, q, x)
            return out
        a = self.accept_prob(p, q)
        keep = q * a
        return keep + (1 - keep.sum(-1, keepdim=True)).clamp_min(0) * self.residual(p, q)

    def judge(self, p: torch.Tensor, q: torch.Tensor, x: int, u: float) -> tuple[float, bool, torch.Tensor, bool]:
        """One drafted token x ~ q against p, with the uniform u: (its acceptance probability as recorded,
        accepted, the law to go on with, final). After a rejection the node's law becomes that residual (the
        next sibling is tried against it, or the bonus is drawn from it); `final` (EASD's second rejection of
        an accepted token): the replacement is drawn from it and the step ends."""
        if self.name == "easd":
            a = float(torch.clamp(p[x] / q[x].clamp_min(EPS), max=1.0))
            fires = self.easd_fires(p, q)
            if u < a:
                return (0.0, False, self.residual(p, q, x), True) if fires else (a, True, p, False)
            return (0.0 if fires else a), False, normalise((p - q).clamp_min(0)), False
        a = float(self.accept_prob(p, q)[x])
        return (a, True, p, False) if u < a else (a, False, self.residual(p, q), False)

    def accepted(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Law of the drafted tokens that pass the test (truncation rules: q 1_A / Z_A)."""
        return normalise(q * self.accept_prob(p, q))


def overshoot_ratio(rule: Rule, p: torch.Tensor, q: torch.Tensor) -> float:
    """max over {x: q(x) > p(x), p(x) > 0} of output(x) / p(x): how far the rule lets the draft's overshoot
    through (1 = never above the target; lenience <= 1/l; cos's ensemble unbounded as p -> 0)."""
    over = (q > p) & (p > 0)
    if not bool(over.any()):
        return 1.0
    return float((rule.output(p, q)[over] / p[over]).max())


def overshoot_mass(rule: Rule, p: torch.Tensor, q: torch.Tensor) -> float:
    """sum over {x: q(x) > p(x)} of (output(x) - p(x))^+: the probability mass the rule emits ABOVE the target
    where the draft overshoots it (0 for any lossless rule; the second overshoot metric)."""
    over = q > p
    return float(((rule.output(p, q) - p).clamp_min(0) * over).sum())


# name -> {"params": {knob: (default, (lo, hi))}, "family": ...}
INF = float("inf")
RULES: dict[str, dict] = {
    "lossless": {"family": "lossless", "params": {}},
    "minp": {"family": "truncation", "params": {"p_base": (0.3, (0.0, 1.0))}},
    "eta": {"family": "truncation", "params": {"eps": (0.1, (0.0, 1.0)), "delta": (1.0, (0.0, 100.0))}},
    "lenience": {"family": "collaborative", "params": {"l": (0.6, (1e-3, 1.0))}},
    "cos": {"family": "collaborative", "params": {"lam": (0.6, (0.0, 1.0))}},
    "cos-contrastive": {"family": "collaborative (unverified formula)", "params": {"mu": (0.5, (0.0, 10.0))}},
    "capped": {"family": "collaborative, overshoot-capped", "params": {"lam": (0.6, (0.0, 1.0)),
                                                                       "c": (2.0, (1.0, 1e6))}},
    "easd": {"family": "entropy-aware", "params": {"tq": (2.0, (0.0, INF)), "tp": (2.0, (0.0, INF)),
                                                   "n": (5, (1, 1000)), "rho": (0.6, (0.0, 1.0))}},
}


def parse_rule(spec: str) -> Rule:
    """'lenience:l=0.6', 'minp:p_base=0.3', 'easd:tq=2.1,tp=1.8', 'lossless' -> Rule (ValueError if bad)."""
    name, _, rest = spec.strip().partition(":")
    params = {}
    for part in filter(None, (s.strip() for s in rest.split(","))):
        k, eq, v = part.partition("=")
        if not eq:
            raise ValueError(f"bad rule knob {part!r} in {spec!r}: use NAME:key=value,...")
        try:
            params[k.strip()] = float(v)
        except ValueError:
            raise ValueError(f"rule knob {k.strip()} must be a number, got {v!r}") from None
    return Rule(name.strip(), params)


def sample_position(rule: Rule, p: torch.Tensor, q: torch.Tensor, generator: torch.Generator,
                    x: int | None = None) -> tuple[int, bool]:
    """One position of speculative sampling under `rule`: the draft x ~ q (or the given x, for a point mass),
    the test, and on rejection a replacement. Returns (emitted token, whether x was accepted).
    The random draws are the same for every rule (x, then u, then the replacement), so a rule that reduces to
    lossless SD also reproduces its tokens under one seed."""
    if x is None:
        x = int(torch.multinomial(q, 1, generator=generator))
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    _, ok, law, _ = rule.judge(p, q, x, u)
    return (x, True) if ok else (int(torch.multinomial(law, 1, generator=generator)), False)
