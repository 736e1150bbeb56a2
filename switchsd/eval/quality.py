"""Quality harness of the verification lab: what relaxing verification buys (tokens per target forward, Tok/s)
and what it costs (accuracy, low-probability tokens), against the RIGHT baselines.

    python -m switchsd quality --rules lossless,minp:p_base=0.3,target-minp:p_base=0.3,target \
        --method eagle3@chain4 --limit 40 --seeds 3 --out runs/quality

Items are templated arithmetic word problems generated in code (one step a +/- b, two steps a + b - c), asked
with three worked examples and parsed from the first line of the answer; the offline model at T = 0.7 answers
a good share of them (the harness reports plain sampling's accuracy: that is the calibration). `--data-file`
JSONL rows {"question", "answer"} replace them.

Specs (comma-separated): a verification rule of switchsd/core/rules.py (`lossless`, `minp:p_base=..`,
`eta:eps=..`, `lenience:l=..`, `cos:lam=..`, `capped:lam=..,c=..`, `cos-contrastive:mu=..`, `easd:tq=..,tp=..`)
run with `--method`; or a baseline run without speculation: `target` (plain target sampling),
`target-minp:p_base=..` and `target-eta:eps=..` (target sampling truncated to the same sets: the TRUE baseline of a
truncation rule); or `smc:n=N,gamma=G[,layers=L,ess=E]`, SMC-SD (switchsd/core/smc.py; approximate) drafted by
the EAGLE-3 head, the `--draft` model, or (layers=L) a self-draft of the target's first L layers. `easd:auto` takes its thresholds from entropy percentiles measured on a separate problem set
(seed 10_000+, `--easd-pct`).

Per spec: exact-match accuracy with a 95% Wilson interval over limit x seeds answers; tokens per target
forward; Tok/s; the share of drafted tokens rejected; the low-p rate (share of emitted tokens whose target
probability at T is below 1e-3); for lossy rules the overshoot mass (mean over verified positions of the mass the
rule's output law puts above p on {q > p}; 0 for a lossless rule; not computed for EASD). Resumable (one JSONL line per answer in --out). Last line is JSON:
{"rules": {SPEC: {"accuracy", "ci", "tokens_per_forward", "tok_s", "low_p_rate", "n", "lossy", ...}}}.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from ..cli.common import Neural, add_model_args, add_neural_args, build_engine, load, resolve_budget
from ..core.config import CopyConfig, EngineConfig, SamplingConfig, SMCConfig
from ..core.rules import entropy, parse_rule
from ..factory import smc_engine
from ..io import read_jsonl

SHOTS = ("Question: Mia has 3 pens. Mia gets 5 more pens. How many pens does Mia have now?\nAnswer: 3 + 5 = 8\n\n"
         "Question: Sam has 9 cards. Sam gives away 4 cards. How many cards does Sam have left?\nAnswer: 9 - 4 = 5\n\n"
         "Question: Eva has 6 shells. Eva gets 7 more shells, then gives away 2 shells. How many shells does Eva "
         "have now?\nAnswer: 6 + 7 - 2 = 11\n\n")
NAMES = ["Tom", "Anna", "Ben", "Maria", "Leo", "Sara", "Omar", "Lena", "Ravi", "Jade"]
ITEMS = ["apples", "pencils", "books", "cookies", "stickers", "marbles", "stamps", "coins", "cards", "shells"]
LOW_P = 1e-3


def problems(n: int, seed: int) -> list[dict]:
    """Deterministic arithmetic word problems {"question", "answer"}: one or two steps, numbers 2..15."""
    r = random.Random(seed)
    out = []
    for _ in range(n):
        who, what = r.choice(NAMES), r.choice(ITEMS)
        a, b = r.randint(2, 12), r.randint(2, 9)
        kind = r.choice(["add", "sub", "two"])
        if kind == "add":
            q, ans = f"{who} has {a} {what}. {who} gets {b} more {what}. How many {what} does {who} have now?", a + b
        elif kind == "sub":
            a += b
            q, ans = f"{who} has {a} {what}. {who} gives away {b} {what}. How many {what} does {who} have left?", a - b
        else:
            c = r.randint(1, a + b - 1)
            q = (f"{who} has {a} {what}. {who} gets {b} more {what}, then gives away {c} {what}. How many {what} "
                 f"does {who} have now?")
            ans = a + b - c
        out.append({"question": q, "answer": ans})
    return out


def prompt_of(question: str) -> str:
    return SHOTS + "Question: " + question + "\nAnswer:"


def parse_answer(text: str) -> int | None:
    line = text.strip().split("\n")[0]
    m = re.search(r"=\s*(-?\d+)", line) or re.search(r"(-?\d+)", line)
    return int(m.group(1)) if m else None


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def spec_engine(spec: str, args, lm, neural: Neural, budget: int, easd: tuple[float, float] | None):
    """(engine, rule label, lossy) for one spec."""
    name, _, knobs = spec.partition(":")
    sampling = dict(temperature=args.temperature)
    if name.startswith("target"):
        if name == "target-minp":
            sampling["min_p"] = parse_rule("minp:" + knobs).get("p_base")
        elif name == "target-eta":
            sampling["eta"] = parse_rule("eta:" + knobs).get("eps")
        elif name != "target":
            raise SystemExit(f"error: unknown baseline {spec!r}: target, target-minp:p_base=X, target-eta:eps=X")
        cfg = EngineConfig(max_new_tokens=args.max_new_tokens, budget=budget, sampling=SamplingConfig(**sampling))
        return build_engine("vanilla", lm, cfg, CopyConfig(), neural), "target sampling" + (
            f" truncated ({knobs})" if knobs else ""), False
    if name == "smc":
        kv = dict(part.split("=") for part in knobs.split(",") if "=" in part)
        try:
            smc = SMCConfig(int(kv.get("n", 4)), int(kv.get("gamma", 4)), ess_threshold=float(kv.get("ess", 0.5)),
                            self_draft_layers=int(kv.get("layers", 0)))
            cfg = EngineConfig(max_new_tokens=args.max_new_tokens, sampling=SamplingConfig(args.temperature))
            eng = smc_engine(lm, neural.drafters, cfg, smc, {}, "sps" if args.draft else "eagle3")
        except (ValueError, TypeError) as e:
            raise SystemExit(f"error: {spec}: {e}") from None
        return eng, f"SMC-SD {knobs} (approximate)", True
    if name == "easd" and knobs == "auto":
        spec = f"easd:tq={easd[0]:.4f},tp={easd[1]:.4f}"
    try:
        rule = parse_rule(spec)
        cfg = EngineConfig(max_new_tokens=args.max_new_tokens, budget=budget,
                           sampling=SamplingConfig(**sampling), verify=spec, record_overshoot=rule.lossy)
    except ValueError as e:
        raise SystemExit(f"error: {spec}: {e}") from None
    return build_engine(args.method, lm, cfg, CopyConfig(), neural), rule.label, rule.lossy


@torch.inference_mode()
def low_p_count(lm, ids: list[int], out: list[int], temperature: float) -> int:
    """Emitted tokens whose target probability (at T, untruncated) is below LOW_P."""
    if not out:
        return 0
    logits = lm.model(input_ids=torch.tensor([ids + out], device=lm.device)).logits[0, len(ids) - 1:-1]
    p = torch.softmax(logits.float() / temperature, -1)
    return int((p.gather(-1, torch.tensor(out, device=p.device)[:, None]) < LOW_P).sum())


@torch.inference_mode()
def easd_thresholds(lm, neural: Neural, args, pct: float) -> tuple[float, float]:
    """EASD's entropy thresholds: the `pct` percentiles of H(q) (the EAGLE-3 head) and H(p) (the target) over the
    positions of target-sampled answers to a SEPARATE problem set (seed 10_000; never the evaluated items)."""
    from ..drafters.eagle3 import Eagle3Drafter
    hp, hq = [], []
    head = neural.drafters.head
    drafter = Eagle3Drafter(head, lm.model, chain=True, gamma=1, sampling=SamplingConfig(args.temperature))
    for i, item in enumerate(problems(12, 10_000)):
        ids = lm.encode(prompt_of(item["question"]), chat=False)
        hs = lm.model(input_ids=torch.tensor([ids], device=lm.device), output_hidden_states=True)
        p = torch.softmax(hs.logits[0].float() / args.temperature, -1)                    # [T, V]
        hp += entropy(p[len(ids) // 2:]).tolist()
        hq.append(float(entropy(drafter.q_along(hs.hidden_states, ids)[-1].float())))    # the first draft's q
    q = lambda xs: float(torch.tensor(xs).quantile(pct / 100))       # noqa: E731
    return q(hq), q(hp)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rules", default="lossless,target", help="comma-separated specs (see above)")
    ap.add_argument("--method", default="eagle3@chain4", help="the drafting method the rules verify")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--budget", default="auto")
    ap.add_argument("--budget-ratio", type=float, default=2.0)
    ap.add_argument("--data-file", default=None, help='JSONL rows {"question", "answer"} instead of the templates')
    ap.add_argument("--easd-pct", type=float, default=80.0, help="easd:auto thresholds: entropy percentile")
    ap.add_argument("--out", default="runs/quality")
    add_model_args(ap)
    add_neural_args(ap)
    args = ap.parse_args(argv)
    if not args.temperature > 0:
        ap.error("the lab compares sampling rules: --temperature must be > 0")
    specs = [s.strip() for s in re.split(r",(?=[a-z-]+(?::|,|$))", args.rules) if s.strip()]
    items = read_jsonl(args.data_file) if args.data_file else problems(args.limit, 0)
    items = items[:args.limit]
    lm = load(args)
    budget, _ = resolve_budget(args, lm)
    neural = Neural(args, lm)
    easd = easd_thresholds(lm, neural, args, args.easd_pct) if any(s == "easd:auto" for s in specs) else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "records.jsonl"
    done = {(r["spec"], r["seed"], r["i"]): r for r in (read_jsonl(path) if path.exists() else [])}
    bar = tqdm(total=len(specs) * args.seeds * len(items), desc="quality", unit="answer", file=sys.stderr)
    summary = {}
    with open(path, "a") as f:
        for spec in specs:
            engine, label, lossy = spec_engine(spec, args, lm, neural, budget, easd)
            recs = []
            for seed in range(args.seeds):
                for i, item in enumerate(items):
                    key = (spec, seed, i)
                    if key not in done:
                        ids = lm.encode(prompt_of(item["question"]), chat=False)
                        res = engine.run(ids, torch.Generator().manual_seed(seed * 100_003 + i))
                        text = lm.tokenizer.decode(res.token_ids, skip_special_tokens=True)
                        drafted = sum(len(e.tree_tokens) - 1 for e in res.events)
                        done[key] = {"spec": spec, "seed": seed, "i": i, "correct": parse_answer(text) == item["answer"],
                                     "tokens": len(res.token_ids), "forwards": len(res.events),
                                     "wall_s": res.stats["wall_s"], "drafted": drafted,
                                     "rejected": max(0, drafted - sum(len(e.accepted) for e in res.events)),
                                     "low_p": low_p_count(lm, ids, res.token_ids, args.temperature),
                                     "resamples": res.stats.get("resamples"), "mean_ess": res.stats.get("mean_ess"),
                                     # drafted tokens the rule evaluated, and those given probability 0 (EASD: fired)
                                     "evaluated": sum(a is not None for e in res.events for a in e.accept_probs or []),
                                     "zero_prob": sum(a == 0.0 for e in res.events for a in e.accept_probs or []),
                                     # mass emitted above p on {q > p}, summed over verified nodes (lossy rules)
                                     "overshoot": [sum(o for e in res.events for o in e.overshoot or []),
                                                   sum(len(e.overshoot or []) for e in res.events)]}
                        f.write(json.dumps(done[key]) + "\n")
                        f.flush()
                    recs.append(done[key])
                    bar.update()
            engine.close()
            k, n = sum(r["correct"] for r in recs), len(recs)
            toks = sum(r["tokens"] for r in recs)
            summary[spec] = {"label": label, "lossy": lossy, "accuracy": k / n, "ci": list(wilson(k, n)), "n": n,
                             "tokens_per_forward": toks / max(1, sum(r["forwards"] for r in recs)),
                             "tok_s": toks / max(1e-9, sum(r["wall_s"] for r in recs)),
                             "low_p_rate": sum(r["low_p"] for r in recs) / max(1, toks),
                             "rejected_share": sum(r["rejected"] for r in recs) / max(1, sum(r["drafted"] for r in recs))}
            if spec.startswith("easd") and all("zero_prob" in r for r in recs):
                summary[spec]["trigger_rate"] = (sum(r["zero_prob"] for r in recs) /
                                                 max(1, sum(r["evaluated"] for r in recs)))
            nodes = sum(r.get("overshoot", [0, 0])[1] for r in recs)
            if nodes:       # mean over verified nodes of the rule's emitted mass above p on {q > p}
                summary[spec]["overshoot_mass"] = sum(r["overshoot"][0] for r in recs) / nodes
            if recs and recs[0].get("mean_ess") is not None:
                summary[spec].update(mean_ess=sum(r["mean_ess"] for r in recs) / n,
                                     resample_rate=sum(r["resamples"] for r in recs) / max(1, sum(r["forwards"] for r in recs)))
    bar.close()
    meta = {"method": args.method, "temperature": args.temperature, "limit": len(items), "seeds": args.seeds,
            "max_new_tokens": args.max_new_tokens, "model": lm.name, "dtype": lm.precision, "budget": budget,
            "easd_thresholds": easd, "command": "python -m switchsd quality " + " ".join(argv or sys.argv[1:])}
    (out / "summary.json").write_text(json.dumps({"meta": meta, "rules": summary}, indent=1))
    print("| spec | accuracy (95% CI) | tok/fwd | Tok/s | low-p rate | overshoot mass | rejected |\n"
          "|---|---|---|---|---|---|---|")
    for spec, s in summary.items():
        om = f"{s['overshoot_mass']:.4f}" if "overshoot_mass" in s else "-"
        print(f"| {s['label']} | {s['accuracy']:.3f} ({s['ci'][0]:.2f}-{s['ci'][1]:.2f}) | "
              f"{s['tokens_per_forward']:.2f} | {s['tok_s']:.1f} | {s['low_p_rate']:.4f} | {om} | "
              f"{s['rejected_share']:.2f} |")
    print(json.dumps({"rules": {k: {f: v[f] for f in ("accuracy", "ci", "tokens_per_forward", "tok_s", "low_p_rate",
                                                       "n", "lossy")} for k, v in summary.items()}}))


if __name__ == "__main__":
    main()
