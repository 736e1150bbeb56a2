"""Frozen configuration objects. Every result records the config that produced it (`asdict`)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingConfig:
    """temperature == 0 means greedy. top_k == 0 and top_p == 1.0 disable those filters."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not (self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

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
class EngineConfig:
    """`budget`: most tokens verified in one target forward, the pending token included (>= 1).
    `capture`: hidden-state sites (layer, "attn" | "mlp") to record from every verify forward."""
    max_new_tokens: int = 128
    budget: int = 32
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    capture: tuple[tuple[int, str], ...] = ()
    stop_at_eos: bool = True

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1 (the pending token), got {self.budget}")
        for layer, where in self.capture:
            if where not in ("attn", "mlp"):
                raise ValueError(f"capture sub-layer must be 'attn' or 'mlp', got {where!r}")
