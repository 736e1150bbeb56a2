"""The copy-intent probe on real prompts: Spec-Bench questions outside MT-Bench (translation, summarization, QA,
math reasoning, RAG; --per-category each), completed by the target (vanilla greedy, --writer format), labelled and
read (at the probe's site, float32) as the probe's training data is. Scores the shipped probe there, then asks
whether such data helps: the questions split in two by id parity, a probe fitted on the CopyDiversity training
split plus one half is scored on the other half (and one fitted on that half alone), both ways round.

    python scripts/dev/probe_real_prompts.py --data runs/probes/smollm2b --out runs/probe-real [--per-category 20]

Completions and features are cached in --out (the run resumes). Needs ../shared/data/spec_bench_question.jsonl.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from probes.features import decision_features, load_site
from probes.fit import fit_probe
from probes.labels import aligned_pairs
from probes.metrics import roc_auc
from probes.train import split_mask
from switchsd.core.config import EngineConfig
from switchsd.core.probe import load_probe
from switchsd.eval.datasets import load_prompts
from switchsd.factory import Drafters, build_engine
from switchsd.models.loading import load_model

CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")


def completions(rows: list[dict], path: Path, writer: str, max_new: int) -> list[dict]:
    done = {r["id"]: r for r in map(json.loads, path.read_text().splitlines())} if path.exists() else {}
    todo = [r for r in rows if r["id"] not in done]
    if todo:
        lm = load_model(None, dtype=writer)
        eng, eos = build_engine("vanilla", lm, Drafters(lm), EngineConfig(max_new_tokens=max_new)), set(lm.eos_ids())
        with open(path, "a") as f:
            for i, r in enumerate(todo):
                ids = lm.encode(r["prompt"], chat=True)
                rec = {**r, "prompt_ids": ids, "completion_ids": [t for t in eng.run(ids).token_ids if t not in eos]}
                done[r["id"]] = rec
                f.write(json.dumps(rec) + "\n")
                f.flush()
                print(f"completion {i + 1}/{len(todo)}", flush=True)
    return [{**done[r["id"]], **r} for r in rows]


@torch.inference_mode()
def features(recs: list[dict], path: Path, site: tuple[int, str]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """x [N, d] float32 at the decision positions, y [N] labels, the record index of each position."""
    if path.exists():
        return torch.load(path, weights_only=True), *_labels(recs)[1:]
    x = decision_features(load_model(None, dtype="float32"), recs, [site])[0][site]
    torch.save(x, path)
    return x, *_labels(recs)[1:]


def _labels(recs):
    y, owner = [], []
    for i, r in enumerate(recs):
        _, lab = aligned_pairs(r["prompt_ids"] + r["completion_ids"], len(r["prompt_ids"]), 5)
        y += lab
        owner += [i] * len(lab)
    return None, torch.tensor(y, dtype=torch.bool), owner


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="runs/probes/smollm2b", help="probes.collect output (CopyDiversity features)")
    ap.add_argument("--out", default="runs/probe-real")
    ap.add_argument("--probe", default="probes/smollm2-135m-instruct.safetensors")
    ap.add_argument("--per-category", type=int, default=20)
    ap.add_argument("--writer", default="int4", help="format of the target while it writes the completions")
    ap.add_argument("--max-new-tokens", type=int, default=192)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for c in CATEGORIES for r in load_prompts("specbench", category=c)[:args.per_category]]
    recs = completions(rows, out / "completions.jsonl", args.writer, args.max_new_tokens)
    probe = load_probe(args.probe)
    site = (probe.layer, probe.sublayer)
    xs, ys, owner = features(recs, out / f"features-{site[0]}-{site[1]}.pt", site)
    cat = [recs[i]["category"] for i in owner]
    auc = lambda w, m: roc_auc(torch.sigmoid(xs[m] @ w), ys[m])              # noqa: E731
    shipped = probe.weight.float()
    print(f"shipped probe on {len(ys)} positions ({ys.float().mean():.1%} copy): AUC {auc(shipped, slice(None)):.4f}")
    for c in CATEGORIES:
        m = torch.tensor([k == c for k in cat])
        print(f"  {c:15s} {int(m.sum()):5d} positions  AUC {auc(shipped, m):.4f}")
    cd = Path(args.data) / "copydiversity"
    x, y, s = load_site(cd / "features", f"{site[0]}:{site[1]}")
    x = x.float()
    tr, va = split_mask(cd, s, "train"), split_mask(cd, s, "val")
    base = fit_probe(x[tr], y[tr], 1e-3)
    half = torch.tensor([int(recs[i]["id"]) % 2 for i in owner])
    for h in (0, 1):
        fit_m, ev_m = half == h, half != h
        plus = fit_probe(torch.cat([x[tr], xs[fit_m]]), torch.cat([y[tr], ys[fit_m]]), 1e-3)
        alone = fit_probe(xs[fit_m], ys[fit_m], 1e-3)
        fits = (("base", base), ("plus", plus), ("alone", alone))
        val = {k: roc_auc(torch.sigmoid(x[va] @ w), y[va]) for k, w in fits}
        print(f"fitted with half {h}, scored on the other ({int(ev_m.sum())} positions): CopyDiversity only "
              f"{auc(base, ev_m):.4f}, + this half {auc(plus, ev_m):.4f}, this half alone {auc(alone, ev_m):.4f} "
              f"(CopyDiversity validation {val['base']:.4f} / {val['plus']:.4f} / {val['alone']:.4f})")


if __name__ == "__main__":
    main()
