"""Temperature sweep (the paper's Table 4) and the T > 0 distribution check.

    python -m switchsd analysis temperature --dataset mtbench --limit 10 --temps 0,0.25,0.5,0.75,1.0 \
        --methods vanilla,copyspec,eagle3,switchsd --max-new-tokens 128 --dist-samples 200 --out runs/temperature

speed: at every T, every method decodes the same prompts (interleaved, one warm-up); Tok/s, speedup over
vanilla at the same T, tokens per target forward (the paper's tau) and per-path shares.
distribution (every T > 0): speculative sampling must leave the output distribution equal to the target's,
which is NOT the same as reproducing vanilla's tokens (different random draws are consumed). On one copy-heavy
prompt each method and vanilla draw `--dist-samples` continuations of `--dist-tokens` tokens with seeds
0..N-1; a two-sample chi-square test compares each method with vanilla on the joint continuation and on each
position's token. A negative control (vanilla at 1.5 T against vanilla at T) shows the test has the power to
see a distribution shift of that size. We also report how often a method's continuation equals vanilla's for
the same seed: well below 100% means the equality is distributional, not token identity.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

import torch

from ..cli.common import Neural, build_engine, copy_config, engine_config, load, load_prompt_file, resolve_budget

DIST_PROMPT = ('Repeat this JSON exactly, without changing anything: {"id": 4821, "name": "Solar Panel Kit", '
               '"price": 249.99, "in_stock": true, "tags": ["energy", "outdoor", "diy"]}')


def chi2_two_sample(a: list, b: list, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Two-sample chi-square homogeneity test over categorical samples. Categories whose pooled expected
    count is below `min_expected` are merged into one. Returns (statistic, dof, p-value)."""
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    keys = set(ca) | set(cb)
    big = [k for k in keys if min(na, nb) * (ca[k] + cb[k]) / (na + nb) >= min_expected]
    rows = [(ca[k], cb[k]) for k in big]
    rest = (na - sum(r[0] for r in rows), nb - sum(r[1] for r in rows))
    if sum(rest) > 0:
        rows.append(rest)
    if len(rows) < 2:
        return 0.0, 0, 1.0
    stat = 0.0
    for xa, xb in rows:
        tot = xa + xb
        for x, n in ((xa, na), (xb, nb)):
            e = tot * n / (na + nb)
            stat += (x - e) ** 2 / e
    dof = len(rows) - 1
    p = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                      torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, dof, p


def compare(samples: list[tuple[int, ...]], ref: list[tuple[int, ...]]) -> dict:
    """Joint and per-position tests; `p_min_bonf` = smallest p-value x number of tests (capped at 1)."""
    tests = {"joint": chi2_two_sample(samples, ref)}
    for i in range(min(len(s) for s in samples + ref)):
        tests[f"pos{i}"] = chi2_two_sample([s[i] for s in samples], [s[i] for s in ref])
    p_min = min(t[2] for t in tests.values())
    return {"p_min_bonf": min(1.0, p_min * len(tests)), "tests": {k: {"chi2": round(t[0], 2), "dof": t[1],
                                                                      "p": t[2]} for k, t in tests.items()}}


def draws(lm, method: str, ids: list[int], args, budget: int, T: float, n: int, neural: Neural,
          bar=None) -> list[tuple]:
    """n continuations of `args.dist_tokens` tokens at temperature T, seeds 0..n-1 (target and drafter)."""
    a = argparse.Namespace(**{**vars(args), "temperature": T, "max_new_tokens": args.dist_tokens})
    cfg, copy_cfg = engine_config(a, budget), copy_config(a)
    out = []
    for s in range(n):
        eng = build_engine(method, lm, cfg, copy_cfg, neural, seed=s)     # the drafter's own generator: seed s + 1
        out.append(tuple(eng.run(ids, torch.Generator().manual_seed(s)).token_ids))
        if bar is not None:
            bar.update()
    return out


