"""Copy-intent probe: a bias-free linear probe sigmoid(w . h) on one (layer, sub-layer) hidden state.

File format: safetensors with tensor `weight` [d] (float32) and string metadata:
  format="switchsd-probe-v1", model, model_revision, hidden_size, num_layers, layer, sublayer ("attn"|"mlp"),
  tau, n_train, kappa, align, data (JSON summary of the training data), val_auc, val_f1,
  per_layer (JSON list of {layer, sublayer, auc, f1, tau}), fingerprint (JSON: its model's, models/fingerprint.py).
Loading never unpickles anything, and reads no weight before the file's size and header have been checked
(a probe is d floats and a little metadata: files over MAX_PROBE_BYTES are refused unread). The engine scores
the hidden state its verify forward already captured.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

FORMAT = "switchsd-probe-v1"
MAX_PROBE_BYTES = 1 << 20          # the shipped probe is ~10 KB
MAX_HEADER_BYTES = 256 << 10
MAX_HIDDEN = 1 << 16
_DTYPES = ("F16", "BF16", "F32", "F64")


class ProbeError(ValueError):
    pass


SIGNATURE = ("model_type", "vocab_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")


def model_signature(model) -> dict:
    """What a probe records of its model beyond hidden size and layers, so that a probe from another model of
    the same width and depth is refused (not a vocabulary hash: one file per model format would need one)."""
    cfg = model.config
    return {k: getattr(cfg, k, None) for k in SIGNATURE if getattr(cfg, k, None) is not None}


@dataclass
class Probe:
    weight: torch.Tensor          # [d]
    layer: int
    sublayer: str
    tau: float
    meta: dict = field(default_factory=dict)
    _on_device: dict = field(default_factory=dict, repr=False, compare=False)   # device -> weight copy

    def _weight(self, device) -> torch.Tensor:
        """The weight on `device`, copied there once (not on every step)."""
        w = self._on_device.get(device)
        if w is None:
            w = self._on_device[device] = self.weight.to(device)
        return w

    @property
    def site(self) -> tuple[int, str]:
        return (self.layer, self.sublayer)

    def score(self, hidden: torch.Tensor) -> float:
        """hidden [d] (any dtype/device) -> probability of copy intent."""
        return float(torch.sigmoid(hidden.float() @ self._weight(hidden.device)))

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, d] -> [N]."""
        return torch.sigmoid(hidden.float() @ self._weight(hidden.device))

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
        from .fingerprint import fingerprint, mismatch
        why = mismatch(fingerprint(model), self.meta.get("fingerprint"))
        if why:
            raise ProbeError(f"probe is for a model with {why} ({self.meta.get('model')}): this probe belongs to "
                             "another model")
        have = model_signature(model)
        for key, want in ((k, self.meta.get(k)) for k in SIGNATURE):      # older probes carry none of these
            if want is not None and str(want) != str(have.get(key)):
                raise ProbeError(f"probe is for a model with {key} {want} ({self.meta.get('model')}), the model "
                                 f"has {have.get(key)}: this probe belongs to another model of the same shape")

    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file
        meta = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in self.meta.items()}
        meta.update(format=FORMAT, layer=str(self.layer), sublayer=self.sublayer, tau=repr(float(self.tau)))
        save_file({"weight": self.weight.float().contiguous().cpu()}, str(path), metadata=meta)


def check_header(path: Path) -> dict:
    """Size and safetensors header of a would-be probe file, checked before any tensor is read: one `weight`
    vector of a float dtype, nothing else. Returns the header."""
    size = path.stat().st_size
    if size > MAX_PROBE_BYTES:
        raise ProbeError(f"{path.name}: {size} bytes; a probe file is at most {MAX_PROBE_BYTES} bytes")
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > MAX_HEADER_BYTES or 8 + n > size:
            raise ProbeError(f"{path.name}: not a safetensors probe (no valid header)")
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise ProbeError(f"{path.name}: not a safetensors probe (unreadable header)") from None
    if not isinstance(header, dict) or set(header) - {"__metadata__"} != {"weight"}:
        raise ProbeError(f"{path.name}: a probe file holds exactly one tensor, 'weight'; not a SwitchSD probe")
    w = header["weight"]
    shape = w.get("shape") if isinstance(w, dict) else None
    if (not isinstance(shape, list) or len(shape) != 1 or not isinstance(shape[0], int)
            or not 1 <= shape[0] <= MAX_HIDDEN or w.get("dtype") not in _DTYPES):
        raise ProbeError(f"{path.name}: 'weight' must be a float vector of at most {MAX_HIDDEN} values")
    return header


def _number(meta: dict, key: str, kind=float):
    try:
        v = kind(meta[key])
    except KeyError:
        raise ProbeError(f"metadata field '{key}' missing") from None
    except (TypeError, ValueError):
        raise ProbeError(f"metadata field '{key}' is not a number: {str(meta[key])[:40]!r}") from None
    if kind is float and not math.isfinite(v):
        raise ProbeError(f"metadata field '{key}' must be finite")
    return v


def _check_per_layer(rows) -> None:
    ok = isinstance(rows, list) and all(
        isinstance(r, dict) and isinstance(r.get("layer"), int) and r.get("sublayer") in ("attn", "mlp")
        and all(isinstance(r.get(k), (int, float)) for k in ("auc", "f1", "tau")) for r in rows)
    if not ok:
        raise ProbeError("metadata field 'per_layer' must be a list of {layer, sublayer, auc, f1, tau}")


def load_probe(path: str | Path, model=None) -> Probe:
    from safetensors import safe_open
    path = Path(path)
    if not path.is_file():
        raise ProbeError(f"probe file {path} does not exist")
    check_header(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            weight = f.get_tensor("weight")
    except Exception as e:
        raise ProbeError(f"{path}: not a readable safetensors probe ({e.__class__.__name__}: {str(e)[:200]})") from e
    if meta.get("format") != FORMAT:
        raise ProbeError(f"{path}: metadata format {str(meta.get('format'))[:40]!r}, expected {FORMAT!r}")
    parsed = {}
    for k, v in meta.items():
        try:
            parsed[k] = json.loads(v)
        except (json.JSONDecodeError, TypeError):
            parsed[k] = v
    try:
        sub = str(parsed.get("sublayer"))
        if sub not in ("attn", "mlp"):
            raise ProbeError(f"sublayer must be 'attn' or 'mlp', got {sub[:20]!r}")
        layer, tau = _number(parsed, "layer", int), _number(parsed, "tau")
        if not 0.0 <= tau <= 1.0:
            raise ProbeError(f"tau must be in [0, 1], got {tau}")
        if "per_layer" in parsed:
            _check_per_layer(parsed["per_layer"])
        if not torch.isfinite(weight).all():
            raise ProbeError("the weight holds NaN or inf")
    except ProbeError as e:
        raise ProbeError(f"{path}: {e}") from None
    probe = Probe(weight=weight.float(), layer=layer, sublayer=sub, tau=tau, meta=parsed)
    if model is not None:
        probe.check(model)
    return probe
