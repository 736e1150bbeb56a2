"""Tables from `switchsd vllm bench`'s results: per set, every method at each concurrency: output tok/s (and x
`none` at that concurrency), TPOT and TTFT p50 / p90, vLLM's acceptance length, requests whose text equals `none`'s,
and for the proposers of this project their per-path counts over that run. Where a method's text differs from
`none`'s, the first differing token (both texts re-encoded) is named with its float32 logit margin, from the model
re-scoring the shared prefix (`switchsd.eval.mismatch.explain`): a margin near zero is a near-tie that vLLM's
batched kernels may break either way, a large one a decoding error.

    switchsd vllm report runs/vllm [--markdown OUT.md] [--model FOLDER]
"""
from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from .gate import mean_accepted

ORDER = ("none", "ngram", "suffix", "eagle3", "copy", "switchsd")


def load(run: Path) -> dict:
    """{(method, set, concurrency): result dict}, with 'counts' (the proposer's counts over that run) when kept."""
    out = {}
    for f in sorted(run.glob("*/*-c*.json")):
        m = re.fullmatch(r"(.+)-c(\d+)\.json", f.name)
        if not m:
            continue
        r = json.loads(f.read_text())
        before, after = (f.with_name(f"{m[1]}-c{m[2]}.counts-{w}.json") for w in ("before", "after"))
        if after.exists():
            a = json.loads(after.read_text())
            b = json.loads(before.read_text()) if before.exists() else {}
            r["counts"] = delta(a, b)
        out[(f.parent.name, m[1], int(m[2]))] = r
    return out


def delta(a: dict, b: dict) -> dict:
    """The counts of one run: the counts after it less those before (the gate's cost model, "costs": as after)."""
    return {k: v if k == "costs" else delta(v, b.get(k, {})) if isinstance(v, dict) else v - b.get(k, 0)
            for k, v in a.items()}


def paths(c: dict | None, acceptance_length: float | None = None) -> str:
    """The proposer's per-path counts over one run. For the SwitchSD gate, its own acceptance length (1 + accepted
    per verified draft, both paths) is shown beside vLLM's when they differ by more than 2%."""
    if not c:
        return ""
    s = max(1, c["steps"])
    if "neural" in c:                # the SwitchSD gate
        mal = mean_accepted(c)
        own = 1 + sum(c["accepted"].values()) / max(1, sum(c["verified"].values()))
        share = 100 * c["gate_s"] / max(1e-9, c["period_s"])
        note = f" (gate counts {own:.2f} tokens per draft)" if acceptance_length and \
            abs(own - acceptance_length) > 0.02 * acceptance_length else ""
        priced_out = f" ({100 * c['none_chain'] / s:.0f}% with a chain priced out)" if c.get("none_chain") else ""
        none = f", none {100 * c.get('none', 0) / s:.0f}%{priced_out}" if c.get("none") else ""
        memory = f", {100 * c['copy_backoff'] / max(1, c['copy']):.0f}% of them backed off" \
            if c.get("copy_backoff") else ""
        return (f"copy {100 * c['copy'] / s:.0f}% (MAL {mal['copy']:.2f}{memory}), neural {100 * c['neural'] / s:.0f}% "
                f"(MAL {mal['neural']:.2f}){none}; gate {share:.1f}% of step time{note}")
    return f"copy {100 * c['copy'] / s:.0f}% of steps, {c['drafted_tokens'] / max(1, c['copy']):.1f} tokens a draft"


def same(r: dict, base: dict | None) -> str:
    if base is None or "generated_texts" not in r:
        return "-"
    u, v = r["generated_texts"], base["generated_texts"]
    return f"{sum(x == y for x, y in zip(u, v))}/{len(v)}"


def table(res: dict, ds: str) -> str:
    concs = sorted({c for (_, d, c) in res if d == ds})
    lines = [f"### {ds}", "", "| method | concurrency | output tok/s | x none | TPOT p50 / p90 ms | TTFT p50 / p90 ms "
             "| acceptance length | same text as none | paths |", "|---|---|---|---|---|---|---|---|---|"]
    methods = sorted({m for (m, d, _) in res if d == ds}, key=lambda m: ORDER.index(m) if m in ORDER else 99)
    for c in concs:
        base = res.get(("none", ds, c))
        for m in methods:
            r = res.get((m, ds, c))
            if r is None:
                continue
            x = f"{r['output_throughput'] / base['output_throughput']:.2f}x" if base else "-"
            acc = r.get("spec_decode_acceptance_length")
            lines.append(f"| {m} | {c} | {r['output_throughput']:.1f} | {x} | {r['median_tpot_ms']:.1f} / "
                         f"{r.get('p90_tpot_ms', float('nan')):.1f} | {r['median_ttft_ms']:.0f} / "
                         f"{r.get('p90_ttft_ms', float('nan')):.0f} | {f'{acc:.2f}' if acc else '-'} | "
                         f"{same(r, base)} | {paths(r.get('counts'), acc)} |")
    return "\n".join(lines)


SETS = ("humaneval", "math500", "cnndm", "mtbench")


