"""Self-describing records of benchmark runs: what `switchsd report` builds the results pages from.

A record is one gzipped JSON file holding everything needed to re-derive and to trust a table: the machine
(CPU model and flags, cores, L3), the versions (Python, torch, transformers, llama.cpp), the commit (and whether
the tree had uncommitted changes), the model and format, the head and probe files with their SHA-256, the
command and date, and per method and prompt the token ids, the text, the wall time and the path statistics.
Figures are never stored twice: a page recomputes them from the per-prompt runs (`aggregate`).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from ..core.events import add_counts

SCHEMA = "switchsd-record/1"
ROOT = Path(__file__).resolve().parents[2]
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16")


def aggregate(records: list[dict], vanilla_ids: dict) -> dict:
    """Per-prompt records of one method -> its summary row (Tok/s as the mean of per-prompt rates, Spec-Bench's
    convention; tokens per target forward; per path % of steps and MAL; outputs identical to vanilla's)."""
    rates = [r["stats"]["tok_s"] for r in records]
    tokens = sum(r["stats"]["new_tokens"] for r in records)
    wall = sum(r["stats"]["wall_s"] for r in records)
    steps = sum(r["stats"]["steps"] for r in records)
    paths: dict[str, dict] = {}
    for r in records:
        for name, p in r["stats"]["paths"].items():
            a = paths.setdefault(name, {"steps": 0, "accepted": 0, "zero": 0, "tried": [], "hit": []})
            a["steps"] += p["steps"]
            a["accepted"] += p["accepted"]
            a["zero"] += p.get("zero", 0)
            for key in ("tried", "hit"):                  # per draft position (switchsd.core.events)
                add_counts(a[key], p.get(key, []))
    return {
        "tok_s": sum(rates) / len(rates) if rates else 0.0,
        "tok_s_total": tokens / wall if wall else 0.0,
        "tok_per_fwd": tokens / steps if steps else 0.0,
        "new_tokens": tokens,
        "identical": sum(r["token_ids"] == vanilla_ids[r["id"]] for r in records),
        "n": len(records),
        "paths": {k: {"pct": 100.0 * v["steps"] / steps, "mal": v["accepted"] / v["steps"] if v["steps"] else 0.0,
                      "zero_accept": v["zero"] / v["steps"] if v["steps"] else 0.0,
                      **({"accept_at": [h / t for h, t in zip(v["hit"], v["tried"])]} if v["tried"] else {})}
                  for k, v in sorted(paths.items())},
    }


def machine() -> dict:
    """This machine as a record names it: CPU model, the flags that decide kernels, cores, L3, memory."""
    cpu, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu in ("unknown", "", "x86_64"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    l3 = None
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "level").read_text().strip() == "3":
                l3 = (index / "size").read_text().strip()
        except OSError:
            continue
    mem = None
    try:
        mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {"cpu": cpu, "flags": [f for f in FLAGS if f in flags], "cores": os.cpu_count(), "l3": l3,
            "memory_gib": mem, "platform": platform.platform()}


def machine_label(m: dict) -> str:
    """'Intel(R) Xeon(R) Processor, 2 cores, L3 480M, AVX-512 + AMX' -- one line for a table heading."""
    f = set(m.get("flags", []))
    isa = "AMX" if "amx_tile" in f else "AVX-512" if "avx512f" in f else "AVX2" if "avx2" in f else "x86"
    if isa == "AMX":
        isa = "AVX-512 + AMX"
    return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, L3 {_size(m.get('l3'))}, {isa}"


def machine_tag(m: dict) -> str:
    """'intel-xeon-amx', 'amd-epyc-avx512': the folder a machine's file records live in (docs/records/files/TAG)."""
    words = [w for w in re.sub(r"\(.*?\)|processor|cpu|\d+-core", " ", m.get("cpu", "").lower()).split() if w.isalnum()]
    f = set(m.get("flags", []))
    isa = "amx" if "amx_tile" in f else "avx512" if "avx512f" in f else "avx2" if "avx2" in f else "x86"
    return "-".join(words[:2] + [isa])


def _size(text: str | None) -> str:
    """'491520K' (sysfs) -> '480 MiB'."""
    if not text:
        return "?"
    num, unit = text[:-1], text[-1].upper()
    if not num.isdigit() or unit not in "KMG":
        return text
    kib = int(num) * {"K": 1, "M": 1024, "G": 1024 ** 2}[unit]
    return f"{kib / 1024:g} MiB" if kib >= 1024 else f"{kib} KiB"


def commit() -> dict:
    """The checkout's commit and whether tracked files outside docs/ differ from it (docs/ holds the records and
    pages runs write: a series of runs stays "clean" as it records)."""
    def git(*a):
        r = subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    sha = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs")
    return {"sha": sha, "dirty": bool(dirty)} if sha else {"sha": None, "dirty": None}


def file_hash(path: str | os.PathLike | None) -> dict | None:
    """{path, sha256} of a file (a folder: its model.safetensors), None when there is none."""
    if not path:
        return None
    p = Path(path)
    if p.is_dir():
        p = p / "model.safetensors"
    if not p.is_file():
        return {"path": str(path), "sha256": None}
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    try:
        shown = str(p.resolve().relative_to(ROOT))
    except ValueError:
        shown = p.name
    return {"path": shown, "sha256": h.hexdigest()}


def versions(llama_cpp: str | None = None, llama_cpp_amx: str | None = None) -> dict:
    import importlib.metadata as md
    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "vllm"):
        try:
            out[pkg] = md.version(pkg if pkg != "vllm" else "vllm")
        except md.PackageNotFoundError:
            out[pkg] = None
    out["llama_cpp"] = llama_cpp
    out["llama_cpp_amx"] = llama_cpp_amx
    return out


