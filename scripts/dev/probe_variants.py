"""Probe variants beyond the shipped one (single site, L2 1e-3), scored on the validation split and on the
out-of-template completions that `probes.evaluate --cache` wrote. A record of what does and does not lift
out-of-template AUC; selection is by the validation split only.

    python scripts/dev/probe_variants.py --data runs/probes/smollm2b --caches runs/probe-eval
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from probes.features import decision_features, load_site
from probes.fit import fit_probe
from probes.metrics import roc_auc
from probes.train import split_mask  # noqa: E402
from switchsd.models.loading import load_model  # noqa: E402

VARIANTS = {"19:attn": (["19:attn"], 1e-3), "19:attn l2=1e-2": (["19:attn"], 1e-2),
            "19:attn l2=1e-4": (["19:attn"], 1e-4), "19+12+24 attn": (["19:attn", "12:attn", "24:attn"], 1e-3),
            "19+12+24+29+6 attn": (["19:attn", "12:attn", "24:attn", "29:attn", "6:attn"], 1e-3)}
SETS = ("probe_heldout-64", "probe_heldout-192", "probe_heldout2-64", "probe_heldout2-192")


def site(key: str) -> tuple[int, str]:
    layer, sub = key.split(":")
    return int(layer), sub


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="probes.collect output folder")
    ap.add_argument("--caches", required=True, help="folder of <set>-<tokens>.cache.jsonl completions")
    args = ap.parse_args()
    cd = Path(args.data) / "copydiversity"
    weights, rows = {}, {}
    for name, (keys, l2) in VARIANTS.items():
        parts = [load_site(cd / "features", k) for k in keys]
        x, y, s = torch.cat([p[0].float() for p in parts], 1), parts[0][1], parts[0][2]
        tr, va = split_mask(cd, s, "train"), split_mask(cd, s, "val")
        weights[name] = fit_probe(x[tr], y[tr], l2)
        rows[name] = {"val": roc_auc(torch.sigmoid(x[va] @ weights[name]), y[va])}
        print(name, rows[name], flush=True)
    lm = load_model(None, dtype="float32")
    sites = sorted({site(k) for keys, _ in VARIANTS.values() for k in keys})
    for tag in SETS:
        recs = [json.loads(line) for line in (Path(args.caches) / f"{tag}.cache.jsonl").read_text().splitlines()]
        feats, y, _ = decision_features(lm, recs, sites)
        for name, (keys, _) in VARIANTS.items():
            x = torch.cat([feats[site(k)] for k in keys], 1)
            rows[name][tag] = roc_auc(torch.sigmoid(x @ weights[name]), y)
    print("| variant | val | " + " | ".join(SETS) + " |")
    print("|---" * (len(SETS) + 2) + "|")
    for name, r in rows.items():
        print(f"| {name} | {r['val']:.4f} | " + " | ".join(f"{r[t]:.4f}" for t in SETS) + " |")


if __name__ == "__main__":
    main()
