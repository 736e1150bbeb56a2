"""llama.cpp as its users run it: its own `llama-server`, built by `make llama-cpp`, as benchmark rows.

- `llama-cpp`: plain decoding;
- `llama-cpp-ngram`: `--spec-default` (its ngram-mod drafter, the speculation llama.cpp turns on by default);
- `llama-cpp-eagle3`: `--spec-type draft-eagle3` with the shipped EAGLE-3 head, converted by llama.cpp's own
  `convert_hf_to_gguf.py` (cached beside the build);
- `llama-cpp-hybrid`: ngram-mod and draft-eagle3 together (llama.cpp tries the draftless type first);
- `llama-cpp-f32kv`: plain decoding with a float32 key/value cache (llama.cpp's default is float16): where its text
  and this project's part, which of the two arithmetics makes the difference.

Every row gets the same prompt token ids as the engine (chat template included) through `/completion`, greedy
(temperature 0), no prompt cache, up to max_new_tokens, stopping at the model's end of generation. Its time is
the client's wall clock around the request, so prefill is counted as for every other row. Tokens per forward
come from the server's own draft counters (accepted drafts + one token per target forward).

    python -m switchsd.eval.llama_server --self-test [--build DIR]   # a server run in a subprocess: 0 = survives
"""
from __future__ import annotations

import argparse
import atexit
import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch

from ..core.config import EngineConfig
from ..core.engine import Generation
from ..io import stop_process
from ..models.loading import cache_dir

SERVER_PEERS = ("llama-cpp", "llama-cpp-ngram", "llama-cpp-eagle3", "llama-cpp-hybrid", "llama-cpp-f32kv")
SPEC_FLAGS = {"llama-cpp": [], "llama-cpp-f32kv": ["--cache-type-k", "f32", "--cache-type-v", "f32"],
              "llama-cpp-ngram": ["--spec-default"],
              "llama-cpp-eagle3": ["--spec-type", "draft-eagle3"],
              "llama-cpp-hybrid": ["--spec-default", "--spec-type", "draft-eagle3"]}
NEEDS_HEAD = ("llama-cpp-eagle3", "llama-cpp-hybrid")
CONTEXT = 4096
START_TIMEOUT_S = 120.0


def llama_cpp_home() -> Path:
    return cache_dir() / "llama.cpp"


def build_dir() -> Path:
    """The build the benchmark uses (`make llama-cpp` points `active` at it)."""
    return llama_cpp_home() / "active"


def missing(build: Path | None = None) -> str | None:
    """None when llama-server is built, else one line saying how to build it."""
    exe = (build or build_dir()) / "bin" / "llama-server"
    if exe.exists():
        return None
    return f"llama.cpp is not built ({exe} missing): run `make llama-cpp` (about 10 minutes on 2 cores, once)"


def version(build: Path | None = None) -> str:
    """`llama-server --version`'s build line, e.g. 'version: 1 (abc123)'."""
    exe = (build or build_dir()) / "bin" / "llama-server"
    try:
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = [x for x in (out.stdout + out.stderr).splitlines() if x.startswith("version")]
    line = lines[0].split(":", 1)[1].strip() if lines else "unknown"
    return f"{line}, from the llama-cpp-python 0.3.36 source distribution"


