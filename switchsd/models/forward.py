"""The target model's forward behind one small interface, so the engine and `calibrate` drive either
transformers' own forward or the lean forward (`switchsd.models.lean`) the same way:

    target = make_target(model, sites=[(14, "attn")], forward="auto")
    cache = target.new_cache(capacity)
    logits = target.forward(ids, cache, position_ids, mask)    # [R, V]; target.last: {site: [1, T, d]}

`forward`: "auto" (lean where the architecture is supported, else transformers), "lean" or "hf".
"""
from __future__ import annotations

from typing import Iterable

import torch

from ..core.cache import KVCache, check_grew
from ..core.engine import Target  # noqa: F401 - the protocol HFTarget and LeanTarget implement
from .capture import HiddenCapture
from .lean import LeanLlama, StaticKVCache, supports

FORWARDS = ("auto", "lean", "hf")
Site = tuple[int, str]


def resolve_forward(model, forward: str = "auto") -> str:
    """"lean" or "hf" for this model; ValueError for an unknown choice or "lean" on an unsupported model."""
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {', '.join(FORWARDS)}, got {forward!r}")
    if forward == "hf":
        if getattr(model, "_switchsd_q4q8", None) is not None:
            raise ValueError("the q4q8 format runs its own forward only (forward 'auto' or 'lean')")
        return "hf"
    why = supports(model)
    if why and forward == "lean":
        raise ValueError(f"the lean forward does not support this model ({why}); use forward 'hf' or 'auto'")
    return "hf" if why else "lean"


def own_forward(model):
    """The model's own forward object: the q4q8 format's (switchsd.models.q4q8) where the model carries one, else
    the lean forward. Every consumer (the engine, serving, regeneration, calibrate) runs the format through it."""
    return getattr(model, "_switchsd_q4q8", None) or LeanLlama.of(model)


class HFTarget:
    """transformers' forward: a DynamicCache and forward hooks for the hidden states."""
    kind = "hf"

    def __init__(self, model, sites: Iterable[Site] = ()):
        self.model = model
        sites = list(sites)
        self.capture = HiddenCapture(model, sites, attach=False) if sites else None

    @property
    def last(self) -> dict[Site, torch.Tensor]:
        return self.capture.last if self.capture else {}

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.model.config)

    def forward(self, ids, cache: KVCache, position_ids=None, mask=None, logit_rows=None) -> torch.Tensor:
        before = len(cache)
        if position_ids is None:
            position_ids = torch.arange(before, before + ids.shape[1], device=ids.device)[None]
        # the head over exactly the rows asked for (a matrix product's rounding can depend on its row count)
        keep = 1 if logit_rows == -1 else 0 if logit_rows is None else \
            torch.arange(min(logit_rows, ids.shape[1]), device=ids.device)
        out = self.model(input_ids=ids, position_ids=position_ids, attention_mask=mask, cache=cache.hf,
                         use_cache=True, logits_to_keep=keep)
        check_grew(cache, before, ids.shape[1])
        return out.logits[0]                                                          # [R, V]

    def attach(self) -> None:
        if self.capture:
            self.capture.attach()

    def close(self) -> None:
        if self.capture:
            self.capture.close()


class LeanTarget:
    """The lean forward: a preallocated cache, fused and packed weights, hidden states recorded inline."""
    kind = "lean"

    def __init__(self, model, sites: Iterable[Site] = ()):
        self.model, self.lean = model, own_forward(model)
        self.sites = [(int(a), str(b)) for a, b in sites]
        for layer, where in self.sites:
            if not 0 <= layer < self.lean.n_layers:
                raise ValueError(f"capture layer {layer} out of range: the model has {self.lean.n_layers} layers")
            if where not in ("attn", "mlp"):
                raise ValueError(f"sub-layer must be 'attn' or 'mlp', got {where!r}")
        self.last: dict[Site, torch.Tensor] = {}

    def new_cache(self, capacity: int) -> StaticKVCache:
        return self.lean.new_cache(capacity)

    def forward(self, ids, cache: StaticKVCache, position_ids=None, mask=None, logit_rows=None) -> torch.Tensor:
        logits, self.last = self.lean.forward(ids, cache, position_ids, mask, self.sites, logit_rows)
        return logits

    def attach(self) -> None:
        pass

    def close(self) -> None:
        self.last = {}


def make_target(model, sites: Iterable[Site] = (), forward: str = "auto") -> HFTarget | LeanTarget:
    return LeanTarget(model, sites) if resolve_forward(model, forward) == "lean" else HFTarget(model, sites)
