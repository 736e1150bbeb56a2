"""Models of the sizes users run, with random weights: the real shapes, rope and vocabularies, as GGUF files made by
llama.cpp's own converter and quantiser (for speed measurements where weights come from DRAM, not the L3).

    python -m switchsd.eval.synthetic --shape llama-3.2-1b --types Q4_K_M      # prints the GGUF's path

Shapes: Llama-3.2-1B (hidden 2048, 16 layers, 32 / 8 heads, llama3 rope scaling, tied embeddings, Llama-3's
tokenizer), Qwen3-1.7B (hidden 2048, 28 layers, 16 / 8 heads of 128, q / k norms, tied, Qwen's tokenizer), Qwen3-4B.
The tokenizers are llama.cpp's test vocabularies (`models/ggml-vocab-*.gguf` in its source tree). Needs
`make llama-cpp`; files are cached under `<cache>/synthetic/<shape>/`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ..models.loading import cache_dir
from .ggufs import make
from .llama_server import llama_cpp_home

SHAPES = {
    "llama-3.2-1b": ("llama", "ggml-vocab-llama-bpe.gguf", dict(
        hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        intermediate_size=8192, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "qwen3-1.7b": ("qwen3", "ggml-vocab-qwen2.gguf", dict(
        hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        intermediate_size=6144, vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen3-4b": ("qwen3", "ggml-vocab-qwen2.gguf", dict(
        hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        intermediate_size=9728, vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
}


def folder(shape: str, seed: int = 0) -> Path:
    """A transformers checkpoint of `shape` with random weights (std 0.02, bfloat16 on disk) and its tokenizer."""
    family, vocab_file, sizes = SHAPES[shape]
    out = cache_dir() / "synthetic" / shape / "hf"
    if (out / "model.safetensors").exists() or (out / "model.safetensors.index.json").exists():
        return out
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    tok = AutoTokenizer.from_pretrained(llama_cpp_home() / "src" / "models", gguf_file=vocab_file)
    cfg_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if family == "llama" else (Qwen3Config, Qwen3ForCausalLM)
    cfg = cfg_cls(**sizes, initializer_range=0.02)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)         # made in bfloat16: a float32 copy of a 4B model would not fit
    try:
        model = model_cls(cfg)
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():         # norms away from 1, as trained models' are
        for p_name, p in model.named_parameters():
            if p_name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    tmp = out.with_name("hf.part")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    _drop_tokens_past(tmp, cfg.vocab_size)
    tmp.rename(out)
    return out


def _drop_tokens_past(folder: Path, vocab: int) -> None:
    """Remove tokens with ids >= vocab that transformers' GGUF tokenizer reader adds (Llama-3's: an <|endoftext|> at
    128256), so the tokenizer has the model's own vocabulary."""
    import json
    p = folder / "tokenizer.json"
    tj = json.loads(p.read_text())
    tj["added_tokens"] = [t for t in tj.get("added_tokens", []) if t["id"] < vocab]
    model = tj.get("model", {})
    if isinstance(model.get("vocab"), dict):
        model["vocab"] = {t: i for t, i in model["vocab"].items() if i < vocab}
    p.write_text(json.dumps(tj, ensure_ascii=False))
    c = folder / "tokenizer_config.json"
    tc = json.loads(c.read_text())
    if isinstance(tc.get("added_tokens_decoder"), dict):
        tc["added_tokens_decoder"] = {k: v for k, v in tc["added_tokens_decoder"].items() if int(k) < vocab}
    for key in ("pad_token", "unk_token"):
        if tc.get(key) == "<|endoftext|>" and vocab == 128256:
            tc.pop(key)
    c.write_text(json.dumps(tc, ensure_ascii=False, indent=1))


def gguf(shape: str, kind: str = "Q4_K_M") -> Path:
    """The GGUF of `shape` in `kind`, by llama.cpp's converter and quantiser."""
    return make(folder(shape), [kind], cache_dir() / "synthetic" / shape)[kind]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m switchsd.eval.synthetic", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--types", default="Q4_K_M", help="comma-separated llama-quantize types (f16: none)")
    args = ap.parse_args(argv)
    try:
        for kind in args.types.split(","):
            print(f"{kind}\t{gguf(args.shape, kind)}")
    except (RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
