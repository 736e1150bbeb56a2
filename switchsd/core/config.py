"""Frozen configuration objects: the ONE place where defaults are declared. The CLIs, the studio and the docs
read them from here. Every result records the config that produced it (`asdict`)."""
from __future__ import annotations

from dataclasses import dataclass, field

# below MIN_TEMPERATURE, logits / T overflow float32 (use 0: greedy); NaN and inf are refused too
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-5, 100.0


@dataclass(frozen=True)
class SamplingConfig:
    """temperature == 0 means greedy. top_k == 0 and top_p == 1.0 disable those filters. `min_p` > 0 keeps the
    tokens with p >= min_p * max p; `eta` > 0 those with p >= min(eta, exp(-H(p))): the truncated-sampling
    baselines of the verification lab (the same sets as its minp / eta rules)."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    eta: float = 0.0

    def __post_init__(self):
        t = self.temperature
        if not (t == 0.0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):
            raise ValueError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and {MAX_TEMPERATURE}, "
                             f"got {t}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        for k in ("min_p", "eta"):
            if not (0.0 <= getattr(self, k) <= 1.0):
                raise ValueError(f"{k} must be in [0, 1], got {getattr(self, k)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class CopyConfig:
    """The SwitchSD copy path: kappa-gram match, W candidates of up to D tokens, most recent first."""
    kappa: int = 5
    max_candidates: int = 10   # W
    max_draft_len: int = 20    # D

    def __post_init__(self):
        for k in ("kappa", "max_candidates", "max_draft_len"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")


@dataclass(frozen=True)
class LookupConfig:
    """The other copy drafters. Prompt lookup (method `pld`, and the cost gate's lookup option): the continuation
    (<= `pld_tokens`) of the last 1..`pld_max_ngram` tokens' earlier occurrence, as transformers'
    `prompt_lookup_num_tokens=10` does. CopySpec: the `copyspec_ngram`-gram's earliest occurrence, then
    `copyspec_tokens` tokens (its Spec-Bench settings). SAM-Decoding: the suffix automaton's chain of
    `samd_n_predicts` tokens when its match is >= `samd_len_threshold` tokens long, else the neural drafter; without
    one, min(n_predicts, 1 + `samd_alpha` x match) tokens (Spec-Bench: 40, 5; the reference's alpha 4)."""
    pld_max_ngram: int = 2
    pld_tokens: int = 10
    copyspec_ngram: int = 3
    copyspec_tokens: int = 10
    samd_n_predicts: int = 40
    samd_len_threshold: int = 5
    samd_alpha: float = 4.0
    lookahead_level: int = 5       # Lookahead Decoding: N (n-gram size), W (window), G (guesses per key),
    lookahead_window: int = 7      # Spec-Bench's settings
    lookahead_guess: int = 7

    def __post_init__(self):
        if not self.samd_alpha > 0:
            raise ValueError(f"samd_alpha must be > 0, got {self.samd_alpha}")
        if self.lookahead_level < 3 or self.lookahead_window < 2:
            raise ValueError(f"lookahead needs level >= 3 and window >= 2, got {self.lookahead_level}, "
                             f"{self.lookahead_window}")
        for k in ("pld_max_ngram", "pld_tokens", "copyspec_ngram", "copyspec_tokens", "samd_n_predicts",
                  "samd_len_threshold", "lookahead_guess"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")


@dataclass(frozen=True)
class EngineConfig:
    """`budget`: most tokens verified in one target forward, the pending token included (>= 1).
    `capture`: hidden-state sites (layer, "attn" | "mlp") to record from every verify forward.
    `forward`: the target's forward: "auto" (the lean forward where the architecture is supported, else
    transformers'), "lean" or "hf" (transformers' own)."""
    max_new_tokens: int = 128
    budget: int = 32
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    capture: tuple[tuple[int, str], ...] = ()
    stop_at_eos: bool = True
    forward: str = "auto"
    verify: str = "lossless"    # the verification rule (switchsd/core/rules.py): lossy ones only at T > 0
    record_overshoot: bool = False  # lossy rules: each event records overshoot_mass per verified node (costs time)

    def __post_init__(self):
        from .rules import parse_rule
        rule = parse_rule(self.verify)                      # ValueError with the reason
        if rule.lossy and self.sampling.greedy:
            raise ValueError(f"verification rule {rule.label} applies to sampling: set a temperature > 0")
        if self.forward not in ("auto", "lean", "hf"):
            raise ValueError(f"forward must be auto, lean or hf, got {self.forward!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1 (the pending token), got {self.budget}")
        for layer, where in self.capture:
            if where not in ("attn", "mlp"):
                raise ValueError(f"capture sub-layer must be 'attn' or 'mlp', got {where!r}")


@dataclass(frozen=True)
class TreeConfig:
    """EAGLE-2 dynamic tree. top_k = 1 with depth = gamma is a chain."""
    top_k: int = 4
    depth: int = 5
    total_tokens: int = 24   # draft nodes (root excluded), further capped by the engine's budget

    def __post_init__(self):
        for k in ("top_k", "depth", "total_tokens"):
            if getattr(self, k) < 1:
                raise ValueError(f"tree {k} must be >= 1, got {getattr(self, k)}")


NEURAL_SHAPES = ("auto", "chain", "tree")


@dataclass(frozen=True)
class NeuralConfig:
    """How the neural drafter (EAGLE-3 head or SPS draft model) drafts.
    shape "auto" (default): a chain whose length (0..gamma, 0 = a plain step) the cost model picks every step;
    "chain": always `gamma` tokens; "tree": the EAGLE-2 dynamic tree `tree`."""
    shape: str = "auto"
    gamma: int = 5
    tree: TreeConfig = field(default_factory=TreeConfig)

    def __post_init__(self):
        if self.shape not in NEURAL_SHAPES:
            raise ValueError(f"neural shape must be one of {NEURAL_SHAPES}, got {self.shape!r}")
        if self.gamma < 1:
            raise ValueError(f"gamma (chain length) must be >= 1, got {self.gamma}")


GATE_MODES = ("cost", "paper")


@dataclass(frozen=True)
class GateConfig:
    """SwitchSD's gate. Copying is plausible iff probe(h) >= tau AND the kappa-gram ending at the current token
    occurred earlier (`CopyConfig.kappa`). mode "cost" (default): the cost model then picks copy (and its depth),
    a neural chain (and its length) or a plain step, whichever is expected to commit the most tokens per second
    on this device; "paper": the fixed dual gate of the paper (eq. 4): copy when plausible, else the neural
    drafter. `tau` None: the probe's own (F1-optimal) threshold. `explore`: the share of time the cost gate may
    spend re-trying a drafter it currently deems too slow. `kappa`: the cost gate's kappa-gram (its copy drafter's
    n-gram too); shorter than the paper's 5 (`CopyConfig.kappa`, which the paper gate keeps) because the cost
    model, not the n-gram length, now prices a false trigger (dev set: docs/results.md). `lookup`: the cost gate
    may also take a short prompt-lookup draft (<= 10 tokens, up to `lookup_candidates` distinct continuations
    of the last 1-2 tokens' most recent occurrences, verified as a trie) where the acceptance it measures
    for such drafts (per probe-score bucket) pays for their verify rows; the long multi-candidate copy path
    stays gated by probe AND kappa-gram (False: copy / neural / plain only)."""
    mode: str = "cost"
    tau: float | None = None
    explore: float = 0.005
    kappa: int = 3
    lookup: bool = True
    lookup_candidates: int = 3
    confidence: bool = False   # price each neural chain by its tokens' own probabilities (CostAware; variant +conf)
    # a neural draft runs only where it is expected to beat the other options by this share: its price (a head
    # step of ~4 ms beside a target step of 15-25 ms on a CPU, plus catch-up) is the least certain one the gate has
    neural_margin: float = 0.05
    # until the neural drafter has been timed, its cost per token as a share of a target step: a head step on a
    # CPU is a sizeable share (EAGLE-3: ~3-5 ms beside 15-25 ms), so no draft runs on an optimistic guess
    neural_guess: float = 0.25
    bandit_c: float = 1.0      # BanditSpec's UCB exploration constant (method banditspec)

    def __post_init__(self):
        if self.mode not in GATE_MODES:
            raise ValueError(f"gate mode must be one of {GATE_MODES}, got {self.mode!r}")
        if self.tau is not None and not (0.0 <= self.tau <= 1.0):
            raise ValueError(f"tau (probe threshold) must be in [0, 1], got {self.tau}")
        if not (0.0 < self.explore < 1.0):
            raise ValueError(f"explore must be in (0, 1), got {self.explore}")
        if self.kappa < 1:
            raise ValueError(f"kappa must be >= 1, got {self.kappa}")
        if not (0.0 <= self.neural_guess < 10.0):
            raise ValueError(f"neural_guess must be in [0, 10), got {self.neural_guess}")
        if not (0.0 <= self.neural_margin < 1.0):
            raise ValueError(f"neural_margin must be in [0, 1), got {self.neural_margin}")
        if self.lookup_candidates < 1:
            raise ValueError(f"lookup_candidates must be >= 1, got {self.lookup_candidates}")
        if not (self.bandit_c > 0 and self.bandit_c < float("inf")):
            raise ValueError(f"bandit_c must be a positive number, got {self.bandit_c}")


@dataclass(frozen=True)
class SMCConfig:
    """SMC-SD (switchsd/core/smc.py): particles, draft length per cycle, the two temperatures, the ESS fraction
    below which the particles are resampled; `self_draft_layers` > 0 drafts with the target's first layers
    instead of the neural drafter (EAGLE-3 head or SPS model)."""
    n_particles: int = 4
    gamma: int = 4
    draft_temperature: float = 0.7
    target_temperature: float = 0.7
    ess_threshold: float = 0.5          # resample when ESS < threshold * N (0: never)
    self_draft_layers: int = 0

    def __post_init__(self):
        if not 1 <= self.n_particles <= 256:
            raise ValueError(f"n_particles must be in [1, 256], got {self.n_particles}")
        if not 1 <= self.gamma <= 64:
            raise ValueError(f"gamma must be in [1, 64], got {self.gamma}")
        for k in ("draft_temperature", "target_temperature"):
            SamplingConfig(getattr(self, k))            # same validation as any temperature
            if getattr(self, k) == 0:
                raise ValueError(f"{k} must be > 0 (SMC samples)")
        if self.self_draft_layers < 0:
            raise ValueError(f"self_draft_layers must be >= 0, got {self.self_draft_layers}")
        if not 0.0 <= self.ess_threshold <= 1.0:
            raise ValueError(f"ess_threshold must be in [0, 1], got {self.ess_threshold}")
