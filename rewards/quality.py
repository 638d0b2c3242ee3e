"""Reward-quality metrics: how far a reward model can be trusted, measured against ground truth.

Pure functions over arrays, shared by every reward model (VLM, preference, ...):

- ``auroc(scores, labels)``: area under the ROC curve of per-frame success classification
  (the probability that a random success frame outscores a random non-success frame;
  ties count one half). 0.5 is chance.
- ``spearman(a, b)``: rank correlation (average ranks for ties); ``voc`` is the
  value-order correlation of one episode, the Spearman correlation of reward with time.
- ``epic_distance``: EPIC (Gleave et al., "Quantifying differences in reward functions",
  ICLR 2021), in torch: canonicalise both rewards over a coverage distribution of states,
  then take the Pearson distance ``sqrt((1 - rho) / 2)`` in [0, 1]. Invariant to potential
  shaping, to positive scale and to a constant offset; 0 means equivalent rewards.
- ``roc_curve``: false/true positive rates at every threshold, for plots.
- ``preference_accuracy``: how often a predicted P[right ≻ left] > 0.5 agrees with a strict
  reference label; ``expected_calibration_error`` (ECE): bins of predicted P, weighted mean
  |mean P − frequency| (a learned preference reward's held-out quality).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

RewardFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _check_pair(a: np.ndarray, b: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"{what}: the two arrays must have the same length, got {a.shape[0]} and {b.shape[0]}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError(f"{what}: values must be finite (got NaN or inf)")
    return a, b


def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x`` (n,), ties given their average rank."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), np.float64)
    sx = x[order]
    # boundaries of runs of equal values
    starts = np.flatnonzero(np.r_[True, sx[1:] != sx[:-1]])
    ends = np.r_[starts[1:], len(x)]
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = 0.5 * (s + e - 1) + 1.0
    return ranks


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation; NaN when either array is constant."""
    a, b = _check_pair(a, b, "pearson")
    a, b = a - a.mean(), b - b.mean()
    den = np.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / den) if den > 0 else float("nan")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation in [-1, 1]; NaN when either array is constant or n < 2."""
    a, b = _check_pair(a, b, "spearman")
    if len(a) < 2:
        return float("nan")
    return pearson(rankdata(a), rankdata(b))


def voc(rewards: np.ndarray) -> float:
    """Value-order correlation of one episode: Spearman of reward (T,) with time 0..T-1."""
    r = np.asarray(rewards, np.float64).ravel()
    return spearman(r, np.arange(len(r), dtype=np.float64))


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` (n,) for boolean ``labels`` (n,).

    Mann-Whitney U over average ranks, so ties between a positive and a negative count
    one half. NaN when all labels are equal (no positive or no negative).
    """
    s, y = _check_pair(scores, np.asarray(labels, bool), "auroc")
    pos = y > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = rankdata(s)
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def roc_curve(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(false positive rate, true positive rate) at every distinct threshold, from (0, 0) to (1, 1)."""
    s, y = _check_pair(scores, np.asarray(labels, bool), "roc_curve")
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order] > 0.5
    last = np.r_[s[1:] != s[:-1], True]  # the last index of each run of equal scores
    tp, fp = np.cumsum(y)[last], np.cumsum(~y)[last]
    n_pos, n_neg = max(int(y.sum()), 1), max(int((~y).sum()), 1)
    return np.r_[0.0, fp / n_neg], np.r_[0.0, tp / n_pos]


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


def canonicalize(reward: RewardFn, s: torch.Tensor, s_next: torch.Tensor, pool: torch.Tensor,
                 gamma: float) -> torch.Tensor:
    """EPIC's canonical reward of each transition (N,), actions marginalised out.

    ``C(R)(s, s') = R(s, s') + gamma E[R(s', S')] - E[R(s, S')] - gamma E[R(S, S')]`` with
    ``S, S'`` drawn independently from the coverage states ``pool`` (M,). ``reward(a, b)``
    maps index tensors of states (any equal shapes) to rewards of the transitions a -> b.
    The reward models here read the frame reached (and, at most, the one left), not the
    action, so the expectation over actions is the identity.
    """
    m = pool.shape[0]
    cols = pool[None, :].expand(s.shape[0], m)
    from_next = reward(s_next[:, None].expand(-1, m), cols).mean(1)
    from_s = reward(s[:, None].expand(-1, m), cols).mean(1)
    both = reward(pool[:, None].expand(m, m), pool[None, :].expand(m, m)).mean()
    return reward(s, s_next) + gamma * from_next - from_s - gamma * both


def epic_distance(reward_a: RewardFn, reward_b: RewardFn, s: torch.Tensor, s_next: torch.Tensor,
                  pool: torch.Tensor, gamma: float = 0.99) -> float:
    """EPIC distance in [0, 1] between two rewards over transitions ``s -> s_next`` (N,).

    Both rewards are canonicalised over the coverage states ``pool`` (see ``canonicalize``),
    then compared by the Pearson distance ``sqrt((1 - rho) / 2)``. NaN when a canonical
    reward is constant over the transitions.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if s.shape != s_next.shape or s.ndim != 1 or s.numel() < 2:
        raise ValueError(f"s and s_next must be equal 1-d index tensors of >= 2 transitions, "
                         f"got {tuple(s.shape)} and {tuple(s_next.shape)}")
    ca = canonicalize(reward_a, s, s_next, pool, gamma).double()
    cb = canonicalize(reward_b, s, s_next, pool, gamma).double()
    ca, cb = ca - ca.mean(), cb - cb.mean()
    den = torch.sqrt((ca * ca).sum() * (cb * cb).sum())
    if not den > 0:
        return float("nan")
    rho = float((ca * cb).sum() / den)
    return float(np.sqrt(max(0.0, (1.0 - min(rho, 1.0)) / 2.0)))


def next_state_reward(values: torch.Tensor) -> RewardFn:
    """The reward of a transition a -> b that reads only the state reached: ``values[b]``."""
    return lambda a, b: values[b]
