"""Compile the C kernels once per source, compiler and flags, and load them with ctypes.

    lib = load("q4q8")          # switchsd/kernels/q4q8.c -> ~/.cache/switchsd/kernels/q4q8-<hash>.so

No torch headers (a build takes about a second): the kernels take raw pointers. They use OpenMP; torch is imported
first, so they share torch's OpenMP runtime (one thread pool, no oversubscription). Set SWITCHSD_KERNEL_DIR to
build elsewhere; SWITCHSD_CC to use another compiler.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch  # noqa: F401  (loads torch's OpenMP runtime before ours)

from .. import envs

HERE = Path(__file__).resolve().parent
# -ffp-contract=off: a * b + c stays two roundings, as the kernels' arithmetic (and its reference) says
FLAGS = ("-O3", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-std=c11")


class BuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(envs.get("SWITCHSD_KERNEL_DIR") or Path.home() / ".cache" / "switchsd" / "kernels")


def compiler() -> str:
    cc = envs.get("SWITCHSD_CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise BuildError("no C compiler found (install gcc, e.g. `apt install gcc`, or set SWITCHSD_CC)")
    return cc


@lru_cache(maxsize=None)
def load(name: str) -> ctypes.CDLL:
    """The compiled kernel library `name` (switchsd/kernels/<name>.c), built on first use."""
    src = HERE / f"{name}.c"
    cc = compiler()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    sources = b"".join(f.read_bytes() for f in sorted(HERE.glob("*.c")))       # a kernel may include another
    key = hashlib.sha256(src.read_bytes() + sources + repr((version, FLAGS)).encode()).hexdigest()[:16]
    out = cache_dir() / f"{name}-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_out = Path(tmp) / out.name
            r = subprocess.run([cc, *FLAGS, str(src), "-o", str(tmp_out), "-lm"], capture_output=True, text=True)
            if r.returncode:
                raise BuildError(f"building {src.name} with {cc} failed:\n{r.stderr[-4000:]}")
            os.replace(tmp_out, out)          # atomic: a concurrent build never loads a half-written file
    return ctypes.CDLL(str(out))


def available(name: str = "llama") -> bool:
    """Whether kernel `name` builds and loads here (a C compiler with OpenMP; a build takes about a second, once)."""
    try:
        load(name)
        return True
    except (BuildError, OSError):
        return False
