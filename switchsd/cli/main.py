"""`switchsd <subcommand>` (also `python -m switchsd <subcommand>`): one command for everything.

Each subcommand is the `main(argv)` of a module, imported only when it runs (so `switchsd --help` is instant
and a subcommand's heavy imports stay its own).
"""
from __future__ import annotations

import importlib
import sys

# name -> (module with main(argv), one line for --help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("switchsd.cli.generate", "decode one prompt with one method and print the text (or --json)"),
    "bench": ("switchsd.eval.bench", "methods and peers side by side on a dataset (Tok/s, speedup, identity)"),
    "report": ("switchsd.eval.report", "rebuild docs/results.md and the README's results from docs/records"),
    "probe": ("switchsd.cli.groups:probe", "copy-intent probes: collect | train | evaluate"),
    "vllm": ("switchsd.cli.groups:vllm", "SwitchSD in vLLM: serve | bench | pair | report | replay"),
    "calibrate": ("switchsd.models.calibrate", "measure this device's verification cost curve (the cost gate's)"),
    "quality": ("switchsd.eval.quality", "task accuracy of lossy verification rules against lossless"),
    "serve-bench": ("switchsd.serve.bench", "batched serving: plain, speculative and MineDraft PSD under load"),
    "train-eagle3": ("switchsd.training.eagle3", "train an EAGLE-3 head on the target's own answers (resumable)"),
    "regen-sharegpt": ("switchsd.training.regen_job", "the target answers ShareGPT prompts: EAGLE-3 training data"),
    "analysis": ("switchsd.eval.analysis", "the paper's analyses: copy regimes, the speculation tax, temperature"),
    "tempsweep": ("switchsd.eval.tempsweep", "temperature sweep: speed at T > 0 and the output-law check"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name:<{width}}  {line}" for name, (_, line) in SUBCOMMANDS.items()]
    return ("usage: switchsd <subcommand> [options]   (or: python -m switchsd <subcommand>)\n\n"
            "SwitchSD: speculative decoding that copies from the context when the model intends to copy.\n\n"
            "subcommands:\n" + "\n".join(lines) + "\n\n`switchsd <subcommand> --help` for its options. "
            "The studio: python app.py\n")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return
    if argv[0] == "--help-env":
        from ..envs import table
        print(table(), end="")
        return
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(usage(), end="", file=sys.stderr)
        raise SystemExit(f"error: unknown subcommand {name!r}; choose from {', '.join(SUBCOMMANDS)}")
    target, _, func = SUBCOMMANDS[name][0].partition(":")
    module = importlib.import_module(target)
    sys.argv[0] = f"switchsd {name}"           # argparse's prog: usage lines read `switchsd bench ...`
    getattr(module, func or "main")(rest)
