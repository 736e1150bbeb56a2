"""The AMX self-test, run in a child process by `build.amx_rows()` before any kernel uses the tiles:

    SWITCHSD_AMX_SELF_TEST=1 python -m switchsd.kernels.amxcheck

Every block type with a tile kernel, on shapes with an odd column group and row counts below, at and past one tile
(16 rows), through path 5 (amx) and path 4 (vnni512): exit 0 only if every product has the same bits. A CPU or kernel
that faults on the tiles kills this process, and the parent then keeps to the vector paths. Then it times both paths
on Q4_K matrices and prints `rows N`: the tiles from N rows up (each row count from N on faster on the tiles), or
`rows 0`: never.
"""
from __future__ import annotations

import sys
import time

import numpy as np
import torch

from . import qx


def main() -> int:
    rng = np.random.default_rng(0)
    for kind in sorted(qx.TYPES):
        n, k = 40, 512                                   # five column groups: two pairs and one alone
        raw = qx.random_blocks(kind, n, k, rng)
        x = torch.from_numpy(rng.standard_normal((33, k)).astype(np.float32))
        for as_bytes in (False, True):
            tiles, vectors = (qx.gguf_linear(raw, kind, path, as_bytes) for path in ("amx", "vnni512"))
            for rows in (2, 3, 16, 17, 33):
                if not torch.equal(tiles(x[:rows]), vectors(x[:rows])):
                    print(f"{kind}{' as bytes' if as_bytes else ''}, {rows} rows: the tiles' product differs")
                    return 1
    print(f"rows {crossover(rng)}")
    return 0


def crossover(rng: np.random.Generator, n: int = 2048, k: int = 2048, mats: int = 8) -> int:
    """The fewest rows from which every row count up to 16 multiplies faster on the tiles (best of 3 rounds over
    `mats` Q4_K matrices [n, k], 19 MB: past the cores' own caches), or 0."""
    raw = [qx.random_blocks("Q4_K", n, k, rng) for _ in range(mats)]
    paths = {p: [qx.gguf_linear(r, "Q4_K", p) for r in raw] for p in ("amx", "vnni512")}
    faster = {}
    for rows in range(2, 17, 2):
        x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32))
        best = {}
        for _ in range(3):
            for p, lins in paths.items():
                t = time.perf_counter()
                for lin in lins:
                    lin(x)
                best[p] = min(best.get(p, float("inf")), time.perf_counter() - t)
        faster[rows] = best["amx"] < best["vnni512"]
    from_rows = [r for r in faster if all(faster[s] for s in faster if s >= r)]
    return min(from_rows) if from_rows else 0


if __name__ == "__main__":
    sys.exit(main())
