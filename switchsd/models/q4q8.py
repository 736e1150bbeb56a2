"""The q4q8 format: a Llama model's own GGUF 4-bit weights, every forward one call into C (switchsd/kernels/llama.c).

    fwd = Q4Q8Llama.from_gguf(model, gguf_path)      # model: the same checkpoint loaded dense (embeddings, norms)
    cache = fwd.new_cache(capacity)
    logits, captured = fwd.forward(ids, cache, position_ids, mask, sites, logit_rows)     # as LeanLlama.forward

Arithmetic: Q4_1 weights x Q8 activation blocks (llama.cpp's; switchsd/kernels/q4q8.c), the residual stream,
norms, rotary and attention in float32, every row computed alone. So a verify forward's rows equal, bit for bit,
the one-row steps of vanilla decoding in this format (chains and trees alike), and the verify rows share each
weight block's work. The head: the GGUF's Q8_0 matrix (the offline model's tied embedding) through its own 8-bit
kernel (`Q8Linear`), or a Q4 head.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from ..kernels.build import load
from ..kernels.q4q8 import Q4Q8Linear, Q8Linear, check_path
from ..kernels.qx import READABLE, Linear, bytes_layout, fuse, gguf_linear, release
from .lean import StaticKVCache, supports

Site = tuple[int, str]
CHUNK = 256              # prefills longer than this run in causal chunks (attention scratch grows with rows x keys)
_P, _I = ctypes.c_void_p, ctypes.c_int64
PROJ = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",))
PHASES = ("norm", "q|k|v", "rotary + cache", "attention", "o + residual", "norm + gate|up", "swiglu",
          "down + residual", "head")


_ARANGE = torch.arange(0, dtype=torch.int32)


def _positions(n: int) -> torch.Tensor:
    """0 .. n - 1 as int32 (a view of one growing table)."""
    global _ARANGE
    if _ARANGE.numel() < n:
        _ARANGE = torch.arange(max(n, 2 * _ARANGE.numel(), 1024), dtype=torch.int32)
    return _ARANGE[:n]


def _visible(mask: torch.Tensor) -> torch.Tensor:
    """An additive or boolean mask [b, 1, T, S] -> which keys each row sees, bool [b, T, S] on the CPU."""
    return (mask[:, 0] == 0 if mask.dtype != torch.bool else mask[:, 0]).cpu()


def _csr(vis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vis bool [N, S] -> (offsets [N + 1], positions) int32: row n sees positions[off[n]:off[n + 1]], ascending."""
    rows, cols = vis.nonzero(as_tuple=True)                                         # row-major: ascending per row
    off = torch.zeros(vis.shape[0] + 1, dtype=torch.int32)
    off[1:] = torch.bincount(rows, minlength=vis.shape[0]).cumsum(0)
    return off, cols.to(torch.int32).contiguous()


