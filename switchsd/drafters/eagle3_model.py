"""The EAGLE-3 draft head: config, module and loader for the published checkpoint layout.

Checkpoint facts (SafeAILab/EAGLE `cnets.py`, SpecForge, SGLang, vLLM agree):
    fc.weight                                   [H, 3*Ht]   fuses the target's low/mid/high hidden states
    midlayer.input_layernorm.weight             [H]         on the token embedding
    midlayer.hidden_norm.weight                 [H]         on the incoming hidden stream
    midlayer.self_attn.{q,k,v}_proj.weight      [heads*hd, 2H] / [kv_heads*hd, 2H]
    midlayer.self_attn.o_proj.weight            [H, heads*hd]
    midlayer.post_attention_layernorm.weight    [H]
    midlayer.mlp.{gate,up}_proj.weight          [I, H];  midlayer.mlp.down_proj.weight [H, I]
    norm.weight                                 [H]
    lm_head.weight                              [Vd, H]     own reduced draft vocabulary
    d2t                                         [Vd] int64  target_id = draft_id + d2t[draft_id]
    t2d                                         [V]  bool   target ids present in the draft vocabulary
No biases; `embed_tokens` is normally absent and always taken from the target.
Choices where sources disagree (documented in README):
  * RoPE base: config `rope_theta` (or `rope_parameters.rope_theta`), else 10000 (the official trainer's).
  * head_dim: config `head_dim` if present (AngelSlim Qwen3 heads), else hidden / heads.
  * fused layers: input to target layers (2, L//2, L-3) unless the config says otherwise; a top-level
    `eagle_aux_hidden_state_layer_ids` is read as input-to-layer ids (vLLM), `eagle_config.
    eagle_aux_hidden_state_layer_ids` as layer-output ids (SGLang, +1).
  * key prefixes `model.` and `layers.0.` (speculators / vLLM re-exports) are accepted.
`.bin` files are read with torch's weights-only loader (no code execution); safetensors preferred.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..models.dense import attention_dtype


class Eagle3LoadError(ValueError):
    pass


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int            # target vocabulary (len t2d)
    draft_vocab_size: int      # rows of lm_head (len d2t)
    target_hidden_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    aux_layers: tuple[int, int, int] | None = None   # input-to-layer ids; None = (2, L//2, L-3)

    @classmethod
    def from_json(cls, d: dict) -> "Eagle3Config":
        """The published layouts: EAGLE / SpecForge / SGLang (flat) and vLLM speculators (the layer's fields nested
        in `transformer_layer_config`). Missing or malformed fields raise Eagle3LoadError."""
        if isinstance(d.get("transformer_layer_config"), dict):           # speculators
            if d.get("norm_before_residual"):
                raise Eagle3LoadError("this EAGLE3 head uses norm_before_residual=True (a speculators variant); "
                                      "only the official residual convention is supported")
            d = {**d["transformer_layer_config"], **{k: v for k, v in d.items() if k != "transformer_layer_config"}}
        try:
            return cls._from_flat(d)
        except KeyError as e:
            raise Eagle3LoadError(f"EAGLE3 config.json lacks the field {e}") from None
        except (TypeError, ValueError) as e:
            raise Eagle3LoadError(f"EAGLE3 config.json has a malformed field ({e})") from None

    @classmethod
    def _from_flat(cls, d: dict) -> "Eagle3Config":
        H = int(d["hidden_size"])
        heads = int(d["num_attention_heads"])
        aux = d.get("eagle_aux_hidden_state_layer_ids")
        if aux is None and isinstance(d.get("eagle_config"), dict):
            ids = d["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
            aux = [i + 1 for i in ids] if ids is not None else None
        return cls(hidden_size=H, intermediate_size=int(d["intermediate_size"]), num_attention_heads=heads,
                   num_key_value_heads=int(d.get("num_key_value_heads", heads)),
                   head_dim=int(d.get("head_dim") or H // heads), vocab_size=int(d["vocab_size"]),
                   draft_vocab_size=int(d.get("draft_vocab_size") or d["vocab_size"]),
                   target_hidden_size=int(d.get("target_hidden_size") or H),
                   rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)), rope_theta=rope_theta_of(d),
                   aux_layers=tuple(int(i) for i in aux) if aux is not None else None)

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int, rope_theta: float | None = None) -> "Eagle3Config":
        """A new head shaped like one layer of the target (what self-distillation trains)."""
        d = target_config.to_dict()
        return cls.from_json({**d, "draft_vocab_size": draft_vocab_size, "target_hidden_size": d["hidden_size"],
                              "rope_theta": rope_theta if rope_theta is not None else rope_theta_of(d)})

    def to_json(self) -> dict:
        d = asdict(self)
        aux = d.pop("aux_layers")
        d.update(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1,
                 hidden_act="silu", tie_word_embeddings=False)
        if aux is not None:
            d["eagle_aux_hidden_state_layer_ids"] = list(aux)
        return d

    def layers_for(self, n_target_layers: int) -> tuple[int, int, int]:
        return self.aux_layers or default_aux_layers(n_target_layers)


def default_aux_layers(n_target_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's fused features: the inputs to target layers 2, L/2 and L-3 (hidden_states indices)."""
    L = n_target_layers
    return (2, L // 2, L - 3)


def rope_theta_of(config: dict) -> float:
    """RoPE base of a config dict: `rope_theta`, or transformers 5's `rope_parameters.rope_theta`; else 10000."""
    rope = config.get("rope_theta")
    if rope is None and isinstance(config.get("rope_parameters"), dict):
        rope = config["rope_parameters"].get("rope_theta")
    return float(rope) if rope is not None else 10000.0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate-half RoPE. x [B, heads, T, hd], pos [T]."""
    hd = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = pos.float()[:, None] * inv[None]                       # [T, hd/2]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    rot = torch.cat([-x2, x1], -1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, pos: torch.Tensor):
        """x [B, T, 2H] -> q [B, heads, T, hd], k, v [B, kv_heads, T, hd] (RoPE applied)."""
        B, T, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        return rope(q, pos, c.rope_theta), rope(k, pos, c.rope_theta), v

    def attend(self, q, k, v, mask: torch.Tensor | None) -> torch.Tensor:
        """q [B, h, T, hd]; k, v [B, kvh, S, hd]; mask additive [T, S] or None (full). -> [B, T, H]"""
        rep = self.c.num_attention_heads // self.c.num_key_value_heads
        dt, out_dt = attention_dtype(q.dtype, q.device), q.dtype   # float32 where 16-bit SDPA is emulated (CPU)
        if dt != q.dtype:
            q, k, v = q.to(dt), k.to(dt), v.to(dt)
            mask = mask.to(dt) if mask is not None and mask.is_floating_point() else mask
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        B, h, T, hd = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(B, T, h * hd).to(out_dt))


class MLP(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)


class Eagle3Head(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.config = c
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool))

    def qkv(self, emb: torch.Tensor, h: torch.Tensor, pos: torch.Tensor):
        """The block's input: normed token embedding and normed hidden, side by side. emb, h [B, T, H]; pos [T]
        -> q [B, heads, T, hd], k, v [B, kv_heads, T, hd] (RoPE applied)."""
        m = self.midlayer
        x = torch.cat([m.input_layernorm(emb), m.hidden_norm(h)], -1)           # [B, T, 2H] embedding first
        return m.self_attn.qkv(x, pos)

    def finish(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The block's output from the attention result attn [B, T, H] (after o_proj): residual, then MLP."""
        m = self.midlayer
        h1 = h + attn
        return h1 + m.mlp(m.post_attention_layernorm(h1))

    def step(self, emb: torch.Tensor, h: torch.Tensor, pos: torch.Tensor, past_k: torch.Tensor | None,
             past_v: torch.Tensor | None, mask: torch.Tensor | None):
        """One midlayer pass. emb, h [B, T, H]; pos [T]; past K/V [B, kvh, S, hd]; mask additive [T, S+T]
        (None: causal over the new rows, full over the past). Returns out [B, T, H] (pre-norm), k, v (new rows).
        """
        q, k, v = self.qkv(emb, h, pos)
        K = k if past_k is None else torch.cat([past_k, k], 2)
        V = v if past_v is None else torch.cat([past_v, v], 2)
        if mask is None and q.shape[2] > 1:
            T, S = q.shape[2], K.shape[2]
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
        return self.finish(h, self.midlayer.self_attn.attend(q, K, V, mask)), k, v

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """[..., H] -> draft-vocab logits [..., Vd]."""
        return self.lm_head(self.norm(out))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


def _normalise_keys(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        k = k[len("model."):] if k.startswith("model.") else k
        k = "midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k
        if k == "draft_id_to_target_id":
            k = "d2t"
        out[k] = v
    return out


def read_state_dict(folder: Path) -> dict:
    if (folder / "model.safetensors").exists():
        from safetensors.torch import load_file
        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").exists():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise Eagle3LoadError(f"{folder}: neither model.safetensors nor pytorch_model.bin found")


def resolve_folder(name_or_path: str) -> Path:
    p = Path(name_or_path).expanduser()
    if p.exists():
        return p
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(name_or_path, allow_patterns=["config.json", "*.safetensors", "*.bin"]))
    except Exception as e:
        raise Eagle3LoadError(f"cannot fetch EAGLE3 head {name_or_path!r} ({e.__class__.__name__}); the Hugging "
                              f"Face Hub may be unreachable: download it elsewhere and pass the folder") from e


def load_eagle3(name_or_path: str, target) -> Eagle3Head:
    """Load a published-format head and check it against the target model (a HF causal LM)."""
    folder = resolve_folder(name_or_path)
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        raise Eagle3LoadError(f"{folder}: config.json missing")
    try:
        raw = json.loads(cfg_path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise Eagle3LoadError(f"{cfg_path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise Eagle3LoadError(f"{cfg_path}: expected a JSON object")
    c = Eagle3Config.from_json(raw)
    tc = target.config
    if c.target_hidden_size != tc.hidden_size:
        raise Eagle3LoadError(f"EAGLE3 head expects target hidden size {c.target_hidden_size}, the target has "
                              f"{tc.hidden_size}: this head belongs to another model")
    if c.vocab_size != tc.vocab_size:
        raise Eagle3LoadError(f"EAGLE3 head expects a target vocabulary of {c.vocab_size}, the target has "
                              f"{tc.vocab_size}: this head belongs to another model")
    from ..core.fingerprint import fingerprint, mismatch
    why = mismatch(fingerprint(target), raw.get("switchsd_fingerprint"))
    if why:
        raise Eagle3LoadError(f"EAGLE3 head {folder.name} was trained for a model with {why}: this head belongs to "
                              "another model")
    sd = _normalise_keys(read_state_dict(folder))
    sd.pop("embed_tokens.weight", None)
    if "d2t" not in sd:
        if c.draft_vocab_size != c.vocab_size:
            raise Eagle3LoadError("checkpoint has no d2t but draft_vocab_size != vocab_size")
        sd["d2t"] = torch.zeros(c.draft_vocab_size, dtype=torch.long)
    if "t2d" not in sd:
        t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
        t2d[torch.arange(c.draft_vocab_size) + sd["d2t"].long()] = True
        sd["t2d"] = t2d
    head = Eagle3Head(c)
    expected = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    wrong = [f"{k}: file {tuple(sd[k].shape)} vs config {expected[k]}" for k in expected
             if k in sd and tuple(sd[k].shape) != expected[k]]
    if missing or unexpected or wrong:
        raise Eagle3LoadError(f"EAGLE3 checkpoint {folder} does not match its config: missing {missing}, "
                              f"unexpected {unexpected}, wrong shapes {wrong}")
    sd["d2t"], sd["t2d"] = sd["d2t"].long(), sd["t2d"].bool()
    head.load_state_dict(sd)
    p = next(target.parameters())
    return head.to(device=p.device, dtype=p.dtype).eval().requires_grad_(False)


def save_eagle3(head: Eagle3Head, folder: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write config.json + model.safetensors in the published layout."""
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(head.config.to_json(), indent=1))
    sd = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
