"""Teachers: whoever answers "which clip is better?" — behind one interface.

``Teacher.label(queries) -> list[str]``, one of ``left | right | equal | skip`` per query.

- ``SimulatedTeacher``: B-Pref's model of an imperfect person, from the ground-truth
  per-step rewards of the two segments (R⁰ = Σ r(σ⁰), R¹ = Σ r(σ¹)), in this order:
    1. skip if max(R⁰, R¹) < skip · margin (neither clip shows anything worth judging);
    2. myopic: the returns used below weight step t of L by γ^(L−1−t) (recent steps count more);
    3. stochastic: P[right] = sigmoid(β (R¹_γ − R⁰_γ)), a draw from it; β = inf is deterministic
       (right iff R¹_γ > R⁰_γ; an exact tie is "equal");
    4. mistake: the answer is flipped with probability ε;
    5. equal if |R¹ − R⁰| < equal · margin (undiscounted), overriding steps 3–4.
  ``margin`` is the scale of a segment's return; B-Pref uses the mean episode return times
  L / T, and ``embodied prefer`` computes it that way from the first trajectories.
  ``PRESETS`` are B-Pref's: oracle, stochastic (β=1), mistake (ε=0.1), skip (0.1), equal (0.1),
  myopic (γ=0.9).
- ``RewardModelTeacher``: any ``RewardModel`` that scores frames (the VLM reward, in RL-VLM-F's
  spirit) judges the two clips against the instruction and abstains (skip) when the scores are
  closer than ``abstain``.
- The human teacher answers through the label page (``rewards.preference.server``).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from embodied.core.reward import RewardModel
from rewards.preference.segments import Query, Segment


class Teacher(abc.ABC):
    """Answers queries. ``records_labels`` is True for a teacher that writes the store itself."""

    name: str = "teacher"
    records_labels: bool = False

    @abc.abstractmethod
    def label(self, queries: Sequence[Query]) -> list[str]:
        """One of ``left | right | equal | skip`` per query, in order."""


@dataclass
class TeacherConfig:
    """B-Pref's irrationalities; the defaults are the oracle."""

    beta: float = math.inf  # rationality (inf: deterministic)
    gamma: float = 1.0  # myopic discount (1: not myopic)
    eps: float = 0.0  # mistake probability
    skip: float = 0.0  # skip threshold, as a fraction of ``margin``
    equal: float = 0.0  # equal threshold, as a fraction of ``margin``

    def __post_init__(self) -> None:
        if not self.beta > 0:
            raise ValueError(f"teacher beta must be > 0 (inf: deterministic), got {self.beta}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"teacher gamma must be in (0, 1], got {self.gamma}")
        if not 0 <= self.eps <= 0.5:
            raise ValueError(f"teacher eps (mistake probability) must be in [0, 0.5], got {self.eps}")
        for name in ("skip", "equal"):
            if getattr(self, name) < 0:
                raise ValueError(f"teacher {name} threshold must be >= 0, got {getattr(self, name)}")


PRESETS: dict[str, TeacherConfig] = {
    "oracle": TeacherConfig(),
    "stochastic": TeacherConfig(beta=1.0),
    "mistake": TeacherConfig(eps=0.1),
    "skip": TeacherConfig(skip=0.1),
    "equal": TeacherConfig(equal=0.1),
    "myopic": TeacherConfig(gamma=0.9),
}


def discounted_return(rewards: np.ndarray, gamma: float) -> float:
    """Σ_t γ^(L−1−t) r_t: the last step has weight 1 (B-Pref's myopic teacher)."""
    r = np.asarray(rewards, np.float64)
    return float(np.sum(r * gamma ** np.arange(len(r) - 1, -1, -1)))


class SimulatedTeacher(Teacher):
    """B-Pref's simulated teacher (see the module docstring for the rules and their order)."""

    def __init__(self, cfg: TeacherConfig, margin: float | None = None, seed: int = 0, name: str = "simulated"):
        if (cfg.skip > 0 or cfg.equal > 0) and not (margin is not None and margin > 0):
            raise ValueError(f"a skip or equal threshold needs margin > 0 (the scale of a segment's return), "
                             f"got margin={margin}")
        self.cfg, self.margin, self.name = cfg, margin, name
        self.rng = np.random.default_rng(seed)

    def label(self, queries: Sequence[Query]) -> list[str]:
        return [self._one(q.left, q.right) for q in queries]

    def _one(self, left: Segment, right: Segment) -> str:
        c = self.cfg
        r0, r1 = left.ret, right.ret
        if c.skip > 0 and max(r0, r1) < c.skip * self.margin:
            return "skip"
        g0, g1 = discounted_return(left.rewards, c.gamma), discounted_return(right.rewards, c.gamma)
        if math.isinf(c.beta):
            if g0 == g1:
                return "equal"
            answer = "right" if g1 > g0 else "left"
        else:
            p_right = 1.0 / (1.0 + math.exp(-c.beta * (g1 - g0)))
            answer = "right" if self.rng.random() < p_right else "left"
        if c.eps > 0 and self.rng.random() < c.eps:
            answer = "left" if answer == "right" else "right"
        if c.equal > 0 and abs(r1 - r0) < c.equal * self.margin:
            return "equal"
        return answer


def make_simulated(preset: str, margin: float | None = None, seed: int = 0, **overrides: float) -> SimulatedTeacher:
    """A preset teacher (``PRESETS``), with any field overridden (e.g. ``eps=0.2``)."""
    if preset not in PRESETS:
        raise ValueError(f"teacher must be one of {tuple(PRESETS)} (or vlm, human), got {preset!r}")
    base = PRESETS[preset]
    cfg = TeacherConfig(**{**base.__dict__, **{k: v for k, v in overrides.items() if v is not None}})
    return SimulatedTeacher(cfg, margin, seed, name=preset)


class RewardModelTeacher(Teacher):
    """Judges two clips with a frame-reading ``RewardModel`` (e.g. the VLM reward) and abstains
    when unsure.

    A clip's score is the model's mean reward over ``frames`` frames spread evenly over it
    (the last one always included); the clip with the higher score wins unless the two
    scores differ by less than ``abstain`` (in the model's reward units), when it skips.
    """

    def __init__(self, model: RewardModel, abstain: float = 0.0, frames: int = 4, name: str = "vlm"):
        if "frames" not in model.inputs:
            raise ValueError(f"a frame teacher needs a RewardModel that reads frames; "
                             f"{type(model).__name__} reads {sorted(model.inputs)}")
        if abstain < 0 or frames < 1:
            raise ValueError(f"abstain must be >= 0 and frames >= 1, got abstain={abstain}, frames={frames}")
        self.model, self.abstain, self.frames, self.name = model, float(abstain), int(frames), name

    def clip_score(self, seg: Segment) -> float:
        if seg.frames is None:
            raise ValueError("the frame teacher needs rendered frames in each segment (render=true)")
        idx = np.unique(np.linspace(len(seg) - 1, 0, self.frames).round().astype(int))
        states = seg.states[idx] if "states" in self.model.inputs else None
        return float(np.mean(self.model(seg.frames[idx], states, seg.instruction).reward))

    def label(self, queries: Sequence[Query]) -> list[str]:
        out = []
        for q in queries:
            s0, s1 = self.clip_score(q.left), self.clip_score(q.right)
            out.append("skip" if abs(s1 - s0) < self.abstain or s1 == s0 else ("right" if s1 > s0 else "left"))
        return out