def temperature(args) -> None:
    from tqdm import tqdm
    prompts = load_prompt_file(args, args.limit)
    lm = load(args)
    budget, _ = resolve_budget(args, lm)
    neural = Neural(args, lm)
    temps = [float(t) for t in args.temps.split(",")]
    methods = ["vanilla"] + [m for m in dict.fromkeys(m.strip() for m in args.methods.split(",")) if m != "vanilla"]
    chat = bool(getattr(lm.tokenizer, "chat_template", None))
    encoded = [lm.encode(p["prompt"], chat=chat) for p in prompts]
    speed: dict = {}
    bar = tqdm(total=len(temps) * len(methods) * len(encoded), desc="temperature sweep", unit="gen")
    for T in temps:
        a = argparse.Namespace(**{**vars(args), "temperature": T})
        cfg = engine_config(a, budget)
        engines = {m: build_engine(m, lm, cfg, copy_config(a), neural) for m in methods}
        for m in methods:     # warm-up
            engines[m].run(encoded[0][:64], torch.Generator().manual_seed(0))
        recs = {m: [] for m in methods}
        for i, ids in enumerate(encoded):
            for m in methods:
                st = engines[m].run(ids, torch.Generator().manual_seed(i)).stats
                recs[m].append(st)
                bar.update()
        base = statistics.mean(r["tok_s"] for r in recs["vanilla"])
        speed[str(T)] = {m: {"tok_s": statistics.mean(r["tok_s"] for r in rs),
                             "speedup": statistics.mean(r["tok_s"] for r in rs) / base,
                             "tok_per_fwd": sum(r["new_tokens"] for r in rs) / sum(r["steps"] for r in rs)}
                         for m, rs in recs.items()}
    bar.close()
    out = Path(args.out)
    _write(out, temps, methods, speed, {}, args)          # the speed table is kept even if the check is cut short
    dist: dict = {}
    ids = lm.encode(args.dist_prompt, chat=chat)
    dist_temps = [t for t in temps if t > 0] if args.dist_samples > 0 else []
    bar = tqdm(total=len(dist_temps) * (len(methods) + 1) * args.dist_samples, desc="distribution check",
               unit="draw")
    for T in dist_temps:
        ref = draws(lm, "vanilla", ids, args, budget, T, args.dist_samples, neural, bar)
        res = {"negative_control_vanilla_at_1.5T": compare(
            draws(lm, "vanilla", ids, args, budget, 1.5 * T, args.dist_samples, neural, bar), ref)}
        for m in methods[1:]:
            s = draws(lm, m, ids, args, budget, T, args.dist_samples, neural, bar)
            res[m] = {**compare(s, ref), "same_as_vanilla_same_seed": sum(x == y for x, y in zip(s, ref)) / len(s),
                      "distinct_continuations": len(set(s))}
        dist[str(T)] = res
        print(f"T={T}: " + ", ".join(f"{m} p={r['p_min_bonf']:.3g}" for m, r in res.items()), flush=True)
        _write(out, temps, methods, speed, dist, args)
    bar.close()
    print("\n".join(_table(temps, methods, speed, dist)))
    print(json.dumps({"speedup": {t: {m: round(v["speedup"], 3) for m, v in s.items()} for t, s in speed.items()},
                      "dist_p": {t: {m: r["p_min_bonf"] for m, r in d.items()} for t, d in dist.items()}}))


def _table(temps, methods, speed, dist) -> list[str]:
    lines = ["| method | " + " | ".join(f"T={t}" for t in temps) + " |", "|---|" + "---|" * len(temps)]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(f"{speed[str(t)][m]['speedup']:.2f}x ({speed[str(t)][m]['tok_per_fwd']:.2f} tok/fwd)"
                                               for t in temps) + " |")
    if dist:
        lines += ["", "| method | " + " | ".join(f"T={t} p (same-seed equal)" for t in dist) + " |",
                  "|---|" + "---|" * len(dist)]
        for m in next(iter(dist.values())):
            cells = []
            for t in dist:
                r = dist[t][m]
                same = f" ({100 * r['same_as_vanilla_same_seed']:.0f}%)" if "same_as_vanilla_same_seed" in r else ""
                cells.append(f"{r['p_min_bonf']:.3g}{same}")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def _write(out: Path, temps, methods, speed, dist, args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "temperature.json").write_text(json.dumps({"speed": speed, "distribution": dist,
                                                      "dist_prompt": args.dist_prompt,
                                                      "dist_samples": args.dist_samples}, indent=1))
    (out / "table.md").write_text("\n".join(_table(temps, methods, speed, dist)) + "\n")


def add_args(t: argparse.ArgumentParser) -> None:
    t.add_argument("--temps", default="0,0.25,0.5,0.75,1.0")
    t.add_argument("--methods", default="vanilla,copyspec,eagle3,switchsd")
    t.add_argument("--dist-samples", type=int, default=200, help="draws per method for the check (0: skip)")
    t.add_argument("--dist-tokens", type=int, default=12, help="tokens per draw")
    t.add_argument("--dist-prompt", default=DIST_PROMPT)


def main(argv=None) -> None:
    """`switchsd tempsweep ...`: the same as `switchsd analysis temperature ...`."""
    import sys

    from .analysis import main as analysis_main
    analysis_main(["temperature", *(sys.argv[1:] if argv is None else argv)])
