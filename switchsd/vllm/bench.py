"""vLLM's own client (`vllm bench serve`) against vLLM's own server, one server per speculative method, greedy,
float32, the project's prompt sets; each request's text saved so every method can be compared with `none`.
Resumable: a (method, set, concurrency) whose result file exists is skipped. Needs `make vllm`.

    switchsd vllm bench                                        # every method, four sets, concurrency 1 4 16
    switchsd vllm bench --methods none,suffix,switchsd --sets humaneval:8 math500:8 --conc 1 4 --max-new 128 \\
        --out runs/vllm-small
    switchsd vllm report runs/vllm                             # the tables

Methods (switchsd/vllm/methods.py): none, ngram, suffix, eagle3, copy, switchsd. Every run starts on a fresh server:
suffix decoding's tree and the gate's back-off counts keep every request's output across requests (a run would
draft the answers the previous run, same prompts, wrote), and a server that served a run starts the next warm.
Drift-free pairs of two methods: `switchsd vllm pair`.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path

from .methods import METHODS
from .server import VPY, VllmServer, missing


def _sets(specs: list[str]) -> list[tuple[str, int]]:
    out = []
    for s in specs:
        name, _, n = s.partition(":")
        if not n.isdigit() or int(n) < 1:
            raise SystemExit(f"error: --sets {s!r}: expected NAME:N with N >= 1")
        out.append((name, int(n)))
    return out


def _has_suffix() -> bool:
    return subprocess.run([str(VPY), "-c", "import arctic_inference.suffix_decoding"], capture_output=True
                          ).returncode == 0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    ap.add_argument("--sets", nargs="+", default=["humaneval:40", "math500:40", "cnndm:20", "mtbench:20"])
    ap.add_argument("--conc", nargs="+", type=int, default=[1, 4, 16], help="client concurrencies")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--k", type=int, default=None, help="draft cap of suffix, copy and switchsd (default: their own)")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--out", default="runs/vllm")
    a = ap.parse_args(argv)
    methods = [m for m in a.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise SystemExit(f"error: unknown method(s) {bad}; choose from {', '.join(METHODS)}")
    if a.max_new < 1 or any(c < 1 for c in a.conc):
        raise SystemExit("error: --max-new and --conc must be >= 1")
    why = missing()
    if why:
        raise SystemExit(f"error: {why}")
    from switchsd.eval.datasets import load_prompts
    from switchsd.models.loading import default_model_folder
    sets, model = _sets(a.sets), str(default_model_folder())
    out = Path(a.out).resolve()
    (out / "prompts").mkdir(parents=True, exist_ok=True)
    for ds, n in sets:        # vLLM's custom dataset: one {"prompt": ...} per line (the server applies the template)
        rows = load_prompts(ds, limit=n)
        (out / "prompts" / f"{ds}.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in rows))
    for m in methods:
        if m == "suffix" and not _has_suffix():
            (out / "suffix.skipped").write_text("arctic-inference is not installed in .venv-vllm\n")
            print("skip suffix: arctic-inference is not installed in .venv-vllm")
            continue
        todo = [(ds, n, c) for ds, n in sets for c in a.conc if not (out / m / f"{ds}-c{c}.json").exists()]
        for ds, n, c in todo:
            counts = out / m / "counts.json"
            counts.unlink(missing_ok=True)          # a new server counts from zero
            server = VllmServer(m, model, a.port, out / m / "server.log", a.k, counts=counts)
            try:
                server.wait()
                print(f"== {m} {ds} concurrency {c}", flush=True)
                if counts.exists():
                    shutil.copy(counts, out / m / f"{ds}-c{c}.counts-before.json")
                part = out / m / f"{ds}-c{c}.json.part"
                cmd = [str(VPY), "-m", "switchsd.vllm.cli", "bench", "serve", "--backend", "openai-chat",
                       "--endpoint", "/v1/chat/completions", "--base-url", f"http://127.0.0.1:{a.port}",
                       "--model", model, "--dataset-name", "custom", "--dataset-path",
                       str(out / "prompts" / f"{ds}.jsonl"), "--num-prompts", str(n), "--custom-output-len",
                       str(a.max_new), "--max-concurrency", str(c), "--temperature", "0", "--seed", "0",
                       "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,90", "--save-result",
                       "--save-detailed", "--result-dir", str(out / m), "--result-filename", part.name]
                with open(out / m / f"{ds}-c{c}.log", "w") as log:
                    if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                        raise SystemExit(f"error: bench failed ({out / m / f'{ds}-c{c}.log'})")
                time.sleep(1)           # the plugin rewrites its counts file at most every 0.5 s (copy.FLUSH_S)
                if counts.exists():
                    shutil.copy(counts, out / m / f"{ds}-c{c}.counts-after.json")
                done = json.loads(part.read_text())["completed"]
                if done != n:
                    raise SystemExit(f"error: {n - done} of {n} requests failed ({server.log})")
                part.rename(out / m / f"{ds}-c{c}.json")
            finally:
                server.stop()
    print(f"done: switchsd vllm report {out}")
