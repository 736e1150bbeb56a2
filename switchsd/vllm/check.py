"""Run in vLLM's environment: vLLM loads the plugin, and greedy outputs with the copy proposer and with SwitchSD
(EAGLE-3 behind the probe gate) equal vLLM's own outputs without speculation on three prompts (a JSON echo, a
story, a code rewrite).

    .venv-vllm/bin/python -m switchsd.vllm.check [--model FOLDER] [--max-tokens 128] [--out check.json]

One process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the proposers' path counts can be read back. Prints, and
writes with --out, one JSON object.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

from switchsd import envs

PROMPTS = [
    'Repeat this JSON exactly: {"name": "Alice", "age": 30, "city": "Paris", "tags": ["a", "b", "c"]}',
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Rewrite this function with type hints:\ndef add(a, b):\n    total = a + b\n    return total\n",
]


ROOT = Path(__file__).resolve().parents[2]


def _first_diff(u: list[int], v: list[int]) -> int | None:
    i = next((i for i, (x, y) in enumerate(zip(u, v)) if x != y), None)
    return i if i is not None or len(u) == len(v) else min(len(u), len(v))


def default_model() -> str:
    return str(Path(envs.get("SWITCHSD_CACHE") or Path.home() / ".cache" / "switchsd") / "smollm2-135m-instruct")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    ap.add_argument("--head", default=str(ROOT / "assets" / "eagle3-smollm2-135m"))
    ap.add_argument("--probe", default=str(ROOT / "probes" / "smollm2-135m-instruct.safetensors"))
    ap.add_argument("--methods", default="copy,switchsd")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if not (Path(a.model) / "config.json").exists():
        raise SystemExit(f"error: no model folder at {a.model} (`make vllm` prepares it)")
    from switchsd.vllm.gate import ENV
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault(ENV, a.probe)                     # the gate wraps EAGLE-3 (the switchsd method only)
    from importlib.metadata import entry_points

    from vllm import LLM, SamplingParams

    from switchsd.vllm import check_internals
    from switchsd.vllm.copy import CopyProposer
    from switchsd.vllm.gate import Gate
    from switchsd.vllm.methods import speculative_config

    loaded = any(e.value == "switchsd.vllm:register" for e in entry_points(group="vllm.general_plugins"))
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    specs = {m: speculative_config(m, a.k, a.head) for m in ("none", "copy", "switchsd")}
    outs = {}
    for name in ["none"] + [m for m in a.methods.split(",") if m]:
        spec = specs[name]
        llm = LLM(model=a.model, dtype="float32", enforce_eager=True, max_model_len=1024, seed=0,
                  speculative_config=spec, gpu_memory_utilization=0.1)       # on a CPU: a share of the RAM
        tok = llm.get_tokenizer()
        prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                   for p in PROMPTS]
        outs[name] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
        del llm
        gc.collect()                       # its KV cache, before the next engine reserves its own
    counts = {"copy": CopyProposer.last_counts(), "switchsd": Gate.last_counts()}
    res = {"plugin_loaded": loaded, "internals_missing": check_internals(), "n": len(PROMPTS),
           "tokens": [len(o) for o in outs["none"]], "methods": {}}
    for name in outs:
        if name == "none":
            continue
        diff = [_first_diff(u, v) for u, v in zip(outs["none"], outs[name])]
        res["methods"][name] = {"identical": sum(d is None for d in diff), "first_diff": diff, "counts": counts[name]}
    print(json.dumps(res))
    if a.out:
        Path(a.out).write_text(json.dumps(res))


if __name__ == "__main__":
    main()
