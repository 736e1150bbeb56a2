"""GGUF files of the offline model in other block types, written by gguf-py (no llama.cpp needed): the shipped Q4_1
file's metadata and tensors, chosen matrices re-quantised (imported as `gguf_files` by the tests)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter

from switchsd.models.loading import GGUF_FILE, gguf_folder


def retype(src: Path, dst: Path, kind_for: Callable[[str, str], str | None]) -> Path:
    """dst: src with each tensor `name` of type `kind` re-quantised to kind_for(name, kind) (None: kept)."""
    r = GGUFReader(str(src))
    arch = r.fields["general.architecture"]
    w = GGUFWriter(str(dst), bytes(arch.parts[arch.data[0]]).decode())
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        w.add_key_value(f.name, f.contents(), vt, sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        k = kind_for(t.name, t.tensor_type.name)
        if k and k != t.tensor_type.name:
            w.add_tensor(t.name, gguf.quants.quantize(gguf.quants.dequantize(t.data, t.tensor_type), Q[k]),
                         raw_dtype=Q[k])
        else:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


# a mix of the types gguf-py writes, as llama-quantize mixes types in one file
MIX = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "ffn_down": "Q5_1"}


def mixed_offline_gguf(folder: Path) -> Path:
    """The offline model with q, k in Q5_0, v in Q8_0, down in Q5_1 (the rest as shipped: Q4_1, the head Q8_0)."""
    return retype(gguf_folder() / GGUF_FILE, folder / "smollm2-mixed.gguf",
                  lambda n, k: MIX.get(n.split(".")[-2]) if n.startswith("blk.") else None)


def _permute(w, heads: int):
    """llama.cpp's converter's q / k row order for the llama architecture (rotary halves interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, path: Path, kinds=("Q4_K", "Q4_K", "Q6_K", "Q5_0", "Q8_0")) -> Path:
    """A GGUF of a tiny transformers model (Llama, Qwen2 or Qwen3, vocabulary the offline model's: its tokenizer and
    chat template are copied from the shipped file), as llama.cpp's converter lays it out. Matrices take the block
    types `kinds` in turn (a K type on rows not a multiple of 256 falls back as llama-quantize does): K types as
    random blocks (gguf-py cannot write them; the model then is the file's), the others quantised by gguf-py.
    Norms, biases and the embedding stay float32."""
    import numpy as np
    from families import BLOCKS, FALLBACK, random_blocks
    cfg = model.config
    arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[cfg.model_type]
    src = GGUFReader(str(gguf_folder() / GGUF_FILE))
    w = GGUFWriter(str(path), arch)
    for f in src.fields.values():
        if f.name.startswith("tokenizer."):
            vt = f.types[0]
            w.add_key_value(f.name, f.contents(), vt, sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]) if getattr(cfg, "rope_parameters", None)
                         else float(cfg.rope_theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    rng = np.random.default_rng(0)
    turn = [0]

    def matrix(name: str, weight, heads: int | None = None):
        kind = kinds[turn[0] % len(kinds)]
        turn[0] += 1
        n, k = weight.shape
        if k % BLOCKS[kind][1]:
            kind = FALLBACK[kind]
        if kind in ("Q4_K", "Q5_K", "Q6_K"):
            w.add_tensor(name, random_blocks(kind, n, k, rng), raw_dtype=Q[kind])
        else:
            data = weight.detach().float().numpy()
            if heads is not None and arch == "llama":
                data = _permute(data, heads)
            w.add_tensor(name, gguf.quants.quantize(data, Q[kind]), raw_dtype=Q[kind])

    f32 = lambda t: t.detach().float().numpy()                                # noqa: E731
    inner = model.model
    w.add_tensor("token_embd.weight", f32(inner.embed_tokens.weight))
    w.add_tensor("output_norm.weight", f32(inner.norm.weight))
    if not cfg.tie_word_embeddings:
        matrix("output.weight", model.lm_head.weight)
    for i, b in enumerate(inner.layers):
        a, m = b.self_attn, b.mlp
        w.add_tensor(f"blk.{i}.attn_norm.weight", f32(b.input_layernorm.weight))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", f32(b.post_attention_layernorm.weight))
        matrix(f"blk.{i}.attn_q.weight", a.q_proj.weight, cfg.num_attention_heads)
        matrix(f"blk.{i}.attn_k.weight", a.k_proj.weight, cfg.num_key_value_heads)
        matrix(f"blk.{i}.attn_v.weight", a.v_proj.weight)
        matrix(f"blk.{i}.attn_output.weight", a.o_proj.weight)
        matrix(f"blk.{i}.ffn_gate.weight", m.gate_proj.weight)
        matrix(f"blk.{i}.ffn_up.weight", m.up_proj.weight)
        matrix(f"blk.{i}.ffn_down.weight", m.down_proj.weight)
        for short, lin in (("attn_q", a.q_proj), ("attn_k", a.k_proj), ("attn_v", a.v_proj)):
            if getattr(lin, "bias", None) is not None:
                w.add_tensor(f"blk.{i}.{short}.bias", f32(lin.bias))
        if hasattr(a, "q_norm"):
            w.add_tensor(f"blk.{i}.attn_q_norm.weight", f32(a.q_norm.weight))
            w.add_tensor(f"blk.{i}.attn_k_norm.weight", f32(a.k_norm.weight))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
