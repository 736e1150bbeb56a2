"""Does `torch.compile` pay for the lean decode step here? Times the eager one-token step of the lean forward
against the same forward under `torch.compile` (inductor, the system C++ compiler; dynamic shapes, so the
growing context does not recompile), after a prefix of --prefix tokens, and checks the logits agree.

    python scripts/dev/compile_step.py --dtype int4 --prefix 300 --steps 40

Prints the compile time (first call), the steady-state ms per step of both, recompiles, and the max |logit
difference|; then the same for a break-free one-token step (the lean layer loop written without Python-side
state, final norm included, head excluded), compiled whole. The eager forward stays the product's path unless
this says otherwise (docs/results.md).
"""
from __future__ import annotations

import argparse
import time

import torch

from switchsd.models.lean import LeanLlama
from switchsd.models.loading import load_model


@torch.inference_mode()
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="int4")
    ap.add_argument("--prefix", type=int, default=300)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args(argv)
    lean = LeanLlama.of(load_model(dtype=args.dtype, device="cpu").model)
    ids = torch.randint(0, lean.config.vocab_size, (1, args.prefix), generator=torch.Generator().manual_seed(0))
    tok = torch.tensor([[1]])

    def run(fn, n: int) -> tuple[float, torch.Tensor]:
        cache = lean.new_cache(args.prefix + n + 8)
        lean.forward(ids, cache)
        fn(tok, cache)                                          # first step (compiles, for the compiled one)
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn(tok, cache)[0]
        return 1000 * (time.perf_counter() - t0) / n, out

    eager = lambda t, c: lean.forward(t, c, logit_rows=-1)      # noqa: E731
    run(eager, 5)
    ms_eager, ref = run(eager, args.steps)
    compiled = torch.compile(lambda t, c: lean.forward(t, c, logit_rows=-1), dynamic=True)
    t0 = time.perf_counter()
    run(compiled, 1)
    first = time.perf_counter() - t0
    ms_comp, out = run(compiled, args.steps)
    counters = torch._dynamo.utils.counters
    print(f"{args.dtype}: eager {ms_eager:.2f} ms/step, compiled {ms_comp:.2f} ms/step "
          f"({ms_eager / ms_comp:.2f}x), first compiled call {first:.0f} s, "
          f"graph breaks {sum(counters['graph_break'].values())}, frames {dict(counters['stats'])}, "
          f"max |logit diff| {(out.float() - ref.float()).abs().max().item():.3g}")
    whole(lean, ids, args.steps)


def whole(lean: LeanLlama, ids: torch.Tensor, steps: int) -> None:
    """The layer loop as one function of tensors and an int (no graph breaks), eager vs compiled."""
    H, KV, hd = lean.heads, lean.kv_heads, lean.head_dim

    def step(x, K, V, start: int, cos, sin):                     # x [1, 1, d]; K, V [L, 1, KV, cap, hd]
        end = start + 1
        for i, (n1, qkv, o, n2, gate_up, down) in enumerate(lean.layers):
            h = qkv(lean._rms(x, n1)).view(1, 1, H + 2 * KV, hd)
            qk = lean._rotate(h[:, :, :H + KV], cos, sin)
            K[i, :, :, start:end] = qk[:, :, H:].transpose(1, 2)
            V[i, :, :, start:end] = h[:, :, H + KV:].transpose(1, 2)
            att = torch.nn.functional.scaled_dot_product_attention(
                qk[:, :, :H].transpose(1, 2), K[i, :, :, :end], V[i, :, :, :end], scale=lean.scale, enable_gqa=True)
            x = x + o(att.transpose(1, 2).reshape(1, 1, H * hd))
            g, u = gate_up(lean._rms(x, n2)).chunk(2, dim=-1)
            x = x + down(torch.nn.functional.silu(g) * u)
        return lean._rms(x, lean.norm)

    cache = lean.new_cache(ids.shape[1] + steps + 8)
    lean.forward(ids, cache)
    start = ids.shape[1]
    x = torch.nn.functional.embedding(torch.tensor([[1]]), lean.embed)
    cos, sin = lean._rotary(torch.tensor([[start]]), cache.capacity)

    def timed(fn) -> float:
        fn(x, cache.k, cache.v, start, cos, sin)
        t0 = time.perf_counter()
        for j in range(steps):
            fn(x, cache.k, cache.v, start + j, cos, sin)
        return 1000 * (time.perf_counter() - t0) / steps

    ms_eager = timed(step)
    compiled = torch.compile(step, dynamic=True, fullgraph=True)
    t0 = time.perf_counter()
    compiled(x, cache.k, cache.v, start, cos, sin)
    first = time.perf_counter() - t0
    ms_comp = timed(compiled)
    print(f"break-free step: eager {ms_eager:.2f} ms, compiled {ms_comp:.2f} ms ({ms_eager / ms_comp:.2f}x), "
          f"first compiled call {first:.0f} s")


if __name__ == "__main__":
    main()
