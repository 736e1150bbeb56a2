"""The regeneration loop (EAGLE-3 training data): continuous batching over slots gives each prompt its greedy
answer, and the features it records are the target's hidden states at those positions (tiny float64 Llama)."""
from __future__ import annotations

import pytest
import torch
from helpers import EOS, greedy_reference, random_prompt

from switchsd.models.loading import LoadedModel
from switchsd.training.regen import Regenerator


class _Tok:
    eos_token_id = EOS


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_regenerator_answers_are_greedy_and_features_are_the_targets(tiny_model, slots):
    lm = LoadedModel(model=tiny_model, tokenizer=_Tok(), name="tiny")
    prompts = [(f"p{i}", random_prompt(10 + i, n)) for i, n in enumerate([5, 9, 3, 14, 7])]
    gen = Regenerator(lm, layers=(1, 1, 1), slots=slots, max_new_tokens=12, max_prompt=32)
    got = dict(gen.run(prompts))
    assert sorted(got) == sorted(k for k, _ in prompts)
    for key, prompt in prompts:
        s = got[key]
        want = greedy_reference(tiny_model, prompt, 12)
        assert s["ids"].tolist() == prompt + want and s["start"] == len(prompt)
        T = len(s["ids"])
        with torch.inference_mode():
            hs = tiny_model(input_ids=s["ids"][None, :-1].long(), output_hidden_states=True).hidden_states
        aux = torch.cat([hs[1], hs[1], hs[1]], -1)[0]          # input to layer 1 (hs[2] of 2 layers is normed)
        assert s["aux"].shape == (T - 1, 3 * 32) and s["final"].shape == (T - 1, 32)
        torch.testing.assert_close(s["aux"].double(), aux.to(torch.float16).double(), atol=1e-3, rtol=0)
        torch.testing.assert_close(s["final"].double(), hs[-1][0].to(torch.float16).double(), atol=1e-3, rtol=0)


def test_shards_round_trip_and_resume_keys(tmp_path):
    """A finished shard is listed in answers.jsonl and read back whole; a key whose shard is gone is not done."""
    from switchsd.training.regen_job import done_keys, flush, load_split
    from switchsd.training.sharegpt import list_order
    from switchsd.training.sources import clip_context
    g = torch.Generator().manual_seed(0)

    def sample(n, start):
        return {"ids": torch.arange(n, dtype=torch.int32), "aux": torch.randn(n - 1, 6, generator=g).half(),
                "final": torch.randn(n - 1, 2, generator=g).half(), "start": start}
    a, b = sample(9, 4), sample(5, 2)
    name = flush(tmp_path, "train", [("conv#0", a), ("conv#1", b)])
    flush(tmp_path, "val", [("other#0", sample(4, 1))])
    flush(tmp_path, "train", [(f"more#{i}", sample(3, 1)) for i in range(6)])
    got = load_split(tmp_path, "train")
    keys = [s["key"] for s in got]                 # the prompt list's order, not the order the job finished in
    assert keys == sorted(keys, key=list_order) and len(keys) == 8 and keys != sorted(keys)
    got = {s["key"]: s for s in got}
    assert torch.equal(got["conv#0"]["aux"], a["aux"]) and got["conv#1"]["start"] == 2
    assert got["conv#0"]["ids"].tolist() == list(range(9))
    assert done_keys(tmp_path) == {"conv#0", "conv#1", "other#0"} | {f"more#{i}" for i in range(6)}
    assert done_keys(tmp_path, "tf") == set() and load_split(tmp_path, "train", limit=0) == []
    assert [s["key"] for s in load_split(tmp_path, "train", limit=3)] == keys[:3]
    clipped = {s["key"]: s for s in load_split(tmp_path, "train", max_context=1)}["conv#0"]   # clipped as it loads
    want = clip_context(got["conv#0"], 1)
    assert clipped["start"] == want["start"] == 1 and torch.equal(clipped["ids"], want["ids"])
    assert torch.equal(clipped["aux"], want["aux"]) and torch.equal(clipped["final"], want["final"])
    (tmp_path / name).unlink()
    assert done_keys(tmp_path) == {"other#0"} | {f"more#{i}" for i in range(6)}
    c = clip_context(got["conv#0"], 1)                       # 3 of 4 prompt positions dropped
    assert c["start"] == 1 and c["ids"].tolist() == list(range(3, 9)) and torch.equal(c["aux"], a["aux"][3:])


class _ChatTok(_Tok):
    """A stand-in chat template: the prompt's characters as token ids 2..63 (the tiny model's vocabulary)."""
    pad_token_id = 0

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        text = "|".join(m["content"] for m in messages)
        return [2 + ord(c) % 62 for c in text]

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[2 + ord(c) % 62 for c in t] for t in texts]}


