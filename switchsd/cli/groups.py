"""Subcommand groups: `switchsd vllm <bench|pair|report|replay|serve>` and `switchsd probe <collect|train|evaluate>`.
Each is the `main(argv)` of a module, imported only when it runs."""
from __future__ import annotations

import importlib
import sys

VLLM = {"serve": ("switchsd.vllm.server", "start vLLM's server with a speculative method (make vllm-serve)"),
        "bench": ("switchsd.vllm.bench", "vLLM's own client against one server per method, several concurrencies"),
        "pair": ("switchsd.vllm.pair", "two methods request by request, both servers up (drift-free), a record"),
        "report": ("switchsd.vllm.report", "the tables of a `switchsd vllm bench` run"),
        "replay": ("switchsd.vllm.replay", "draft quality of suffix decoding and the gate's copy path on saved "
                                           "outputs (run with .venv-vllm/bin/python: arctic-inference)")}
PROBE = {"collect": ("probes.collect", "the target's completions, copy labels and hidden states (cached, resumes)"),
         "train": ("probes.train", "a linear probe per layer and site; the best one, its tau and its card"),
         "evaluate": ("probes.evaluate", "a probe's AUC / F1 on new prompts")}
GROUPS = {"vllm": VLLM, "probe": PROBE}


def run(group: str, argv: list[str]) -> None:
    table = GROUPS[group]
    width = max(map(len, table))
    usage = (f"usage: switchsd {group} <{'|'.join(table)}> [options]\n\n" +
             "\n".join(f"  {k:<{width}}  {line}" for k, (_, line) in table.items()) + "\n")
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage, end="")
        return
    if argv[0] not in table:
        print(usage, end="", file=sys.stderr)
        raise SystemExit(f"error: unknown `switchsd {group}` subcommand {argv[0]!r}; choose from {', '.join(table)}")
    sys.argv[0] = f"switchsd {group} {argv[0]}"
    importlib.import_module(table[argv[0]][0]).main(argv[1:])


def vllm(argv: list[str] | None = None) -> None:
    run("vllm", list(sys.argv[1:] if argv is None else argv))


def probe(argv: list[str] | None = None) -> None:
    run("probe", list(sys.argv[1:] if argv is None else argv))
