"""Rebuild the results pages from the committed records (`docs/records/*.json.gz`).

    switchsd report            # writes docs/results.md and the README's results block
    switchsd report --check    # exit 1 when a committed page differs from what the records give

Every figure on those pages is recomputed here from a record's per-prompt runs; every table is headed with the
record's machine, commit, format, head and probe, and the command that produced it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .records import ROOT, machine_label, read_record, summarize

RECORDS = ROOT / "docs" / "records"
RESULTS = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- results:begin (switchsd report) -->", "<!-- results:end -->"
SETS = {"humaneval": "HumanEval", "math500": "MATH-500", "cnndm": "CNN/DM", "mtbench": "MT-Bench",
        "specbench": "Spec-Bench"}
ORDER = list(SETS)
LLAMA_SPEC = ("llama-cpp-ngram", "llama-cpp-eagle3", "llama-cpp-hybrid")


def load_records(folder: Path = RECORDS) -> list[tuple[str, dict]]:
    """(file name, record) of every bench record, in the order of SETS then name."""
    out = [(p.name, read_record(p)) for p in sorted(folder.glob("*.json.gz"))]
    rank = {s: i for i, s in enumerate(ORDER)}
    return sorted([x for x in out if x[1]["kind"] == "bench"],
                  key=lambda x: (rank.get(x[1]["dataset"], len(rank)), x[0]))


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def _heading(name: str, rec: dict) -> list[str]:
    s, c, f = rec["settings"], rec["commit"], rec["files"]
    short = lambda h: (h or {}).get("sha256", "")[:12] if h and h.get("sha256") else "none"
    return [f"Machine: {machine_label(rec['machine'])}. Commit `{(c['sha'] or '?')[:10]}`"
            f"{' (with uncommitted changes)' if c.get('dirty') else ''}, {rec['date']}; torch "
            f"{rec['versions'].get('torch')}, llama.cpp {rec['versions'].get('llama_cpp') or '-'}.",
            f"Model {rec['model']}, format {rec['format']}, budget {s.get('budget')}, "
            f"{s.get('max_new_tokens')} new tokens, greedy; EAGLE-3 head `{short(f.get('head'))}`, probe "
            f"`{short(f.get('probe'))}` (SHA-256 prefixes). Record: `docs/records/{name}`.",
            "", f"    {rec['command'].replace('python -m switchsd', 'switchsd')}"]


def set_table(rec: dict) -> list[str]:
    summ = summarize(rec)
    cpp = summ.get("llama-cpp", {}).get("tok_s", 0.0)
    rows = ["| method | Tok/s | vs vanilla | vs llama-cpp | tok/fwd | paths: % steps / MAL | identical to vanilla |",
            "|---|---|---|---|---|---|---|"]
    for m, s in summ.items():
        paths = ", ".join(f"{k} {v['pct']:.0f}% / {v['mal']:.2f}" for k, v in s["paths"].items())
        rows.append(f"| {m} | {s['tok_s']:.1f} | {s['speedup']:.2f}x | {_x(s['tok_s'], cpp) if cpp else '-'} | "
                    f"{s['tok_per_fwd']:.2f} | {paths} | {s['identical']}/{s['n']} |")
    return rows


def _mismatch_lines(rec: dict) -> list[str]:
    """Every text that differs from vanilla's, with the float32 margin at its first differing token."""
    mm = rec.get("mismatches")
    if mm is None:
        return ["Outputs that differ from vanilla's were not re-scored in float32."]
    if not mm:
        return []
    out = ["Texts that differ from vanilla's, at the first differing token: the float32 logit of vanilla's token "
           "minus the other's (a near-tie where it is small):", ""]
    for x in mm:
        if x.get("kind") == "token":
            out.append(f"- {x['method']}, {x['id']}: token {x['position']}, margin {x['fp32_margin']:+.3f}, "
                       f"float32 top-2 gap {x['fp32_top2_gap']:.3f}")
        else:
            out.append(f"- {x['method']}, {x['id']}: lengths {x.get('vanilla_len')} vs {x.get('other_len')}")
    return out


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
                    f"{s['switchsd']['tok_s']:.1f} | **{_x(s['switchsd']['tok_s'], s['llama-cpp']['tok_s'])}** | "
                    f"{_x(s['switchsd']['tok_s'], best[0])} | {'yes' if same else 'no'} |")
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
        mm = _mismatch_lines(rec)
        out += [*mm, ""] if mm else []
    return "\n".join(out).rstrip() + "\n"


def readme_block(recs: list[tuple[str, dict]]) -> str:
    lines = [BEGIN]
    heads = []
    for _, rec in recs:
        s = summarize(rec)
        if {"llama-cpp", "switchsd"} <= set(s):
            heads.append(f"{SETS.get(rec['dataset'], rec['dataset'])} "
                         f"{_x(s['switchsd']['tok_s'], s['llama-cpp']['tok_s'])}")
    if heads:
        lines += [f"**SwitchSD against llama.cpp's own server on the same GGUF** (tok/s ratio, 128 new tokens, "
                  f"greedy, outputs identical to vanilla's): {', '.join(heads)}; on {_machines(recs)}. "
                  "Every row, llama.cpp's speculative types included: [docs/results.md](docs/results.md)."]
    else:
        lines += ["No benchmark records yet: see [docs/results.md](docs/results.md)."]
    return "\n".join(lines + [END])


def _readme_with(text: str, block: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"error: README.md has no `{BEGIN}` ... `{END}` block for the results")
    head, rest = text.split(BEGIN, 1)
    return head + block + rest.split(END, 1)[1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail when a committed page differs from the records")
    ap.add_argument("--records", type=Path, default=RECORDS)
    args = ap.parse_args(argv)
    try:
        recs = load_records(args.records)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    pages = {RESULTS: results_page(recs), README: _readme_with(README.read_text(), readme_block(recs))}
    stale = [p for p, text in pages.items() if not p.exists() or p.read_text() != text]
    if args.check:
        if stale:
            raise SystemExit("error: " + ", ".join(str(p.relative_to(ROOT)) for p in stale) +
                             " differ from what the records give: run `switchsd report`")
        print(f"report: {len(recs)} record(s); pages match")
        return
    for p in stale:
        p.write_text(pages[p])
    print(f"report: {len(recs)} record(s); wrote {', '.join(str(p.relative_to(ROOT)) for p in stale) or 'nothing'}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
