"""The eight manipulation tasks: parameters, success, shaped reward terms, scripted expert.

Each task is registered (in ``sim/manipulation/__init__.py``) from the ``TASKS`` table
below, with its wordings from ``instructions.yaml`` beside this file. Reward terms are in
[0, 1]; their weights sum to 1. Experts are small state machines over the state vector
(see ``state.py`` for its layout); their memory lives in a dict the env clears on reset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from sim.manipulation.scene import BLOCK_COLORS, BUTTON_COLORS, BLOCK_HALF
from sim.manipulation.state import STATE_DIM, STEP_M, block_index, button_index

OPEN, CLOSE = -1.0, 1.0
HALF_OPEN = 0.33  # each finger 1.5 cm from the centre line
HOVER = 0.07  # height above an object to approach from (m)
ZONE_HALF = 0.045  # half side of the yellow zone (m), as in scene.py


def _reach(d: float, scale: float = 10.0) -> float:
    return float(1.0 - np.tanh(scale * d))


def goto(s: np.ndarray, target: np.ndarray, grip: float) -> np.ndarray:
    """Proportional move toward ``target`` (saturating at one full step)."""
    a = np.empty(4)
    a[:3] = np.clip((target - s[0:3]) / STEP_M, -1.0, 1.0)
    a[3] = grip
    return a


def holding(s: np.ndarray, obj: np.ndarray) -> bool:
    """True when ``obj`` sits between the closed fingers."""
    d = np.abs(obj - s[0:3])
    return bool(d[0] < 0.02 and d[1] < 0.012 and d[2] < 0.03 and s[3] < 2 * BLOCK_HALF + 0.008)


def _safe_approach(s: np.ndarray, above: np.ndarray, grip: float) -> np.ndarray:
    """Rise first when low and far, so the gripper never sweeps through objects."""
    if np.linalg.norm(s[0:2] - above[:2]) > 0.02 and s[2] < above[2] - 0.025:
        return goto(s, np.array([s[0], s[1], above[2]]), grip)
    return goto(s, above, grip)


def pick_step(s: np.ndarray, obj: np.ndarray, mem: dict[str, Any], carry_to: np.ndarray) -> np.ndarray:
    """Approach, descend, close, then move to ``carry_to`` while holding."""
    phase = mem.setdefault("phase", "approach")
    if phase in ("lift",) and not holding(s, obj):
        phase = "approach"
    if phase == "approach":
        above = obj + [0, 0, HOVER]
        if np.linalg.norm(s[0:2] - obj[:2]) < 0.006 and abs(s[2] - above[2]) < 0.03:
            phase = "descend"
        else:
            mem["phase"] = phase
            return _safe_approach(s, above, OPEN)
    if phase == "descend":
        grasp = obj + [0, 0, 0.004]
        if np.linalg.norm(s[0:3] - grasp) < 0.006:
            phase, mem["t"] = "close", 0
        else:
            mem["phase"] = phase
            return goto(s, grasp, OPEN)
    if phase == "close":
        mem["t"] += 1
        if mem["t"] > 5:
            phase = "lift"
        else:
            mem["phase"] = phase
            return goto(s, obj + [0, 0, 0.004], CLOSE)
    mem["phase"] = "lift"
    if s[2] < 0.1 and np.linalg.norm(s[0:2] - carry_to[:2]) > 0.02:
        return goto(s, np.array([s[0], s[1], max(carry_to[2], 0.12)]), CLOSE)
    return goto(s, carry_to, CLOSE)


@dataclass
class Task:
    """One task kind. ``sample`` draws its parameters; ``evaluate`` and ``expert`` read the state."""

    name: str
    description: str
    weights: dict[str, float]
    max_steps: int = 100
    sample_fn: Callable[[np.random.Generator], dict[str, Any]] = field(default=lambda rng: {})

    def sample(self, env: Any, rng: np.random.Generator) -> dict[str, Any]:
        return self.sample_fn(rng)

    def evaluate(self, env: Any, s: np.ndarray) -> tuple[bool, dict[str, float], dict[str, float]]:
        raise NotImplementedError

    def expert(self, env: Any, s: np.ndarray, mem: dict[str, Any]) -> np.ndarray:
        raise NotImplementedError


def _block_color(rng: np.random.Generator) -> dict[str, Any]:
    return {"color": str(rng.choice(list(BLOCK_COLORS)))}


def _two_blocks(rng: np.random.Generator) -> dict[str, Any]:
    a, b = rng.choice(list(BLOCK_COLORS), size=2, replace=False)
    return {"color": str(a), "base": str(b)}


def _button_color(rng: np.random.Generator) -> dict[str, Any]:
    return {"color": str(rng.choice(list(BUTTON_COLORS)))}


class Reach(Task):
    def evaluate(self, env, s):
        goal = s[block_index(env.params["color"])] + [0, 0, HOVER]
        d = float(np.linalg.norm(s[0:3] - goal))
        return d < 0.02, {"reach": _reach(d)}, self.weights

    def expert(self, env, s, mem):
        return goto(s, s[block_index(env.params["color"])] + [0, 0, HOVER], OPEN)


class Pick(Task):
    def evaluate(self, env, s):
        b = s[block_index(env.params["color"])]
        lift = float(np.clip((b[2] - BLOCK_HALF) / 0.08, 0, 1))
        terms = {"reach": _reach(np.linalg.norm(s[0:3] - b)), "grasp": float(holding(s, b)), "lift": lift}
        return bool(b[2] > BLOCK_HALF + 0.08 and holding(s, b)), terms, self.weights

    def expert(self, env, s, mem):
        b = s[block_index(env.params["color"])]
        return pick_step(s, b, mem, np.array([b[0], b[1], 0.16]))


class PlaceInBin(Task):
    def evaluate(self, env, s):
        b = s[block_index(env.params["color"])]
        bin_xy = s[13:15]
        d = float(np.linalg.norm(b[:2] - bin_xy))
        inside = bool(np.all(np.abs(b[:2] - bin_xy) < 0.05) and b[2] < 0.05)
        released = s[3] > 2 * BLOCK_HALF + 0.01
        terms = {"reach": _reach(np.linalg.norm(s[0:3] - b)), "grasp": float(holding(s, b)),
                 "place": _reach(d, 5.0), "inside": float(inside)}
        return inside and released, terms, self.weights

    def expert(self, env, s, mem):
        b = s[block_index(env.params["color"])]
        above_bin = np.array([s[13], s[14], 0.12])
        if mem.get("phase") == "release" or (holding(s, b) and np.linalg.norm(b[:2] - above_bin[:2]) < 0.015):
            mem["phase"] = "release"
            if b[2] > 0.06 and not holding(s, b) and np.linalg.norm(b[:2] - above_bin[:2]) > 0.05:
                mem["phase"] = "approach"  # dropped outside: start over
            return goto(s, above_bin, OPEN)
        return pick_step(s, b, mem, above_bin)


class Stack(Task):
    def evaluate(self, env, s):
        top, base = s[block_index(env.params["color"])], s[block_index(env.params["base"])]
        dxy = float(np.linalg.norm(top[:2] - base[:2]))
        dz = top[2] - base[2]
        stacked = bool(dxy < 0.02 and abs(dz - 2 * BLOCK_HALF) < 0.008)
        released = s[3] > 2 * BLOCK_HALF + 0.01
        terms = {"reach": _reach(np.linalg.norm(s[0:3] - top)), "grasp": float(holding(s, top)),
                 "align": _reach(dxy), "stacked": float(stacked)}
        return stacked and released, terms, self.weights

    def expert(self, env, s, mem):
        top, base = s[block_index(env.params["color"])], s[block_index(env.params["base"])]
        above = base + [0, 0, 2 * BLOCK_HALF + 0.012]
        if mem.get("phase") == "release" or (holding(s, top) and np.linalg.norm(s[0:3] - above) < 0.006):
            mem["phase"] = "release"
            if not holding(s, top) and np.linalg.norm(top[:2] - base[:2]) > 0.02 and top[2] < 0.03:
                mem["phase"] = "approach"  # fell off: start over
            return goto(s, above + [0, 0, 0.03], OPEN)
        if mem.get("phase") == "lift" and holding(s, top) and np.linalg.norm(s[0:2] - base[:2]) > 0.01:
            return pick_step(s, top, mem, base + [0, 0, 0.09])
        return pick_step(s, top, mem, above)


def _seg_dist(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    ab = b - a
    t = np.clip((p - a) @ ab / (ab @ ab + 1e-12), 0.0, 1.0)
    return float(np.linalg.norm(a + t * ab - p))


class Push(Task):
    def sample(self, env, rng):
        """Prefer a block whose straight push path to the zone is clear of the others.

        The scene distribution is the same as every other task's; only the choice of
        colour depends on it (any colour when no path is clear).
        """
        s = env._state()
        zone, clear = s[15:17], []
        for c in BLOCK_COLORS:
            b = s[block_index(c)][:2]
            start = b - (zone - b) / (np.linalg.norm(zone - b) + 1e-9) * 0.06
            others = [s[block_index(o)][:2] for o in BLOCK_COLORS if o != c]
            if all(_seg_dist(o, start, zone) > 0.06 for o in others):
                clear.append(c)
        return {"color": str(rng.choice(clear or list(BLOCK_COLORS)))}

    def evaluate(self, env, s):
        b = s[block_index(env.params["color"])]
        d = float(np.linalg.norm(b[:2] - s[15:17]))
        terms = {"reach": _reach(np.linalg.norm(s[0:3] - b)), "place": _reach(d, 5.0)}
        on_zone = bool(np.all(np.abs(b[:2] - s[15:17]) < ZONE_HALF) and b[2] < 0.03)  # centre on the square
        return on_zone, terms, self.weights

    def expert(self, env, s, mem):
        b, zone = s[block_index(env.params["color"])], s[15:17]
        d = zone - b[:2]
        dist = np.linalg.norm(d) + 1e-9
        u = d / dist
        behind = b[:2] - u * 0.045  # gripper centre just behind the block
        rel = s[0:2] - b[:2]
        along, across = float(rel @ u), float(rel @ np.array([-u[1], u[0]]))
        aligned = along < -0.03 and abs(across) < 0.012
        if s[2] > 0.04 or not aligned:
            if s[2] < 0.045 and (along > -0.035 or abs(across) > 0.02):
                return goto(s, np.array([s[0], s[1], 0.08]), CLOSE)  # lift clear before repositioning
            if np.linalg.norm(s[0:2] - behind) > 0.006:
                return goto(s, np.array([behind[0], behind[1], 0.08]), CLOSE)
            return goto(s, np.array([behind[0], behind[1], 0.022]), CLOSE)
        step = np.append(b[:2] + u * min(dist, 0.03) - u * 0.035 + (0 if dist > 0.005 else 0), 0.022)
        return goto(s, step, CLOSE)


class OpenDrawer(Task):
    def evaluate(self, env, s):
        h = s[18:21]
        terms = {"reach": _reach(np.linalg.norm(s[0:3] - h)), "open": float(np.clip(s[17] / 0.16, 0, 1))}
        return bool(s[17] > 0.16), terms, self.weights

    def expert(self, env, s, mem):
        h = s[18:21]
        grasped = abs(s[0] - h[0]) < 0.03 and abs(s[1] - h[1]) < 0.02 and abs(s[2] - h[2]) < 0.012
        if mem.get("phase") == "pull" and grasped and s[3] < 0.03:
            return goto(s, h + [0, -0.012, 0], CLOSE)  # slow enough that the handle does not slip
        above = h + [0, 0, 0.05]
        if mem.get("phase") not in ("descend", "close") and np.linalg.norm(s[0:3] - above) > 0.008:
            mem["phase"] = "approach"
            return _safe_approach(s, above, HALF_OPEN)
        if mem.get("phase") in (None, "approach", "pull"):
            mem["phase"] = "descend"
        if mem["phase"] == "descend":  # half-open, so the outer finger clears the drawer front
            if np.linalg.norm(s[0:3] - h) < 0.005:
                mem["phase"], mem["t"] = "close", 0
            return goto(s, h, HALF_OPEN)
        mem["t"] += 1
        if mem["t"] > 5:
            mem["phase"] = "pull"
        return goto(s, h, CLOSE)


class CloseDrawer(Task):
    def evaluate(self, env, s):
        h = s[18:21]
        terms = {"reach": _reach(np.linalg.norm(s[0:3] - h)), "close": float(np.clip(1 - s[17] / 0.12, 0, 1))}
        return bool(s[17] < 0.015), terms, self.weights

    def expert(self, env, s, mem):
        h = s[18:21]
        front = h + [0, -0.03, 0]
        if abs(s[0] - h[0]) < 0.01 and abs(s[2] - h[2]) < 0.01 and s[1] < h[1]:
            return goto(s, h + [0, 0.04, 0], CLOSE)  # push the handle in
        if np.linalg.norm(s[0:2] - front[:2]) > 0.01:
            return _safe_approach(s, front + [0, 0, 0.05], CLOSE)
        return goto(s, front, CLOSE)


class PressButton(Task):
    def evaluate(self, env, s):
        c = s[button_index(env.params["color"])]
        z0 = 0.03
        depth = float(np.clip((z0 - c[2]) / 0.015, 0, 1))
        terms = {"reach": _reach(np.linalg.norm(s[0:3] - c - [0, 0, 0.03])), "press": depth}
        return bool(z0 - c[2] > 0.012), terms, self.weights

    def expert(self, env, s, mem):
        c = s[button_index(env.params["color"])]
        above = c + [0, 0, 0.06]
        if np.linalg.norm(s[0:2] - c[:2]) > 0.008:
            return _safe_approach(s, above, CLOSE)
        return goto(s, c + [0, 0, 0.0], CLOSE)


# Instructions are data: sim/manipulation/instructions.yaml holds each task's wordings.
TASKS: dict[str, Task] = {t.name: t for t in [
    Reach("reach", "move the gripper above a block of a given colour", {"reach": 1.0}, 60, _block_color),
    Push("push", "push a block onto the yellow zone without lifting it", {"reach": 0.3, "place": 0.7}, 120,
         _block_color),
    Pick("pick", "pick up a block and lift it 8 cm", {"reach": 0.3, "grasp": 0.2, "lift": 0.5}, 80, _block_color),
    PlaceInBin("place-in-bin", "put a block into the bin and let go",
               {"reach": 0.2, "grasp": 0.1, "place": 0.4, "inside": 0.3}, 120, _block_color),
    Stack("stack", "stack one block on another and let go",
          {"reach": 0.2, "grasp": 0.1, "align": 0.4, "stacked": 0.3}, 120, _two_blocks),
    OpenDrawer("open-drawer", "pull the drawer open (over 16 cm)", {"reach": 0.3, "open": 0.7}, 100),
    CloseDrawer("close-drawer", "push the drawer shut", {"reach": 0.3, "close": 0.7}, 80),
    PressButton("press-button", "press the button of a given colour", {"reach": 0.3, "press": 0.7}, 60,
                _button_color),
]}


# ------------------------------------------------------------------ hindsight captions
def task_goals(task: str) -> list[dict[str, str]]:
    """Every parameter set ``task`` can be given in a scene: each block (or button) colour, each
    ordered pair of blocks for ``stack``, the one goal of the drawer tasks."""
    if task not in TASKS:
        raise ValueError(f"no manipulation task {task!r}; the tasks are {list(TASKS)}")
    if task == "stack":
        return [{"color": a, "base": b} for a in BLOCK_COLORS for b in BLOCK_COLORS if a != b]
    if task == "press-button":
        return [{"color": c} for c in BUTTON_COLORS]
    if task in ("open-drawer", "close-drawer"):
        return [{}]
    return [{"color": c} for c in BLOCK_COLORS]


@dataclass
class _Params:
    """What a task's ``evaluate`` reads of its env besides the state: the episode's parameters."""

    params: dict[str, str]


def hindsight_labels(states: np.ndarray, tasks: Sequence[str]) -> list[tuple[str, dict[str, str], np.ndarray,
                                                                               np.ndarray]]:
    """Ground truth of every goal of the named tasks along an episode (hindsight captions).

    Args:
        states: (T, 27) the privileged states of the episode's recorded frames (``state.py``).
        tasks: the tasks whose goals to label (``task_goals``).

    Returns:
        one ``(task, params, success (T,) bool, reward (T,) float32)`` per goal: its success
        predicate and dense reward (weighted terms) in each frame, from the state alone, as the
        env computes them.
    """
    states = np.asarray(states, np.float64)
    if states.ndim != 2 or states.shape[1] != STATE_DIM or len(states) == 0:
        raise ValueError(f"states must be (T, {STATE_DIM}) manipulation states with T >= 1, got {states.shape}")
    out = []
    for task in tasks:
        for params in task_goals(task):
            ctx, spec = _Params(params), TASKS[task]
            success = np.zeros(len(states), bool)
            reward = np.zeros(len(states), np.float32)
            for t, s in enumerate(states):
                ok, terms, weights = spec.evaluate(ctx, s)
                success[t], reward[t] = ok, sum(weights[k] * terms[k] for k in weights)
            out.append((task, dict(params), success, reward))
    return out
