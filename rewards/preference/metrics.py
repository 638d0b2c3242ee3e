"""Quality of a learned reward on held-out data: pure functions over arrays.

- ``preference_accuracy``: how often P[σ¹ ≻ σ⁰] > 0.5 agrees with a strict reference label.
- ``expected_calibration_error`` (ECE): bins of predicted P, weighted mean |mean P − frequency|.
- ``spearman``: rank correlation (e.g. learned vs ground-truth episode return).
- ``auroc``: how well a score separates positives (e.g. successful episodes) from negatives.
EPIC distance belongs to the shared reward metrics (the VLM reward issue); not repeated here.
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def preference_accuracy(p_right: np.ndarray, target: np.ndarray) -> float:
    """Accuracy over strict targets (0 or 1); "equal" targets (0.5) are left out."""
    p, y = np.asarray(p_right, float), np.asarray(target, float)
    strict = y != 0.5
    if not strict.any():
        return float("nan")
    return float(np.mean((p[strict] > 0.5) == (y[strict] > 0.5)))


def expected_calibration_error(p_right: np.ndarray, target: np.ndarray, bins: int = 10) -> float:
    """ECE of P[right] against outcomes 1 (right) / 0 (left), equal-width bins over [0, 1].

    Targets of 0.5 count as half an outcome, so an honest 0.5 on a tie is calibrated.
    """
    p, y = np.asarray(p_right, float), np.asarray(target, float)
    if len(p) == 0:
        return float("nan")
    which = np.minimum((p * bins).astype(int), bins - 1)
    err = 0.0
    for b in range(bins):
        m = which == b
        if m.any():
            err += m.mean() * abs(p[m].mean() - y[m].mean())
    return float(err)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's ρ; nan when either side is constant."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(stats.spearmanr(a, b).statistic)


def auroc(score: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve (Mann–Whitney form, ties count half); nan with one class only."""
    s, y = np.asarray(score, float), np.asarray(positive, bool)
    if y.all() or not y.any():
        return float("nan")
    ranks = stats.rankdata(s)
    n1, n0 = y.sum(), (~y).sum()
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))
