"""How well an EAGLE-3 head's own probability predicts acceptance of its first draft token: over the target's
greedy answers of a bench run (its vanilla rows), the head's top-1 probability at every answer position (teacher
forced, `Eagle3Drafter.q_along` at T = 1), binned, against whether that token is the target's next one. This is
what the cost gate's confidence mode (`+conf`) relies on.

    python -m switchsd bench --dataset mtbench --limit 20 --max-new-tokens 256 --methods vanilla --out runs/mt
    python scripts/dev/head_calibration.py --results runs/mt/partial.jsonl --dataset mtbench \
        --head assets/eagle3-smollm2-135m
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from switchsd.core.config import SamplingConfig
from switchsd.drafters.eagle3 import Eagle3Drafter
from switchsd.drafters.eagle3_model import load_eagle3
from switchsd.eval.datasets import load_prompts
from switchsd.models.loading import load_model

EDGES = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 1.0001)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, required=True, help="a bench run's partial.jsonl (with vanilla rows)")
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--data-file", default=None)
    ap.add_argument("--head", default="assets/eagle3-smollm2-135m")
    ap.add_argument("--model", default=None)
    args = ap.parse_args(argv)
    lines = [json.loads(x) for x in args.results.read_text().splitlines() if x.strip()]
    key, rows = lines[0]["key"], lines[1:]
    if not rows or "vanilla" not in rows[0]["records"]:
        raise SystemExit(f"{args.results}: no vanilla rows (run the bench with --methods vanilla)")
    lm = load_model(args.model, dtype="float32")
    head = load_eagle3(args.head, lm.model).float().eval()
    drafter = Eagle3Drafter(head, lm.model, chain=True, sampling=SamplingConfig(1.0))
    prompts = {p["id"]: p["prompt"] for p in load_prompts(args.dataset, args.data_file)}
    conf, hit = [], []
    for row in rows:
        ids = lm.encode(prompts[row["id"]], chat=key.get("chat", True))
        toks = ids + row["records"]["vanilla"]["token_ids"]
        with torch.inference_mode():
            hs = lm.model(torch.tensor([toks]), output_hidden_states=True).hidden_states
            q = drafter.q_along(hs, toks)                   # [T-1, V]: row t is the law of token t+2
        p, top = q[len(ids) - 2:len(toks) - 2].max(-1)       # pending token t+1 from the prompt's last on
        conf.append(p)
        hit.append(top == torch.tensor(toks[len(ids):]))
    conf, hit = torch.cat(conf), torch.cat(hit).float()
    print(f"{args.head}: {len(conf)} positions of {len(rows)} {args.dataset} answers; first-token acceptance "
          f"{hit.mean():.3f}\n\n| head probability | share of positions | acceptance |\n|---|---|---|")
    for lo, hi in zip(EDGES, EDGES[1:]):
        m = (conf >= lo) & (conf < hi)
        rate = f"{hit[m].mean():.3f}" if m.any() else "-"
        print(f"| [{lo:.2f}, {min(hi, 1.0):.2f}{']' if hi > 1 else ')'} | {m.float().mean():.3f} | {rate} |")


if __name__ == "__main__":
    main()
