"""Rebuild the results pages from the committed records (`docs/records/*.json.gz`).

    switchsd report            # writes docs/results.md, the README's results block and docs/scaling.md's vLLM one
    switchsd report --check    # exit 1 when a committed page differs from what the records give

Every figure on those pages is recomputed here from a record's per-prompt runs; every table is headed with the
record's machine, commit, format, head and probe, and the command that produced it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .files_page import FILES, files_page, load_machines, n_records
from .records import ROOT, machine_label, summarize
from .tables import RECORDS, SETS, load_records, mismatch_lines, ratio

RESULTS = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
SCALING = ROOT / "docs" / "scaling.md"
BEGIN, END = "<!-- results:begin (switchsd report) -->", "<!-- results:end -->"
VLLM_BEGIN, VLLM_END = "<!-- vllm:begin (switchsd report) -->", "<!-- vllm:end -->"
LLAMA_SPEC = ("llama-cpp-ngram", "llama-cpp-eagle3", "llama-cpp-hybrid")


def vllm_block(recs: list[tuple[str, dict]]) -> str:
    """The vLLM pair records as tables: per set, each method's tok/s, B over A with its 90% interval over
    prompts (bootstrap), identical texts; headed with machine, commit, versions, files and command."""
    from ..vllm.pair import ratio_interval
    lines = [VLLM_BEGIN]
    if not recs:
        lines.append("No vLLM record yet.")
    for name, rec in recs:
        A, B = rec["methods"]
        v, c, f = rec["versions"], rec["commit"], rec["files"]
        lines += ["", f"Machine: {machine_label(rec['machine'])}. Commit `{(c.get('sha') or '?')[:10]}`"
                  f"{' (with uncommitted changes)' if c.get('dirty') else ''}, {rec['date']}; vLLM {v.get('vllm')}, "
                  f"{rec['format']}, {rec['settings']['max_new_tokens']} new tokens, concurrency 1, greedy; EAGLE-3 "
                  f"head `{(f.get('head') or {}).get('sha256', '')[:12]}`, probe "
                  f"`{(f.get('probe') or {}).get('sha256', '')[:12]}`. Record: `docs/records/{name}`.", "",
                  f"    {rec['command']}", "",
                  f"| set | {A} tok/s | {B} tok/s | {B} / {A} (90% interval over prompts) | same text |",
                  "|---|---|---|---|---|"]
        for ds, r in rec["sets"].items():
            rows = r["requests"]
            ta, tb = [x[A]["s"] for x in rows], [x[B]["s"] for x in rows]
            ka, kb = sum(x[A]["tokens"] for x in rows), sum(x[B]["tokens"] for x in rows)
            lo, hi = ratio_interval(ta, tb)
            same = sum(x[A]["text"] == x[B]["text"] for x in rows)
            lines.append(f"| {SETS.get(ds, ds)} {len(rows)} | {ka / sum(ta):.1f} | {kb / sum(tb):.1f} | "
                         f"{(kb / sum(tb)) / (ka / sum(ta)):.3f}x ({lo:.3f}-{hi:.3f}) | {same}/{len(rows)} |")
    return "\n".join(lines + ["", VLLM_END])


def _amx(note: str) -> str:
    """'AMX build not used: self-test: llama-server was killed by SIGSEGV at start: /path ...' -> without paths."""
    return note.split(": /", 1)[0].replace("self-test: ", "its server self-test: ")


def _heading(name: str, rec: dict) -> list[str]:
    s, c, f = rec["settings"], rec["commit"], rec["files"]
    short = lambda h: (h or {}).get("sha256", "")[:12] if h and h.get("sha256") else "none"
    return [f"Machine: {machine_label(rec['machine'])}. Commit `{(c['sha'] or '?')[:10]}`"
            f"{' (with uncommitted changes)' if c.get('dirty') else ''}, {rec['date']}; torch "
            f"{rec['versions'].get('torch')}, llama.cpp {rec['versions'].get('llama_cpp') or '-'}.",
            f"Model {rec['model']}, format {rec['format']}, budget {s.get('budget')}, "
            f"{s.get('max_new_tokens')} new tokens, greedy; EAGLE-3 head `{short(f.get('head'))}`, probe "
            f"`{short(f.get('probe'))}` (SHA-256 prefixes). Record: `docs/records/{name}`.",
            *([f"llama.cpp's {_amx(rec['versions']['llama_cpp_amx'])} (`make llama-cpp LLAMA_CPP_AMX=1` builds "
               "it and keeps it only where a server survives)."] if rec["versions"].get("llama_cpp_amx") else []),
            "", f"    {rec['command'].replace('python -m switchsd', 'switchsd')}"]


def set_table(rec: dict) -> list[str]:
    summ = summarize(rec)
    cpp = summ.get("llama-cpp", {}).get("tok_s", 0.0)
    rows = ["| method | Tok/s | vs vanilla | vs llama-cpp | tok/fwd | paths: % steps / MAL | identical to vanilla |",
            "|---|---|---|---|---|---|---|"]
    for m, s in summ.items():
        paths = ", ".join(f"{k} {v['pct']:.0f}% / {v['mal']:.2f}" for k, v in s["paths"].items())
        rows.append(f"| {m} | {s['tok_s']:.1f} | {s['speedup']:.2f}x | {ratio(s['tok_s'], cpp) if cpp else '-'} | "
                    f"{s['tok_per_fwd']:.2f} | {paths} | {s['identical']}/{s['n']} |")
    return rows


def headline(recs: list[tuple[str, dict]]) -> list[str]:
    rows = ["| set | prompts | llama-cpp | best llama.cpp speculative | vanilla | switchsd | switchsd vs llama-cpp "
            "| vs best llama.cpp speculative | every engine method identical |",
            "|---|---|---|---|---|---|---|---|---|"]
    for _, rec in recs:
        s = summarize(rec)
        if not {"llama-cpp", "vanilla", "switchsd"} <= set(s):
            continue
        spec = [(s[m]["tok_s"], m) for m in LLAMA_SPEC if m in s]
        best = max(spec) if spec else (0.0, "-")
        engine = [m for m in s if not m.startswith(("llama-cpp", "hf"))]
        same = all(s[m]["identical"] == s[m]["n"] for m in engine)
        rows.append(f"| {SETS.get(rec['dataset'], rec['dataset'])} | {s['vanilla']['n']} | "
                    f"{s['llama-cpp']['tok_s']:.1f} | {best[0]:.1f} ({best[1]}) | {s['vanilla']['tok_s']:.1f} | "
                    f"{s['switchsd']['tok_s']:.1f} | **{ratio(s['switchsd']['tok_s'], s['llama-cpp']['tok_s'])}** | "
                    f"{ratio(s['switchsd']['tok_s'], best[0])} | {'yes' if same else 'no'} |")
    return rows


def _machines(recs) -> str:
    labels = sorted({machine_label(r["machine"]) for _, r in recs})
    return "; ".join(labels) if labels else "no records"


def results_page(recs: list[tuple[str, dict]]) -> str:
    out = ["# Results", "",
           "<!-- Written by `switchsd report` from docs/records/*.json.gz: change a record or "
           "switchsd/eval/report.py, never this page (`switchsd report --check` runs in `make test`). -->", "",
           "Each table is one benchmark run: every row on the same prompt token ids (chat template), prompt by "
           "prompt interleaved, in one process on one machine, after a warm-up; Tok/s is the mean of per-prompt "
           "rates with prefill counted; speedups are ratios within the run. The `llama-cpp*` rows are llama.cpp's "
           "own `llama-server` (built by `make llama-cpp`) on the same GGUF; every other row is this project's "
           "engine. Terms (tok/fwd, MAL, budget, near-tie, ...): [glossary.md](glossary.md).", "",
           "## Against llama.cpp", "", *headline(recs), "",
           f"Machines: {_machines(recs)}. The per-set tables below name each run's machine, commit and files.", ""]
    for name, rec in recs:
        title = SETS.get(rec["dataset"], rec["dataset"])
        out += [f"## {title}, {rec['settings'].get('n_prompts')} prompts", "", *_heading(name, rec), "",
                *set_table(rec), ""]
        mm = mismatch_lines(rec)
        out += [*mm, ""] if mm else []
    return "\n".join(out).rstrip() + "\n"


def readme_block(recs: list[tuple[str, dict]]) -> str:
    lines, heads, same, total = [BEGIN], [], 0, 0
    for _, rec in recs:
        s = summarize(rec)
        if {"llama-cpp", "switchsd"} <= set(s):
            heads.append(f"{SETS.get(rec['dataset'], rec['dataset'])} "
                         f"**{ratio(s['switchsd']['tok_s'], s['llama-cpp']['tok_s'])}**")
            same, total = same + s["switchsd"]["identical"], total + s["switchsd"]["n"]
    if heads:
        lines += [f"SwitchSD against llama.cpp's own server on the same GGUF file (Tok/s, prefill counted, 128 new "
                  f"tokens, greedy): {', '.join(heads)}; {same} of {total} texts identical to plain greedy decoding. "
                  f"{_machines(recs)}. Every row, llama.cpp's own speculative types and this project's other methods "
                  "included, with the record behind it: [docs/results.md](docs/results.md)."]
    else:
        lines += ["No benchmark records yet: see [docs/results.md](docs/results.md)."]
    return "\n".join(lines + [END])


def _with_block(text: str, block: str, begin: str, end: str, where: str) -> str:
    if begin not in text or end not in text:
        raise SystemExit(f"error: {where} has no `{begin}` ... `{end}` block")
    head, rest = text.split(begin, 1)
    return head + block + rest.split(end, 1)[1]


def _show(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail when a committed page differs from the records")
    ap.add_argument("--records", type=Path, default=RECORDS)
    args = ap.parse_args(argv)
    try:
        recs, pairs = load_records(args.records), load_records(args.records, "vllm-pair")
        machines = load_machines(args.records / "files")
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    pages = {RESULTS: results_page(recs), FILES: files_page(machines),
             README: _with_block(README.read_text(), readme_block(recs), BEGIN, END, "README.md"),
             SCALING: _with_block(SCALING.read_text(), vllm_block(pairs), VLLM_BEGIN, VLLM_END, "docs/scaling.md")}
    stale = [p for p, text in pages.items() if not p.exists() or p.read_text() != text]
    if args.check:
        if stale:
            raise SystemExit("error: " + ", ".join(_show(p) for p in stale) +
                             " differ from what the records give: run `switchsd report`")
        print(f"report: {len(recs) + len(pairs) + n_records(machines)} record(s); pages match")
        return
    for p in stale:
        p.write_text(pages[p])
    print(f"report: {len(recs) + len(pairs) + n_records(machines)} record(s); wrote {', '.join(_show(p) for p in stale) or 'nothing'}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
