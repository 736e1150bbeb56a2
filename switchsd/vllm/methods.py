"""The speculative methods the benchmarks and `make vllm-serve` serve, as vLLM's `--speculative-config` (one table).

    python -m switchsd.vllm.methods switchsd        # prints the JSON (nothing for "none"); K: python -m ... copy 8
    python -m switchsd.vllm.methods --serve-flags   # the `vllm serve` flags every server here is started with

Each method at the draft length its users get by default (DEFAULT_K): ngram k 5 with lookup <= 4 (vLLM's
documented example); suffix decoding vLLM's own default (num_speculative_tokens left out: its tree depth, 24;
needs arctic-inference); eagle3 k 3 with the shipped head; copy (SwitchSD's copy drafter, every chain drafted
whole) k 5; switchsd (EAGLE-3's proposer behind the gate, which cuts each copy chain to the length that pays; the
server also needs SWITCHSD_VLLM_GATE=PROBE) chains of up to 24, suffix decoding's depth (each at most twice as long
as the context it matched), EAGLE-3 SWITCHSD_NEURAL_K = 3. A K given sets
suffix's, copy's and switchsd's draft cap. Imports nothing.
"""
from __future__ import annotations

import json
import sys

HEAD = "assets/eagle3-smollm2-135m"
PROBE = "probes/smollm2-135m-instruct.safetensors"
METHODS = ("none", "ngram", "suffix", "eagle3", "copy", "switchsd")
SERVE_FLAGS = ("--dtype", "float32", "--max-model-len", "4096", "--seed", "0", "--enforce-eager")   # bench, pairs, make


DEFAULT_K = {"ngram": 5, "suffix": None, "eagle3": 3, "copy": 5, "switchsd": 24}


def speculative_config(method: str, k: int | None = None, head: str = HEAD) -> dict | None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: expected one of {', '.join(METHODS)}")
    if k is not None and k < 1:
        raise ValueError(f"draft length {k}: expected >= 1")
    if method == "none":
        return None
    k = k if k is not None and method in ("suffix", "copy", "switchsd") else DEFAULT_K[method]
    cap = {} if k is None else {"num_speculative_tokens": k}
    return {"ngram": {"method": "ngram", **cap, "prompt_lookup_max": 4},
            "suffix": {"method": "suffix", **cap},
            "eagle3": {"method": "eagle3", "model": head, **cap},
            "copy": {"method": "custom_class", "model": "switchsd.vllm.copy.CopyProposer", **cap},
            "switchsd": {"method": "eagle3", "model": head, **cap}}[method]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--serve-flags"]:
        print(" ".join(SERVE_FLAGS))
        return
    if len(argv) not in (1, 2):
        raise SystemExit("usage: python -m switchsd.vllm.methods METHOD [K] | --serve-flags")
    try:
        spec = speculative_config(argv[0], int(argv[1]) if len(argv) == 2 and argv[1] else None)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if spec is not None:
        print(json.dumps(spec))


if __name__ == "__main__":
    main()