def summary(res: dict) -> str:
    """One row per method: output tok/s and x none per set and concurrency; requests whose text equals none's."""
    sets = sorted({d for (_, d, _) in res}, key=lambda d: SETS.index(d) if d in SETS else 99)
    concs = sorted({c for (_, _, c) in res})
    cols = [(d, c) for d in sets for c in concs]
    methods = sorted({m for (m, _, _) in res}, key=lambda m: ORDER.index(m) if m in ORDER else 99)
    lines = ["| method | " + " | ".join(f"{d} c{c}" for d, c in cols) + " | same text as none |",
             "|---|" + "---|" * (len(cols) + 1)]
    for m in methods:
        cells, same_n, total = [], 0, 0
        for d, c in cols:
            r, base = res.get((m, d, c)), res.get(("none", d, c))
            if r is None:
                cells.append("-")
                continue
            x = f" ({r['output_throughput'] / base['output_throughput']:.2f}x)" if base and m != "none" else ""
            cells.append(f"{r['output_throughput']:.1f}{x}")
            if base and "generated_texts" in r:
                same_n += sum(u == v for u, v in zip(r["generated_texts"], base["generated_texts"]))
                total += len(base["generated_texts"])
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {same_n}/{total} |")
    return "\n".join(lines)


def differing(res: dict) -> list[tuple[str, str, int, int]]:
    """(method, set, concurrency, request index) of every text that differs from `none`'s at that set and
    concurrency (requests in the order vLLM's client sent them)."""
    out = []
    for (m, ds, c), r in sorted(res.items()):
        base = res.get(("none", ds, c))
        if m == "none" or base is None or "generated_texts" not in r:
            continue
        out += [(m, ds, c, i) for i, (u, v) in enumerate(zip(r["generated_texts"], base["generated_texts"])) if u != v]
    return out


def sent_prompts(run: Path, ds: str, seed: int = 0) -> list[str]:
    """The set's prompts in the order `vllm bench serve --dataset-name custom --seed SEED` sends them: the file's
    lines shuffled by Python's random seeded with SEED (vLLM's CustomDataset.load_data)."""
    data = [json.loads(line)["prompt"] for line in (run / "prompts" / f"{ds}.jsonl").read_text().splitlines() if line]
    random.Random(seed).shuffle(data)
    return data


def explain_differences(res: dict, run: Path, lm) -> list[dict]:
    """For each text that differs from `none`'s: where it parts and the float32 margin there (lm: the served model
    in float32, a `switchsd.models.loading.LoadedModel`). The prompt is checked against the request's input length
    (vLLM applied the same chat template), so a wrong prompt order is reported, never rescored."""
    from switchsd.eval.mismatch import explain
    out, sent = [], {}
    for m, ds, c, i in differing(res):
        r, base = res[(m, ds, c)], res[("none", ds, c)]
        if ds not in sent:
            sent[ds] = sent_prompts(run, ds)
        prompt = sent[ds][i]
        ids = lm.encode(prompt, chat=True)
        item = {"method": m, "set": ds, "concurrency": c, "request": i}
        if "input_lens" in r and len(ids) != r["input_lens"][i]:
            out.append({**item, "kind": "unmatched", "why": f"prompt of {len(ids)} tokens, request of "
                                                              f"{r['input_lens'][i]}"})
            continue
        van, oth = (_encode(lm, t[i]) for t in (base["generated_texts"], r["generated_texts"]))
        x = explain(lm.model, ids, van, oth) or {"kind": "re-encoded alike"}
        if x.get("kind") == "token":
            x["tokens"] = [lm.tokenizer.decode([x["vanilla_token"]]), lm.tokenizer.decode([x["other_token"]])]
        out.append({**item, **x})
    return out


def _encode(lm, text: str) -> list[int]:
    return [int(t) for t in lm.tokenizer(text, add_special_tokens=False)["input_ids"]]


def differences_text(items: list[dict]) -> str:
    if not items:
        return "Every text equals `none`'s."
    lines = [f"{len(items)} text(s) differ from `none`'s. At the first differing token, the float32 logits of "
             "`none`'s token less the method's (a margin near zero: a near-tie):", ""]
    for x in items:
        head = f"- {x['method']} / {x['set']} c{x['concurrency']} / request {x['request']}: "
        if x["kind"] == "token":
            lines.append(head + f"token {x['position']} ({x['tokens'][0]!r} vs {x['tokens'][1]!r}), margin "
                         f"{x['fp32_margin']:+.4f}, float32 top-2 gap {x['fp32_top2_gap']:.4f}")
        elif x["kind"] == "length":
            lines.append(head + f"one ends first ({x['vanilla_len']} vs {x['other_len']} tokens)")
        else:
            lines.append(head + x.get("why", x["kind"]))
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--model", default=None, help="the served model, to explain texts that differ from none's "
                                                  "(default: the offline default)")
    a = ap.parse_args(argv)
    res = load(a.run)
    if not res:
        raise SystemExit(f"error: no results under {a.run} (`switchsd vllm bench` writes them)")
    sets = sorted({d for (_, d, _) in res}, key=lambda d: SETS.index(d) if d in SETS else 99)
    text = ("Output tok/s (x none at the same concurrency):\n\n" + summary(res) + "\n\n"
            + "\n\n".join(table(res, ds) for ds in sets) + "\n")
    if differing(res):
        from switchsd.models.loading import load_model
        text += "\n### Texts that differ from none's\n\n" + differences_text(
            explain_differences(res, a.run, load_model(a.model, dtype="float32", device="cpu"))) + "\n"
    print(text)
    if a.markdown:
        a.markdown.write_text(text)


if __name__ == "__main__":
    main()
