"""A lean forward for Llama-family targets: the same arithmetic as transformers' forward, less around it.

transformers' Llama forward spends a third of a one-token decode step outside the matrix multiplies on a
small model (module dispatch, mask construction, a cache that concatenates), and on CPUs its bfloat16
`F.linear` repacks every weight on every call. This forward keeps the math op for op (RMSNorm in float32,
rotary tables computed as transformers computes them, SDPA called the way transformers calls it) and changes
only how it is driven:

- q/k/v and gate/up projections fused into one matrix each (the same dot products per output column);
- on CPU in bfloat16/float16, weights packed once for oneDNN (`mkldnn._linear_pointwise`) instead of on
  every call; float32 keeps MKL's `F.linear` (its one-row path is already at the memory floor);
- a preallocated key/value cache (`StaticKVCache`) written in place, rolled back by a length and a gather; in the
  int4 format on CPUs without native bfloat16, held and attended in float32 (`dense.attention_dtype`: SDPA's
  emulated bfloat16 kernel costs ~4x its float32 time there);
- hidden states at the requested sites recorded as the forward runs (no hooks);
- on CPU, decode and verify steps run the layer loop in TorchScript (`switchsd.models.scripted`: the same ATen
  calls without Python between them, bit for bit the Python loop below; 1.2-1.4x faster steps on this model).

Supported: `supports(model)` says why not (other architectures run on transformers' forward). The
equality with transformers' forward is a test (`tests/test_lean.py`): logits within float rounding in
float32, and the same greedy tokens.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F

from .dense import Dense, attention_dtype
from .int4 import Int4Linear
from .scripted import ScriptedStep, _attend, _rms, _rotate

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
# rope types whose tables are inv_freq (and attention_scaling) alone, as transformers computes them
ROPE_TYPES = ("default", "llama3", "linear", "yarn")
MAX_FAST_ROWS = 32       # verify forwards are at most this wide; longer inputs are prefills
ROW_EXACT_MAX = 32       # causal chains of up to this many rows on a cached prefix: attention row by row (CPU)
TREE_EXACT_MAX = 16      # masked forwards (trees) of up to this many rows: each row over its own keys (CPU)
Site = tuple[int, str]


def supports(model) -> str | None:
    """None when `model` can run on the lean forward, else the reason it cannot."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in SUPPORTED:
        return f"model type {kind!r} (lean forward: {', '.join(SUPPORTED)})"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r}"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ROPE_TYPES:
        return f"rope type {rope.get('rope_type')!r}"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True) is not False \
            and cfg.sliding_window < cfg.max_position_embeddings:
        return "sliding-window attention"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    if not hasattr(getattr(model, "model", None), "layers"):
        return "no model.layers"
    return None


@torch.inference_mode()
def grow(cache, n: int, valid: int) -> None:
    """cache.k / cache.v [layers, rows, kv_heads, capacity, head_dim]: at least `n` positions (doubling), the
    first `valid` positions of every row copied over."""
    if n <= cache.k.shape[3]:
        return
    cap = max(n, 2 * cache.k.shape[3])
    for name in ("k", "v"):
        old = getattr(cache, name)
        new = old.new_empty(old.shape[:3] + (cap,) + old.shape[4:])
        new[:, :, :, :valid] = old[:, :, :, :valid]
        setattr(cache, name, new)


class StaticKVCache:
    """Keys/values of every cached position in preallocated tensors, written in place.

    k, v: [layers, 1, kv_heads, capacity, head_dim]; positions [0, len) are valid. Same interface as
    `switchsd.core.cache.KVCache`: `len`, `crop(length)`, `keep(prefix_len, rows)`."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype, device):
        shape = (layers, 1, kv_heads, max(1, capacity), head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0

    def __len__(self) -> int:
        return self.length

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def reserve(self, n: int) -> None:
        """Make room for `n` positions (doubling; the valid prefix is copied)."""
        grow(self, n, self.length)

    def crop(self, length: int) -> None:
        self.length = min(self.length, max(0, length))

    @torch.inference_mode()
    def keep(self, prefix_len: int, rows: Iterable[int]) -> None:
        """Keep positions [0, prefix_len) plus prefix_len + r for r in `rows` (ascending), drop the rest."""
        rows = list(rows)
        if rows != list(range(len(rows))):
            idx = torch.tensor(rows, device=self.k.device) + prefix_len
            n = len(rows)
            self.k[:, :, :, prefix_len:prefix_len + n] = self.k.index_select(3, idx)
            self.v[:, :, :, prefix_len:prefix_len + n] = self.v.index_select(3, idx)
        self.crop(prefix_len + len(rows))

    def layer_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values), each [1, kv_heads, len, head_dim] (views)."""
        return [(self.k[i, :, :, :self.length], self.v[i, :, :, :self.length]) for i in range(self.k.shape[0])]


