"""The verification lab's quality harness: items, answer parsing, intervals, and a tiny end-to-end run on the
real model (resumable, the right labels, baselines without speculation)."""
from __future__ import annotations

import json

import pytest

from switchsd.eval.quality import parse_answer, problems, prompt_of, wilson


def test_problems_are_deterministic_and_answerable():
    a, b = problems(30, 0), problems(30, 0)
    assert a == b and problems(30, 1) != a
    assert all(isinstance(x["answer"], int) and x["answer"] >= 0 for x in a)
    assert {"gets", "gives away"} <= {w for x in a for w in ("gets", "gives away") if w in x["question"]}
    assert prompt_of("Q?").endswith("Question: Q?\nAnswer:")


def test_answer_parsing_and_wilson():
    assert parse_answer(" 3 + 4 = 7\n\nQuestion: 9") == 7
    assert parse_answer(" 12\nmore") == 12 and parse_answer(" none") is None
    assert parse_answer(" 5 + 6 - 2 = 9 apples") == 9
    lo, hi = wilson(30, 60)
    assert lo < 0.5 < hi and wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0


@pytest.mark.real
def test_quality_end_to_end_resumes_and_labels(tmp_path, capsys, real_lm):
    from switchsd.eval import quality
    argv = ["--rules", "lossless,minp:p_base=0.3,target-minp:p_base=0.3,capped:lam=0.5,c=2", "--limit", "2",
            "--seeds", "1", "--max-new-tokens", "8", "--out", str(tmp_path), "--dtype", "float32", "--budget", "8"]
    quality.main(argv)
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rules"]
    assert set(last) == {"lossless", "minp:p_base=0.3", "target-minp:p_base=0.3", "capped:lam=0.5,c=2"}
    assert not last["lossless"]["lossy"] and last["minp:p_base=0.3"]["lossy"] and last["capped:lam=0.5,c=2"]["lossy"]
    assert last["target-minp:p_base=0.3"]["tokens_per_forward"] == 1.0       # a baseline: no speculation
    n_lines = len((tmp_path / "records.jsonl").read_text().splitlines())
    quality.main(argv)                                                        # resumes: nothing recomputed
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == n_lines == 8
