"""Acceptance rules, as pure functions of (tree, target logits). p = target, q = draft.

Greedy (T = 0): follow the child whose token is the target's argmax; the first miss gives the bonus token.

Sampling (T > 0), one rule for every drafter (recursive rejection sampling over a node's children, in
priority order):
    accept child x with probability min(1, p(x) / q(x));
    on rejection p <- normalise(max(p - q, 0)) and try the next child;
    when every child is rejected, the bonus token is drawn from the final p.
A deterministic draft (copy, PLD, top-k trees) is a point mass q = onehot(x): the rule becomes
"accept x with probability p(x); on rejection zero p(x), renormalise, try the next sibling" and the
committed token is distributed exactly as p. For a chain with sampled q this is standard speculative
sampling with residual resampling (Leviathan et al. 2023, Chen et al. 2023); for i.i.d. sampled
siblings it is SpecInfer's multi-draft rule. Both keep the output distribution exactly p.
"""
from __future__ import annotations

from typing import Callable

import torch

from .config import SamplingConfig
from .rules import Rule, normalise, overshoot_mass
from .tree import TokenTree


def target_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Logits [..., V] -> probabilities [..., V] after temperature, top-k and top-p, in >= float32."""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits.clone()
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(sorted_logits, dim=-1) >= cfg.top_p  # keep the smallest set reaching top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    p = torch.softmax(logits, dim=-1)
    if cfg.min_p > 0 or cfg.eta > 0:       # truncated sampling: the same allowed sets as the lab's rules
        rule = Rule("minp", {"p_base": cfg.min_p}) if cfg.min_p > 0 else Rule("eta", {"eps": cfg.eta})
        p = normalise(p * rule.allowed(p))
    return p


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> the index of each row's largest logit, the first of equal ones (argmax's answer, NaN
    included), through torch.max, which on a CPU takes a third of argmax's time over a 49k vocabulary."""
    return logits.max(-1).indices


def accept_greedy(tree: TokenTree, argmax: list[int]) -> tuple[list[int], int]:
    """`argmax[r]`: the target's greedy token after row r. Returns (accepted rows, bonus token)."""
    row, accepted = 0, []
    while True:
        want = argmax[row]
        nxt = next((c for c in tree.children[row] if tree.tokens[c] == want), None)
        if nxt is None:
            return accepted, want
        accepted.append(nxt)
        row = nxt


def accept_rule(tree: TokenTree, probs_at: Callable[[int], torch.Tensor], generator: torch.Generator,
                rule: Rule, overshoot: list[float] | None = None) -> tuple[list[int], int, list[float | None]]:
    """Sampling under a verification rule of the lab (switchsd/core/rules.py; lossy unless it reduces to the
    target). At each node the children are tried in order: child x (q = its draft distribution, or one-hot
    for a copy draft) is accepted with the rule's probability; after a rejection the node's distribution
    becomes the rule's residual and the next sibling is tried against it (SpecInfer's multi-draft scheme,
    with the rule in place of min(1, p/q)); when every child is rejected the bonus is drawn from it.
    EASD: a child that passes the standard test while both entropies are high and the top-n sets agree is
    rejected too and replaced from p without it (that ends the step).
    `overshoot`: when a list is given, each visited node appends overshoot_mass(rule, p, q) of its first child
    (the rule's one-position output law against the node's target law; EASD is skipped: its law is costly).
    Returns (accepted rows, bonus token, acceptance probability per tree row: None where not evaluated)."""
    probs: list[float | None] = [None] * len(tree.tokens)
    row, accepted = 0, []
    while True:
        p = probs_at(row).double()
        V = p.shape[-1]
        moved = False
        for k, child in enumerate(tree.children[row]):
            x, q = tree.tokens[child], tree.q[child]
            q = torch.zeros(V, dtype=p.dtype).index_fill_(0, torch.tensor([x]), 1.0) if q is None else q.double()
            if overshoot is not None and k == 0 and rule.name != "easd":
                overshoot.append(overshoot_mass(rule, p, q))
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            probs[child], ok, law, final = rule.judge(p, q, x, u)
            if ok:
                accepted.append(child)
                row, moved = child, True
                break
            if final:
                return accepted, int(torch.multinomial(law, 1, generator=generator)), probs
            p = law if float(law.sum()) > 0 else probs_at(row).double()    # nothing left: the target's own law
        if not moved:
            return accepted, int(torch.multinomial(p, 1, generator=generator)), probs


def accept_sampling(tree: TokenTree, probs_at: Callable[[int], torch.Tensor],
                    generator: torch.Generator) -> tuple[list[int], int]:
    """`probs_at(r)`: the target distribution p [V] after row r (on the generator's device).

    Returns (accepted rows, bonus token). Only rows on the walked path are evaluated.
    """
    row, accepted = 0, []
    while True:
        p = probs_at(row).clone()
        moved = False
        for child in tree.children[row]:
            x, q = tree.tokens[child], tree.q[child]
            ratio = p[x] if q is None else torch.clamp(p[x] / q[x], max=1.0)
            if torch.rand((), generator=generator, device=p.device, dtype=p.dtype) < ratio:
                accepted.append(child)
                row, moved = child, True
                break
            if q is None:
                p[x] = 0.0
            else:
                p = torch.clamp(p - q.to(p.dtype), min=0.0)
            total = p.sum()
            if total <= 0:  # only reachable through rounding when p(x) was 1: the draft is certain
                accepted.append(child)
                row, moved = child, True
                break
            p = p / total
        if not moved:
            return accepted, int(torch.multinomial(p, 1, generator=generator).item())
