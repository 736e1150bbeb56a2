"""docs/files.md from the file and curve records, one section per machine (docs/records/files/MACHINE/*.json.gz,
MACHINE as `records.machine_tag` names a CPU: intel-xeon-amx, amd-epyc-avx512, ...). Written by `switchsd report`."""
from __future__ import annotations

from pathlib import Path

from .records import ROOT, machine_label, summarize
from .tables import ORDER, SETS, load_records, mismatch_lines, ratio

FILES = ROOT / "docs" / "files.md"
FILE_TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "f16")


class Machine:
    """One machine's records: its folder's tag, bench records of files (the table and the llama.cpp cache runs) and
    real-size curves."""

    def __init__(self, folder: Path):
        self.tag = folder.name
        rank = {t: i for i, t in enumerate(FILE_TYPES)}
        recs = load_records(folder)
        self.kv = [(n, r) for n, r in recs if "llama-cpp-f32kv" in r["methods"]]
        self.files = sorted([(n, r) for n, r in recs if "llama-cpp-f32kv" not in r["methods"]],
                            key=lambda x: (rank.get(_file_type(x[1]), len(rank)),
                                           ORDER.index(x[1]["dataset"]) if x[1]["dataset"] in ORDER else len(ORDER)))
        self.curves = load_records(folder, "curve")
        first = (self.files + self.kv + self.curves or [(None, {})])[0][1]
        self.label = machine_label(first["machine"]) if first else self.tag

    def path(self, name: str) -> str:
        return f"docs/records/files/{self.tag}/{name}"


def load_machines(folder: Path) -> list[Machine]:
    """Every machine folder under `folder` that holds records, in name order."""
    found = [Machine(d) for d in sorted(folder.iterdir()) if d.is_dir()] if folder.is_dir() else []
    return [m for m in found if m.files or m.kv or m.curves]


def n_records(machines: list[Machine]) -> int:
    return sum(len(m.files) + len(m.kv) + len(m.curves) for m in machines)


def _file_type(rec: dict) -> str:
    """'Q4_K_M' from a record of a file made by switchsd.eval.ggufs (its name ends -<type>.gguf)."""
    name = Path(str(rec.get("model", ""))).name
    return name.rsplit("-", 1)[-1].removesuffix(".gguf") if name.endswith(".gguf") else name


def files_table(recs: list[tuple[str, dict]]) -> list[str]:
    """One row per file and set: each method's Tok/s, vanilla over llama.cpp, switchsd over vanilla, identity."""
    methods = ["llama-cpp", "vanilla", "pld", "eagle3", "switchsd"]
    rows = ["| file | format here | set | " + " | ".join(methods) + " | vanilla / llama-cpp | switchsd / vanilla "
            "| identical to vanilla | llama-cpp's text = vanilla's |", "|---" * (len(methods) + 7) + "|"]
    for _, rec in recs:
        summ = summarize(rec)
        cpp, van = summ.get("llama-cpp", {}).get("tok_s", 0.0), summ["vanilla"]["tok_s"]
        ours = [m for m in summ if not m.startswith("llama-cpp") and m != "vanilla"]
        same = f"{sum(summ[m]['identical'] for m in ours)}/{sum(summ[m]['n'] for m in ours)}"
        cells = [f"{summ[m]['tok_s']:.1f}" if m in summ else "-" for m in methods]
        rows.append(f"| {_file_type(rec)} | {rec['format']} | {SETS.get(rec['dataset'], rec['dataset'])} "
                    f"{rec['settings'].get('n_prompts')} | " + " | ".join(cells) +
                    f" | {ratio(van, cpp) if cpp else '-'} | {ratio(summ['switchsd']['tok_s'], van) if 'switchsd' in summ else '-'}"
                    f" | {same} | " + (f"{summ['llama-cpp']['identical']}/{summ['llama-cpp']['n']}" if cpp else "-") + " |")
    return rows


