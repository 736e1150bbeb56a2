"""Explaining outputs that differ from vanilla when the target runs in bfloat16.

Speculative decoding is lossless in exact arithmetic: every committed token is the target's argmax given the
same prefix. In bfloat16 the target's logits depend slightly on how many rows a forward holds (batched matmul
kernels round differently from one-row kernels), so when two candidate tokens are nearly tied the argmax of a
k-row verify forward and of vanilla's one-row forward can differ, and the outputs part from there on.

For each differing output we find the first differing position i and re-score the shared prefix
(prompt + vanilla[:i]) with the target in float32: if the two tokens' float32 logits are within a fraction of a
logit of each other, the mismatch is a near-tie broken by bfloat16 rounding, not a decoding error.
"""
from __future__ import annotations

import torch


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where a and b differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def explain(model, prompt_ids: list[int], vanilla_ids: list[int], other_ids: list[int]) -> dict | None:
    """Where `other` leaves `vanilla` and the float32 logit margin between their two tokens there.

    `model` should be the target in float32. Returns None for identical outputs."""
    i = first_divergence(vanilla_ids, other_ids)
    if i is None:
        return None
    if i >= len(vanilla_ids) or i >= len(other_ids):   # one stopped earlier (EOS reached on a near-tie)
        return {"position": i, "kind": "length", "vanilla_len": len(vanilla_ids), "other_len": len(other_ids)}
    ctx = torch.tensor(prompt_ids + vanilla_ids[:i], device=next(model.parameters()).device)[None]  # [1, P+i]
    logits = model(input_ids=ctx, logits_to_keep=1).logits[0, -1].float()                       # [V]
    v, o = vanilla_ids[i], other_ids[i]
    top2 = logits.topk(2).values
    return {"position": i, "kind": "token", "vanilla_token": v, "other_token": o,
            "fp32_margin": float(logits[v] - logits[o]),          # > 0: float32 agrees with vanilla
            "fp32_top2_gap": float(top2[0] - top2[1]), "fp32_argmax": int(logits.argmax())}


def summarize_mismatches(items: list[dict] | None) -> str:
    """One Markdown paragraph for table.md (None: the explanations were skipped)."""
    if items is None:
        return "Outputs that differ from vanilla were not explained (the float32 re-scoring failed; see the log)."
    if not items:
        return "All outputs identical to vanilla."
    tok = [x for x in items if x.get("kind") == "token"]
    gaps = sorted(abs(x["fp32_margin"]) for x in tok)
    lines = [f"{len(items)} output(s) differ from vanilla; at the first differing token the float32 logits of "
             f"vanilla's and the method's token differ by " +
             (f"{gaps[0]:.3f} to {gaps[-1]:.3f} (median {gaps[len(gaps) // 2]:.3f})" if gaps else "n/a") +
             " logits (near-ties: rounded differently by the 16-bit / 4-bit arithmetic of multi-row verify forwards,"
             " or by another implementation's arithmetic for the peers llama-cpp / hf*)."]
    for x in items:
        if x.get("kind") == "token":
            lines.append(f"- {x['method']} / {x['id']}: token {x['position']}, margin {x['fp32_margin']:+.3f}, "
                         f"float32 top-2 gap {x['fp32_top2_gap']:.3f}")
        else:
            lines.append(f"- {x['method']} / {x['id']}: lengths {x['vanilla_len']} vs {x['other_len']}")
    return "\n".join(lines)
