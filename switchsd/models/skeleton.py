"""A GGUF file's model for the q4q8 format without de-quantising its matrices.

    model = skeleton(gguf_path, config)     # transformers' model class; matrices left on the meta device

The C forward (`switchsd.models.q4q8`) multiplies by the file's own blocks; of the transformers model it reads only
the embeddings, the norms, Qwen2's q/k/v biases, Qwen3's q/k norms and the rotary frequencies. Those come from the
file here (the embedding de-quantised by gguf-py, the rest stored as float32), and every other parameter stays on
the meta device, unallocated: a 1B file loads in seconds and a few hundred MB instead of transformers' float32 copy
of every matrix. Calling the dense forward of such a model fails at once (meta tensors); `--dtype float32` loads
the dense model.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .ggufread import architecture, reader, rotary_rows

# GGUF name (per layer where it has {i}) -> the transformers parameter it fills
NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
         "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
         "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
         "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
         "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
         "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
         "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
         "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias"}


def _set(model: torch.nn.Module, dotted: str, value: torch.Tensor) -> None:
    owner, _, name = dotted.rpartition(".")
    module = model.get_submodule(owner)
    old = getattr(module, name)
    if tuple(old.shape) != tuple(value.shape):
        raise ValueError(f"{dotted}: the file holds {tuple(value.shape)}, the config says {tuple(old.shape)}")
    setattr(module, name, torch.nn.Parameter(value, requires_grad=False))


def _dequantized(t, dequantize, rows: int = 4096) -> np.ndarray:
    """A GGUF tensor as float32 [rows, cols] (or [n]), de-quantised a slice of rows at a time: gguf-py's
    temporaries for a whole 128k-token embedding would take several times its size."""
    shape = [int(s) for s in reversed(t.shape)]
    data = np.asarray(t.data)
    if len(shape) == 1:                      # a copy (the file's pages are not kept)
        return np.array(dequantize(data, t.tensor_type), dtype=np.float32).reshape(-1)
    out = np.empty(shape, dtype=np.float32)
    for a in range(0, shape[0], rows):
        out[a:a + rows] = dequantize(data[a:a + rows], t.tensor_type).reshape(-1, shape[1])
    return out


def skeleton(path: str | Path, config) -> torch.nn.Module:
    """transformers' model of `config` with the file's embeddings, norms, biases and q/k norms (float32, CPU), its
    rotary frequencies computed on the CPU, and its matrices unallocated (meta). ValueError for a tensor whose shape
    the config contradicts or an embedding the file lacks."""
    from gguf.quants import dequantize
    from transformers import AutoModelForCausalLM
    arch = architecture(path)
    tensors = {t.name: t for t in reader(path).tensors}
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{Path(path).name}: no token_embd.weight")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    for gguf_name, hf_name in NAMES.items():
        for i in range(config.num_hidden_layers) if "{i}" in gguf_name else [None]:
            t = tensors.get(gguf_name.format(i=i))
            if t is None:
                continue
            value = _dequantized(t, dequantize)
            perm = rotary_rows(arch, gguf_name.split(".")[-2], value.shape[0], config) if value.ndim == 1 else None
            if perm is not None:                                          # a bias in llama.cpp's rotary row order
                value = value[perm.numpy()]
            _set(model, hf_name.format(i=i), torch.from_numpy(value))
    if getattr(config, "tie_word_embeddings", False) or "output.weight" not in tensors:
        model.lm_head.weight = model.model.embed_tokens.weight
    inner = model.model
    inner.rotary_emb = type(inner.rotary_emb)(config=config)          # built outside the meta device
    model.requires_grad_(False)
    model._switchsd_skeleton = True
    name = Path(path).name

    def dense_refused(module, args, kwargs):
        raise RuntimeError(f"{name} is loaded in the q4q8 format: its matrices are the file's own blocks, run by the "
                           "C forward; transformers' forward needs the dense model (--dtype float32 or bfloat16)")
    model.register_forward_pre_hook(dense_refused, with_kwargs=True)
    return model
