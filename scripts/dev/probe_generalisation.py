"""Does any linear probe on the offline model generalise out of template better than the shipped one?

Fits linear probes several ways on the same CopyDiversity training split (the shipped recipe: logistic, L2 1e-3;
LDA with shrinkage; every prompt family weighted equally; group DRO over families; the directions that tell
families apart projected out; CopyDiversity + the RealText set of probes/realtext.py) at each --sites site, and
scores them on CopyDiversity / RealText validation, the out-of-template sets (`probes.evaluate --cache`
completions of tests/data/probe_heldout*.jsonl) and real Spec-Bench prompts (`scripts/probe_real_prompts.py`
completions). Ends with a prompt-level bootstrap of the shipped probe on each held-out set and on the
hand-written sets pooled: how far a set's AUC moves with which prompts it holds.

    python -m probes.collect --out runs/probes/smollm2b --gen-dtype bfloat16 --sets realtext
    python scripts/dev/probe_generalisation.py --data runs/probes/smollm2b --caches runs/probe-eval \
        --real runs/probe-real --out runs/probe-gen
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from probes.features import decision_features, load_site
from probes.fit import fit_probe
from probes.metrics import roc_auc
from probes.train import split_mask
from switchsd.core.probe import load_probe
from switchsd.models.loading import load_model

SETS = ("probe_heldout2-64", "probe_heldout2-192", "probe_heldout3-64", "probe_heldout3-192", "real",
        "probe_heldout-64", "probe_heldout-192")
OUT_OF_TEMPLATE = ("probe_heldout", "probe_heldout2", "probe_heldout3")     # pooled in the bootstrap table


def eval_features(args, sites: list[tuple[int, str]]) -> dict[str, dict]:
    """{set: {"x": {site key: [N, d]}, "y": [N], "seq": [N]}} at every site, float32 target; cached in --out."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lm, res = None, {}
    for tag in SETS:
        path = out / f"{tag}.pt"
        if path.exists():
            res[tag] = torch.load(path)
            if all(f"{a}:{b}" in res[tag]["x"] for a, b in sites):
                continue
        src = Path(args.real) / "completions.jsonl" if tag == "real" else Path(args.caches) / f"{tag}.cache.jsonl"
        recs = [json.loads(line) for line in src.read_text().splitlines()]
        lm = lm or load_model(None, dtype="float32")
        feats, y, seq = decision_features(lm, recs, sites)
        res[tag] = {"x": {f"{a}:{b}": v for (a, b), v in feats.items()}, "y": y, "seq": seq}
        torch.save(res[tag], path)
    return res


