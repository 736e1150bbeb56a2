"""Copy-intent probe: a bias-free linear probe sigmoid(w . h) on one (layer, sub-layer) hidden state.

File format: safetensors with tensor `weight` [d] (float32) and string metadata:
  format="switchsd-probe-v1", model, model_revision, hidden_size, num_layers, layer, sublayer ("attn"|"mlp"),
  tau, n_train, kappa, align, data (JSON summary of the training data), val_auc, val_f1,
  per_layer (JSON list of {layer, sublayer, auc, f1, tau}).
Loading never unpickles anything. The engine scores the hidden state its verify forward already captured.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

FORMAT = "switchsd-probe-v1"


class ProbeError(ValueError):
    pass


@dataclass
class Probe:
    weight: torch.Tensor          # [d]
    layer: int
    sublayer: str
    tau: float
    meta: dict = field(default_factory=dict)

    @property
    def site(self) -> tuple[int, str]:
        return (self.layer, self.sublayer)

    def score(self, hidden: torch.Tensor) -> float:
        """hidden [d] (any dtype/device) -> probability of copy intent."""
        w = self.weight.to(hidden.device)
        return float(torch.sigmoid(hidden.float() @ w))

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, d] -> [N]."""
        return torch.sigmoid(hidden.float() @ self.weight.to(hidden.device))

    def check(self, model) -> None:
        """Raise ProbeError unless this probe fits `model` (hidden size, layer count, model name)."""
        cfg = model.config
        hs, nl = int(self.meta.get("hidden_size", -1)), int(self.meta.get("num_layers", -1))
        if hs != cfg.hidden_size or self.weight.numel() != cfg.hidden_size:
            raise ProbeError(f"probe is for hidden size {hs} ({self.meta.get('model')}), the model has "
                             f"{cfg.hidden_size}: this probe belongs to another model")
        if nl != cfg.num_hidden_layers:
            raise ProbeError(f"probe is for a {nl}-layer model ({self.meta.get('model')}), the model has "
                             f"{cfg.num_hidden_layers} layers: this probe belongs to another model")
        if not 0 <= self.layer < cfg.num_hidden_layers:
            raise ProbeError(f"probe layer {self.layer} does not exist")

    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file
        meta = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in self.meta.items()}
        meta.update(format=FORMAT, layer=str(self.layer), sublayer=self.sublayer, tau=repr(float(self.tau)))
        save_file({"weight": self.weight.float().contiguous().cpu()}, str(path), metadata=meta)


def load_probe(path: str | Path, model=None) -> Probe:
    from safetensors import safe_open
    path = Path(path)
    if not path.exists():
        raise ProbeError(f"probe file {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            if "weight" not in f.keys():
                raise ProbeError(f"{path}: no 'weight' tensor; not a SwitchSD probe")
            weight = f.get_tensor("weight")
    except ProbeError:
        raise
    except Exception as e:
        raise ProbeError(f"{path}: not a readable safetensors probe ({e.__class__.__name__}: {str(e)[:200]})") from e
    if meta.get("format") != FORMAT:
        raise ProbeError(f"{path}: metadata format {meta.get('format')!r}, expected {FORMAT!r}")
    if weight.dim() != 1:
        raise ProbeError(f"{path}: weight must be a vector, got shape {tuple(weight.shape)}")
    parsed = {}
    for k, v in meta.items():
        try:
            parsed[k] = json.loads(v)
        except (json.JSONDecodeError, TypeError):
            parsed[k] = v
    try:
        sub = str(parsed["sublayer"])
        if sub not in ("attn", "mlp"):
            raise ProbeError(f"{path}: sublayer must be 'attn' or 'mlp', got {sub!r}")
        probe = Probe(weight=weight.float(), layer=int(parsed["layer"]), sublayer=sub, tau=float(parsed["tau"]),
                      meta=parsed)
    except KeyError as e:
        raise ProbeError(f"{path}: metadata field {e} missing") from None
    if model is not None:
        probe.check(model)
    return probe
