"""The shipped probe and EAGLE-3 head of a model, found by its fingerprint (switchsd.core.fingerprint): the same model
from a folder or any GGUF file finds them; another model finds none."""
from __future__ import annotations

import json
from pathlib import Path

from ..core.fingerprint import mismatch

ROOT = Path(__file__).resolve().parents[2]


def _probe_fingerprint(path: Path) -> dict | None:
    try:
        from safetensors import safe_open
        with safe_open(str(path), framework="pt") as f:
            return json.loads((f.metadata() or {}).get("fingerprint", "null"))
    except Exception:                   # an unreadable candidate is simply not a match
        return None


def _head_fingerprint(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "config.json").read_text()).get("switchsd_fingerprint")
    except (OSError, ValueError):
        return None


def shipped(kind: str, fp: dict) -> Path | None:
    """The shipped probe (`kind` "probe": probes/*.safetensors) or EAGLE-3 head ("eagle3": assets/*/) whose recorded
    fingerprint equals `fp` on every key, vocabulary included; None if there is none."""
    if kind == "probe":
        candidates = [(p, _probe_fingerprint(p)) for p in sorted((ROOT / "probes").glob("*.safetensors"))]
    else:
        candidates = [(p, _head_fingerprint(p)) for p in sorted((ROOT / "assets").iterdir())
                      if (p / "config.json").is_file()] if (ROOT / "assets").is_dir() else []
    for path, want in candidates:
        if want and "vocab" in want and "vocab" in fp and mismatch(fp, want) is None \
                and all(k in want for k in fp):
            return path
    return None
