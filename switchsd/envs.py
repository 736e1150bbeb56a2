"""Every environment variable SwitchSD reads, registered once with its type, default and meaning.

    switchsd --help-env          # this table

Code reads a variable only through `get(NAME)`, which parses it and refuses a malformed value with one line
naming the variable; a test checks that no module reads an unregistered SWITCHSD_* name.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Env:
    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    where: str


def _flag(v: str) -> bool:
    if v not in ("0", "1"):
        raise ValueError("expected 0 or 1")
    return v == "1"


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(v: str):
        x = kind(v)
        if not x > 0:
            raise ValueError("expected a positive number")
        return x
    return parse


def _nonnegative_int(v: str) -> int:
    x = int(v)
    if x < 0:
        raise ValueError("expected an integer >= 0")
    return x


def _nonnegative_float(v: str) -> float:
    x = float(v)
    if not 0 <= x < float("inf"):
        raise ValueError("expected a number >= 0")
    return x


VARS: dict[str, Env] = {e.name: e for e in (
    # the library
    Env("SWITCHSD_CACHE", str, None, "the cache folder (default ~/.cache/switchsd): the de-quantised model, calibrations, "
        "llama.cpp's build", "library"),
    Env("SWITCHSD_CALIBRATION", str, None, "the folder of device measurements (default: $SWITCHSD_CACHE/calibration)",
        "library"),
    Env("SWITCHSD_DATA", str, None, "the folder holding the benchmark data sets (default: ../shared/data)",
        "library"),
    Env("SWITCHSD_KERNEL_DIR", str, None, "where the C kernels are built (default: $SWITCHSD_CACHE/kernels)",
        "library"),
    Env("SWITCHSD_CC", str, None, "the C compiler for the kernels (default: cc, gcc or clang on PATH)", "library"),
    Env("SWITCHSD_SCRIPTED", _flag, True, "0: run the lean CPU forward without its TorchScript step", "library"),
    Env("SWITCHSD_AMX", _flag, True, "0: never use the AMX tile path (on a CPU with AMX it runs the GGUF K types' "
        "multi-row products once a self-test in a child process matched the other paths bit for bit)", "library"),
    Env("SWITCHSD_AMX_SELF_TEST", _flag, False, "set by SwitchSD in the AMX self-test's own child process (where "
        "the tiles run untested)", "library"),
    Env("SWITCHSD_QX_BYTES", _flag, False, "1: K-type GGUF codes as whole bytes (no unpacking: cheaper wide verify "
        "rows, dearer one-row steps; for models that fit the cache)", "library"),
    # the vLLM plugin (switchsd/vllm)
    Env("SWITCHSD_VLLM_GATE", str, None, "a probe file: turns SwitchSD's gate on in front of vLLM's EAGLE-3",
        "vllm"),
    Env("SWITCHSD_VLLM_COUNTS", str, None, "a file the proposer writes its running counts to (JSON)", "vllm"),
    Env("SWITCHSD_KAPPA", _positive(int), None, "the copy path's kappa-gram (default: 2 in the gate, "
        "3 in the copy method)", "vllm"),
    Env("SWITCHSD_NEURAL_K", _positive(int), 3, "EAGLE-3's draft length behind the gate", "vllm"),
    Env("SWITCHSD_NEURAL_MAX_BATCH", _nonnegative_int, 1, "above this many running requests EAGLE-3 does not run",
        "vllm"),
    Env("SWITCHSD_RULE", str, "cost", "the gate's rule: cost (the cost model) or probe (the paper's)", "vllm"),
    Env("SWITCHSD_BACKOFF", _flag, True, "1: where the kappa-gram never occurred, copy from the requests' outputs",
        "vllm"),
    Env("SWITCHSD_HALF_LIFE", _nonnegative_int, 500, "drafts verified (any path's) over which a draft's weight "
        "in the acceptance record halves; 0: never forget", "vllm"),
    Env("SWITCHSD_SPEC_FACTOR", _nonnegative_int, 2, "a copy chain is at most this many times as long as the "
        "context it matched; 0: no cap", "vllm"),
    # the studio (app/)
    Env("SWITCHSD_REFRESH_S", _positive(float), 0.5, "seconds between token-view refreshes", "studio"),
    Env("SWITCHSD_PLOT_REFRESH_S", _positive(float), 0.5, "seconds between live-plot refreshes", "studio"),
    Env("SWITCHSD_FULL_REFRESH_S", _positive(float), 3.0, "seconds between whole-view refreshes through Gradio",
        "studio"),
    Env("SWITCHSD_FIRST_FRAME_S", _nonnegative_float, 1.0, "the first frame's deadline, seconds", "studio"),
    Env("SWITCHSD_SETTLE_S", _nonnegative_float, 0.15, "seconds a generation's last frame waits for the view",
        "studio"),
    Env("SWITCHSD_RACE_SETTLE_S", _nonnegative_float, 0.3, "seconds the race lets the machine settle before a round",
        "studio"),
    Env("SWITCHSD_SCREENSHOTS", str, None, "the browser test writes the README's screenshots and GIF here",
        "tests"),
)}


def get(name: str) -> Any:
    """The variable's value, parsed, or its registered default; a malformed value: ValueError naming it."""
    env = VARS[name]
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return env.default
    try:
        return env.parse(raw)
    except ValueError as e:
        raise ValueError(f"{name}={raw!r}: {e} ({env.help})") from None


def table() -> str:
    width = max(map(len, VARS))
    lines = ["Environment variables (switchsd/envs.py):", ""]
    for where in ("library", "vllm", "studio", "tests"):
        lines.append(f"{where}:")
        for e in VARS.values():
            if e.where == where:
                lines.append(f"  {e.name:<{width}}  {e.help}" + ("" if e.default is None else f" (default: {e.default})"))
        lines.append("")
    return "\n".join(lines)
