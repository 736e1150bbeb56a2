"""The verification cost curve of a GGUF file, this project's forward beside llama.cpp's, in one run on one machine.

    python -m switchsd.eval.curve --shape llama-3.2-1b --record runs/curve-llama-3.2-1b.json.gz
    python -m switchsd.eval.curve --model FILE.gguf

Ours: the forward of `--dtype auto` on the file, a forward of R rows after a context of `--depth` tokens (the rows
of a verify), median of `--repeats` rounds after a warm-up round, each round every R in turn. llama.cpp's:
`llama-bench` on the same file and threads, `-p R -d depth` (a batch of R rows after the same context) and
`-n 32 -d depth` (decoding). The ratio R rows / 1 row says how much a verify of R rows costs over a plain decode
step: what the cost gate's prices and the budget are made of (`switchsd calibrate` measures the same curve for the
gate).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..kernels.memread import read_bandwidth
from .llama_server import build_dir, missing, version
from .records import SCHEMA, commit, file_hash, machine, versions

ROWS = (1, 2, 4, 8, 16)
REPEATS = 9         # measured rounds of every row count (after one warm-up round)


@torch.inference_mode()
def ours(path: Path, rows=ROWS, depth: int = 256, repeats: int = REPEATS) -> dict:
    """{format, load_s, ms: {R: median ms of an R-row forward after `depth` tokens}}."""
    from ..models.forward import own_forward
    from ..models.loading import load_model
    t = time.perf_counter()
    lm = load_model(str(path), "auto", "cpu")
    load_s = time.perf_counter() - t
    fwd = own_forward(lm.model)
    cache = fwd.new_cache(depth + max(rows) + 8)
    g = torch.Generator().manual_seed(0)
    vocab = lm.model.config.vocab_size
    fwd.forward(torch.randint(0, vocab, (1, depth), generator=g), cache, logit_rows=-1)
    times: dict[int, list[float]] = {r: [] for r in rows}
    for i in range(repeats + 1):          # the row counts in turn: a slow drift of the machine meets each alike
        for r in rows:
            ids = torch.randint(0, vocab, (1, r), generator=g)
            t = time.perf_counter()
            fwd.forward(ids, cache)
            times[r].append(time.perf_counter() - t)
            cache.length = depth
    out = {r: 1e3 * statistics.median(ts[1:]) for r, ts in times.items()}        # the first round: a warm-up
    return {"format": lm.precision, "load_s": load_s, "ms": out, "read_gbs": read_bandwidth()}


def llama_bench(path: Path, rows=ROWS, depth: int = 256, threads: int | None = None, repeats: int = 3) -> dict:
    """llama-bench's {ms: {R: ms of an R-row batch after `depth` tokens}, decode_ms} on the same file."""
    threads = threads or torch.get_num_threads()
    cmd = [str(build_dir() / "bin" / "llama-bench"), "-m", str(path), "-p", ",".join(map(str, rows)), "-n", "32",
           "-d", str(depth), "-r", str(repeats), "-t", str(threads), "-o", "json"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"llama-bench failed: {res.stderr.strip().splitlines()[-1:]}")
    ms, decode = {}, None
    for r in json.loads(res.stdout):
        if r["n_gen"]:
            decode = 1e3 / r["avg_ts"]
        else:
            ms[int(r["n_prompt"])] = 1e3 * r["n_prompt"] / r["avg_ts"]
    shown = [Path(c).name if i in (0, 2) else c for i, c in enumerate(cmd)]      # no path of this machine
    return {"ms": ms, "decode_ms": decode, "command": " ".join(shown)}


def kernels() -> dict:
    """The kernel path a forward takes here, and from how many rows the AMX tiles carry the products (0: never)."""
    from ..kernels.build import amx_rows
    from ..kernels.q4q8 import best_path
    return {"path": best_path(), "amx_rows": amx_rows()}


def run(path: Path, shape: str | None, rows=ROWS, depth: int = 256, command: str = "", repeats: int = REPEATS) -> dict:
    started = commit()
    llama = llama_bench(path, rows, depth)
    mine = ours(path, rows, depth, repeats)
    return {"schema": SCHEMA, "kind": "curve", "shape": shape, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": command, "machine": machine(), "versions": versions(version()), "commit": started,
            "file": {**(file_hash(path) or {}), "name": path.name, "bytes": path.stat().st_size},
            "format": mine["format"], "depth": depth, "rows": list(rows), "repeats": repeats, "load_s": mine["load_s"],
            "read_gbs": mine["read_gbs"], "kernels": kernels(),
            "ours_ms": {str(k): v for k, v in mine["ms"].items()},
            "llama_ms": {str(k): v for k, v in llama["ms"].items()}, "llama_decode_ms": llama["decode_ms"],
            "llama_command": llama["command"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m switchsd.eval.curve", description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--shape", help="a synthetic shape (switchsd.eval.synthetic.SHAPES), made on first use")
    src.add_argument("--model", type=Path, help="a GGUF file")
    ap.add_argument("--type", default="Q4_K_M", help="the synthetic shape's llama-quantize type")
    ap.add_argument("--depth", type=int, default=256, help="context tokens before the measured rows")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="measured rounds of every row count (after one warm-up)")
    ap.add_argument("--record", type=Path, help="write the record here (gzipped JSON)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    why = missing()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 1
    if args.shape:
        from .synthetic import gguf
        path = gguf(args.shape, args.type)
    else:
        path = args.model
    command = "python -m switchsd.eval.curve " + " ".join(argv if argv is not None else sys.argv[1:])
    rec = run(path, args.shape, depth=args.depth, repeats=args.repeats, command=command)
    one, lone = rec["ours_ms"]["1"], rec["llama_ms"]["1"]
    print(f"{path.name}: ours {rec['format']}, llama.cpp decode {rec['llama_decode_ms']:.1f} ms"
          + (f"; memory reads {rec['read_gbs']:.1f} GB/s here" if rec["read_gbs"] else ""))
    print("rows  ours ms (x 1 row)  llama.cpp ms (x 1 row)")
    for r in rec["rows"]:
        o, ll = rec["ours_ms"][str(r)], rec["llama_ms"][str(r)]
        print(f"{r:4d}  {o:7.1f} ({o / one:.2f}x)   {ll:7.1f} ({ll / lone:.2f}x)")
    if args.record:
        import gzip
        import os
        args.record.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.record.with_name(args.record.name + ".tmp")
        with gzip.open(tmp, "wt", compresslevel=9) as f:
            json.dump(rec, f, separators=(",", ":"))
        os.replace(tmp, args.record)
        print(f"record: {args.record}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
