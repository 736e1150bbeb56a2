"""What a method's machinery costs a vLLM step when nothing is drafted: greedy decoding of a few prompts in one
process (vLLM's `LLM` class, no HTTP server), one configuration per process, milliseconds per generated token
(= per step: no draft, one token a step). Configurations: `none` (no speculation); `copy-never` (the copy
proposer through `custom_class`, its kappa-gram too long to ever match); `switchsd-never` (EAGLE-3's method with
the gate: the probe read and the whole plan computed every step, its drafts then dropped); `switchsd-bare`
(EAGLE-3's method, a gate that returns no draft at once). Run them in ABBA order: the machine drifts.

    .venv-vllm/bin/python scripts/vllm_step_cost.py none copy-never switchsd-never switchsd-bare \
        switchsd-bare switchsd-never copy-never none --prompts 8 --max-new 96
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("none", "copy-never", "switchsd-never", "switchsd-bare")


def one(config: str, prompts: int, max_new: int) -> float:
    """Milliseconds per generated token for `config` (run in its own process)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sys.path.insert(0, str(ROOT))
    from switchsd.vllm.gate import ENV
    from switchsd.vllm.methods import PROBE, speculative_config
    if config.startswith("switchsd"):
        os.environ[ENV] = str(ROOT / PROBE)
    if config == "copy-never":
        os.environ["SWITCHSD_KAPPA"] = "1000000"
    from vllm import LLM, SamplingParams

    from switchsd.eval.datasets import load_prompts
    from switchsd.vllm.check import default_model
    from switchsd.vllm.gate import Gate
    plan = Gate.plan
    if config == "switchsd-never":
        Gate.plan = lambda self, scores, seqs, *a, **k: ([[] for _ in plan(self, scores, seqs, *a, **k)[0]], None)
    elif config == "switchsd-bare":
        Gate.plan = lambda self, scores, seqs, *a, **k: ([[] for _ in seqs], None)
    method = {"none": "none", "copy-never": "copy"}.get(config, "switchsd")
    llm = LLM(model=default_model(), dtype="float32", enforce_eager=True, max_model_len=4096, seed=0,
              speculative_config=speculative_config(method), gpu_memory_utilization=0.1)
    tok = llm.get_tokenizer()
    texts = [tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                     add_generation_prompt=True) for r in load_prompts("math500", limit=prompts)]
    llm.generate(texts[:1], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)       # warm-up
    seconds, tokens = 0.0, 0
    for text in texts:                                       # one request at a time: concurrency 1
        t = time.perf_counter()
        out = llm.generate([text], SamplingParams(temperature=0, max_tokens=max_new), use_tqdm=False)[0]
        seconds, tokens = seconds + time.perf_counter() - t, tokens + len(out.outputs[0].token_ids)
    return 1000 * seconds / tokens


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+", choices=CONFIGS)
    ap.add_argument("--prompts", type=int, default=8, help="MATH-500 prompts, one at a time")
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)        # the child process
    a = ap.parse_args(argv)
    if a.prompts < 1 or a.max_new < 1:
        raise SystemExit("error: --prompts and --max-new >= 1")
    if a.one:
        print(json.dumps({"ms_per_token": one(a.configs[0], a.prompts, a.max_new)}))
        return
    env = dict(os.environ)
    iomp = ROOT / ".venv-vllm" / "lib" / "libiomp5.so"           # vLLM's CPU speculative decoding asks for it
    if iomp.exists() and "libiomp5" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = f"{iomp} {env.get('LD_PRELOAD', '')}".strip()
    print("| run | configuration | ms per token |\n|---|---|---|")
    for i, config in enumerate(a.configs, 1):
        r = subprocess.run([sys.executable, __file__, config, "--one", "--prompts", str(a.prompts), "--max-new",
                            str(a.max_new)], capture_output=True, text=True, cwd=ROOT, env=env)
        if r.returncode != 0:
            raise SystemExit(f"error: {config} failed:\n{r.stderr[-2000:]}")
        ms = json.loads(r.stdout.strip().splitlines()[-1])["ms_per_token"]
        print(f"| {i} | {config} | {ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
