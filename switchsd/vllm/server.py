"""The one helper that starts a vLLM server with a speculative method (`make vllm-serve`, `switchsd vllm bench`,
`switchsd vllm pair`): vLLM's own `serve` from `.venv-vllm`, the flags every server here shares
(`methods.SERVE_FLAGS`), the method's `--speculative-config`, the SwitchSD gate's probe where the method is
switchsd, intel-openmp preloaded (vLLM's CPU speculative decoding wants it). Imports nothing of vLLM.

    python -m switchsd vllm serve [--method switchsd] [--k K] [--port 8000]     # in the foreground
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

from switchsd.io import stop_process

from .methods import PROBE, SERVE_FLAGS, speculative_config

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"
VPY = VENV / "bin" / "python"


def missing() -> str | None:
    return None if VPY.exists() else "no .venv-vllm: run `make vllm` (vLLM's CPU build with the plugin)"


def command(method: str, model: str, port: int, k: int | None = None, memory: float = 0.3,
            counts: Path | None = None) -> tuple[list[str], dict]:
    """(argv, environment) of `vllm serve` for `method` on 127.0.0.1:`port`."""
    spec = speculative_config(method, k)
    env = dict(os.environ, SWITCHSD_VLLM_GATE=str(ROOT / PROBE) if method == "switchsd" else "")
    if counts is not None:
        env["SWITCHSD_VLLM_COUNTS"] = str(counts)
    iomp = VENV / "lib" / "libiomp5.so"
    if iomp.exists():
        env["LD_PRELOAD"] = str(iomp)
    cmd = [str(VPY), "-m", "switchsd.vllm.cli", "serve", model, "--host", "127.0.0.1", "--port", str(port),
           *SERVE_FLAGS, "--gpu-memory-utilization", str(memory)]
    if spec:
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd, env


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def post(port: int, path: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class VllmServer:
    """A vLLM server process for one method, its log in `log`; `wait()` until it answers, `stop()` to end it."""

    def __init__(self, method: str, model: str, port: int, log: Path, k: int | None = None, memory: float = 0.3,
                 counts: Path | None = None):
        why = missing()
        if why:
            raise RuntimeError(why)
        self.method, self.port, self.log = method, port, log
        cmd, env = command(method, model, port, k, memory, counts)
        log.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(log, "a")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._out, stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 600) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the {self.method} server exited ({self.log})")
            if healthy(self.port):
                return
            time.sleep(1)
        raise RuntimeError(f"the {self.method} server did not start in {timeout:.0f} s ({self.log})")

    def stop(self) -> None:
        stop_process(self.proc, timeout=60)
        self._out.close()


def main(argv: list[str] | None = None) -> None:
    import argparse

    from .methods import METHODS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="switchsd", choices=METHODS)
    ap.add_argument("--k", type=int, default=None, help="draft cap (default: the method's own)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--memory", type=float, default=0.3, help="vLLM's --gpu-memory-utilization (on CPU: KV cache)")
    a = ap.parse_args(argv)
    why = missing()
    if why:
        raise SystemExit(f"error: {why}")
    from switchsd.models.loading import default_model_folder
    try:
        cmd, env = command(a.method, str(default_model_folder()), a.port, a.k, a.memory)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    os.chdir(ROOT)
    os.execve(cmd[0], cmd, env)
