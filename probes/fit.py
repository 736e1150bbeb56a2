"""Fit a bias-free linear probe sigmoid(w . h) with binary cross-entropy + L2 (full-batch L-BFGS).

Hidden states of LLMs carry a few huge dimensions, so features are divided by their per-dimension RMS before
fitting (no centring: that would add an implicit bias) and the scale is folded back into w.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def fit_probe(x: torch.Tensor, y: torch.Tensor, l2: float = 1e-3, steps: int = 100,
              weights: torch.Tensor | None = None) -> torch.Tensor:
    """x [N, d], y [N] bool -> w [d] in the original feature scale. `weights` [N]: per-position weights of the
    cross-entropy (a weighted mean; None: the plain mean)."""
    x = x.float()
    scale = x.pow(2).mean(0).sqrt().clamp(min=1e-6)                    # [d]
    xs = x / scale
    yf = y.float()
    w = torch.zeros(x.shape[1], requires_grad=True)
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=steps, history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        if weights is None:
            bce = F.binary_cross_entropy_with_logits(xs @ w, yf)
        else:
            bce = (F.binary_cross_entropy_with_logits(xs @ w, yf, reduction="none") * weights).sum() / weights.sum()
        loss = bce + l2 * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return (w.detach() / scale)
