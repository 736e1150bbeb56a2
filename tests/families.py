"""Tiny random models of the families users bring (Llama-3.x rope scaling, Qwen2 biases, Qwen3 q/k norms, Mistral),
and C forwards over random GGUF blocks of every type the forward reads (imported as `families` by the tests)."""
from __future__ import annotations

import numpy as np
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from switchsd.kernels import qx
from switchsd.kernels.qx import BLOCKS, random_blocks  # noqa: F401  (gguf_files takes them from here)
from switchsd.models.q4q8 import Q4Q8Llama

VOCAB, EOS = 64, 1
FAMILIES = ("llama3", "qwen2", "qwen3", "mistral")
SIZES = dict(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=512, max_position_embeddings=256, eos_token_id=EOS, bos_token_id=0, pad_token_id=0)


def make_family(name: str, seed: int = 0, dtype=torch.float64):
    """A tiny random model of family `name` (FAMILIES), float64, eval mode."""
    torch.manual_seed(seed)
    if name == "llama3":              # Llama-3.x: llama3 rope scaling, tied embeddings (Llama-3.2-1B's)
        cfg = LlamaConfig(**SIZES, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 32})
        model = LlamaForCausalLM(cfg)
    elif name == "qwen2":             # q/k/v biases
        model = Qwen2ForCausalLM(Qwen2Config(**SIZES, tie_word_embeddings=True))
        with torch.no_grad():          # transformers initialises biases to zero: make them count
            for layer in model.model.layers:
                for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    lin.bias.normal_(0, 0.5)
    elif name == "qwen3":             # per-head q / k RMSNorm, head_dim apart from hidden / heads
        model = Qwen3ForCausalLM(Qwen3Config(**SIZES, head_dim=32, tie_word_embeddings=False))
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    elif name == "mistral":           # full attention (no sliding window), untied head
        model = MistralForCausalLM(MistralConfig(**SIZES, sliding_window=None, tie_word_embeddings=False))
    else:
        raise ValueError(name)
    with torch.no_grad():
        for layer in model.model.layers:     # norms away from 1 so a missing norm would show
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
    model = model.to(dtype).eval()
    model.requires_grad_(False)
    return model


FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def gguf_forward(model, kinds, path: str = "auto") -> Q4Q8Llama:
    """A C forward over random GGUF blocks (`kinds`: one type, or a list cycled over the model's matrices: mixed
    files), the model's dense weights set to the blocks' values (so transformers' forward computes the same model),
    on kernel path `path`. Attaches it as the model's q4q8 format."""
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    rng = np.random.default_rng(0)
    count = [0]

    def linear(lin: torch.nn.Linear):
        kind = kinds[count[0] % len(kinds)]
        count[0] += 1
        if kind in ("F16", "BF16"):                     # an f16 / bf16 file's matrices as they are
            w16 = (torch.from_numpy(rng.standard_normal(lin.weight.shape)) * 0.1).to(
                torch.float16 if kind == "F16" else torch.bfloat16)
            lin_q = qx.gguf_linear(w16.view(torch.int16).numpy(), kind, path)
            with torch.no_grad():
                lin.weight.copy_(lin_q.dequantized().to(lin.weight.dtype))
            return lin_q
        if lin.weight.shape[1] % BLOCKS[kind][1]:      # llama-quantize's fallbacks for rows not a multiple of 256
            kind = FALLBACK[kind]
        lin_q = qx.gguf_linear(random_blocks(kind, *lin.weight.shape, rng), kind, path)
        with torch.no_grad():
            lin.weight.copy_(lin_q.dequantized().to(lin.weight.dtype))
        return lin_q

    layers = []
    for b in model.model.layers:
        a, m = b.self_attn, b.mlp
        layers.append([qx.fuse([linear(a.q_proj), linear(a.k_proj), linear(a.v_proj)]), [linear(a.o_proj)],
                       qx.fuse([linear(m.gate_proj), linear(m.up_proj)]), [linear(m.down_proj)]])
    head = linear(model.lm_head)                       # tied: the embedding takes the head's blocks' values too
    fwd = Q4Q8Llama(model, layers, [head], path)
    model._switchsd_q4q8, model._switchsd_format = fwd, "q4q8"
    return fwd