def rotary_tables(inv_freq: torch.Tensor, n: int, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin [n, hd] for positions 0 .. n - 1 (rotate-half's sign folded into sin's first half, as
    llama.c's `rotate` reads it). inv_freq: [hd / 2]."""
    freqs = torch.arange(n).float()[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * scale, emb.sin() * scale
    half = sin.shape[-1] // 2
    return cos.contiguous(), torch.cat((-sin[:, :half], sin[:, half:]), -1).contiguous()


KIND_Q4Q8, KIND_Q8, MAX_PARTS = -1, -2, 3


class Mat(ctypes.Structure):
    """llama.c's matrix: up to 3 parts of one block type each (outputs stacked), each with an optional bias."""
    _fields_ = [("w", _P * MAX_PARTS), ("bias", _P * MAX_PARTS), ("n", _I * MAX_PARTS),
                ("kind", ctypes.c_int32 * MAX_PARTS), ("parts", ctypes.c_int32)]


def mat(parts: list[Linear], biases: list[torch.Tensor | None] | None = None) -> Mat:
    """The C descriptor of `parts` (kept alive by the caller), biases float32 [n] per part or None."""
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"a matrix takes 1 to {MAX_PARTS} parts, got {len(parts)}")
    biases = biases or [None] * len(parts)
    m = Mat()
    for i, (p, b) in enumerate(zip(parts, biases)):
        m.w[i] = p.packed.data_ptr()
        m.bias[i] = None if b is None else b.data_ptr()
        m.n[i] = p.out_features
        m.kind[i] = KIND_Q4Q8 if isinstance(p, Q4Q8Linear) else KIND_Q8 if isinstance(p, Q8Linear) else p.kind
        # F16Linear's kind: -3 (F16) or -4 (BF16); QxLinear's: its flags
    m.parts = len(parts)
    return m


class Dims(ctypes.Structure):
    _fields_ = [("d", _I), ("heads", _I), ("kv_heads", _I), ("head_dim", _I), ("inter", _I),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("path", ctypes.c_int)]


def _lib() -> ctypes.CDLL:
    lib = load("llama")
    if not getattr(lib, "_typed", False):
        lib.llama_forward.argtypes = [ctypes.POINTER(Dims), _I, _P, _P, _P, _P, _I, _P, _P, _I, _I, _P, _P, _P, _P, _P,
                                      _P, _P, _P]
        lib.llama_forward.restype = ctypes.c_int
        lib.llama_head.argtypes = [ctypes.POINTER(Dims), _P, _I, _P, ctypes.POINTER(Mat), _P]
        lib.llama_head.restype = ctypes.c_int
        lib._typed = True
    return lib


class Q4Q8Llama:
    """The target's forward in the q4q8 format (one C call per forward, one for the head)."""
    kind = "q4q8"

    def __init__(self, model, layers: list[list[list[Linear]]], head: list[Linear] | Linear, path: str = "auto"):
        """layers: per layer the parts of q|k|v, o, gate|up and down (each a list of products, outputs stacked)."""
        why = supports(model)
        if why:
            raise ValueError(f"the q4q8 forward does not support this model: {why}")
        cfg, inner = model.config, model.model
        self.config, self.n_layers = cfg, cfg.num_hidden_layers
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        if self.head_dim > 512 or self.head_dim % 8:
            raise ValueError(f"q4q8: head_dim {self.head_dim} unsupported (a multiple of 8, at most 512)")
        self.dtype, self.device, self.att_dtype = torch.float32, torch.device("cpu"), torch.float32
        head = head if isinstance(head, list) else [head]
        self.layers, self.head, self.vocab = layers, head, sum(p.out_features for p in head)
        self.dims = Dims(cfg.hidden_size, self.heads, self.kv_heads, self.head_dim, cfg.intermediate_size,
                         float(cfg.rms_norm_eps), float(self.head_dim ** -0.5), check_path(path))
        f32 = lambda t: None if t is None else t.detach().float().contiguous()     # noqa: E731
        self.embed = f32(inner.embed_tokens.weight)                                  # [V, d]
        self.norms = [f32(w) for layer in inner.layers for w in (layer.input_layernorm.weight,
                                                                  layer.post_attention_layernorm.weight)]
        norm_of = lambda a, name: f32(getattr(getattr(a, name, None), "weight", None))     # noqa: E731
        self.qk_norms = [norm_of(layer.self_attn, n) for layer in inner.layers for n in ("q_norm", "k_norm")]
        bias = lambda lin: f32(getattr(lin, "bias", None))                         # noqa: E731
        self.biases = [[bias(a.q_proj), bias(a.k_proj), bias(a.v_proj)] for a in (b.self_attn for b in inner.layers)]
        self.norm = f32(inner.norm.weight)
        self._mats = (Mat * (4 * self.n_layers))(*[
            mat(parts, self._part_biases(parts, self.biases[i]) if j == 0 else None)
            for i, layer in enumerate(layers) for j, parts in enumerate(layer)])
        self._head = mat(head)
        self._n = (_P * (2 * self.n_layers))(*[t.data_ptr() for t in self.norms])
        self._qk = (_P * (2 * self.n_layers))(*[0 if t is None else t.data_ptr() for t in self.qk_norms])
        self.inv_freq = inner.rotary_emb.inv_freq.float().cpu()
        self.rope_scale = float(getattr(inner.rotary_emb, "attention_scaling", 1.0))
        self._cos = self._sin = None
        self._flags: dict[tuple, tuple[list[Site], torch.Tensor]] = {}
        self.lib = _lib()

    def _part_biases(self, parts: list[Linear], qkv: list[torch.Tensor | None]) -> list[torch.Tensor | None] | None:
        """q, k, v biases (Qwen2) regrouped to the fused parts of q|k|v; None where the model has none."""
        if all(b is None for b in qkv):
            return None
        sizes = [self.heads * self.head_dim] + 2 * [self.kv_heads * self.head_dim]
        flat = torch.cat([torch.zeros(n) if b is None else b for b, n in zip(qkv, sizes)])
        self._bias_keep = getattr(self, "_bias_keep", []) + [flat]
        out, at = [], 0
        for p in parts:
            out.append(flat[at:at + p.out_features].contiguous())
            at += p.out_features
        self._bias_keep += out
        return out

    @property
    def mats(self) -> list[Linear]:
        """Every product of the forward and the head (for timing)."""
        return [p for layer in self.layers for parts in layer for p in parts] + list(self.head)

    @classmethod
    def from_gguf(cls, model, gguf_path: str | Path, path: str = "auto") -> "Q4Q8Llama":
        """The GGUF's own blocks, whatever their type (`kernels.qx.READABLE`); ValueError naming what it cannot read."""
        from .ggufread import architecture, reader, rotary_rows
        tensors = {t.name: t for t in reader(gguf_path).tensors}
        arch = architecture(gguf_path)
        cfg = model.config
        as_bytes = bytes_layout()

        def linear(name: str) -> Linear:
            t = tensors.get(name)
            if t is None:
                raise ValueError(f"{Path(gguf_path).name}: no tensor {name}")
            kind = t.tensor_type.name
            if kind not in READABLE:
                raise ValueError(f"{name} is {kind}; the C forward reads {', '.join(READABLE)}")
            raw = np.asarray(t.data)
            perm = rotary_rows(arch, name.split(".")[-2], raw.shape[0], cfg)
            if perm is not None:
                raw = raw[perm]
            return gguf_linear(raw, kind, path, as_bytes)

        layers = [[fuse([linear(f"blk.{i}.{p}.weight") for p in parts]) for parts in PROJ]
                  for i in range(cfg.num_hidden_layers)]
        name = "output.weight" if "output.weight" in tensors else "token_embd.weight"
        fwd = cls(model, layers, [linear(name)], path)
        for p in fwd.mats:          # the packed blocks stay; their unpacked copies would hold ~1 byte a weight more
            release(p)
        return fwd

    @classmethod
    def quantized(cls, model, path: str = "auto") -> "Q4Q8Llama":
        """A dense model's matrices quantised to Q4_1 blocks (`int4.quantize_groups`; lossy): a q4q8 model of its
        own, for tests on tiny random models."""
        from .int4 import quantize_groups

        def mat_(*linears) -> list[Q4Q8Linear]:
            parts = []
            for lin in linears:
                codes, d, zero = quantize_groups(lin.weight.detach().float())
                parts.append(Q4Q8Linear(codes, d.half(), (zero - 8 * d).half(), path))
            return fuse(parts)
        layers = [[mat_(b.self_attn.q_proj, b.self_attn.k_proj, b.self_attn.v_proj), mat_(b.self_attn.o_proj),
                   mat_(b.mlp.gate_proj, b.mlp.up_proj), mat_(b.mlp.down_proj)] for b in model.model.layers]
        return cls(model, layers, mat_(model.lm_head), path)

    def _chunked(self, ids, cache, sites, logit_rows):
        logits, caps = [], []
        for a in range(0, ids.shape[1], CHUNK):
            lg, cap = self.forward(ids[:, a:a + CHUNK], cache, sites=sites, logit_rows=-1 if logit_rows == -1 else None)
            logits.append(lg)
            caps.append(cap)
        if logit_rows == -1:
            out = logits[-1]
        else:
            out = torch.cat(logits)[:logit_rows]
        return out, {k: torch.cat([c[k] for c in caps], 1) for k in caps[0]}

    def profile(self) -> dict[str, float]:
        """Milliseconds per phase of every forward since the last call (llama.c's own clock), then cleared."""
        out = (ctypes.c_double * len(PHASES))()
        self.lib.llama_profile(out)
        return {name: 1e3 * out[i] for i, name in enumerate(PHASES)}

    def new_cache(self, capacity: int) -> StaticKVCache:
        return StaticKVCache(self.n_layers, self.kv_heads, self.head_dim, capacity, torch.float32, self.device)

    def _rotary(self, need: int) -> None:
        """cos and signed-sin tables [n, hd] for positions < need (float32; as lean._rotary computes them)."""
        if self._cos is not None and need <= self._cos.shape[0]:
            return
        n = max(need, 2 * (0 if self._cos is None else self._cos.shape[0]), 256)
        self._cos, self._sin = rotary_tables(self.inv_freq, n, self.rope_scale)

    @staticmethod
    def keys_seen(start: int, T: int, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(offsets [T + 1], positions) int32: row t attends the cache positions positions[off[t]:off[t + 1]]."""
        if mask is None and T == 1:                          # a one-row step sees every position: 0 .. start
            return torch.tensor([0, start + 1], dtype=torch.int32), _positions(start + 1)
        if mask is None:                                     # causal: row t sees 0 .. start + t
            off = torch.zeros(T + 1, dtype=torch.int32)
            off[1:] = torch.arange(start + 1, start + T + 1, dtype=torch.int32).cumsum(0)
            return off, torch.cat([_positions(start + 1 + t) for t in range(T)])
        return _csr(_visible(mask)[0])                                                # [T, start + T]

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """RMS norm in torch (float32), for callers that norm captured states themselves (regeneration)."""
        x = x.float()
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.dims.eps))

    def _sites(self, sites: Iterable[Site]) -> tuple[list[Site], torch.Tensor]:
        """The sites to capture, in layer order, and their flags for llama.c (made once per set of sites)."""
        key = tuple((int(a), str(b)) for a, b in sites)
        if key not in self._flags:
            self._flags[key] = self._site_flags(key)
        return self._flags[key]

    def _site_flags(self, sites: tuple) -> tuple[list[Site], torch.Tensor]:
        want = sorted({(int(a), str(b)) for a, b in sites})
        for layer, where in want:
            if not 0 <= layer < self.n_layers or where not in ("attn", "mlp"):
                raise ValueError(f"capture site {(layer, where)} out of range")
        flags = torch.zeros(2 * self.n_layers, dtype=torch.int32)
        for layer, where in want:
            flags[2 * layer + (where == "mlp")] = 1
        return want, flags

    def _run(self, ids: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot: torch.Tensor, wpos: torch.Tensor,
             pos: torch.Tensor, off: torch.Tensor, keys: torch.Tensor, want: list[Site], flags: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """The C forward of rows ids [N] (row n: cache slot slot[n], written at wpos[n], rotary position pos[n],
        sees keys[off[n]:off[n + 1]] of its slot). k, v: [L, slots, KV, cap, hd]. Returns the last layer's output
        [N, d] and the captured sites [len(want), N, d]."""
        N = ids.shape[0]
        self._rotary(max(int(pos.max()) + 1, k.shape[3]))
        cos, sin = self._cos[pos].contiguous(), self._sin[pos].contiguous()          # [N, hd]
        captured = torch.empty(len(want), N, self.dims.d)
        x = self.embed[ids].contiguous()                                              # [N, d]
        slot, wpos = slot.to(torch.int32).contiguous(), wpos.to(torch.int32).contiguous()
        rc = self.lib.llama_forward(ctypes.byref(self.dims), self.n_layers, self._mats, self._n, self._qk, x.data_ptr(), N,
                                    k.data_ptr(), v.data_ptr(), k.shape[1], k.shape[3], slot.data_ptr(),
                                    wpos.data_ptr(), cos.data_ptr(), sin.data_ptr(), off.data_ptr(), keys.data_ptr(),
                                    flags.data_ptr(), captured.data_ptr())
        if rc:
            raise MemoryError("q4q8 forward: out of memory")
        return x, captured

    def check_ids(self, ids: torch.Tensor) -> None:
        """Token ids the C forward can read: integers, at least one row, each in [0, vocab)."""
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(f"token ids must be integers, got {ids.dtype}")
        if ids.numel() == 0:
            raise ValueError("no token ids to run: a forward needs at least one row")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.vocab:
            raise ValueError(f"token id {lo if lo < 0 else hi} is outside the vocabulary (0..{self.vocab - 1})")

    def head_logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [R, d] (last layer's output) -> logits [R, V]: the final norm and the head, in C."""
        x = x.contiguous()
        logits = torch.empty(x.shape[0], self.vocab)
        rc = self.lib.llama_head(ctypes.byref(self.dims), x.data_ptr(), x.shape[0], self.norm.data_ptr(),
                                 ctypes.byref(self._head), logits.data_ptr())
        if rc:
            raise MemoryError("q4q8 head: out of memory")
        return logits

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: StaticKVCache, position_ids: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, sites: Iterable[Site] = (), logit_rows: int | None = None
                ) -> tuple[torch.Tensor, dict[Site, torch.Tensor]]:
        """ids [1, T] after the cache's `len` positions; mask None (causal) or [1, 1, T, len + T] (additive or bool).
        Returns logits [R, V] for the first `logit_rows` rows (None: all; -1: the last) and {site: [1, T, d]}."""
        T, start = ids.shape[1], len(cache)
        self.check_ids(ids)
        if T > CHUNK and mask is None and position_ids is None:     # long prefills in causal chunks: the same rows
            return self._chunked(ids, cache, sites, logit_rows)      # (each row computed alone), bounded scratch
        end = start + T
        cache.reserve(end)
        pos = (torch.arange(start, end) if position_ids is None else position_ids[0].cpu()).long()
        off, keys = self.keys_seen(start, T, mask)
        want, flags = self._sites(sites)
        x, captured = self._run(ids[0].cpu(), cache.k, cache.v, torch.zeros(T, dtype=torch.int32),
                                torch.arange(start, end), pos, off, keys, want, flags)
        cache.length = end
        logits = self.head_logits(x[-1:] if logit_rows == -1 else x[:logit_rows])
        return logits, {site: captured[i][None] for i, site in enumerate(want)}

    @torch.inference_mode()
    def forward_batched(self, ids: torch.Tensor, cache, pos: torch.Tensor, mask: torch.Tensor | None,
                        sites: Iterable[Site] = (), rows=None, first_slot: int = 0
                        ) -> tuple[torch.Tensor, dict[Site, torch.Tensor]]:
        """`serve.batched.batched_forward` in this format: ids, pos [b, T] for slots first_slot.., each after its
        own len; mask [b, 1, T, S] or None (causal, equal lens). Every row computed alone, as in `forward`."""
        b, T = ids.shape
        self.check_ids(ids)
        lens = torch.tensor(cache.lens[first_slot:first_slot + b])
        S = int(lens.max()) + T
        cache.reserve(S)
        if mask is None:
            if len(set(lens.tolist())) != 1:
                raise ValueError("a causal batched forward needs rows of equal length: pass a mask")
            vis = torch.ones(T, S, dtype=torch.bool).tril(int(lens[0])).expand(b, T, S)
        else:
            vis = _visible(mask)                                                      # [b, T, S]
        off, cols = _csr(vis.reshape(b * T, -1))
        slot = torch.arange(first_slot, first_slot + b).repeat_interleave(T)
        wpos = (lens[:, None] + torch.arange(T)[None]).reshape(-1)
        want, flags = self._sites(sites)
        x, captured = self._run(ids.reshape(-1).cpu(), cache.k, cache.v, slot, wpos, pos.reshape(-1).cpu().long(),
                                off, cols, want, flags)
        for r in range(b):
            cache.lens[first_slot + r] += T
        x = x.view(b, T, -1)
        x = x.reshape(b * T, -1) if rows is None else torch.cat([x[r, :n] for r, n in enumerate(rows)])
        return self.head_logits(x), {site: captured[i].view(b, T, -1) for i, site in enumerate(want)}
