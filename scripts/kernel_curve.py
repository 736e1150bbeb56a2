"""Verify cost per width, q4q8 against int4 (the same GGUF weights), in one run on this machine.

    python scripts/kernel_curve.py [--rows 1,2,4,8,16,32] [--reps 12]

Tables, median of --reps each: (1) the 30 layers' matrix products alone (q|k|v, o, gate|up, down: 120 fused
calls; q4q8 takes float32 and quantises to int8 blocks inside, int4 takes bfloat16); (2) the whole target forward
(the engine's: layers, attention, head) of R new rows on a 256-token cached prefix, logits for every row. The LAST
line is JSON. Then llama.cpp's forward (when llama-cpp-python is installed) and, where the CPU has more than one vector
path (AVX2, AVX-512 VNNI), the products through each.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from switchsd.kernels.q4q8 import Q4Q8Linear, available_paths, best_path, gguf_blocks  # noqa: E402
from switchsd.models.int4 import Int4Linear, q4_groups  # noqa: E402
from switchsd.models.loading import gguf_path  # noqa: E402

FUSED = {"qkv": ("attn_q", "attn_k", "attn_v"), "o": ("attn_output",), "gate_up": ("ffn_gate", "ffn_up"),
         "down": ("ffn_down",)}


def layers(fmt: str, path: str = "auto"):
    from gguf import GGUFReader
    tensors = {t.name: t for t in GGUFReader(str(gguf_path(None))).tensors}
    out = []
    for i in range(30):
        for parts in FUSED.values():
            mats = []
            for p in parts:
                t = tensors[f"blk.{i}.{p}.weight"]
                raw, kind = np.asarray(t.data), t.tensor_type.name
                if fmt == "q4q8":
                    mats.append(Q4Q8Linear(*gguf_blocks(raw, kind), path=path))
                else:
                    mats.append(Int4Linear(*q4_groups(raw, kind), torch.bfloat16))
            out.append((Q4Q8Linear if fmt == "q4q8" else Int4Linear).fuse(mats) if len(mats) > 1 else mats[0])
    return out


def time_all(mats, rows: int, dtype: torch.dtype, reps: int) -> float:
    xs = {m.in_features: torch.randn(rows, m.in_features).to(dtype) for m in mats}
    times = []
    for _ in range(reps + 2):
        t0 = time.perf_counter()
        for m in mats:
            m(xs[m.in_features])
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[2:])


def forward_ms(dtype: str, rows: list[int], reps: int) -> dict[int, float]:
    from switchsd.models.forward import make_target
    from switchsd.models.loading import load_model
    lm = load_model(dtype=dtype, device="cpu")
    target = make_target(lm.model, [], "lean")
    prefix = torch.randint(100, 40000, (1, 256), generator=torch.Generator().manual_seed(0))
    cache = target.new_cache(256 + 40)
    target.forward(prefix, cache, logit_rows=-1)
    out = {}
    for r in rows:
        ids = prefix[:, :r]
        times = []
        for _ in range(reps + 2):
            cache.crop(256)
            t0 = time.perf_counter()
            target.forward(ids, cache, logit_rows=r)
            times.append(time.perf_counter() - t0)
        out[r] = 1e3 * statistics.median(times[2:])
    return out


def llama_cpp_ms(rows: list[int], reps: int) -> dict[int, float] | None:
    """llama.cpp (llama-cpp-python, if installed) on the same GGUF: eval of R tokens after the same 256-token prefix,
    logits for every row (what a verify needs), same threads."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=str(gguf_path(None)), n_ctx=512, n_threads=torch.get_num_threads(),
                n_threads_batch=torch.get_num_threads(), logits_all=True, verbose=False)
    prefix = torch.randint(100, 40000, (256,), generator=torch.Generator().manual_seed(0)).tolist()
    llm.eval(prefix)
    out = {}
    for r in rows:
        times = []
        for _ in range(reps + 2):
            llm.n_tokens = 256                   # eval drops the cache past n_tokens first
            t0 = time.perf_counter()
            llm.eval(prefix[:r])
            times.append(time.perf_counter() - t0)
        out[r] = 1e3 * statistics.median(times[2:])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--reps", type=int, default=12)
    a = ap.parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    q4q8, int4 = layers("q4q8"), layers("int4")
    print(f"threads {torch.get_num_threads()} · q4q8 path {best_path()}\n")
    print("| rows | q4q8 ms | x its 1 row | int4 (bf16) ms | x its 1 row | q4q8 / int4 |\n|---|---|---|---|---|---|")
    res = []
    for r in rows:
        a_ms, b_ms = time_all(q4q8, r, torch.float32, a.reps), time_all(int4, r, torch.bfloat16, a.reps)
        res.append({"rows": r, "q4q8_ms": round(a_ms, 2), "int4_ms": round(b_ms, 2)})
        print(f"| {r} | {a_ms:.2f} | {a_ms / res[0]['q4q8_ms']:.2f} | {b_ms:.2f} | {b_ms / res[0]['int4_ms']:.2f} | "
              f"{a_ms / b_ms:.2f} |")
    full = {fmt: forward_ms(fmt, rows, a.reps) for fmt in ("q4q8", "int4")}
    print("\n| rows | q4q8 forward ms | x its 1 row | int4 forward ms | x its 1 row | q4q8 / int4 |\n|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        q, n = full["q4q8"][r], full["int4"][r]
        res[i].update(q4q8_forward_ms=round(q, 2), int4_forward_ms=round(n, 2))
        print(f"| {r} | {q:.2f} | {q / full['q4q8'][rows[0]]:.2f} | {n:.2f} | {n / full['int4'][rows[0]]:.2f} | "
              f"{q / n:.2f} |")
    cpp = llama_cpp_ms(rows, a.reps)
    if cpp:
        print("\n| rows | llama.cpp ms | x its 1 row | q4q8 forward / llama.cpp |\n|---|---|---|---|")
        for i, r in enumerate(rows):
            res[i]["llama_cpp_ms"] = round(cpp[r], 2)
            print(f"| {r} | {cpp[r]:.2f} | {cpp[r] / cpp[rows[0]]:.2f} | {full['q4q8'][r] / cpp[r]:.2f} |")
    vector = [p for p in available_paths() if p != "portable"]
    if len(vector) > 1:            # the same products through each vector path this CPU has (same bits)
        mats = {p: layers("q4q8", p) for p in vector}
        print("\n| rows | " + " | ".join(f"products {p} ms" for p in vector) + " |\n|---|" + "---|" * len(vector))
        for i, r in enumerate(rows):
            times = {p: [] for p in vector}
            for _ in range(a.reps):                # the paths alternate rep by rep: a drift falls on both
                for p in vector:
                    times[p].append(time_all(mats[p], r, torch.float32, 1))
            ms = {p: statistics.median(t) for p, t in times.items()}
            res[i].update({f"products_{p}_ms": round(v, 2) for p, v in ms.items()})
            print(f"| {r} | " + " | ".join(f"{v:.2f}" for v in ms.values()) + " |")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
