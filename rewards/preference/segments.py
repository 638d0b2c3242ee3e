"""Trajectories, the fixed-length segments cut from them, and query pairs of two segments.

A teacher never judges whole episodes: it compares two clips of ``length`` steps (PEBBLE
uses ~50). Segments carry what every teacher may need: the states and actions (for the
reward model), the ground-truth per-step reward (for the simulated teacher; never shown
to the model), rendered frames (for the VLM and the human teacher) and the instruction.

Shapes (one segment of L steps): ``states`` float32 (L, Ds), ``actions`` float32 (L, Da),
``rewards`` float32 (L,), ``frames`` uint8 (L, H, W, 3) or None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np


@dataclass
class Trajectory:
    """One episode as recorded: T steps of (state, action, ground-truth reward[, frame])."""

    states: np.ndarray  # (T, Ds) float32: the state each action was taken in
    actions: np.ndarray  # (T, Da) float32
    rewards: np.ndarray  # (T,) float32: the task's dense reward for that step
    instruction: str
    success: bool = False
    frames: np.ndarray | None = None  # (T, H, W, 3) uint8
    info: dict[str, Any] = field(default_factory=dict)  # provenance: task, seed, behaviour

    def __post_init__(self) -> None:
        t = len(self.states)
        for name in ("actions", "rewards") + (("frames",) if self.frames is not None else ()):
            if len(getattr(self, name)) != t:
                raise ValueError(f"trajectory {name} has {len(getattr(self, name))} steps, states have {t}")

    def __len__(self) -> int:
        return len(self.states)

    @property
    def ret(self) -> float:
        return float(np.sum(self.rewards))


@dataclass
class Segment:
    """``length`` consecutive steps of a trajectory (see the module docstring for shapes)."""

    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    instruction: str
    frames: np.ndarray | None = None
    info: dict[str, Any] = field(default_factory=dict)  # trajectory provenance + ``start``

    def __len__(self) -> int:
        return len(self.states)

    @property
    def ret(self) -> float:
        """Ground-truth return of the segment (undiscounted)."""
        return float(np.sum(self.rewards))


@dataclass
class Query:
    """Two segments shown side by side: ``left`` (σ⁰) and ``right`` (σ¹). ``id`` is the store's."""

    left: Segment
    right: Segment
    id: int = -1


def cut(traj: Trajectory, start: int, length: int) -> Segment:
    """The segment of ``traj`` covering steps [start, start + length)."""
    if not 0 <= start <= len(traj) - length:
        raise ValueError(f"segment [{start}, {start + length}) does not fit a trajectory of {len(traj)} steps")
    s = slice(start, start + length)
    return Segment(traj.states[s].copy(), traj.actions[s].copy(), traj.rewards[s].copy(), traj.instruction,
                   None if traj.frames is None else traj.frames[s].copy(), {**traj.info, "start": start})


def sample_segments(trajs: Sequence[Trajectory], n: int, length: int, rng: np.random.Generator) -> list[Segment]:
    """``n`` segments: a trajectory uniformly among those at least ``length`` long, then a start.

    Raises ValueError when no trajectory is long enough (a clear message beats an empty pool).
    """
    if length < 1:
        raise ValueError(f"segment length must be >= 1, got {length}")
    pool = [t for t in trajs if len(t) >= length]
    if not pool:
        longest = max((len(t) for t in trajs), default=0)
        raise ValueError(f"no trajectory has {length} steps for a segment (longest: {longest}); "
                         "use a shorter segment_length")
    picks = rng.integers(len(pool), size=n)
    return [cut(pool[i], int(rng.integers(len(pool[i]) - length + 1)), length) for i in picks]


def sample_pairs(trajs: Sequence[Trajectory], n: int, length: int, rng: np.random.Generator,
                 by: str = "instruction") -> list[Query]:
    """``n`` candidate queries (ids unset): a left segment as in ``sample_segments``, and a right one
    from a trajectory of the same group: the same instruction (``by="instruction"``: a clip pair is
    judged against one instruction) or the same task (``by="task"``, ``info["task"]``: the runs of
    several tasks, whose instructions vary within a task, e.g. the block's colour). A pair never
    mixes two tasks, so the teacher's ground-truth comparison is one task's reward against itself."""
    if by not in ("instruction", "task"):
        raise ValueError(f"pairs are grouped by 'instruction' or 'task', got {by!r}")

    def key(t: Trajectory | Segment) -> str:
        if by == "instruction":
            return t.instruction
        if "task" not in t.info:
            raise ValueError("pairs grouped by task need each trajectory's task in info['task']")
        return str(t.info["task"])

    groups: dict[str, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(key(t), []).append(t)
    out = []
    for left in sample_segments(trajs, n, length, rng):
        right = sample_segments(groups[key(left)], 1, length, rng)[0]
        out.append(Query(left, right))
    return out


def stack(segments: Sequence[Segment], what: str) -> np.ndarray:
    """Stack one field of equally long segments: (N, L, ...)."""
    arrs = [getattr(s, what) for s in segments]
    if any(a is None for a in arrs):
        raise ValueError(f"some segments have no {what} (render frames for an image reward or a frame teacher)")
    return np.stack(arrs)
