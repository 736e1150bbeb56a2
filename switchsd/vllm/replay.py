"""Draft quality without a model: replay the greedy outputs of a `switchsd vllm pair` or `switchsd vllm bench`
run through suffix decoding
(Arctic Inference's cache, vLLM's settings) and through the SwitchSD gate's copy path (`Gate.plan` with EAGLE-3 left
out: `copy_match`, the `CopyCounts` back-off, the cost rule's choice of length with a fixed step-time line), token
by token: a draft is accepted up to its first token that differs from the output, then the output's next token is
committed. Counts
steps, drafted and accepted tokens, and tokens per second under the line (no probe: the copy path's record is
not split by the probe here, and EAGLE-3 is left out). With --probe, also the whole gate (`Gate.plan`, the cost
rule, the copy path's record split by the probe as served) with the probe's logit at every position, read by the
gate's own hook in one vLLM prefill of each prompt and its output (EAGLE-3 still left out). Runs in vLLM's
environment (arctic-inference).

    .venv-vllm/bin/python -m switchsd vllm replay runs/vllm-pair/pair.json --k 5 8 --step-ms 55 --row-ms 3 [--probe]
    .venv-vllm/bin/python -m switchsd vllm replay runs/vllm-256e --k 16 24 --kappa 2 3 --factor 0 2
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .copy import SPEC_FACTOR
from .gate import KAPPA

ROOT = Path(__file__).resolve().parents[2]


def suffix_proposer(k: int | None, depth: int = 24):
    from arctic_inference.suffix_decoding import SuffixDecodingCache
    cache, current = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=10000), {"id": None, "n": 0}
    cap = k if k is not None else depth                     # vLLM's default: the tree depth

    def propose(rid: str, ctx: np.ndarray, prompt_len: int) -> list[int]:
        if current["id"] != rid:
            if current["id"] is not None:
                cache.stop_request(current["id"])
            cache.start_request(rid, ctx[:prompt_len].astype(np.int32))
            current.update(id=rid, n=prompt_len)
        if len(ctx) > current["n"]:
            cache.add_active_response(rid, ctx[current["n"]:].tolist())
            current["n"] = len(ctx)
        pattern = ctx[max(0, len(ctx) - depth):].astype(np.int32)
        return list(cache.speculate(rid, pattern, max_spec_tokens=cap, max_spec_factor=1.0,
                                    min_token_prob=0.1).token_ids)
    return propose


def gate_proposer(k: int, step_s, logits: list[list[float]] | None = None, tau: float = 0.5, kappa: int = KAPPA,
                  factor: int = SPEC_FACTOR):
    """The served gate's plan (cost rule, EAGLE-3 left out), the probe read from `logits` (request, position);
    without logits every step scores 0, so the copy path's record is not split by the probe (the "copy path")."""
    import torch

    from switchsd.vllm.gate import Gate
    probe = SimpleNamespace(weight=torch.zeros(1), tau=tau, layer=0, sublayer="mlp")   # scores come from `logits`
    gate = Gate(probe, None, 1, kappa=kappa, neural_k=0, factor=factor)
    for rows in range(1, k + 2):
        gate.costs.set_time(False, rows, step_s(rows))

    def propose(rid: str, ctx: np.ndarray, prompt_len: int, last: tuple[int, int] | None = None) -> list[int]:
        score = 1 / (1 + math.exp(-logits[int(rid)][len(ctx) - 2])) if logits else 0.0   # the last verified token
        gate.last_call = None                                             # replayed steps take no time
        rows, acc = ([1 + last[0]], [last[1]]) if last else ([1], [0])
        plan, _ = gate.plan([score], [ctx], [rid], k, [True], rows, acc, [prompt_len])
        return plan[0] or []
    return propose


def probe_logits(model: str, probe: str, requests: list[tuple[list[int], list[int]]]) -> tuple[list[list[float]], float]:
    """The probe's logit at every position of each prompt + output, as the served gate's hook reads it (one prefill
    per request, prefix caching off so that every position is computed), and its threshold."""
    from switchsd.vllm.gate import ENV
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")       # one process: the gate is read back here
    os.environ[ENV] = probe
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from switchsd.vllm.gate import Gate
    from switchsd.vllm.methods import speculative_config
    longest = max(len(p) + len(o) for p, o in requests) + 8
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=longest, seed=0,
              max_num_batched_tokens=longest, enable_prefix_caching=False, gpu_memory_utilization=0.1,
              speculative_config=speculative_config("switchsd"))
    out = []
    for prompt, output in requests:
        ids = prompt + output
        llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
        out.append(Gate._last.logits[:len(ids)].tolist())
    return out, float(Gate._last.tau)


def replay(requests: list[tuple[list[int], list[int]]], propose, step_s, feedback: bool) -> dict:
    steps = drafted = accepted = tokens = 0
    seconds = 0.0
    for r, (prompt, out) in enumerate(requests):
        pos, last = 0, None
        while pos < len(out):
            ctx = np.array(prompt + out[:pos], dtype=np.int64)
            d = propose(str(r), ctx, len(prompt), last) if feedback else propose(str(r), ctx, len(prompt))
            a = 0
            while a < len(d) and pos + a < len(out) and d[a] == out[pos + a]:
                a += 1
            last = (len(d), a)
            n = min(a + 1, len(out) - pos)
            pos, steps, drafted, accepted, tokens = pos + n, steps + 1, drafted + len(d), accepted + a, tokens + n
            seconds += step_s(1 + len(d))
    return {"steps": steps, "drafted": drafted, "accepted": accepted, "tokens_per_step": tokens / max(1, steps),
            "tok_s": tokens / seconds}