def qwen3_folder(out, seed: int = 0, head_dim: int = 16, aux: tuple[int, int, int] = (1, 1, 1)):
    """A tiny random Qwen3 checkpoint folder with the offline model's tokenizer and chat template (vocabulary 49152,
    hidden 64, 2 layers of 4 / 2 heads of 16), a random EAGLE-3 head for it and a probe that always fires, both
    carrying its fingerprint; the head reads the target layers `aux` (input-to-layer ids; vLLM captures each id once,
    so a head it runs needs three distinct ones, e.g. (0, 1, 2)). Returns (folder, head folder, probe path)."""
    return tiny_folder("qwen3", out, seed, head_dim, aux)


def tiny_folder(family: str, out, seed: int = 0, head_dim: int = 16, aux: tuple[int, int, int] = (1, 1, 1)):
    """`qwen3_folder` for family "llama", "qwen2" (q/k/v biases) or "qwen3" (head_dim: Qwen3's, apart from
    hidden / heads; vLLM's CPU attention takes 32, 64, 80, 96, 112, 128, ...)."""
    import json
    import shutil
    from dataclasses import replace
    from pathlib import Path

    from transformers import AutoTokenizer

    from switchsd.core.fingerprint import fingerprint
    from switchsd.core.probe import Probe
    from switchsd.drafters.eagle3_model import Eagle3Config, Eagle3Head, save_eagle3
    from switchsd.models.loading import default_model_folder
    out = Path(out)
    src = default_model_folder()
    tok = AutoTokenizer.from_pretrained(src)
    torch.manual_seed(seed)
    cls_cfg, cls_model, arch = {"llama": (LlamaConfig, LlamaForCausalLM, "LlamaForCausalLM"),
                                "qwen2": (Qwen2Config, Qwen2ForCausalLM, "Qwen2ForCausalLM"),
                                "qwen3": (Qwen3Config, Qwen3ForCausalLM, "Qwen3ForCausalLM")}[family]
    cfg = cls_cfg(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=head_dim if family == "qwen3" else 16, intermediate_size=128,
                  max_position_embeddings=2048,
                  eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, tie_word_embeddings=False,
                  architectures=[arch], rms_norm_eps=1e-5)
    model = cls_model(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                if lin.bias is not None:
                    lin.bias.normal_(0, 0.5)
    with torch.no_grad():                 # a peaked model: greedy text is far from ties
        model.lm_head.weight.mul_(20.0)
    folder = out / f"{family}-tiny"
    model.save_pretrained(folder)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / f).exists():
            shutil.copy(src / f, folder / f)
    fp = fingerprint(model, tok)
    draft_vocab = 4096                     # a draft vocabulary of its own, as published heads have: the first ids
    head_cfg = replace(Eagle3Config.for_target(cfg, draft_vocab_size=draft_vocab), aux_layers=aux)
    head = Eagle3Head(head_cfg)
    with torch.no_grad():
        head.t2d.zero_()
        head.t2d[:draft_vocab] = True
        head.d2t.zero_()
    head_dir = out / f"{family}-tiny-eagle3"
    save_eagle3(head, head_dir, torch.float32)
    hc = json.loads((head_dir / "config.json").read_text())
    hc["switchsd_fingerprint"] = fp
    (head_dir / "config.json").write_text(json.dumps(hc, indent=1))
    meta = {"model": f"{family}-tiny", "hidden_size": 64, "num_layers": 2, "fingerprint": fp}
    probe = Probe(torch.zeros(64), 1, "attn", 0.0, meta)   # sigmoid(0) = 0.5 >= tau 0: copy intent everywhere
    probe.save(out / f"{family}-tiny-probe.safetensors")
    return folder, head_dir, out / f"{family}-tiny-probe.safetensors"
