"""The regeneration loop's throughput in one format: 48 slots over the same 200 ShareGPT training prompts (the
last ones of the list, <= 512 tokens), for SECONDS (prefills included). Run one format after the other on a quiet
CPU (pause a running job with `kill -STOP`, resume it with `kill -CONT`):

    for d in float32 bfloat16; do python scripts/dev/regen_dtype_ab.py $d 100; done

Prints one JSON line: new tokens decoded per second (every active row's token of every decode step counts).
"""
from __future__ import annotations

import json
import sys
import time

from switchsd.drafters.eagle3_model import default_aux_layers
from switchsd.models.loading import load_model
from switchsd.training import regen
from switchsd.training.regen_job import DEFAULT_STATE, chat_ids
from switchsd.training.sharegpt import sharegpt_prompts


def main() -> None:
    dtype, seconds = sys.argv[1], float(sys.argv[2])
    prompts = [p for p in sharegpt_prompts(cache=DEFAULT_STATE) if p["split"] == "train"][-400:]
    lm = load_model(dtype=dtype, device="cpu")
    items = [(p["key"], ids) for p in prompts if len(ids := chat_ids(lm.tokenizer, p["messages"])) <= 512][:200]
    gen = regen.Regenerator(lm, default_aux_layers(lm.model.config.num_hidden_layers), 48, 512, 512)
    counted = {"steps": 0, "tokens": 0}
    forward = regen.batched_forward

    class TimeUp(Exception):
        pass

    def counting(lean, x, *a, **k):
        if time.time() - t0 > seconds:
            raise TimeUp
        if k.get("grouped"):                       # a decode step (prefills are not counted as new tokens)
            counted["steps"] += 1
            counted["tokens"] += x.shape[0]
        return forward(lean, x, *a, **k)
    regen.batched_forward = counting
    t0, answers = time.time(), 0
    try:
        for _ in gen.run(items):
            answers += 1
    except TimeUp:
        pass
    dt = time.time() - t0
    print(json.dumps({"dtype": dtype, "seconds": round(dt, 1), "decode_steps": counted["steps"],
                      "new_tokens": counted["tokens"], "tok_per_s": round(counted["tokens"] / dt, 1),
                      "answers": answers}))


if __name__ == "__main__":
    main()
