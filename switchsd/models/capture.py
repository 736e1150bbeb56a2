"""Hidden-state capture from the verification forward itself (no extra forward).

Sites are (layer, sub-layer): "attn" = the residual stream right after the attention sub-layer
(the input of `post_attention_layernorm`), "mlp" = after the MLP sub-layer (the decoder layer's output).
Works for Llama/Qwen/Mistral-style decoder layers. Hooks only keep a reference to the activation; the engine
slices the rows it needs.
"""
from __future__ import annotations

from typing import Iterable

import torch


def decoder_layers(model) -> list[torch.nn.Module]:
    for path in ("model.layers", "model.model.layers", "transformer.h"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return list(obj)
        except AttributeError:
            continue
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")


class HiddenCapture:
    """`with HiddenCapture(model, [(14, "attn")]) as cap: model(...); cap.last[(14, "attn")]  # [1, T, d]`"""

    def __init__(self, model, sites: Iterable[tuple[int, str]], attach: bool = True):
        """`attach=False`: hooks are registered only between `attach()` and `close()` (an engine attaches for
        the length of one generation, so no forward of anyone else runs its hooks)."""
        self.sites = [(int(layer), str(where)) for layer, where in sites]
        self.last: dict[tuple[int, str], torch.Tensor] = {}
        self._handles = []
        self._layers = decoder_layers(model)
        for layer, where in self.sites:
            if not 0 <= layer < len(self._layers):
                raise ValueError(f"capture layer {layer} out of range: the model has {len(self._layers)} layers")
            if where == "attn" and getattr(self._layers[layer], "post_attention_layernorm", None) is None:
                raise ValueError(f"layer {layer} of {type(self._layers[layer]).__name__} has no "
                                 "post_attention_layernorm")
            if where not in ("attn", "mlp"):
                raise ValueError(f"sub-layer must be 'attn' or 'mlp', got {where!r}")
        if attach:
            self.attach()

    def attach(self) -> None:
        if self._handles:
            return
        for layer, where in self.sites:
            block = self._layers[layer]
            if where == "attn":
                self._handles.append(block.post_attention_layernorm.register_forward_pre_hook(
                    self._pre_hook((layer, where))))
            else:
                self._handles.append(block.register_forward_hook(self._out_hook((layer, where))))

    def _pre_hook(self, key):
        def hook(module, args):
            self.last[key] = args[0]
        return hook

    def _out_hook(self, key):
        def hook(module, args, output):
            self.last[key] = output[0] if isinstance(output, tuple) else output
        return hook

    def rows(self, row: int) -> dict[tuple[int, str], torch.Tensor]:
        """Hidden vectors [d] at verify row `row` of the last forward, for every site."""
        return {k: v[0, row].detach().clone() for k, v in self.last.items()}   # a copy: frees the activation

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.last = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
