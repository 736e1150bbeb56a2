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
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import torch  # noqa: F401  (loads torch's OpenMP runtime before ours)

from .. import envs
from ..io import write_text_atomic

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


def _key(*parts: bytes) -> str:
    cc = compiler()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    sources = b"".join(f.read_bytes() for f in sorted(HERE.glob("*.c")))       # a kernel may include another
    return hashlib.sha256(b"".join(parts) + sources + repr((version, FLAGS)).encode()).hexdigest()[:16]


@lru_cache(maxsize=None)
def load(name: str) -> ctypes.CDLL:
    """The compiled kernel library `name` (switchsd/kernels/<name>.c), built on first use; its AMX path (5) allowed
    where `amx_rows()`."""
    lib = ctypes.CDLL(str(_build(name)))
    if hasattr(lib, "kernels_amx_allow"):
        lib.kernels_amx_allow(amx_rows())
    return lib


@lru_cache(maxsize=None)
def amx_rows() -> int:
    """From how many rows the kernels multiply on AMX tiles; 0: never. Tiles only where this CPU has them,
    SWITCHSD_AMX is not 0, and a self-test in a child process (`python -m switchsd.kernels.amxcheck`: a fault there
    kills the child, not this process) gave the same bits as the vector path, then timed both: the row count from
    which the tiles are faster. The verdict is kept beside the built kernels, one per CPU model and source."""
    if not envs.get("SWITCHSD_AMX"):
        return 0
    if envs.get(_CHILD):
        return 1
    if not ctypes.CDLL(str(_build("q4q8"))).kernels_amx_unit():
        return 0
    cpu = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "")
    verdict = cache_dir() / f"amx-{_key(cpu.encode())}.txt"
    if not verdict.exists():
        try:
            r = subprocess.run([sys.executable, "-m", "switchsd.kernels.amxcheck"], capture_output=True, text=True,
                               env={**os.environ, _CHILD: "1"}, timeout=300)
            said = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else \
                f"failed: {(r.stdout + r.stderr).strip()[-300:]} (exit {r.returncode})"
        except subprocess.TimeoutExpired:
            said = "failed: the self-test ran past 300 s"
        verdict.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(verdict, said + "\n")    # two processes testing at once: each sees a whole verdict
    said = verdict.read_text().split()
    return int(said[1]) if len(said) == 2 and said[0] == "rows" and said[1].isdigit() else 0


_CHILD = "SWITCHSD_AMX_SELF_TEST"    # set in the self-test's own process: the tiles are tried there, not tested


def _build(name: str) -> Path:
    src = HERE / f"{name}.c"
    cc = compiler()
    out = cache_dir() / f"{name}-{_key(src.read_bytes())}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_out = Path(tmp) / out.name
            r = subprocess.run([cc, *FLAGS, str(src), "-o", str(tmp_out), "-lm"], capture_output=True, text=True)
            if r.returncode:
                raise BuildError(f"building {src.name} with {cc} failed:\n{r.stderr[-4000:]}")
            os.replace(tmp_out, out)          # atomic: a concurrent build never loads a half-written file
    return out


def available(name: str = "llama") -> bool:
    """Whether kernel `name` builds and loads here (a C compiler with OpenMP; a build takes about a second, once)."""
    try:
        load(name)
        return True
    except (BuildError, OSError):
        return False
