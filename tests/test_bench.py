"""Benchmark bookkeeping: resuming an interrupted run, and explaining outputs that differ from vanilla."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import make_tiny_model, random_prompt

from switchsd.eval.bench import _resume, aggregate
from switchsd.eval.mismatch import explain, first_divergence, summarize_mismatches


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2          # one output stopped earlier
    assert first_divergence([], [4]) == 0


def test_explain_reports_the_float32_margin_at_the_first_difference():
    model = make_tiny_model(seed=3).to(torch.float32)
    prompt = random_prompt(1, 12)
    vanilla = [5, 6, 7, 8]
    other = [5, 6, 9, 8]
    x = explain(model, prompt, vanilla, other)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + vanilla[:2]])).logits[0, -1]
    assert x["position"] == 2 and x["kind"] == "token"
    assert x["fp32_margin"] == pytest.approx(float(logits[7] - logits[9]), abs=1e-5)
    assert x["fp32_argmax"] == int(logits.argmax())
    assert explain(model, prompt, vanilla, list(vanilla)) is None
    assert explain(model, prompt, vanilla, vanilla[:3])["kind"] == "length"
    text = summarize_mismatches([{"method": "m", "id": "p", **x}])
    assert "1 output(s) differ" in text and "m / p" in text
    assert summarize_mismatches([]) == "All outputs identical to vanilla."
    assert "not explained" in summarize_mismatches(None)


def test_resume_keeps_finished_prompts_and_drops_a_cut_line(tmp_path):
    path = tmp_path / "partial.jsonl"
    key = {"dataset": "x", "methods": ["vanilla"], "prompts": ["a", "b", "c"]}
    assert _resume(path, key, fresh=False) == []                        # new run: writes the key line
    with open(path, "a") as f:
        f.write(json.dumps({"id": "a", "records": {"vanilla": {"id": "a"}}}) + "\n")
        f.write('{"id": "b", "reco')                                    # killed mid-write
    done = _resume(path, key, fresh=False)
    assert [d["id"] for d in done] == ["a"]
    assert len(path.read_text().splitlines()) == 2                     # the cut line is gone
    with pytest.raises(SystemExit, match="other settings"):
        _resume(path, {**key, "methods": ["vanilla", "pld"]}, fresh=False)
    assert _resume(path, {**key, "methods": ["vanilla", "pld"]}, fresh=True) == []


@pytest.mark.parametrize("bad", ["null", "[1, 2]", '{"id": "x"}', "garbage"])
def test_resume_names_a_bad_middle_line(tmp_path, bad):
    path = tmp_path / "partial.jsonl"
    key = {"dataset": "x", "methods": ["vanilla"], "prompts": ["a", "b", "c"]}
    row = lambda i: json.dumps({"id": i, "records": {"vanilla": {"id": i}}})
    path.write_text("\n".join([json.dumps({"key": key}), row("a"), bad, row("b")]) + "\n")
    with pytest.raises(SystemExit, match=r"partial.jsonl:3: not a line this benchmark wrote"):
        _resume(path, key, fresh=False)
    path.write_text("\n".join([json.dumps({"key": key}), row("b")]) + "\n")    # another run's prompt order
    with pytest.raises(SystemExit, match="not the first 1 of this run"):
        _resume(path, key, fresh=False)


def test_duplicate_prompt_ids_are_refused(tmp_path):
    from switchsd.eval.datasets import load_prompts
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n')
    with pytest.raises(ValueError, match="unique"):
        load_prompts("jsonl", str(f))


def test_aggregate_counts_identity_and_paths():
    stats = lambda tok_s, paths: {"tok_s": tok_s, "new_tokens": 10, "wall_s": 10 / tok_s, "steps": 5,
                                  "paths": paths}
    recs = [{"id": "a", "token_ids": [1, 2], "stats": stats(10.0, {"copy": {"steps": 2, "accepted": 6, "zero": 1},
                                                                    "vanilla": {"steps": 3, "accepted": 0}})},
            {"id": "b", "token_ids": [3], "stats": stats(20.0, {"vanilla": {"steps": 5, "accepted": 0}})}]
    s = aggregate(recs, {"a": [1, 2], "b": [4]})
    assert s["identical"] == 1 and s["n"] == 2
    assert s["tok_s"] == pytest.approx(15.0) and s["tok_per_fwd"] == pytest.approx(2.0)
    assert s["paths"]["copy"] == {"pct": pytest.approx(20.0), "mal": pytest.approx(3.0), "zero_accept": 0.5}


def test_method_variants_parse():
    from switchsd.cli.common import parse_method
    assert parse_method("eagle3") == ("eagle3", {})
    assert parse_method("eagle3@chain4") == ("eagle3", {"shape": "chain", "gamma": 4})
    assert parse_method("switchsd@tree2x3x6+k3+t0.4") == (
        "switchsd", {"shape": "tree", "tree": (2, 3, 6), "kappa": 3, "tau": 0.4})
    assert parse_method("switchsd+k3") == ("switchsd", {"kappa": 3})
    assert parse_method("eagle3+conf") == ("eagle3", {"confidence": True})
    from switchsd.core.config import CopyConfig, GateConfig, NeuralConfig
    from switchsd.factory import _with_variant
    assert _with_variant({"confidence": True}, CopyConfig(), NeuralConfig(), GateConfig())[2].confidence
    with pytest.raises(SystemExit, match="bad method variant"):
        parse_method("switchsd@chain")
    with pytest.raises(SystemExit, match="unknown method"):
        parse_method("nope@chain2")


def test_tau_variant_is_refused_where_no_probe_reads_it():
    from switchsd.cli.common import build_engine
    with pytest.raises(SystemExit, match="only applies to switchsd"):
        build_engine("copyspec@chain1+t0.3", lm=None, cfg=None, copy_cfg=None)


@pytest.mark.real
def test_results_are_written_before_the_optional_rescoring(tmp_path, monkeypatch, real_lm):
    """An out-of-memory in the float32 re-scoring must not lose the run (it used to come before results.json)."""
    from switchsd.eval import bench
    data = tmp_path / "p.jsonl"
    data.write_text('{"id": "a", "prompt": "Repeat: one two three four five six"}\n')

    def oom(*a, **k):
        assert (tmp_path / "out" / "results.json").exists()          # written already
        raise RuntimeError("CUDA out of memory (simulated)")
    monkeypatch.setattr(bench, "_mismatches", oom)
    bench.main(["--dataset", "jsonl", "--data-file", str(data), "--methods", "vanilla,pld", "--dtype", "float32",
                "--max-new-tokens", "8", "--out", str(tmp_path / "out"), "--warmup", "0", "--budget", "8"])
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["mismatches"] is None and res["summary"]["pld"]["n"] == 1
    assert "not explained" in (tmp_path / "out" / "table.md").read_text()


class _CharTokenizer:
    """A stand-in tokenizer for the tiny model: one id per character (ids 2..61), no chat template."""
    eos_token_id = 1
    chat_template = None
    pad_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [2 + ord(c) % 60 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(32 + (int(i) % 90)) for i in ids)


def test_bench_main_end_to_end_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    """`python -m switchsd bench` on a tiny float64 model: every method and the transformers peers identical to
    vanilla, the oracle above every method in tokens per forward, results.json / table.md written, and a second
    run resumes from partial.jsonl without decoding any prompt again."""
    import json as _json

    from helpers import make_tiny_model

    from switchsd.core.engine import Engine
    from switchsd.eval import bench
    from switchsd.models.loading import LoadedModel
    lm = LoadedModel(make_tiny_model(), _CharTokenizer(), "tiny")
    monkeypatch.setattr(bench, "load", lambda args: lm)
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(_json.dumps({"id": f"p{i}", "prompt": t}) for i, t in enumerate(
        ["abcabcabcabcab", "the cat sat on the mat. the cat sat", "xyz"])) + "\n")
    argv = ["--dataset", "jsonl", "--data-file", str(data), "--methods", "hf,hf-pld,vanilla,copy,pld,samd,oracle",
            "--max-new-tokens", "12", "--budget", "8", "--no-chat", "--warmup", "0", "--out", str(tmp_path / "out")]
    bench.main(argv)
    last = _json.loads(capsys.readouterr().out.strip().splitlines()[-1])["methods"]
    assert set(last) == {"hf", "hf-pld", "vanilla", "copy", "pld", "samd", "oracle"}
    assert all(m["identical"] == m["n"] == 3 for m in last.values()), last
    assert last["oracle"]["tok_per_fwd"] >= max(m["tok_per_fwd"] for k, m in last.items() if k != "oracle")
    res = _json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["mismatches"] == [] and (tmp_path / "out" / "table.md").exists()
    runs = []
    monkeypatch.setattr(Engine, "run", lambda self, *a, **k: runs.append(1) or (_ for _ in ()).throw(
        AssertionError("a finished prompt was decoded again")))
    bench.main(argv)                                         # resumes: every prompt is in partial.jsonl
    again = _json.loads(capsys.readouterr().out.strip().splitlines()[-1])["methods"]
    assert not runs and {k: v["identical"] for k, v in again.items()} == {k: v["identical"] for k, v in last.items()}


def test_default_data_files_are_found_next_to_the_checkout(tmp_path, monkeypatch):
    """`../shared/data` beside the checkout (the README's promise) and `shared/data` inside it are searched."""
    from pathlib import Path

    from switchsd.eval import datasets
    monkeypatch.delenv("SWITCHSD_DATA", raising=False)
    checkout = Path(datasets.__file__).resolve().parents[2]
    found = datasets._find("math500", None)
    beside = checkout.parent / "shared" / "data" / datasets.DEFAULT_FILES["math500"]
    inside = checkout / "shared" / "data" / datasets.DEFAULT_FILES["math500"]
    assert found == (beside if beside.exists() else inside if inside.exists() else None)
    (tmp_path / datasets.DEFAULT_FILES["math500"]).write_text("")
    monkeypatch.setenv("SWITCHSD_DATA", str(tmp_path))
    assert datasets._find("math500", None) == tmp_path / datasets.DEFAULT_FILES["math500"]


def test_acceptance_per_draft_position():
    """Position k counts the steps whose draft reached depth k with k-1 tokens accepted; a miss ends the tries.
    Chains of 3: accepted 0, 2 and 3 tokens -> position 1: 2/3, position 2: 2/2, position 3: 1/2."""
    from switchsd.core.events import StepEvent, draft_depth, summarize
    chain = [-1, 0, 1, 2]
    ev = lambda acc, parents=chain, path="neural": StepEvent(
        step=0, path=path, drafter=None, candidates=[], tree_tokens=[0] * len(parents), tree_parents=parents,
        accepted_rows=[], accepted=[7] * acc, accepted_candidate=None, bonus=1, new_tokens=[7] * acc + [1],
        position=0)
    assert draft_depth([-1, 0, 0, 1, 2, 4]) == 3 and draft_depth([-1]) == 0
    s = summarize([ev(0), ev(2), ev(3), ev(0, [-1], "vanilla")])
    assert s["paths"]["neural"]["tried"] == [3, 2, 2] and s["paths"]["neural"]["hit"] == [2, 2, 1]
    assert s["paths"]["vanilla"]["tried"] == []
    recs = [{"id": i, "token_ids": [], "stats": s} for i in "ab"]
    agg = aggregate(recs, {"a": [], "b": []})
    assert agg["paths"]["neural"]["accept_at"] == pytest.approx([2 / 3, 1.0, 0.5])
    assert "accept_at" not in agg["paths"]["vanilla"]


def test_card_acceptance_table_has_a_row_per_drafted_path(tmp_path):
    """scripts/eagle3_card.py: one row per set and drafted path (SwitchSD drafts on both), plain steps left out."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("eagle3_card", Path(__file__).resolve().parents[1] / "scripts" / "eagle3_card.py")
    card = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(card)
    meta = {"dataset": "mtbench", "n_prompts": 2, "engine": {"max_new_tokens": 64}, "dtype": "float32"}
    paths = {"vanilla": {"pct": 20.0}, "copy": {"pct": 30.0, "accept_at": [0.9, 0.8, 0.7, 0.6]},
             "neural": {"pct": 50.0, "accept_at": [0.4, 0.3]}}
    (tmp_path / "r.json").write_text(json.dumps({"meta": meta, "summary": {"switchsd": {
        "tok_per_fwd": 1.7, "paths": paths, "identical": 2, "n": 2}}}))
    rows = card.acceptance_table([tmp_path / "r.json"], "switchsd").splitlines()
    assert rows[0].count("pos ") == 4 and len(rows) == 4
    assert "| copy | 30% | 0.900 | 0.800 | 0.700 | 0.600 | 2/2 |" in rows[2]
    assert "| neural | 50% | 0.400 | 0.300 | - | - | 2/2 |" in rows[3]
    with pytest.raises(SystemExit, match="no 'eagle3' row"):
        card.acceptance_table([tmp_path / "r.json"], "eagle3")