def amx_note() -> str | None:
    """What the AMX build's server self-test said (`make llama-cpp LLAMA_CPP_AMX=1`), or None if never tried."""
    f = llama_cpp_home() / "amx-self-test.txt"
    if not f.exists():
        return None
    text = f.read_text().strip().splitlines()
    active = build_dir().resolve().name
    said = text[-1].split(": /", 1)[0] if text else "no output"          # the command's paths are this machine's
    return f"AMX build {'in use' if active == 'build-amx' else 'not used'}: {said}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def eagle3_gguf(head: Path, target_folder: Path) -> Path:
    """The EAGLE-3 head as a GGUF, by llama.cpp's own converter (`--target-model-dir`), cached by content."""
    weights = head / "model.safetensors"
    digest = hashlib.sha256(weights.read_bytes() + (head / "config.json").read_bytes()).hexdigest()[:12]
    out = llama_cpp_home() / f"eagle3-{head.name}-{digest}.gguf"
    if out.exists():
        return out
    src = llama_cpp_home() / "src"
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "target"      # the converter reads `architectures` from the target's config
        target.mkdir()
        for f in target_folder.iterdir():
            if f.name != "config.json":
                os.symlink(f.resolve(), target / f.name)
        cfg = json.loads((target_folder / "config.json").read_text())
        cfg.setdefault("architectures", ["LlamaForCausalLM"])
        (target / "config.json").write_text(json.dumps(cfg))
        part = out.with_suffix(".part")
        cmd = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(head), "--target-model-dir", str(target),
               "--outtype", "q8_0", "--outfile", str(part)]
        res = subprocess.run(cmd, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(src / "gguf-py")})
        if res.returncode != 0 or not part.exists():
            tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-5:])
            raise RuntimeError(f"llama.cpp's converter failed on {head}:\n{tail}")
        part.rename(out)
    return out


class LlamaServer:
    """One `llama-server` process on 127.0.0.1, started and stopped by this object."""

    def __init__(self, gguf: Path, flags: Sequence[str] = (), threads: int | None = None,
                 build: Path | None = None, log: Path | None = None):
        why = missing(build)
        if why:
            raise RuntimeError(why)
        exe = (build or build_dir()) / "bin" / "llama-server"
        threads = threads or torch.get_num_threads()
        self.port = _free_port()
        self.log = open(log, "ab") if log else subprocess.DEVNULL
        self.cmd = [str(exe), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port), "-t", str(threads),
                    "-tb", str(threads), "-c", str(CONTEXT), "-np", "1", "--no-webui", *flags]
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        atexit.register(self.close)      # never leave a server behind an interrupted benchmark
        self._wait()

    def _wait(self) -> None:
        t0 = time.time()
        while time.time() - t0 < START_TIMEOUT_S:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
                raise RuntimeError(f"llama-server {how} at start: {' '.join(self.cmd)}")
            try:
                status, _ = self._request("GET", "/health", None, timeout=5)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"llama-server did not start within {START_TIMEOUT_S:.0f} s: {' '.join(self.cmd)}")

    def _request(self, method: str, path: str, body: dict | None, timeout: float = 600) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers={"Content-Type": "application/json"})
            res = conn.getresponse()
            raw = res.read()
        finally:
            conn.close()
        try:
            return res.status, json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return res.status, {"raw": raw[:200].decode(errors="replace")}

    def complete(self, prompt_ids: Sequence[int], max_new_tokens: int) -> tuple[dict, float]:
        """Greedy completion of token ids -> (the server's JSON answer, client wall seconds)."""
        body = {"prompt": [int(t) for t in prompt_ids], "n_predict": int(max_new_tokens), "temperature": 0.0,
                "top_k": 1, "repeat_penalty": 1.0, "cache_prompt": False, "return_tokens": True, "seed": 0,
                "stream": False}
        t0 = time.perf_counter()
        status, out = self._request("POST", "/completion", body)
        wall = time.perf_counter() - t0
        if status != 200:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server died (exit {self.proc.returncode}) on a request")
            raise RuntimeError(f"llama-server answered {status}: {str(out)[:200]}")
        return out, wall

    def close(self) -> None:
        stop_process(self.proc)
        if self.log is not subprocess.DEVNULL and not self.log.closed:
            self.log.close()


