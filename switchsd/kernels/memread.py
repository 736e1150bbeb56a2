"""This machine's memory read bandwidth with the forwards' threads (memread.c): the floor under a step that reads
every weight once, stated beside the real-size curves."""
from __future__ import annotations

import ctypes

from .build import BuildError, load


def read_bandwidth(gib: int = 1, repeats: int = 5) -> float | None:
    """GB/s this machine's threads (torch's) read from memory (memread.c); None without a compiler."""
    try:
        lib = load("memread")
    except (BuildError, OSError):
        return None
    lib.mem_read_gbs.restype, lib.mem_read_gbs.argtypes = ctypes.c_double, [ctypes.c_int64, ctypes.c_int]
    gbs = lib.mem_read_gbs(gib << 30, repeats)
    return gbs if gbs > 0 else None
