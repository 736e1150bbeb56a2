"""What the results pages share (docs/results.md from report.py, docs/files.md from files_page.py): the sets' names,
reading the records of a folder, a ratio, the lines on texts that differ from vanilla's."""
from __future__ import annotations

from pathlib import Path

from .records import ROOT, read_record

RECORDS = ROOT / "docs" / "records"
SETS = {"humaneval": "HumanEval", "math500": "MATH-500", "cnndm": "CNN/DM", "mtbench": "MT-Bench",
        "specbench": "Spec-Bench"}
ORDER = list(SETS)


def load_records(folder: Path = RECORDS, kind: str = "bench") -> list[tuple[str, dict]]:
    """(file name, record) of every record of `kind`, bench records in the order of SETS then name."""
    out = [(p.name, read_record(p)) for p in sorted(folder.glob("*.json.gz"))]
    rank = {s: i for i, s in enumerate(ORDER)}
    return sorted([x for x in out if x[1]["kind"] == kind],
                  key=lambda x: (rank.get(x[1].get("dataset"), len(rank)), x[0]))


def ratio(a: float, b: float) -> str:
    """'1.23x' (a / b), or '-' where b is 0."""
    return f"{a / b:.2f}x" if b else "-"


def mismatch_lines(rec: dict) -> list[str]:
    """Per method, the texts that differ from vanilla's: how many, and vanilla's float32 margin at the first
    differing token (its logit minus the other token's: a near-tie where small), the widest one named."""
    mm = rec.get("mismatches")
    if mm is None:
        return ["Outputs that differ from vanilla's were not re-scored in float32."]
    if not mm:
        return []
    out = ["Texts that differ from vanilla's, per method: at the first differing token, vanilla's float32 margin "
           "(the logit of vanilla's token minus the other's; a near-tie where small, so another arithmetic may pick "
           "either):", ""]
    n = {m: len(rs) for m, rs in rec["runs"].items()}
    for method in dict.fromkeys(x["method"] for x in mm):
        xs = [x for x in mm if x["method"] == method]
        tok = sorted(((abs(x["fp32_margin"]), x) for x in xs if x.get("kind") == "token"), key=lambda t: t[0])
        lengths = len(xs) - len(tok)
        line = f"- {method}: {len(xs)} of {n.get(method, '?')}"
        if tok:
            widest = tok[-1][1]
            line += (f"; margin {tok[0][0]:.3f} to {tok[-1][0]:.3f} (median {tok[len(tok) // 2][0]:.3f}), the "
                     f"widest at {widest['id']}, token {widest['position']}")
        if lengths:
            line += f"; {lengths} differ only in where they stop"
        out.append(line)
    return out
