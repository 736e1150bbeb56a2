"""Draft quality without a model: replay the greedy outputs of a `scripts/vllm_pair.py` run through suffix decoding
(Arctic Inference's cache, vLLM's settings) and through the SwitchSD gate's copy path (`copy_match`, the
`CopyCounts` back-off, the cost rule's choice of length with a fixed step-time line), token by token: a draft is
accepted up to its first token that differs from the output, then the output's next token is committed. Counts
steps, drafted and accepted tokens, and tokens per second under the line (no probe: the copy path's record is
not split by the probe here, and EAGLE-3 is left out). Runs in vLLM's environment (arctic-inference).

    .venv-vllm/bin/python scripts/vllm_replay.py runs/vllm-pair/pair.json --k 5 8 --step-ms 55 --row-ms 3
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from switchsd.vllm.copy import KAPPA, CopyCounts, copy_match  # noqa: E402
from switchsd.vllm.costs import PathCosts  # noqa: E402


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


def copy_proposer(k: int, step_s, kappa: int = KAPPA):
    counts, costs, previous = CopyCounts(), PathCosts(), {}
    for rows in range(1, k + 2):
        costs.time[(False, rows)] = [step_s(rows), 1]

    def propose(rid: str, ctx: np.ndarray, prompt_len: int, last: tuple[int, int] | None = None) -> list[int]:
        if rid in previous and last is not None:
            costs.credit(previous.pop(rid), *last)
        counts.add(rid, ctx, prompt_len)
        chain, gap, _ = copy_match(ctx, kappa, k)
        match, backed_off = kappa, False
        if not chain:
            chain, match = counts.chain(rid, ctx, k)
            backed_off = bool(chain)
        tag = f"copy:x:{min(match, kappa)}{'r' if chain and not backed_off and len(chain) > gap else ''}"
        chain = chain[:costs.choose(tag, len(chain), 0)]
        if chain:
            previous[rid] = tag
        return chain
    return propose


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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair", help="pair.json of scripts/vllm_pair.py (its texts and prompt sets)")
    ap.add_argument("--k", type=int, nargs="+", default=[5, 8], help="draft caps to replay")
    ap.add_argument("--step-ms", type=float, default=55.0, help="a step verifying no draft")
    ap.add_argument("--row-ms", type=float, default=3.0, help="what each drafted row adds")
    a = ap.parse_args(argv)
    if min(a.k) < 1 or a.step_ms <= 0 or a.row_ms < 0:
        raise SystemExit("error: --k >= 1, --step-ms > 0, --row-ms >= 0")
    from transformers import AutoTokenizer

    from switchsd.vllm.check import default_model
    from switchsd.vllm.methods import METHODS
    pair = json.loads(Path(a.pair).read_text())
    tok = AutoTokenizer.from_pretrained(default_model())
    prompts_dir = Path(a.pair).parent / "prompts"
    method = next(m for m in pair["methods"] if m in METHODS)

    def step_s(rows: int) -> float:
        return (a.step_ms + a.row_ms * (rows - 1)) / 1000

    print("| set | drafter | k | steps | drafted | accepted | tokens / step | tok/s under the line |")
    print("|---|---|---|---|---|---|---|---|")
    for name, res in pair["sets"].items():
        texts = [r[method]["text"] for r in res["requests"]]
        prompts = [json.loads(line)["prompt"] for line in (prompts_dir / f"{name}.jsonl").read_text().splitlines()]
        requests = []
        for p, t in zip(prompts, texts):
            ids = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=True, add_generation_prompt=True)
            ids = list(ids["input_ids"] if not isinstance(ids, list) else ids)
            requests.append((ids, tok.encode(t, add_special_tokens=False)[:pair["max_new"]]))
        for k in [None] + a.k:
            for label, prop, feedback in (("suffix", suffix_proposer(k), False),) + (
                    (("gate copy path", copy_proposer(k, step_s), True),) if k is not None else ()):
                r = replay(requests, prop, step_s, feedback)
                print(f"| {name} {len(requests)} | {label} | {k or 'default (24)'} | {r['steps']} | {r['drafted']} | "
                      f"{r['accepted']} | {r['tokens_per_step']:.3f} | {r['tok_s']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