class _Linear:
    """y = x [W1; W2; ...]^T: one fused matrix, packed once for oneDNN on CPU in 16-bit floats.

    The fused (and packed) product is used for inputs of up to `exact_rows` rows, the number of rows for
    which it was checked to give bit for bit what transformers computes (one `F.linear` per original
    matrix); larger inputs (long prefills) run the original matrices one by one."""

    def __init__(self, parts: list[tuple[torch.Tensor, torch.Tensor | None]], exact_rows: int | None = None):
        self.parts = parts
        self.weight = torch.cat([w for w, _ in parts]) if len(parts) > 1 else parts[0][0]    # [N, K]
        biases = [b for _, b in parts]
        self.bias = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else w.new_zeros(w.shape[0]) for w, b in parts])
        w = self.weight
        self.dense = Dense(w, w.dtype, self.bias)           # packed once for oneDNN on CPU in 16-bit floats
        self.packed = self.dense.packed
        self.in_features, self.dtype = w.shape[1], w.dtype
        self.exact_rows = self.check_rows() if exact_rows is None else exact_rows
        if self.packed is not None and len(parts) > 1:
            self.weight = None           # the packed copy serves the fast path, `parts` the exact one

    def fast(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(x)

    def exact(self, x: torch.Tensor) -> torch.Tensor:
        outs = [F.linear(x, w, b) for w, b in self.parts]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    @torch.inference_mode()
    def check_rows(self, most: int = MAX_FAST_ROWS) -> int:
        """The largest m <= `most` such that the fast product equals the exact one for every 1..m rows."""
        g = torch.Generator().manual_seed(0)
        for m in range(1, most + 1):
            x = torch.randn(1, m, self.in_features, generator=g).to(self.dtype)
            try:
                same = torch.equal(self.fast(x), self.exact(x))
            except RuntimeError:
                same = False
            if not same:
                return m - 1
        return most

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fast(x) if x.shape[-2] <= self.exact_rows else self.exact(x)


class RowKeys:
    """Verify rows attended one by one, each through the very SDPA call a one-token step makes at its position:
    its query over the cached prefix plus the keys of the rows it sees, in order. SDPA's reductions depend on
    how many keys a call sees, so one masked call over every row can round a row differently from vanilla's
    step there (a near-tie then parts the texts); row by row, a verify forward is vanilla's arithmetic bit for
    bit. A chain row's keys are a view of the cache; a tree row that sees non-adjacent rows gets a gathered copy.
    Rows past `exact` (pad rows, whose outputs are dropped) share one masked call."""

    def __init__(self, start: int, seen: list[list[int]], exact: int, device: torch.device | None = None):
        self.start, self.exact = start, exact
        # per row, once per forward (not per layer): how many rows it sees, and None where those are rows 0..j (its
        # keys are a view of the cache) or else the cache positions of the rows it sees (a gathered copy, on the
        # mask's device)
        self.row_n = [len(r) for r in seen]
        self.row_idx = [None if r == list(range(len(r))) else torch.tensor(r, device=device) + start for r in seen]

    @classmethod
    def plan(cls, start: int, T: int, mask: torch.Tensor | None, logit_rows: int | None) -> "RowKeys | None":
        """None when the forward should keep one call: too wide, or a mask whose rows do not all see the
        whole cached prefix (then the rows are not one-token steps of any sequence)."""
        exact = T if logit_rows is None or logit_rows < 0 else min(T, logit_rows)
        if mask is None:
            return cls(start, [list(range(j + 1)) for j in range(exact)], exact) if exact <= ROW_EXACT_MAX else None
        if exact > TREE_EXACT_MAX:
            return None
        vis = mask[0, 0] == 0 if mask.dtype != torch.bool else mask[0, 0]        # [T, start + T]
        if not bool(vis[:exact, :start].all()):
            return None
        return cls(start, [torch.nonzero(vis[j, start:]).flatten().tolist() for j in range(exact)], exact, mask.device)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
               scale: float, gqa: bool) -> torch.Tensor:
        """q [B, H, T, hd]; keys/values [B, KV, start + T, hd] -> [B, H, T, hd] (`scripted._attend`'s calls)."""
        return _attend(q, keys, values, mask, False, scale, gqa, self.start, self.row_n, self.row_idx, self.exact)