def curve_lines(path: str, rec: dict) -> list[str]:
    ours, llama = rec["ours_ms"], rec["llama_ms"]
    c = rec["commit"]
    one, lone = ours["1"], llama["1"]
    out = [f"#### {rec.get('shape') or rec['file']['name']}: {rec['file']['bytes'] / 1e6:.0f} MB ({rec['file']['name']})",
           "", f"Machine: {machine_label(rec['machine'])}. Commit `{(c.get('sha') or '?')[:10]}`"
           f"{' (with uncommitted changes)' if c.get('dirty') else ''}, {rec['date']}; format here {rec['format']} "
           f"(loaded in {rec['load_s']:.0f} s){_kernels(rec)}; llama.cpp {rec['versions'].get('llama_cpp') or '-'}; after "
           f"{rec['depth']} tokens of context; ours: {_protocol(rec)}. Record: `{path}`.", "",
           f"    {rec['command'].replace('python -m switchsd.eval.curve', 'python -m switchsd.eval.curve')}",
           f"    {rec['llama_command']}", "",
           f"Decoding: this project's one-row step {one:.1f} ms ({1e3 / one:.1f} tok/s), llama.cpp's "
           f"{rec['llama_decode_ms']:.1f} ms ({1e3 / rec['llama_decode_ms']:.1f} tok/s): "
           f"**{ratio(rec['llama_decode_ms'], one)}**." + _floor(rec), "",
           "| rows | this project, ms | x 1 row | llama.cpp, ms | x 1 row |", "|---|---|---|---|---|"]
    for r in rec["rows"]:
        o, ll = ours[str(r)], llama[str(r)]
        out.append(f"| {r} | {o:.1f} | {o / one:.2f}x | {ll:.1f} | {ll / lone:.2f}x |")
    from ..models.calibrate import budget_from_curve, shapes_that_pay
    curve = {int(k): v for k, v in ours.items()}
    pay = shapes_that_pay(curve)
    out += ["", f"The cost gate's defaults on this file, by `switchsd calibrate`'s rules on this curve: a budget of "
            f"**{budget_from_curve(curve)}** rows (the widest verify costing at most 2x a one-row step); a draft "
            "pays from this many expected accepted tokens (its drafting time aside): " +
            ", ".join(f"{n} {pay[n]:.2f}" for n in ("chain1", "chain3", "chain8", "copy10")) + "."]
    return out


def _protocol(rec: dict) -> str:
    """How our side's times were taken (records before the rounds: each row count's repeats one after another)."""
    if "repeats" in rec:
        return f"the median of {rec['repeats']} rounds, each round every row count in turn, after a warm-up round"
    return "the median of 7 forwards per row count, the row counts one after another, after a warm-up forward"


INTRO = ("A `.gguf` file is enough: `switchsd generate --model FILE.gguf --prompt ... --chat`. Architecture, sizes, "
         "rope and tokenizer come from the file; `--dtype auto` runs the file's own blocks in this project's C "
         "forward (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, mixed as `llama-quantize` mixes them; F16 / BF16 "
         "matrices as they are), format `q4q8` below whatever the file's types. In that format the matrices are "
         "never de-quantised: only the embedding, norms and biases are read as floats (`switchsd/models/skeleton.py`"
         "), and transformers' forward is refused with one line (`--dtype float32` loads the dense model). "
         "The shipped probe and EAGLE-3 head are found by the model's fingerprint "
         "(architecture, sizes, vocabulary), so every file of the offline model finds them; another model's "
         "are refused with one line.")
MACHINES = ("CPUs differ (memory bandwidth, caches, AVX-512, AMX), and so do the ratios: each machine's runs are "
            "in their own section, every comparison inside one run on that machine (`make bench-files` and "
            "`make bench-shapes` write to `docs/records/files/MACHINE/`).")
KV = ("Both decode greedily, so a difference is a near-tie that two arithmetics round apart (the first "
      "differing token and vanilla's float32 margin there are listed under each table). llama.cpp keeps "
      "its key/value cache in float16 by default; the `llama-cpp-f32kv` row runs the same server with a "
      "float32 cache (`--cache-type-k f32 --cache-type-v f32`), as this project's cache is. Where the two "
      "llama.cpp runs write the same texts, the cache is not where they part. On the f16 file, where "
      "neither side cuts activations to 8-bit blocks (llama.cpp rounds them to float16, this project keeps "
      "float32), llama.cpp's texts equal this project's on almost every prompt (the tables above); on the "
      "quantised files on few: the difference is in how activations are quantised before each product "
      "(llama.cpp: Q8_0 / Q8_1 blocks of 32 with float16 scales for the Q4_x, Q5_x and Q8_0 weights, Q8_K "
      "blocks of 256 for the K types; this project: blocks of 32 with float32 scales).")
SIZES = ("Random weights in the shapes users run (real vocabularies, rope and layer counts), `Q4_K_M` by "
         "`llama-quantize` (`python -m switchsd.eval.synthetic`): weights read from DRAM (unless a CPU's L3 holds "
         "them). The curve: a forward of R rows after the context (a verify of R - 1 drafted tokens) against a "
         "one-row step; the cost gate prices drafts from this curve (`switchsd calibrate --model FILE` measures it "
         "for the gate). On a CPU with AMX, verifies of as many rows as the kernels' self-test found the tiles "
         "faster from run on them (`switchsd/kernels/qx_amx.c`; each record names its kernels). `make bench-shapes`.")