def lda(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """Shrinkage LDA: (within-class covariance, shrunk towards its mean variance)^-1 (mu_copy - mu_other)."""
    m1, m0 = x[y].mean(0), x[~y].mean(0)
    xc = torch.cat([x[y] - m1, x[~y] - m0]).double()
    c = xc.T @ xc / len(xc)
    c = (1 - lam) * c + lam * c.diagonal().mean() * torch.eye(len(c), dtype=c.dtype)
    return torch.linalg.solve(c, (m1 - m0).double()).float()


def family_directions(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k directions of the per-family class means (minus the class mean): [k, d]."""
    mus = [x[(g == j) & (y == c)].mean(0) - x[y == c].mean(0)
           for c in (True, False) for j in g.unique().tolist() if ((g == j) & (y == c)).sum() > 50]
    return torch.linalg.svd(torch.stack(mus), full_matrices=False)[2][:k]


def fits(x, y, g, rt) -> dict[str, torch.Tensor]:
    counts = torch.bincount(g).float().clamp(min=1)
    out = {"logistic (shipped recipe)": fit_probe(x, y), "LDA shrink 0.1": lda(x, y, 0.1),
           "families weighted equally": fit_probe(x, y, weights=1.0 / counts[g])}
    wf = torch.ones(len(counts))                                   # group DRO: up-weight the worst families
    for _ in range(2):
        w = fit_probe(x, y, weights=(wf / counts)[g])
        with torch.no_grad():
            fl = torch.zeros(len(counts)).index_add_(0, g, F.binary_cross_entropy_with_logits(
                x @ w, y.float(), reduction="none")) / counts
        wf = wf * torch.exp(2.0 * (fl - fl.mean()) / fl.std())
    out["group DRO (2 rounds)"] = w
    v = family_directions(x, y, g, 8)
    p = torch.eye(x.shape[1]) - v.T @ v
    out["family directions erased (8)"] = p @ fit_probe(x @ p, y)
    out["CopyDiversity + RealText"] = fit_probe(torch.cat([x, rt[0]]), torch.cat([y, rt[1]]))
    return out


def bootstrap(s: torch.Tensor, y: torch.Tensor, seq: torch.Tensor, n: int = 1000) -> tuple[float, float, float]:
    """Prompt-level bootstrap of the AUC: (5%, 95%, sd)."""
    gen, ids, vals = torch.Generator().manual_seed(0), seq.unique(), []
    rows = {int(i): torch.nonzero(seq == i).flatten() for i in ids}
    for _ in range(n):
        m = torch.cat([rows[int(i)] for i in ids[torch.randint(len(ids), (len(ids),), generator=gen)]])
        if 0 < int(y[m].sum()) < len(m):
            vals.append(roc_auc(s[m], y[m]))
    v = torch.tensor(vals)
    return float(v.quantile(0.05)), float(v.quantile(0.95)), float(v.std())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="probes.collect output with copydiversity/ and realtext/")
    ap.add_argument("--caches", required=True, help="folder of <set>-<tokens>.cache.jsonl (probes.evaluate)")
    ap.add_argument("--real", required=True, help="scripts/probe_real_prompts.py --out folder")
    ap.add_argument("--sites", default="19:attn,20:attn")
    ap.add_argument("--out", required=True, help="feature cache folder")
    args = ap.parse_args()
    sites = [(int(k.split(":")[0]), k.split(":")[1]) for k in args.sites.split(",")]
    ev = eval_features(args, sites)
    data, cd = Path(args.data), Path(args.data) / "copydiversity"
    types = {r["id"]: r["type"] for r in map(json.loads, (cd / "prompts.jsonl").read_text().splitlines())}
    tid = {t: i for i, t in enumerate(sorted(set(types.values())))}
    cols = ["CD val", "RealText val"] + list(SETS)
    print("| site | fit | " + " | ".join(cols) + " |\n|---|---|" + "---|" * len(cols), flush=True)
    for a, b in sites:
        key = f"{a}:{b}"
        x, y, s = load_site(cd / "features", key)
        x, tr, va = x.float(), split_mask(cd, s, "train"), split_mask(cd, s, "val")
        g = torch.tensor([tid[types[int(i)]] for i in s[tr].tolist()])
        xr, yr, sr = load_site(data / "realtext" / "features", key)
        xr, trr, var = xr.float(), split_mask(data / "realtext", sr, "train"), split_mask(data / "realtext", sr, "val")
        for name, w in fits(x[tr], y[tr], g, (xr[trr], yr[trr])).items():
            aucs = [roc_auc(torch.sigmoid(x[va] @ w), y[va]), roc_auc(torch.sigmoid(xr[var] @ w), yr[var])]
            aucs += [roc_auc(torch.sigmoid(ev[t]["x"][key] @ w), ev[t]["y"]) for t in SETS]
            print(f"| {key} | {name} | " + " | ".join(f"{v:.4f}" for v in aucs) + " |", flush=True)
    probe = load_probe(Path(__file__).resolve().parents[1] / "probes" / "smollm2-135m-instruct.safetensors")
    key = f"{probe.layer}:{probe.sublayer}"
    print("\n| set (shipped probe) | prompts | positions | AUC | bootstrap 90% | sd |\n|---|---|---|---|---|---|")
    for t in SETS:
        if key not in ev[t]["x"]:
            continue
        sc = torch.sigmoid(ev[t]["x"][key] @ probe.weight.float())
        lo, hi, sd = bootstrap(sc, ev[t]["y"], ev[t]["seq"])
        print(f"| {t} | {len(ev[t]['seq'].unique())} | {len(sc)} | {roc_auc(sc, ev[t]['y']):.4f} | "
              f"[{lo:.4f}, {hi:.4f}] | {sd:.4f} |")
    for n in (64, 192):                      # every hand-written out-of-template prompt at once
        parts = [ev[f"{s}-{n}"] for s in OUT_OF_TEMPLATE]
        offsets = torch.tensor([0] + [int(e["seq"].max()) + 1 for e in parts]).cumsum(0)
        x = torch.cat([e["x"][key] for e in parts])
        y, seq = torch.cat([e["y"] for e in parts]), torch.cat([e["seq"] + o for e, o in zip(parts, offsets)])
        sc = torch.sigmoid(x @ probe.weight.float())
        lo, hi, sd = bootstrap(sc, y, seq)
        print(f"| the {len(parts)} out-of-template sets pooled, {n} tokens | {len(seq.unique())} | {len(sc)} | "
              f"{roc_auc(sc, y):.4f} | [{lo:.4f}, {hi:.4f}] | {sd:.4f} |")


if __name__ == "__main__":
    main()
