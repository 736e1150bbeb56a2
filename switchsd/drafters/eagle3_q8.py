"""An EAGLE-3 head for CPU drafting: its matrices as Q8_0 blocks (its LM head Q4_1), its decoder layer one C call.

    fast = q8_head(head)             # once per head (None off CPU, for a float64 head, or where the kernels fail)
    out, k, v = fast.step(emb, h, pos, past_k, past_v, mask)      # as Eagle3Head.step; [1, T, H] rows
    logits = fast.logits(out)                                     # the final norm and the LM head, in C

    cache = fast.new_cache()                                      # K/V with room: `HeadCache`
    out = fast.run(emb, fast.fused(g), pos, cache, at)            # [T, H]; K/V written in place at entries at..

A drafting step reads a quarter of float32's bytes or less and makes three C calls (the layer, the LM head, `fc` at a
catch-up) instead of some forty torch operations; the drafter's CPU chains (`run`) write K/V in place, never
copying the past. Drafts only: verification decides what is kept, and at T > 0
the q a draft carries is this head's.
"""
from __future__ import annotations

import ctypes
import weakref

import torch

from ..kernels.build import available, load
from ..kernels.q4q8 import Q4Q8Linear, Q8Linear
from ..models.q4q8 import Dims, Mat, Q4Q8Llama, mat, rotary_tables
from .eagle3_model import Eagle3Head

_P = ctypes.c_void_p
_I = ctypes.c_int64


class _Packed(torch.nn.Module):
    """A linear layer as `kind`'s blocks (Q8Linear: Q8_0; Q4Q8Linear: Q4_1) through the C kernel
    (switchsd/kernels/q4q8.c); float32 in and out."""

    def __init__(self, weight: torch.Tensor, kind=Q8Linear):
        super().__init__()
        self.lin = kind.quantize(weight)
        self.register_buffer("weight", torch.empty(0), persistent=False)      # dtype / device, as nn.Linear's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def _lib() -> ctypes.CDLL:
    lib = load("eagle3")
    if not getattr(lib, "_typed", False):
        lib.eagle3_step.argtypes = [ctypes.POINTER(Dims), _P, _P, _P, _P, _I, _P, _P, _I, _P, _P, _P, _P, _P, _P]
        lib.eagle3_step.restype = ctypes.c_int
        lib.llama_head.argtypes = [ctypes.POINTER(Dims), _P, _I, _P, ctypes.POINTER(Mat), _P]
        lib.llama_head.restype = ctypes.c_int
        lib.llama_product.argtypes = [ctypes.POINTER(Mat), _P, _I, _I, _P, ctypes.c_int]
        lib.llama_product.restype = ctypes.c_int
        lib._typed = True
    return lib


