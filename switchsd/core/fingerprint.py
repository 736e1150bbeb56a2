"""A model's fingerprint: what a probe or an EAGLE-3 head must match, whatever file or format the model came from.

    fp = fingerprint(lm.model, lm.tokenizer)     # {"model_type": "llama", "hidden_size": 576, ..., "vocab": "ac05..."}
    why = mismatch(fp, probe_meta["fingerprint"])        # None, or one line naming the first difference

Architecture and sizes from the config, plus a hash of the vocabulary (every token string in id order): the same
model as a folder, an f16 GGUF or a Q4_K_M one has one fingerprint; another model of the same shape has another.
The shipped probe and head carry the offline model's (`switchsd.models.shipped` finds them by it).
"""
from __future__ import annotations

import hashlib

KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "intermediate_size", "vocab_size")


def vocab_hash(tokenizer) -> str | None:
    """sha256 (16 hex) of the vocabulary's token strings in id order; None for a tokenizer without one."""
    get = getattr(tokenizer, "get_vocab", None)
    if get is None:
        return None
    vocab = get()
    text = "\n".join(f"{i}\t{t}" for t, i in sorted(vocab.items(), key=lambda kv: kv[1]))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(model, tokenizer=None) -> dict:
    """The model's fingerprint (see the module's docstring); cached on the model."""
    cached = getattr(model, "_switchsd_fingerprint", None)
    if cached is not None and (tokenizer is None or "vocab" in cached):
        return cached
    cfg = model.config
    fp = {k: getattr(cfg, k) for k in KEYS if getattr(cfg, k, None) is not None}
    v = vocab_hash(tokenizer) if tokenizer is not None else None
    if v:
        fp["vocab"] = v
    try:
        model._switchsd_fingerprint = fp
    except AttributeError:
        pass
    return fp


def mismatch(have: dict, want: dict | None) -> str | None:
    """None when `want` (an artifact's recorded fingerprint) fits `have` (the loaded model's), else the first
    difference as a phrase. Keys either side lacks are not compared."""
    for key in (*KEYS, "vocab"):
        if want and key in want and key in have and str(want[key]) != str(have[key]):
            what = "vocabulary" if key == "vocab" else key
            return f"{what} {want[key]} (the model has {have[key]})"
    return None