def load_sets(source: Path, tok) -> dict[str, list[tuple[list[int], list[int]]]]:
    """Each set's (prompt ids with the chat template, greedy output ids), in the order the server saw them: from a
    pair.json of `switchsd vllm pair`, or from a run folder of `switchsd vllm bench` (its concurrency-1 texts
    of the first method found, the prompts in the client's seeded order)."""
    from switchsd.vllm.methods import METHODS
    texts: dict[str, list[str]] = {}
    prompts: dict[str, list[str]] = {}
    if source.is_dir():
        from .report import sent_prompts
        method = next((m for m in METHODS if any((source / m).glob("*-c1.json"))), None)
        if method is None:
            raise SystemExit(f"error: {source}: no METHOD/SET-c1.json of switchsd vllm bench")
        for f in sorted((source / method).glob("*-c1.json")):
            name = f.name[:-len("-c1.json")]
            texts[name] = json.loads(f.read_text())["generated_texts"]
            prompts[name] = sent_prompts(source, name)[:len(texts[name])]
        max_new = None
    else:
        pair = json.loads(source.read_text())
        method = next(m for m in pair["methods"] if m in METHODS)
        for name, res in pair["sets"].items():
            texts[name] = [r[method]["text"] for r in res["requests"]]
            lines = (source.parent / "prompts" / f"{name}.jsonl").read_text().splitlines()
            prompts[name] = [json.loads(line)["prompt"] for line in lines]
        max_new = pair["max_new"]
    sets = {}
    for name in texts:
        sets[name] = []
        for p, t in zip(prompts[name], texts[name]):
            ids = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=True, add_generation_prompt=True)
            ids = list(ids["input_ids"] if not isinstance(ids, list) else ids)
            sets[name].append((ids, tok.encode(t, add_special_tokens=False)[:max_new]))
    return sets


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="pair.json of switchsd vllm pair, or a run folder of switchsd vllm bench")
    ap.add_argument("--k", type=int, nargs="+", default=[5, 8], help="draft caps to replay")
    ap.add_argument("--kappa", type=int, nargs="+", default=[KAPPA], help="the gate's kappa-grams to replay")
    ap.add_argument("--factor", type=int, nargs="+", default=[SPEC_FACTOR],
                    help="the gate's caps on a copy chain, in multiples of its match (0: none)")
    ap.add_argument("--step-ms", type=float, default=55.0, help="a step verifying no draft")
    ap.add_argument("--row-ms", type=float, default=3.0, help="what each drafted row adds")
    ap.add_argument("--probe", nargs="?", const="", default=None, metavar="SAFETENSORS",
                    help="also replay the whole gate with this probe (default: the shipped one)")
    a = ap.parse_args(argv)
    if min(a.k) < 1 or min(a.kappa) < 1 or min(a.factor) < 0 or a.step_ms <= 0 or a.row_ms < 0:
        raise SystemExit("error: --k >= 1, --kappa >= 1, --factor >= 0, --step-ms > 0, --row-ms >= 0")
    source = Path(a.source)
    if not source.exists():
        raise SystemExit(f"error: {source} does not exist")
    from transformers import AutoTokenizer

    from switchsd.vllm.check import default_model
    from switchsd.vllm.methods import PROBE
    sets = load_sets(source, AutoTokenizer.from_pretrained(default_model()))

    def step_s(rows: int) -> float:
        return (a.step_ms + a.row_ms * (rows - 1)) / 1000

    logits, tau = {}, 0.5
    if a.probe is not None:
        flat, tau = probe_logits(default_model(), a.probe or str(ROOT / PROBE), [r for v in sets.values() for r in v])
        for name, requests in sets.items():
            logits[name], flat = flat[:len(requests)], flat[len(requests):]

    print("| set | drafter | k | kappa | factor | steps | drafted | accepted | tokens / step | tok/s under the line "
          "| x suffix |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, requests in sets.items():
        base = None
        for k in [None] + a.k:
            rows = [("suffix", suffix_proposer(k), False, "", "")]
            for kappa in a.kappa if k is not None else []:
                for f in a.factor:
                    rows.append(("gate copy path", gate_proposer(k, step_s, kappa=kappa, factor=f), True, kappa, f))
                    if name in logits:
                        rows.append(("gate with the probe", gate_proposer(k, step_s, logits[name], tau, kappa, f),
                                     True, kappa, f))
            for label, prop, feedback, kappa, f in rows:
                r = replay(requests, prop, step_s, feedback)
                base = base or r["tok_s"]
                print(f"| {name} {len(requests)} | {label} | {k or 'default (24)'} | {kappa} | {f} | {r['steps']} | "
                      f"{r['drafted']} | {r['accepted']} | {r['tokens_per_step']:.3f} | {r['tok_s']:.2f} | "
                      f"{r['tok_s'] / base:.3f} |", flush=True)


if __name__ == "__main__":
    main()