def machine_files(m: Machine) -> list[str]:
    """A machine's files table, its machine / commit lines, records, one command and the texts that differ."""
    out = [f"### {m.label}", "", *files_table(m.files), ""]
    by_commit: dict[str, list[dict]] = {}
    for _, rec in m.files:
        by_commit.setdefault(rec["commit"].get("sha") or "?", []).append(rec)
    for sha, recs in by_commit.items():
        rec = recs[0]
        files = "" if len(by_commit) == 1 else " (" + ", ".join(dict.fromkeys(_file_type(r) for r in recs)) + ")"
        out.append(f"Machine: {machine_label(rec['machine'])}; commit `{sha[:10]}`{files}"
                   f"{' (with uncommitted changes)' if any(r['commit'].get('dirty') for r in recs) else ''}; "
                   f"llama.cpp {rec['versions'].get('llama_cpp') or '-'}.")
    out += ["", "Records and commands: " + ", ".join(f"`{m.path(n)}`" for n, _ in m.files) + "; e.g.",
            "", f"    {m.files[0][1]['command'].replace('python -m switchsd', 'switchsd')}", ""]
    for _, rec in m.files:
        mm = mismatch_lines(rec)
        if mm and rec.get("mismatches"):
            out += [f"{_file_type(rec)}, {SETS.get(rec['dataset'], rec['dataset'])}:", *mm, ""]
    return out


def machine_kv(m: Machine) -> list[str]:
    out = [f"### {m.label}", "",
           "| file | set | texts equal to vanilla's: llama-cpp (f16 cache) | llama-cpp-f32kv | the two llama.cpp "
           "runs equal each other |", "|---|---|---|---|---|"]
    for _, rec in m.kv:
        summ = summarize(rec)
        a = {r["id"]: r["token_ids"] for r in rec["runs"]["llama-cpp"]}
        b = {r["id"]: r["token_ids"] for r in rec["runs"]["llama-cpp-f32kv"]}
        same = sum(a[i] == b.get(i) for i in a)
        out.append(f"| {_file_type(rec)} | {SETS.get(rec['dataset'], rec['dataset'])} "
                   f"{rec['settings'].get('n_prompts')} | {summ['llama-cpp']['identical']}/{summ['llama-cpp']['n']} "
                   f"| {summ['llama-cpp-f32kv']['identical']}/{summ['llama-cpp-f32kv']['n']} | {same}/{len(a)} |")
    out += ["", *[f"Record `{m.path(n)}`: `{r['command'].replace('python -m switchsd', 'switchsd')}`."
                  for n, r in m.kv], ""]
    for _, rec in m.kv:
        out += [*mismatch_lines(rec), ""]
    return out


def _kernels(rec: dict) -> str:
    """', kernels vnni512' or ', kernels amx (AMX tiles from 10 rows)', where the record says."""
    k = rec.get("kernels")
    if not k:
        return ""
    return f", kernels {k['path']}" + (f" (AMX tiles from {k['amx_rows']} rows)" if k.get("amx_rows") else "")


def _floor(rec: dict) -> str:
    """The memory floor under a one-row step, where the record measured this machine's read bandwidth."""
    gbs = rec.get("read_gbs")
    if not gbs:
        return ""
    mb, one, dec = rec["file"]["bytes"] / 1e6, rec["ours_ms"]["1"], rec["llama_decode_ms"]
    return (f" This machine reads memory at {gbs:.1f} GB/s (`switchsd/kernels/memread.c`, the same threads): a step "
            f"that reads the file's {mb:.0f} MB once takes at least {mb / gbs:.1f} ms, so neither side can decode "
            f"faster than {1e3 * gbs / mb:.1f} tok/s; this project's step reads at {mb / one:.1f} GB/s "
            f"({mb / one / gbs:.0%} of it), llama.cpp's at {mb / dec:.1f} GB/s ({mb / dec / gbs:.0%}).")


def files_page(machines: list[Machine]) -> str:
    out = ["# Your own GGUF file", "",
           "<!-- Written by `switchsd report` from docs/records/files/MACHINE/*.json.gz: change a record or "
           "switchsd/eval/files_page.py, never this page. -->", "", INTRO, "",
           "## The offline model in the files users download", "",
           "Each row is one benchmark run: llama.cpp's own `llama-server` and this project's methods on the same "
           "file, the same prompt token ids (chat template), 128 new tokens, greedy, prompt by prompt interleaved, "
           "in one process; Tok/s with prefill counted. The files are made by llama.cpp's `convert_hf_to_gguf.py` "
           "and `llama-quantize` (`python -m switchsd.eval.ggufs`), the runs by `make bench-files`. " + MACHINES, ""]
    with_files = [m for m in machines if m.files]
    for m in with_files:
        out += machine_files(m)
    if not with_files:
        out += ["No records yet: `make bench-files`.", ""]
    with_kv = [m for m in machines if m.kv]
    if with_kv:
        out += ["## Where llama.cpp's text parts from this project's", "", KV, ""]
        for m in with_kv:
            out += machine_kv(m)
    out += ["## Real sizes", "", SIZES, ""]
    with_curves = [m for m in machines if m.curves]
    for m in with_curves:
        out += [f"### {m.label}", ""]
        for name, rec in m.curves:
            out += curve_lines(m.path(name), rec) + [""]
    if not with_curves:
        out += ["No records yet: `make bench-shapes`.", ""]
    return "\n".join(out).rstrip() + "\n"
