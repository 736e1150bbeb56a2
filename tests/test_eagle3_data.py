"""EAGLE-3 training data from completions the target already wrote: one teacher-forced, right-padded batch
forward must give each sample exactly the features a forward over that sample alone gives."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from switchsd.models.loading import LoadedModel
from switchsd.training.data import from_completions, load_samples


def test_from_completions_matches_single_forwards(tmp_path, tiny_model):
    model = tiny_model
    g = torch.Generator().manual_seed(5)
    rows = []
    for i, (p, c) in enumerate([(5, 9), (12, 3), (7, 20), (3, 1)]):
        ids = torch.randint(2, 64, (p + c,), generator=g).tolist()
        rows.append({"id": i, "prompt_ids": ids[:p], "completion_ids": ids[p:]})
    rows.append({"id": 9, "prompt_ids": [3, 4], "completion_ids": []})          # nothing written: skipped
    jsonl = tmp_path / "completions.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lm = LoadedModel(model=model, tokenizer=None, name="tiny")
    layers = (1, 1, 2)
    n = from_completions(lm, jsonl, tmp_path / "extra", layers, tokens_per_batch=64)
    assert n == 4
    samples = load_samples(tmp_path / "extra")
    assert len(samples) == 4 and len(list((tmp_path / "extra").glob("feat_*.safetensors"))) >= 2
    by_ids = {tuple(s["ids"].tolist()): s for s in samples}
    for r in rows[:4]:
        seq = r["prompt_ids"] + r["completion_ids"]
        s = by_ids[tuple(seq)]
        assert s["start"] == len(r["prompt_ids"])
        with torch.no_grad():
            hs = model(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states
        aux = torch.cat([hs[i] for i in layers], -1)[0, :-1]
        assert s["aux"].shape == (len(seq) - 1, 3 * model.config.hidden_size)
        torch.testing.assert_close(s["aux"].double(), aux.to(torch.float16).double(), rtol=0, atol=2e-3)
        torch.testing.assert_close(s["final"].double(), hs[-1][0, :-1].to(torch.float16).double(), rtol=0, atol=2e-3)
    # resumable: a second call writes nothing new and keeps the shards
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "extra").glob("feat_*")}
    from_completions(lm, jsonl, tmp_path / "extra", layers, tokens_per_batch=64)
    assert before == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "extra").glob("feat_*")}


def test_length_batches_pack_under_the_token_budget():
    from switchsd.io import length_batches
    lens = [5, 40, 3, 17, 17, 90, 1, 33]
    out = length_batches(lens, lambda n: n, 64)
    assert sorted(x for b in out for x in b) == sorted(lens)
    for b in out:
        assert b == sorted(b) and (len(b) == 1 or max(b) * len(b) <= 64)
    assert [90] in out                     # longer than the budget: alone


def test_prompt_sets_are_deterministic_and_distinct():
    from switchsd.training.prompts import build_prompts
    for version in (1, 2):
        a = build_prompts(300, seed=3, version=version)
        assert a == build_prompts(300, seed=3, version=version) and len(set(a)) == 300
        assert a != build_prompts(300, seed=4, version=version)
        assert all("{" not in p.split("JSON")[0] for p in a), "unfilled template slot"
    v2 = build_prompts(300, seed=3, version=2)
    assert v2 != build_prompts(300, seed=3, version=1)
    assert sum(p.endswith((".", "?")) and any(c in p for c in ("Use ", "Keep it", "Be concise", "Include", "Write it"))
               for p in v2) > 30, "version 2 adds form / length / voice constraints"


def test_training_prompts_are_not_spec_bench_questions():
    """The self-distillation prompts never contain an evaluation question (Spec-Bench's, when the file is here)."""
    from switchsd.training.prompts import build_prompts
    spec = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench_question.jsonl"
    if not spec.exists():
        pytest.skip(f"needs the shared data file {spec.name} (../shared/data)")
    questions = {t.strip() for line in spec.read_text().splitlines() if line.strip()
                 for t in json.loads(line).get("turns", [])}
    assert len(questions) > 400
    assert not questions & (set(build_prompts(2000, 0, 1)) | set(build_prompts(2000, 11, 2)))
