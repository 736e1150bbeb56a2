"""ROC AUC and F1 without extra dependencies."""
from __future__ import annotations

import torch


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Probability that a random positive outscores a random negative (ties count one half)."""
    labels = labels.bool()
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = torch.argsort(scores.double())
    s = scores.double()[order]
    ranks = torch.empty_like(s)
    # average ranks for ties
    uniq, inverse, counts = torch.unique_consecutive(s, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    avg = ends - (counts.double() - 1) / 2
    ranks = avg[inverse]
    r_pos = ranks[labels[order]].sum()
    return float((r_pos - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def f1_at(scores: torch.Tensor, labels: torch.Tensor, tau: float) -> float:
    pred, labels = scores >= tau, labels.bool()
    tp = int((pred & labels).sum())
    fp = int((pred & ~labels).sum())
    fn = int((~pred & labels).sum())
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def best_f1(scores: torch.Tensor, labels: torch.Tensor, grid: int = 99) -> tuple[float, float]:
    """(best F1, its threshold) over tau in (0, 1)."""
    taus = torch.linspace(0.01, 0.99, grid)
    f1s = [f1_at(scores, labels, float(t)) for t in taus]
    i = max(range(len(f1s)), key=f1s.__getitem__)
    return f1s[i], float(taus[i])


def f1_curve(scores: torch.Tensor, labels: torch.Tensor, grid: int = 99) -> tuple[list[float], list[float]]:
    taus = torch.linspace(0.01, 0.99, grid)
    return [float(t) for t in taus], [f1_at(scores, labels, float(t)) for t in taus]


def roc_curve(scores: torch.Tensor, labels: torch.Tensor, points: int = 200) -> tuple[list[float], list[float]]:
    labels = labels.bool()
    taus = torch.quantile(scores.float(), torch.linspace(0, 1, points)).flip(0)
    P, N = max(1, int(labels.sum())), max(1, int((~labels).sum()))
    fpr, tpr = [0.0], [0.0]
    for t in taus:
        pred = scores >= t
        tpr.append(int((pred & labels).sum()) / P)
        fpr.append(int((pred & ~labels).sum()) / N)
    fpr.append(1.0)
    tpr.append(1.0)
    return fpr, tpr
