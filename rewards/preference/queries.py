"""Which pairs to ask about, and how many per round.

Selection (PEBBLE, B-Pref): draw ``oversample`` × n candidate pairs uniformly, then keep n:
    uniform       the first n candidates;
    disagreement  the n with the largest standard deviation of P_m[σ¹ ≻ σ⁰] over members;
    entropy       the n with the largest binary entropy of the ensemble-mean P.
Without a trained model (no label yet) every method falls back to uniform.

Schedule: how a total budget of labels is spread over rounds (imitation's
``preference_comparisons`` has the same idea): ``constant`` splits it evenly;
``hyperbolic`` and ``inverse_quadratic`` front-load it (∝ 1/(1+r), ∝ 1/(1+r)²), so the
reward is shaped early and refined later.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rewards.preference.segments import Query

SELECTIONS = ("uniform", "disagreement", "entropy")
SCHEDULES = ("constant", "hyperbolic", "inverse_quadratic")


def check_choice(kind: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{kind} must be one of {tuple(allowed)}, got {value!r}")


def binary_entropy(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return -(p * np.log(p) + (1 - p) * np.log(1 - p))


def uncertainty(probs: np.ndarray, method: str) -> np.ndarray:
    """Score (N,) of each candidate from member probabilities (M, N): larger is more informative."""
    check_choice("selection", method, SELECTIONS)
    if method == "disagreement":
        return probs.std(0)
    if method == "entropy":
        return binary_entropy(probs.mean(0))
    return np.zeros(probs.shape[1])


def select(candidates: Sequence[Query], n: int, method: str, probs: np.ndarray | None = None) -> list[Query]:
    """Keep ``n`` of ``candidates``: the most uncertain under ``probs`` (M, N), or the first n.

    Ties (and ``uniform``) keep the candidates' order, which is already random.
    """
    check_choice("selection", method, SELECTIONS)
    if n > len(candidates):
        raise ValueError(f"asked for {n} queries from only {len(candidates)} candidates")
    if method == "uniform" or probs is None:
        return list(candidates[:n])
    if probs.shape[1] != len(candidates):
        raise ValueError(f"probabilities cover {probs.shape[1]} candidates, expected {len(candidates)}")
    order = np.argsort(-uncertainty(probs, method), kind="stable")[:n]
    return [candidates[i] for i in order]


def schedule(total: int, rounds: int, kind: str = "constant") -> list[int]:
    """Labels per round: ``rounds`` non-negative integers summing to ``total``."""
    check_choice("schedule", kind, SCHEDULES)
    if rounds < 1 or total < 0:
        raise ValueError(f"schedule needs rounds >= 1 and total >= 0, got rounds={rounds}, total={total}")
    r = np.arange(rounds, dtype=float)
    w = {"constant": np.ones(rounds), "hyperbolic": 1 / (1 + r), "inverse_quadratic": 1 / (1 + r) ** 2}[kind]
    raw = total * w / w.sum()
    out = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - out), kind="stable")[: total - out.sum()]:  # largest remainders
        out[i] += 1
    return out.tolist()
