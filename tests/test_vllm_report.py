"""`switchsd vllm report` (switchsd/vllm/report.py): a text that differs from `none`'s is found, matched to the prompt vLLM's client sent (its
shuffled order, checked against the request's input length) and named with the float32 margin at its first
differing token; identical texts are not reported."""
from __future__ import annotations

import json
import random

import pytest
import torch

from switchsd.vllm import report


def _result(texts: list[str], input_lens: list[int]) -> dict:
    return {"output_throughput": 10.0, "median_tpot_ms": 50.0, "median_ttft_ms": 200.0, "generated_texts": texts,
            "input_lens": input_lens}


def test_sent_prompts_follow_vllm_s_seeded_shuffle(tmp_path):
    (tmp_path / "prompts").mkdir()
    prompts = [f"question {i}" for i in range(12)]
    (tmp_path / "prompts" / "math500.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    random.seed(0)                                   # vLLM's CustomDataset.load_data: the global random, seeded
    expected = list(prompts)
    random.shuffle(expected)
    assert report.sent_prompts(tmp_path, "math500") == expected != prompts


@pytest.mark.real
def test_a_differing_text_is_named_with_its_float32_margin(tmp_path, real_lm):
    (tmp_path / "prompts").mkdir()
    prompts = ["Name a colour.", "Write one word about the sea.", "Say hello."]
    (tmp_path / "prompts" / "mtbench.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    sent = report.sent_prompts(tmp_path, "mtbench")
    lens = [len(real_lm.encode(p, chat=True)) for p in sent]
    base = ["Blue is a colour.", "Waves.", "Hello there!"]
    other = ["Blue is a color.", "Waves.", "Hello there!"]            # request 0 parts at its fourth token
    res = {("none", "mtbench", 1): _result(base, lens), ("copy", "mtbench", 1): _result(other, lens),
           ("ngram", "mtbench", 1): _result(list(base), lens)}
    assert report.differing(res) == [("copy", "mtbench", 1, 0)]
    (x,) = report.explain_differences(res, tmp_path, real_lm)
    assert x["kind"] == "token" and x["method"] == "copy" and x["request"] == 0
    ids = real_lm.encode(sent[0], chat=True)
    van = real_lm.tokenizer(base[0], add_special_tokens=False)["input_ids"]
    oth = real_lm.tokenizer(other[0], add_special_tokens=False)["input_ids"]
    i = next(j for j, (a, b) in enumerate(zip(van, oth)) if a != b)
    with torch.inference_mode():
        logits = real_lm.model(input_ids=torch.tensor([ids + van[:i]])).logits[0, -1].float()
    assert x["position"] == i and x["tokens"] == [real_lm.tokenizer.decode([van[i]]), real_lm.tokenizer.decode([oth[i]])]
    assert abs(x["fp32_margin"] - float(logits[van[i]] - logits[oth[i]])) < 1e-4
    assert "copy / mtbench c1 / request 0: token" in report.differences_text([x])
    res[("copy", "mtbench", 1)]["input_lens"] = [n + 1 for n in lens]      # the prompts are not the ones sent
    (y,) = report.explain_differences(res, tmp_path, real_lm)
    assert y["kind"] == "unmatched" and "request of" in report.differences_text([y])
