"""Generate with one method and print the text (or, with --json, one JSON object).

    python -m switchsd generate --method copy --chat --prompt "Repeat this JSON: {...}" --json
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from ..core.events import hidden_to_list
from ..core.rules import parse_rule
from ..io import check_text, decode_utf8
from ..methods import METHODS
from .common import (
    Neural,
    add_decode_args,
    add_model_args,
    add_neural_args,
    build_engine,
    copy_config,
    engine_config,
    load,
    parse_method,
    resolve_budget,
)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="switchsd",
                    help=f"one of {', '.join(METHODS)}, optionally with a variant (NAME@chainG, NAME@treeKxDxN, "
                         "+kN, +tX) as in the benchmark")
    ap.add_argument("--prompt", default=None, help="prompt text (or '-' / omitted: read stdin)")
    ap.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, steps, stats")
    ap.add_argument("--hidden", action="store_true", help="with --json: include captured hidden vectors")
    add_model_args(ap)
    add_decode_args(ap)
    add_neural_args(ap)
    args = ap.parse_args(argv)
    parse_method(args.method)
    try:
        prompt = check_text(args.prompt if args.prompt not in (None, "-") else decode_utf8(sys.stdin.buffer.read()))
    except ValueError as e:
        ap.error(str(e))
    if not prompt.strip():
        ap.error("the prompt is empty")
    lm = load(args)
    budget, source = resolve_budget(args, lm)
    cfg = engine_config(args, budget)
    ids = lm.encode(prompt, chat=args.chat)
    if len(ids) >= lm.max_length:
        ap.error(f"the prompt has {len(ids)} tokens; the model's context is {lm.max_length}")
    engine = build_engine(args.method, lm, cfg, copy_config(args), Neural(args, lm), args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    approximate = getattr(engine, "approximate", False)
    if approximate:
        print("note: APPROXIMATE method (SMC-SD): the text is a sample of the target's distribution only as the "
              "particle count grows", file=sys.stderr)
    if parse_rule(cfg.verify).lossy:
        print(f"note: LOSSY verification ({parse_rule(cfg.verify).label}): the text is not a sample of the target's "
              "distribution", file=sys.stderr)
    if args.json:
        res = engine.run(ids, gen)
        steps = []
        for e in res.events:
            d = e.to_dict()
            if args.hidden:
                d["hidden"] = hidden_to_list(e.hidden)
            steps.append(d)
        text = lm.tokenizer.decode(res.token_ids, skip_special_tokens=True)
        rule = parse_rule(cfg.verify)
        print(json.dumps({"method": args.method, "model": lm.name, "budget": budget, "budget_source": source,
                          "verify": "SMC-SD (approximate)" if approximate else rule.label,
                          "lossy": rule.lossy or approximate,
                          "prompt_tokens": len(ids), "text": text, "token_ids": res.token_ids,
                          "steps": steps, "stats": res.stats}))
        return
    out: list[int] = []
    shown = ""
    for e in engine.generate(ids, gen):  # stream text as steps commit
        out.extend(e.new_tokens)
        text = lm.tokenizer.decode(out, skip_special_tokens=True)
        sys.stdout.write(text[len(shown):])
        sys.stdout.flush()
        shown = text
    print()


if __name__ == "__main__":
    main()