class LeanLlama:
    """The target's forward, driven lean. Shares the model's weights (fused copies of q/k/v and gate/up)."""

    def __init__(self, model):
        why = supports(model)
        if why:
            raise ValueError(f"the lean forward does not support this model: {why}")
        cfg = model.config
        self.config, self.model = cfg, model
        self.n_layers, self.heads, self.kv_heads = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        inner = model.model
        self.embed = inner.embed_tokens.weight                                     # [V, d]
        wb = lambda lin: (lin.weight, getattr(lin, "bias", None))                 # noqa: E731
        self.layers, rows = [], {}       # rows: per projection, checked on the first layer, shared by the rest
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            if isinstance(a.q_proj, Int4Linear):            # the GGUF's 4-bit groups (switchsd.models.int4)
                made = {"qkv": Int4Linear.fuse([a.q_proj, a.k_proj, a.v_proj]), "o": a.o_proj,
                        "gate_up": Int4Linear.fuse([m.gate_proj, m.up_proj]), "down": m.down_proj}
            else:
                lins = {"qkv": [wb(a.q_proj), wb(a.k_proj), wb(a.v_proj)],              # [(H+2KV)*hd, d]
                        "o": [wb(a.o_proj)], "gate_up": [wb(m.gate_proj), wb(m.up_proj)],   # [2I, d]
                        "down": [wb(m.down_proj)]}
                made = {k: _Linear(v, rows.get(k)) for k, v in lins.items()}
            rows = {k: v.exact_rows for k, v in made.items()}
            self.layers.append((layer.input_layernorm.weight, made["qkv"], made["o"],
                                layer.post_attention_layernorm.weight, made["gate_up"], made["down"]))
        self.exact_rows = min([*rows.values(), MAX_FAST_ROWS])
        # the cache's and attention's dtype: the int4 format (its own arithmetic) attends in float32 where 16-bit
        # SDPA is emulated; dense formats keep transformers' arithmetic (attention in the activations' dtype)
        int4 = isinstance(self.layers[0][1], Int4Linear)
        self.att_dtype = attention_dtype(self.dtype, self.device) if int4 else self.dtype
        self.norm = inner.norm.weight
        attn = inner.layers[0].self_attn
        self.qk_norms = [n.weight for b in inner.layers for n in (b.self_attn.q_norm, b.self_attn.k_norm)] \
            if hasattr(attn, "q_norm") else []                                      # Qwen3: [hd] each
        self.head = getattr(model, "_switchsd_int8_head", None) or _Linear([wb(model.lm_head)])
        self.inv_freq = inner.rotary_emb.inv_freq.float()                          # [hd/2]
        self.rope_scale = float(getattr(inner.rotary_emb, "attention_scaling", 1.0))
        self._cos = self._sin = None                                               # `_rotary`'s tables
        # verify forwards attend row by row (`RowKeys`) on CPU: exact, ~20 us a row and layer; on GPUs that would be
        # one kernel launch per row and layer, unmeasured there, so they keep one call
        self.row_exact = self.device.type == "cpu"
        self.groups = self.heads // self.kv_heads
        self.scale = self.head_dim ** -0.5
        # steps on CPU (up to the fast products' width) run their layer loop in TorchScript (the same ops, bit for
        # bit: scripted.py)
        self.step = ScriptedStep.make(self)
        self._flags: dict[frozenset, list[bool]] = {}

    @classmethod
    def of(cls, model) -> "LeanLlama":
        """The model's lean forward, built once and kept on the model (packing takes ~1 s)."""
        lean = getattr(model, "_switchsd_lean", None)
        if lean is None or lean.dtype != next(model.parameters()).dtype:
            lean = cls(model)
            model._switchsd_lean = lean
        return lean

    def new_cache(self, capacity: int) -> StaticKVCache:
        return StaticKVCache(self.n_layers, self.kv_heads, self.head_dim, capacity, self.att_dtype, self.device)

    def qk_normed(self, i: int, heads: torch.Tensor) -> torch.Tensor:
        """heads [..., H + 2 KV, hd] -> q and k [..., H + KV, hd], each head RMS-normed first where the model does
        (Qwen3's q_norm / k_norm)."""
        H, KV = self.heads, self.kv_heads
        if not self.qk_norms:
            return heads[..., :H + KV, :]
        qn, kn = self.qk_norms[2 * i], self.qk_norms[2 * i + 1]
        return torch.cat([self._rms(heads[..., :H, :], qn), self._rms(heads[..., H:H + KV, :], kn)], -2)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # transformers' arithmetic (normalise in float32, round, then scale), its mean as sum / d: one definition,
        # shared with the scripted loop (scripted._rms)
        return _rms(x, w, self.eps)

    def _rotary(self, pos: torch.Tensor, upto: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and a signed sin at positions `pos` [B, T], [B, T, 1, hd] each, read from tables kept for
        positions < `upto` (default pos.max() + 1; grown by doubling). x * cos + roll(x, hd/2) * sin_signed is
        transformers' x * cos + rotate_half(x) * sin bit for bit (the minus moves from -x2 * sin1 to x2 * -sin1);
        the tables hold transformers' values (pos * inv_freq in float32, cos / sin, scaled, rounded to dtype)."""
        need = int(pos.max()) + 1 if upto is None else upto
        if self._cos is None or need > self._cos.shape[0]:
            n = max(need, 2 * (0 if self._cos is None else self._cos.shape[0]), 256)
            freqs = torch.arange(n, device=self.device).float()[:, None] * self.inv_freq.to(self.device)
            emb = torch.cat((freqs, freqs), dim=-1)                                # [n, hd]
            cos, sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
            half = sin.shape[-1] // 2
            sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
            self._cos, self._sin = cos.to(self.dtype), sin.to(self.dtype)
        return self._cos[pos][:, :, None], self._sin[pos][:, :, None]              # [B, T, 1, hd]

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        return _rotate(x, cos, sin_signed)

    def finish_layer(self, i: int, x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     mask: torch.Tensor | None, causal: bool, want: set, captured: dict,
                     rows: "RowKeys | None" = None) -> torch.Tensor:
        """Layer i after q/k/v: attention (additive `mask`, else causal when `causal`; with `rows`, each exact row
        as its own one-row call over its own keys), o_proj, the MLP; records the hidden states at the wanted
        sites ([B, T, d]). x [B, T, d] or [T, d]; q [B, H, T, hd]; keys/values [B, KV, S, hd]."""
        q = q.to(keys.dtype)                          # the attention dtype (`att_dtype`): a no-op unless it differs
        if rows is not None:
            att = rows.attend(q, keys, values, mask, self.scale, self.groups > 1)
            return self._after_attention(i, x, att, want, captured)
        # SDPA reads each KV head for its query group itself (no K/V copies): on CPU the cheapest attention for
        # one query row and for verify-sized ones alike (a few-row matmul version measured 3-10x slower)
        att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal and mask is None,
                                             scale=self.scale, enable_gqa=self.groups > 1)
        return self._after_attention(i, x, att, want, captured)

    def _after_attention(self, i: int, x: torch.Tensor, att: torch.Tensor, want: set, captured: dict) -> torch.Tensor:
        """o_proj, the residual, the MLP. att [B, H, T, hd]; x [B, T, d] or (the one-sequence forward) [T, d]."""
        _, _, o_proj, n2, gate_up, down = self.layers[i]
        att = att.to(x.dtype)
        x = x + o_proj(att.transpose(1, 2).reshape(*x.shape[:-1], self.heads * att.shape[-1]))
        if (i, "attn") in want:
            captured[(i, "attn")] = x if x.dim() == 3 else x[None]
        g, u = gate_up(self._rms(x, n2)).chunk(2, dim=-1)
        x = x + down(F.silu(g) * u)
        if (i, "mlp") in want:
            captured[(i, "mlp")] = x if x.dim() == 3 else x[None]
        return x

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: StaticKVCache, position_ids: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, sites: Iterable[Site] = (), logit_rows: int | None = None
                ) -> tuple[torch.Tensor, dict[Site, torch.Tensor]]:
        """ids: [1, T] appended after the cache's `len` positions. `mask`: None (causal) or an additive float
        mask [1, 1, T, len + T] (trees, padded rows). Returns logits [R, V] for the first `logit_rows` rows
        (None: all; -1: the last row only), and the hidden states at `sites` ({site: [1, T, d]})."""
        T, start = ids.shape[1], len(cache)
        end = start + T
        cache.reserve(end)
        if position_ids is None:
            position_ids = torch.arange(start, end, device=ids.device)[None]
        cos, sin = self._rotary(position_ids, cache.capacity)
        want = {(int(a), str(b)) for a, b in sites}
        captured: dict[Site, torch.Tensor] = {}
        rows = RowKeys.plan(start, T, mask, logit_rows) if self.row_exact and start > 0 and T > 1 else None
        chain = rows is not None and mask is None
        if mask is not None and mask.is_floating_point():
            mask = mask.to(self.att_dtype)                             # additive: in the attention's dtype
        if mask is None and T > 1 and start > 0 and not chain:       # causal over the cached prefix (transformers')
            mask = torch.ones(T, end, dtype=torch.bool, device=ids.device).tril(start)[None, None]
        # one sequence: the residual stream as [T, d] (the products take it as is: no reshapes around ~120 calls)
        x = F.embedding(ids[0], self.embed)                                        # [T, d]
        cos, sin = cos[0], sin[0]                                                  # [T, 1, hd]
        if self.step is not None and T <= self.step.most_rows:      # decode and verify steps (not long prefills)
            x = self._scripted(x, cache, start, cos, sin, want, captured, mask, rows)
        else:
            x = self._layers(x, cache, start, cos, sin, mask, want, captured, rows)
        cache.length = end
        x = x[-1:] if logit_rows == -1 else x[:logit_rows]
        return self.head(self._rms(x, self.norm)), captured                        # [R, V]

    def _scripted(self, x: torch.Tensor, cache: StaticKVCache, start: int, cos: torch.Tensor, sin: torch.Tensor,
                  want: set, captured: dict, mask: torch.Tensor | None, rows: RowKeys | None) -> torch.Tensor:
        key = frozenset(want)
        flags = self._flags.get(key)
        if flags is None:
            flags = self._flags[key] = [(i, w) in want for i in range(self.n_layers) for w in ("attn", "mlp")]
        x, caps = self.step(self, x, cache, start, cos, sin, flags, mask, rows)
        for site, h in zip(sorted(want), caps):                  # (layer, "attn" < "mlp"): the loop's order
            captured[site] = h[None]
        return x

    def _layers(self, x: torch.Tensor, cache: StaticKVCache, start: int, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None, want: set, captured: dict, rows: RowKeys | None) -> torch.Tensor:
        """The layer loop in Python: x [T, d] at positions start..; cos, sin [T, 1, hd]."""
        T = x.shape[0]
        end = start + T
        H, KV, hd = self.heads, self.kv_heads, self.head_dim
        K, V = cache.k[:, 0], cache.v[:, 0]                                        # [L, KV, cap, hd]
        for i, (n1, qkv, *_) in enumerate(self.layers):
            heads = qkv(self._rms(x, n1)).view(T, H + 2 * KV, hd)                 # q, k, v heads
            qk = self._rotate(self.qk_normed(i, heads), cos, sin)                   # q and k in one go
            q = qk[:, :H].transpose(0, 1)[None]                                     # [1, H, T, hd]
            Ki, Vi = K[i], V[i]                                                     # [KV, cap, hd]
            Ki[:, start:end] = qk[:, H:].transpose(0, 1)                            # [KV, T, hd]
            Vi[:, start:end] = heads[:, H + KV:].transpose(0, 1)
            x = self.finish_layer(i, x, q, Ki[None, :, :end], Vi[None, :, :end], mask, T > 1, want, captured, rows)
        return x