def local_paths_out(text: str, model: str | None) -> str:
    """`text` without the folder of a model file (a .gguf path of this machine names the file alone)."""
    if model and str(model).endswith(".gguf") and os.sep in str(model):
        return str(text).replace(str(Path(model).parent) + os.sep, "")
    return str(text)


def write_record(path: Path, *, meta: dict, methods: list[str], records: dict[str, list[dict]],
                 texts: dict[str, dict[str, str]], mismatches: list | None) -> Path:
    """One benchmark run -> a gzipped record at `path` (atomically)."""
    rec = {
        "schema": SCHEMA, "kind": "bench", "dataset": meta["dataset"], "date": meta["date"],
        "command": local_paths_out(meta["command"], meta["model"]), "machine": machine(), "versions": versions(meta.get("llama_cpp"), meta.get("llama_cpp_amx")),
        "commit": meta.get("commit") or commit(), "model": local_paths_out(meta["model"], meta["model"]),
        "format": meta["dtype"], "device": meta["device"],
        "files": {"head": file_hash(meta.get("head_path")), "probe": file_hash(meta.get("probe_path")),
                  "head_gguf": file_hash(meta.get("head_gguf"))},
        "settings": {**{k: meta[k] for k in ("n_prompts", "chat", "budget", "engine", "copy", "max_new_tokens")
                        if k in meta},
                     "budget_source": Path(str(meta.get("budget_source", ""))).name},   # no path of this machine
        "methods": methods,
        "runs": {m: [{**r, "text": texts.get(m, {}).get(r["id"], "")} for r in records[m]] for m in methods},
        "mismatches": mismatches,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", compresslevel=9) as f:
        json.dump(rec, f, separators=(",", ":"))
    os.replace(tmp, path)
    return path


def read_record(path: Path) -> dict:
    try:
        with gzip.open(path, "rt") as f:
            rec = json.load(f)
    except (OSError, json.JSONDecodeError, EOFError) as e:
        raise ValueError(f"{path}: not a readable record ({e.__class__.__name__})") from None
    if rec.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {rec.get('schema')!r}, expected {SCHEMA}")
    return rec


def summarize(rec: dict) -> dict[str, dict]:
    """A record's per-method summary rows, recomputed from its runs (speedup over vanilla's mean Tok/s)."""
    runs = rec["runs"]
    vanilla = {r["id"]: r["token_ids"] for r in runs["vanilla"]}
    out = {m: aggregate(runs[m], vanilla) for m in rec["methods"] if m in runs}
    base = out["vanilla"]["tok_s"]
    for s in out.values():
        s["speedup"] = s["tok_s"] / base if base else 0.0
    return out


if __name__ == "__main__":      # print a record's machine line and summary
    r = read_record(Path(sys.argv[1]))
    print(machine_label(r["machine"]))
    print(json.dumps({m: round(s["tok_s"], 2) for m, s in summarize(r).items()}))