class LlamaServerPeer:
    """A benchmark row run by llama-server: `run(ids, generator) -> Generation`, like an Engine."""

    def __init__(self, kind: str, gguf: Path, cfg: EngineConfig, eos_ids: Sequence[int],
                 head_gguf: Path | None = None, log: Path | None = None):
        if kind not in SERVER_PEERS:
            raise ValueError(f"unknown llama.cpp row {kind!r}; choose from {', '.join(SERVER_PEERS)}")
        if not cfg.sampling.greedy:
            raise ValueError("the llama.cpp rows run greedy decoding only (T = 0)")
        flags = list(SPEC_FLAGS[kind])
        if kind in NEEDS_HEAD:
            if head_gguf is None:
                raise ValueError(f"{kind} needs the EAGLE-3 head as a GGUF")
            flags += ["-md", str(head_gguf)]
        self.kind, self.cfg = kind, cfg
        self.eos = set(int(e) for e in eos_ids) if cfg.stop_at_eos else set()
        self.server = LlamaServer(gguf, flags, log=log)

    def run(self, prompt_ids: Sequence[int], generator: torch.Generator | None = None) -> Generation:
        out, wall = self.server.complete(prompt_ids, self.cfg.max_new_tokens)
        new = [int(t) for t in out.get("tokens", [])]
        if out.get("stop_type") == "eos" and self.eos and (not new or new[-1] not in self.eos):
            new.append(min(self.eos))      # the engine keeps the end-of-generation token; the server drops it
        cut = next((i for i, t in enumerate(new) if t in self.eos), None)
        new = new[:cut + 1] if cut is not None else new[:self.cfg.max_new_tokens]
        t = out.get("timings", {})
        drafted, accepted = int(t.get("draft_n", 0) or 0), int(t.get("draft_n_accepted", 0) or 0)
        steps = max(len(new) - accepted, 1)
        stats = {"new_tokens": len(new), "steps": steps, "target_forwards": steps, "tok_per_fwd": len(new) / steps,
                 "wall_s": wall, "tok_s": len(new) / wall if wall > 0 else 0.0, "draft_s": 0.0, "verify_s": wall,
                 "prompt_ms": t.get("prompt_ms"), "predicted_ms": t.get("predicted_ms"),
                 "paths": {self.kind: {"steps": steps, "accepted": accepted, "drafted": drafted,
                                       "zero": 0, "pct": 100.0, "mal": accepted / steps}}}
        return Generation(list(prompt_ids), new, [], stats)

    def close(self) -> None:
        self.server.close()


def self_test(build: Path, gguf: Path) -> int:
    """Start a server from `build` and complete a 300-token prompt; 0 when it survives (run in a subprocess)."""
    try:
        srv = LlamaServer(gguf, build=build)
    except RuntimeError as e:
        print(f"self-test: {e}", file=sys.stderr)
        return 1
    try:
        ids = [1] + [100 + (i * 37) % 3000 for i in range(300)]
        out, _ = srv.complete(ids, 32)
        ok = len(out.get("tokens", [])) > 0
        print(f"self-test: {'survived' if ok else 'no tokens'}: {build}", file=sys.stderr)
        return 0 if ok else 1
    except (RuntimeError, OSError) as e:
        print(f"self-test: {e}", file=sys.stderr)
        return 1
    finally:
        srv.close()


def main(argv=None) -> int:
    from ..models.loading import GGUF_FILE, gguf_folder
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--self-test", action="store_true", help="start a server and complete one prompt")
    ap.add_argument("--convert-head", default=None, metavar="DIR",
                    help="convert an EAGLE-3 head folder with llama.cpp's converter (cached)")
    ap.add_argument("--build", type=Path, default=None, help="a llama.cpp build folder (default: the active one)")
    ap.add_argument("--model", type=Path, default=None, help="a GGUF (default: the offline model)")
    args = ap.parse_args(argv)
    gguf = args.model or gguf_folder() / GGUF_FILE
    if args.convert_head:
        from ..models.loading import default_model_folder
        print(eagle3_gguf(Path(args.convert_head), default_model_folder()))
        return 0
    if args.self_test:
        return self_test(args.build or build_dir(), gguf)
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
