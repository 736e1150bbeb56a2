"""The two-sample chi-square used by the temperature sweep's distribution check: calibrated under the null,
powerful against a shift (the negative control), and robust to rare categories."""
from __future__ import annotations

import torch

from switchsd.eval.tempsweep import chi2_two_sample, compare


def draw(probs, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.multinomial(torch.tensor(probs), n, replacement=True, generator=g).tolist()


def test_same_distribution_is_not_rejected():
    p = [0.5, 0.2, 0.1, 0.1, 0.05, 0.03, 0.02]
    pvals = [chi2_two_sample(draw(p, 400, s), draw(p, 400, 1000 + s))[2] for s in range(40)]
    # under the null p-values are ~uniform: few below 0.05, none absurdly small
    assert sum(v < 0.05 for v in pvals) <= 6
    assert min(pvals) > 1e-4


def test_shifted_distribution_is_rejected():
    a = draw([0.5, 0.3, 0.2], 400, 1)
    b = draw([0.35, 0.35, 0.3], 400, 2)
    stat, dof, p = chi2_two_sample(a, b)
    assert dof == 2 and p < 1e-4


def test_rare_categories_are_pooled_and_identical_samples_pass():
    a = [0] * 300 + list(range(1, 50))
    stat, dof, p = chi2_two_sample(a, list(a))
    assert stat == 0 and p == 1.0 and dof == 1      # 49 singletons pooled into one "other" category


def test_compare_reports_joint_and_positions():
    seqs = [tuple(x) for x in zip(draw([0.6, 0.4], 300, 3), draw([0.3, 0.7], 300, 4))]
    ref = [tuple(x) for x in zip(draw([0.6, 0.4], 300, 5), draw([0.3, 0.7], 300, 6))]
    r = compare(seqs, ref)
    assert set(r["tests"]) == {"joint", "pos0", "pos1"} and r["p_min_bonf"] > 1e-3
    shifted = [(a, 1) for a, _ in seqs]
    assert compare(shifted, ref)["p_min_bonf"] < 1e-6