class Q8Eagle3Head(Eagle3Head):
    """Eagle3Head with Q8_0 matrices (llama.cpp's: d = max |w| / 127 per 32 weights) whose `step` and `logits` run
    in C (switchsd/kernels/eagle3.c): q|k|v and gate|up fused, norms, rotary and attention in float32. Its torch
    modules stay (fc, and the layer for callers that run it in torch: `Eagle3Head.step` over a batch).
    The LM head, the largest matrix and the one every drafted token reads (the shipped head's: 12,288 x 576), is Q4_1:
    5 bits a weight where Q8_0 takes 8.5 (drafts only: verification decides what is kept)."""

    @classmethod
    def of(cls, head: Eagle3Head) -> "Q8Eagle3Head":
        fast = cls(head.config)
        fast.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in head.state_dict().items()})
        fast.eval().requires_grad_(False)
        m, a = fast.midlayer, fast.midlayer.self_attn
        fused = [torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), a.o_proj.weight,
                 torch.cat([m.mlp.gate_proj.weight, m.mlp.up_proj.weight]), m.mlp.down_proj.weight]
        fast._mats = [Q8Linear.quantize(w) for w in fused]        # quantised per row: the codes of each part
        for owner, name in ((fast, "fc"), (a, "q_proj"), (a, "k_proj"), (a, "v_proj"),
                            (a, "o_proj"), (m.mlp, "gate_proj"), (m.mlp, "up_proj"), (m.mlp, "down_proj")):
            setattr(owner, name, _Packed(getattr(owner, name).weight))
        fast.lm_head = _Packed(fast.lm_head.weight, Q4Q8Linear)
        fast._lm_mat = mat([fast.lm_head.lin])            # the modules keep the packed matrices alive
        fast._fc_mat = mat([fast.fc.lin])
        fast._norms = [m.input_layernorm.weight.contiguous(), m.hidden_norm.weight.contiguous(),
                       m.post_attention_layernorm.weight.contiguous()]
        c = head.config
        fast._w = (ctypes.c_void_p * 4)(*[q.packed.data_ptr() for q in fast._mats])
        fast._n = (ctypes.c_void_p * 3)(*[n.data_ptr() for n in fast._norms])
        fast._dims = Dims(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                          c.intermediate_size, c.rms_norm_eps, c.head_dim ** -0.5, 0)
        fast._inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        fast._cos, fast._sin = rotary_tables(fast._inv, 256)
        fast._lib = _lib()
        return fast

    def _tables(self, need: int) -> None:
        """cos and signed sin tables [n, hd] for positions < need, grown as positions come (`rotary_tables`)."""
        if self._cos.shape[0] < need:
            self._cos, self._sin = rotary_tables(self._inv, max(need, 2 * self._cos.shape[0]))

    def _layer(self, emb: torch.Tensor, h: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, wpos: torch.Tensor,
               cos: torch.Tensor, sin: torch.Tensor, off: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """eagle3.c's layer over rows emb, h [T, H] float32 (K/V written into kc, vc [KV, cap, hd] at wpos;
        `keys_seen`'s off, keys; cos, sin [T, hd]) -> out [T, H]."""
        T = emb.shape[0]
        out = torch.empty(T, self.config.hidden_size)
        rc = self._lib.eagle3_step(ctypes.byref(self._dims), self._w, self._n, emb.contiguous().data_ptr(),
                                   h.contiguous().data_ptr(), T, kc.data_ptr(), vc.data_ptr(), kc.shape[1],
                                   wpos.data_ptr(), cos.data_ptr(), sin.data_ptr(), off.data_ptr(), keys.data_ptr(),
                                   out.data_ptr())
        if rc:
            raise MemoryError("EAGLE-3 head step: out of memory")
        return out

    def step(self, emb, h, pos, past_k, past_v, mask):
        if emb.shape[0] != 1 or emb.device.type != "cpu":
            return super().step(emb, h, pos, past_k, past_v, mask)
        c = self.config
        T, S = emb.shape[1], 0 if past_k is None else past_k.shape[2]
        kc = torch.empty(c.num_key_value_heads, S + T, c.head_dim)
        vc = torch.empty_like(kc)
        if S:
            kc[:, :S], vc[:, :S] = past_k[0], past_v[0]
        if mask is not None:
            mask = mask[None, None] if mask.dim() == 2 else mask
        off, keys = Q4Q8Llama.keys_seen(S, T, mask)
        pos = pos.reshape(-1)
        self._tables(int(pos.max()) + 1)
        out = self._layer(emb[0].float(), h[0].float(), kc, vc, torch.arange(S, S + T, dtype=torch.int32),
                          self._cos[pos].contiguous(), self._sin[pos].contiguous(), off, keys)
        return out[None], kc[None, :, S:], vc[None, :, S:]

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        if out.device.type != "cpu":
            return super().logits(out)
        x = out.reshape(-1, out.shape[-1]).float().contiguous()
        y = torch.empty(x.shape[0], self.config.draft_vocab_size)
        rc = self._lib.llama_head(ctypes.byref(self._dims), x.data_ptr(), x.shape[0], self.norm.weight.data_ptr(),
                                  ctypes.byref(self._lm_mat), y.data_ptr())
        if rc:
            raise MemoryError("EAGLE-3 head logits: out of memory")
        return y.view(*out.shape[:-1], -1)

    # -- drafting straight into a cache with room (`HeadCache`): no copies of the past, few torch operations --
    def fused(self, g: torch.Tensor) -> torch.Tensor:
        """fc over the fused target features g [n, 3 Ht] float32 -> [n, H] (one C call)."""
        g = g.contiguous()
        n, k = g.shape
        y = torch.empty(n, self.config.hidden_size)
        if self._lib.llama_product(ctypes.byref(self._fc_mat), g.data_ptr(), n, k, y.data_ptr(), 0):
            raise MemoryError("EAGLE-3 head fc: out of memory")
        return y

    def run(self, emb: torch.Tensor, h: torch.Tensor, pos: int, cache: "HeadCache", at: int) -> torch.Tensor:
        """The layer over T rows (emb, h [T, H] float32) at rotary positions pos .. pos + T - 1, their K/V written to
        cache entries at .. at + T - 1, row t seeing entries 0 .. at + t (what `step` computes for past entries
        0 .. at - 1, without copying them). Returns out [T, H]."""
        T = emb.shape[0]
        cache.room(at + T)
        self._tables(pos + T)
        off, keys = Q4Q8Llama.keys_seen(at, T, None)
        return self._layer(emb, h, cache.k, cache.v, torch.arange(at, at + T, dtype=torch.int32),
                           self._cos[pos:pos + T], self._sin[pos:pos + T], off, keys)

    def new_cache(self) -> "HeadCache":
        c = self.config
        return HeadCache(c.num_key_value_heads, c.head_dim)


class HeadCache:
    """The Q8 head's K/V, k and v [KV, cap, hd] float32, grown by doubling: the drafter's stable entries first, a
    draft's own entries after them (overwritten by the next catch-up)."""

    def __init__(self, kv_heads: int, head_dim: int, cap: int = 256):
        self.k = torch.empty(kv_heads, cap, head_dim)
        self.v = torch.empty_like(self.k)

    @property
    def cap(self) -> int:
        return self.k.shape[1]

    def room(self, n: int) -> None:
        """At least n entries, the present ones kept."""
        if n > self.cap:
            k, v = self.k, self.v
            self.k = torch.empty(k.shape[0], max(n, 2 * self.cap), k.shape[2])
            self.v = torch.empty_like(self.k)
            self.k[:, :k.shape[1]], self.v[:, :v.shape[1]] = k, v

    def views(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n entries as the drafter's [1, KV, n, hd] (views, not copies)."""
        return self.k[None, :, :n], self.v[None, :, :n]


def q8_head(head: Eagle3Head) -> Eagle3Head | None:
    """The head's Q8_0 copy (`Q8Eagle3Head`), made once per head. A float64 head (the tests' reference arithmetic)
    is kept as it is; None off CPU, where the kernels do not build, or for shapes they do not take."""
    w = head.fc.weight
    if w.device.type != "cpu" or w.dtype == torch.float64 or not available("eagle3"):
        return None
    if head not in _Q8HEADS:
        try:
            _Q8HEADS[head] = Q8Eagle3Head.of(head)
        except ValueError:                    # dimensions the kernels do not take (multiples of 32 and 8)
            return None
    return _Q8HEADS[head]


_Q8HEADS: "weakref.WeakKeyDictionary[Eagle3Head, Eagle3Head]" = weakref.WeakKeyDictionary()