def test_job_counts_answers_on_disk_resumes_and_imports(tmp_path, tiny_model, monkeypatch):
    """`python -m switchsd regen-sharegpt` end to end on a tiny model: progress counts exactly the answers in
    shards (tokens too), a second run answers nothing again, exported answers imported into a fresh state give the
    same shards' token ids, counted as imported (not as generation throughput), and a job reading the prompts as
    exported token ids (`--export-prompt-ids` / `--prompt-ids`, the accelerator's input) writes the same answers."""
    import json

    from switchsd.training import regen_job
    lm = LoadedModel(model=tiny_model, tokenizer=_ChatTok(), name="tiny")
    prompts = [{"key": f"c{i}#0", "split": "val" if i < 2 else "train", "reply": "xy" * i,
                "messages": [{"role": "user", "content": "ab" * (i + 2)}]} for i in range(6)]
    monkeypatch.setattr(regen_job, "load_model", lambda *a, **k: lm)
    monkeypatch.setattr(regen_job, "sharegpt_prompts", lambda cache=None: prompts)
    monkeypatch.setattr(regen_job, "default_aux_layers", lambda n: (1, 1, 1))
    args = ["--val", "2", "--answers", "3", "--slots", "2", "--max-new-tokens", "6", "--shard", "2",
            "--dtype", "float64"]
    regen_job.main(["--state", str(tmp_path / "a")] + args)
    prog = json.loads((tmp_path / "a" / "progress.json").read_text())
    rows = regen_job.read_jsonl(tmp_path / "a" / "answers.jsonl")
    assert prog["answers"] == len(rows) == 5 and "imported" not in prog
    assert prog["tokens"] == sum(len(r["completion_ids"]) for r in rows)
    assert [len(regen_job.load_split(tmp_path / "a", split)) for split in ("val", "train")] == [2, 3]
    regen_job.main(["--state", str(tmp_path / "a")] + args)                 # resumes: nothing left to answer
    assert json.loads((tmp_path / "a" / "progress.json").read_text())["answers"] == 5
    regen_job.main(["--state", str(tmp_path / "a"), "--export-answers", str(tmp_path / "x.jsonl.gz")])
    regen_job.main(["--state", str(tmp_path / "b"), "--import-answers", str(tmp_path / "x.jsonl.gz")] + args)
    prog_b = json.loads((tmp_path / "b" / "progress.json").read_text())
    assert prog_b["imported"] == 5 and prog_b["answers"] == 0 and prog_b["tokens"] == 0
    for split in ("val", "train"):
        a, b = regen_job.load_split(tmp_path / "a", split), regen_job.load_split(tmp_path / "b", split)
        assert {s["key"]: s["ids"].tolist() for s in a} == {s["key"]: s["ids"].tolist() for s in b}
    regen_job.main(["--state", str(tmp_path / "a"), "--export-prompt-ids", str(tmp_path / "p")] + args)
    monkeypatch.setattr(regen_job, "sharegpt_prompts", None)                 # the package is not needed now
    regen_job.main(["--state", str(tmp_path / "c"), "--prompt-ids", str(tmp_path / "p")] + args)
    counts = regen_job.load_file(str(tmp_path / "c" / regen_job.REPLY_COUNTS))["counts"]
    assert int(counts.sum()) == sum(len(p["reply"]) for p in prompts if p["split"] == "train")
    for split in ("val", "train"):
        a, c = regen_job.load_split(tmp_path / "a", split), regen_job.load_split(tmp_path / "c", split)
        assert {s["key"]: s["ids"].tolist() for s in a} == {s["key"]: s["ids"].tolist() for s in c}


def test_trainer_reads_reply_counts_from_the_state(tmp_path, monkeypatch):
    """The trainer ranks its draft vocabulary with the counts in the state folder when present (a machine without
    the ShareGPT package), and caches the ones it computes there."""
    from switchsd.io import save_safetensors_atomic
    from switchsd.training import sharegpt
    from switchsd.training.regen_job import REPLY_COUNTS, sharegpt_reply_counts
    (tmp_path / "a").mkdir()
    save_safetensors_atomic({"counts": torch.arange(64)}, tmp_path / "a" / REPLY_COUNTS)
    monkeypatch.setattr(sharegpt, "sharegpt_prompts", None)
    lm = LoadedModel(model=None, tokenizer=_ChatTok(), name="tiny")
    assert torch.equal(sharegpt_reply_counts(lm, tmp_path / "a"), torch.arange(64))
    rows = [{"split": "train", "reply": "ab"}, {"split": "val", "reply": "zz"}]
    monkeypatch.setattr(sharegpt, "sharegpt_prompts", lambda cache=None: rows)
    lm.model = type("M", (), {"config": type("C", (), {"vocab_size": 64})()})()
    got = sharegpt_reply_counts(lm, tmp_path)
    assert int(got.sum()) == 2 and torch.equal(sharegpt_reply_counts(lm, tmp_path), got)
    assert (tmp_path / REPLY_COUNTS).exists()


def test_teacher_forced_keeps_list_order_by_blocks(monkeypatch):
    """Teacher-forced items are sorted by length only inside a block, so a job stopped early holds a prefix of
    the prompt list (a random sample), not its shortest answers."""
    from switchsd.training import regen_job
    monkeypatch.setattr(regen_job, "forward_features", lambda lm, chunk, layers: [(it[0], None) for it in chunk])
    items = [(f"k{i}", [0] * (10 - i), 1) for i in range(10)]          # later items are shorter
    keys = [k for k, _ in regen_job.teacher_forced(None, items, (0, 0, 0), tokens_per_batch=4, block=4)]
    assert sorted(keys) == sorted(k for k, *_ in items)
    assert set(keys[:4]) == {"k0", "k1", "k2", "k3"} and set(keys[4:8]) == {"k4", "k5", "k6", "k7"}
    assert keys[:4] != ["k0", "k1", "k2", "k3"]                        # sorted by length inside the block
