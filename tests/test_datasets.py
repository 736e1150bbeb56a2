"""Every benchmark prompt loader refuses a malformed file with one line naming the file and the row, and reads a
well-formed one; the command line turns that line into `error: ...` (no traceback)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from switchsd.eval.datasets import load_prompts
from switchsd.io import read_jsonl

GOOD = {"jsonl": {"id": 1, "prompt": "Say hi."},
        "humaneval": {"task_id": "HumanEval/0", "prompt": "def f():\n"},
        "math500": {"unique_id": "a", "problem": "1+1?"},
        "cnndm": {"id": "x", "article": "Text."},
        "mtbench": {"question_id": 81, "category": "writing", "turns": ["Write."]},
        "specbench": {"question_id": 1, "category": "qa", "turns": ["Ask."]}}
FIELD = {"jsonl": "prompt", "humaneval": "prompt", "math500": "problem", "cnndm": "article", "mtbench": "turns",
         "specbench": "turns"}


def _file(tmp_path, lines) -> str:
    p = tmp_path / "d.jsonl"
    p.write_text("".join(x if isinstance(x, str) else json.dumps(x) + "\n" for x in lines))
    return str(p)


@pytest.mark.parametrize("name", list(GOOD))
def test_a_good_file_loads(tmp_path, name):
    out = load_prompts(name, _file(tmp_path, [GOOD[name]]))
    assert len(out) == 1 and isinstance(out[0]["prompt"], str) and out[0]["prompt"]


@pytest.mark.parametrize("name", list(GOOD))
@pytest.mark.parametrize("row", ["null\n", "[1, 2]\n", '"text"\n', "7\n"])
def test_rows_that_are_not_objects(tmp_path, name, row):
    with pytest.raises(ValueError, match=r"d\.jsonl: row 2 is .* not a JSON object"):
        load_prompts(name, _file(tmp_path, [GOOD[name], row]))


@pytest.mark.parametrize("name", list(GOOD))
def test_a_missing_field(tmp_path, name):
    bad = {k: v for k, v in GOOD[name].items() if k != FIELD[name]}
    with pytest.raises(ValueError, match=r"d\.jsonl: row 2 has no .*" + FIELD[name]):
        load_prompts(name, _file(tmp_path, [GOOD[name], bad]))


@pytest.mark.parametrize("name", list(GOOD))
@pytest.mark.parametrize("value", [None, 3, ""])
def test_a_field_that_is_not_a_string(tmp_path, name, value):
    bad = dict(GOOD[name], **{FIELD[name]: [value] if FIELD[name] == "turns" else value})
    with pytest.raises(ValueError, match=r"d\.jsonl: row 2 field .* not a non-empty string"):
        load_prompts(name, _file(tmp_path, [GOOD[name], bad]))


@pytest.mark.parametrize("name", ["mtbench", "specbench"])
def test_a_question_id_that_is_not_a_number(tmp_path, name):
    with pytest.raises(ValueError, match=r"d\.jsonl: row 1 field 'question_id' is 'x'"):
        load_prompts(name, _file(tmp_path, [dict(GOOD[name], question_id="x")]))


@pytest.mark.parametrize("name", list(GOOD))
def test_an_empty_file(tmp_path, name):
    with pytest.raises(ValueError, match=r"d\.jsonl: no rows"):
        load_prompts(name, _file(tmp_path, ["\n"]))


def test_a_huge_row_and_a_binary_file(tmp_path):
    with pytest.raises(ValueError, match=r"d\.jsonl: row 2 is 1\.0 MB, over the 0 MB"):
        read_jsonl(_file(tmp_path, [GOOD["jsonl"], json.dumps({"prompt": "x" * (1 << 20)}) + "\n"]),
                   max_row_bytes=1 << 10)
    p = tmp_path / "b.jsonl"
    p.write_bytes(b'{"prompt": "a"}\n\xff\xfe\x00\n')
    with pytest.raises(ValueError, match=r"b\.jsonl: row 2 is not UTF-8 text"):
        read_jsonl(p)


def test_the_command_line_prints_one_line(tmp_path):
    f = _file(tmp_path, [GOOD["jsonl"], "null\n"])
    r = subprocess.run([sys.executable, "-m", "switchsd", "bench", "--dataset", "jsonl", "--data-file", f,
                        "--methods", "vanilla"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith(f"error: {f}: row 2 is null, not a JSON object")
