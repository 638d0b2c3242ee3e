"""The navigation tasks: what each instruction asks for, registered next to its definition.

The wordings of each task are data, in ``instructions.yaml`` beside this file.

A task is a goal sampler ``(scene, start, rng) -> Goal``: it picks what the instruction
refers to in an already sampled scene and start pose (their distribution is the same for
every task) and returns the instruction fields plus a goal region.
``sim.navigation.world.NavigationEnv`` looks the sampler up by task name in ``GOALS`` and
turns the goal into a success predicate, a planner field (``solve``) and reward terms.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from embodied.core.registry import TaskSpec, register_task
from sim.navigation.arena import BALL_R, COLORS, HALF, ROBOT_R, ROOM_MARGIN, ROOMS, Scene, free_pairs, room_of, \
    wall_clearance
from sim.instructions import load_instructions
from sim.navigation.planner import Grid, Plan, ramp_cost

SUITE = "navigation"
ENTRY_POINT = "sim.navigation.world:NavigationEnv"
INSTRUCTIONS = load_instructions(Path(__file__).with_name("instructions.yaml"))
MAX_STEPS = 100  # control steps at 10 Hz: 10 s; the expert needs at most ~70 (5 s on average)
REACH_RADIUS = 0.45  # robot centre within this of a ball centre counts as "at" it (m)
BETWEEN_RADIUS = 0.3  # robot centre within this of the midpoint of two balls (m)
AVOID_RADIUS = 0.8  # robot centre closer than this to the avoided ball fails the episode (m)
AVOID_MAX_STEPS = 130  # detours around the avoided ball take the expert up to ~100 steps
AVOID_ON_PATH = 1.0  # a ball this close to the direct route is "in the way" (m)
AVOID_ON_PATH_P = 0.75  # how often approach-avoid names the ball in the way, when there is one
GEO_NORM = 8.0  # cost-to-go that maps to zero progress (about the longest start-goal path, m)
WEIGHTS = {"progress": 0.6, "heading": 0.2, "safety": 0.2, "avoid": 0.0}
AVOID_WEIGHTS = {"progress": 0.5, "heading": 0.15, "safety": 0.1, "avoid": 0.25}


@dataclass
class Goal:
    """What an episode asks for.

    Attributes:
        fields: instruction fields, e.g. ``{"color": "red"}``.
        point: target point (2,) in metres, or None for a room goal.
        radius: success when the robot centre is within ``radius`` of ``point`` (m).
        room: success when the robot is inside this room (see ``arena.room_of``).
        target: index of the ball being approached (the planner may touch it), if any.
        avoid: index of the ball to keep ``AVOID_RADIUS`` away from, if any.
    """

    fields: dict[str, str]
    point: np.ndarray | None = None
    radius: float = 0.0
    room: str | None = None
    target: int | None = None
    avoid: int | None = None


GoalSampler = Callable[[Scene, np.ndarray, np.random.Generator], Goal]
GOALS: dict[str, GoalSampler] = {}

# ------------------------------------------------------------- goal -> planner field
GRID = Grid(HALF, 0.1)
WALL_COST = 1.0 + ramp_cost(wall_clearance(GRID.xy), r_hard=ROBOT_R + 0.02, r_soft=ROBOT_R + 0.17, penalty=4.0)
CONTACT = BALL_R + ROBOT_R  # centre distance at which the robot touches a ball (m)


def goal_cost(scene: Scene, goal: Goal) -> np.ndarray:
    """Planner cell costs (n, n): walls, balls to steer around, a wide berth for the avoided one."""
    cost = WALL_COST.copy()
    for k, p in enumerate(scene.landmarks):
        d = np.linalg.norm(GRID.xy - p, axis=-1)
        if k == goal.avoid:
            cost += ramp_cost(d, AVOID_RADIUS + 0.05, AVOID_RADIUS + 0.35, 10.0)
        elif k == goal.target:
            cost += ramp_cost(d, CONTACT - 0.08, CONTACT, 0.0)
        else:
            cost += ramp_cost(d, CONTACT + 0.02, CONTACT + 0.3, 4.0)
    return cost


def goal_seeds(goal: Goal) -> np.ndarray:
    """Cells (n, n) bool whose centre is safely inside the goal region."""
    if goal.room is not None:
        sx, sy = ROOMS[goal.room]
        inside = ROOM_MARGIN + 0.05  # a cell centre this deep means the robot is in the room
        return (sx * GRID.xy[..., 0] > inside) & (sy * GRID.xy[..., 1] > inside)
    return np.linalg.norm(GRID.xy - goal.point, axis=-1) < goal.radius - 0.07


def solve(scene: Scene, goal: Goal) -> Plan:
    """The planner field (cost-to-go from every cell) of a goal in a scene."""
    return Plan.solve(GRID, goal_cost(scene, goal), goal_seeds(goal))


def goal_step(goal: Goal, plan: Plan, avoid_point: np.ndarray | None, x: float, y: float, yaw: float,
              contact: bool, violated: bool) -> tuple[bool, dict[str, float], bool]:
    """A goal's success, reward terms (see ``sim.navigation.world``) and avoid flag at a pose.

    ``avoid_point`` is the avoided ball's centre (approach-avoid), ``contact`` whether the robot
    touches anything, ``violated`` whether it came within ``AVOID_RADIUS`` of the avoided ball
    earlier; the returned flag includes this pose.
    """
    i, j = GRID.cell(x, y)
    geo = float(plan.dist[i, j])
    progress = max(0.0, 1.0 - geo / GEO_NORM)  # 0 when unreachable (inf)
    dx, dy = float(plan.direction[i, j, 0]), float(plan.direction[i, j, 1])
    if goal.point is not None and geo == 0.0:  # inside the goal region: face the point
        dx, dy = float(goal.point[0]) - x, float(goal.point[1]) - y
        norm = math.hypot(dx, dy) or 1.0
        dx, dy = dx / norm, dy / norm
    heading = 0.5 + 0.5 * (math.cos(yaw) * dx + math.sin(yaw) * dy)
    avoid = 1.0
    if avoid_point is not None:
        d = math.hypot(x - float(avoid_point[0]), y - float(avoid_point[1]))
        violated = violated or d < AVOID_RADIUS
        avoid = min(1.0, max(0.0, (d - AVOID_RADIUS) / 0.5))
    if goal.point is not None:
        reached = math.hypot(x - float(goal.point[0]), y - float(goal.point[1])) < goal.radius
    else:
        sx, sy = ROOMS[goal.room]
        reached = sx * x > ROOM_MARGIN and sy * y > ROOM_MARGIN
    terms = {"progress": progress, "heading": heading, "safety": 0.0 if contact else 1.0, "avoid": avoid}
    return reached and not violated, terms, violated


def goal_weights(goal: Goal) -> dict[str, float]:
    """The reward weights of a goal's terms."""
    return AVOID_WEIGHTS if goal.avoid is not None else WEIGHTS


def navigation_task(name: str, description: str,
                    max_episode_steps: int = MAX_STEPS) -> Callable[[GoalSampler], GoalSampler]:
    """Register a task (``TaskSpec`` + gymnasium id) whose goal the decorated function samples.

    Its wordings are the task's entry in ``instructions.yaml`` beside this file.
    """

    def add(fn: GoalSampler) -> GoalSampler:
        words = INSTRUCTIONS[name]
        register_task(TaskSpec(name=name, suite=SUITE, entry_point=ENTRY_POINT, train_instructions=words.train,
                               heldout_instructions=words.heldout, max_episode_steps=max_episode_steps,
                               description=description))
        GOALS[name] = fn
        return fn

    return add


@navigation_task(
    "goto-landmark",
    description="drive next to the ball of the named colour (within 0.45 m of its centre)",
)
def goto_landmark(scene: Scene, start: np.ndarray, rng: np.random.Generator) -> Goal:
    k = int(rng.integers(len(COLORS)))
    return Goal({"color": COLORS[k]}, point=scene.landmarks[k], radius=REACH_RADIUS, target=k)


@navigation_task(
    "goto-room",
    description="enter the named room (kitchen, bedroom, office or garage; the start is elsewhere)",
)
def goto_room(scene: Scene, start: np.ndarray, rng: np.random.Generator) -> Goal:
    names = [r for r in ROOMS if r != room_of(start[0], start[1], margin=0.0)]
    room = names[int(rng.integers(len(names)))]
    return Goal({"room": room}, room=room)


@navigation_task(
    "goto-between",
    description="drive to the midpoint of two named balls (within 0.3 m)",
)
def goto_between(scene: Scene, start: np.ndarray, rng: np.random.Generator) -> Goal:
    i, j = scene.pairs[int(rng.integers(len(scene.pairs)))]
    if rng.random() < 0.5:
        i, j = j, i
    mid = 0.5 * (scene.landmarks[i] + scene.landmarks[j])
    return Goal({"a": COLORS[i], "b": COLORS[j]}, point=mid, radius=BETWEEN_RADIUS)


@navigation_task(
    "approach-avoid",
    description="reach the named ball without ever coming within 0.8 m of the other named ball",
    max_episode_steps=AVOID_MAX_STEPS,
)
def approach_avoid(scene: Scene, start: np.ndarray, rng: np.random.Generator) -> Goal:
    """The ball to avoid is, with probability ``AVOID_ON_PATH_P``, the one closest to the
    route the robot would take if it ignored it (when that is within ``AVOID_ON_PATH`` m),
    so that the instruction usually calls for a detour; otherwise any other ball."""
    k = int(rng.integers(len(COLORS)))
    others = [c for c in range(len(COLORS)) if c != k]
    a = int(rng.choice(others))
    if rng.random() < AVOID_ON_PATH_P:
        blind = solve(scene, Goal({}, point=scene.landmarks[k], radius=REACH_RADIUS, target=k))
        route = [GRID.xy[c] for c in blind.path(*GRID.cell(start[0], start[1]), length=GRID.n * 4)]
        if route:
            gap = np.linalg.norm(np.array(route)[None] - scene.landmarks[others][:, None], axis=-1).min(1)
            if gap.min() < AVOID_ON_PATH:
                a = others[int(gap.argmin())]
    return Goal({"color": COLORS[k], "avoid": COLORS[a]}, point=scene.landmarks[k], radius=REACH_RADIUS,
                target=k, avoid=a)


# ------------------------------------------------------------------ hindsight captions
def scene_goals(scene: Scene, tasks: Sequence[str] = tuple(GOALS)) -> list[tuple[str, Goal]]:
    """Every goal the named tasks can ask for in ``scene``, with its task: each ball (goto-landmark),
    each room (goto-room), each free pair in both orders (goto-between) and each ordered pair of
    balls (approach-avoid: reach the first, avoid the second)."""
    out: list[tuple[str, Goal]] = []
    lm = scene.landmarks
    for task in tasks:
        if task == "goto-landmark":
            out += [(task, Goal({"color": c}, point=lm[k], radius=REACH_RADIUS, target=k)) for k, c in enumerate(COLORS)]
        elif task == "goto-room":
            out += [(task, Goal({"room": r}, room=r)) for r in ROOMS]
        elif task == "goto-between":
            for i, j in scene.pairs:
                for a, b in ((i, j), (j, i)):
                    out.append((task, Goal({"a": COLORS[a], "b": COLORS[b]}, point=0.5 * (lm[a] + lm[b]),
                                           radius=BETWEEN_RADIUS)))
        elif task == "approach-avoid":
            out += [(task, Goal({"color": COLORS[k], "avoid": COLORS[a]}, point=lm[k], radius=REACH_RADIUS, target=k,
                                avoid=a)) for k in range(len(COLORS)) for a in range(len(COLORS)) if a != k]
        else:
            raise ValueError(f"no navigation task {task!r}; the tasks are {list(GOALS)}")
    return out


@functools.lru_cache(maxsize=8)
def _scene_plans(landmarks: bytes, tasks: tuple[str, ...]) -> list[tuple[str, Goal, Plan]]:
    """``scene_goals`` of the scene whose balls are at ``landmarks`` (float32 (4, 2) bytes), each
    with its plan; cached, since a bank plays each scene with several behaviours in a row."""
    lm = np.frombuffer(landmarks, np.float32).reshape(len(COLORS), 2).astype(np.float64)
    scene = Scene(lm, free_pairs(lm))
    return [(task, goal, solve(scene, goal)) for task, goal in scene_goals(scene, tasks)]


def hindsight_labels(states: np.ndarray, tasks: Sequence[str]) -> list[tuple[str, dict[str, str], np.ndarray,
                                                                               np.ndarray]]:
    """Ground truth of every goal of an episode's scene along the episode (hindsight captions).

    Args:
        states: (T, 30) the privileged states of the episode's recorded frames, in order
            (``NavigationEnv``'s layout: the robot's pose at [0:3], the balls at [6:14]).
        tasks: the tasks whose goals to label (``scene_goals``).

    Returns:
        one ``(task, fields, success (T,) bool, reward (T,) float32)`` per goal: whether the goal
        holds in each frame, and its dense reward there (``goal_step``'s terms and weights). Two
        things the states do not say are taken as: no contact (the safety term is 1), and, for
        approach-avoid, the robot came near the avoided ball only if a recorded frame shows it
        (frames kept every k-th step can miss a brief pass).
    """
    states = np.asarray(states, np.float64)
    if states.ndim != 2 or states.shape[1] < 14 or len(states) == 0:
        raise ValueError(f"states must be (T, 30) navigation states with T >= 1, got {states.shape}")
    yaw = np.arctan2(states[:, 3], states[:, 2])
    lm = states[0, 6:14].reshape(len(COLORS), 2)
    out = []
    for task, goal, plan in _scene_plans(lm.astype(np.float32).tobytes(), tuple(tasks)):
        weights = goal_weights(goal)
        avoid = None if goal.avoid is None else lm[goal.avoid]
        success = np.zeros(len(states), bool)
        reward = np.zeros(len(states), np.float32)
        violated = False
        for t, (x, y) in enumerate(states[:, :2]):
            ok, terms, violated = goal_step(goal, plan, avoid, float(x), float(y), float(yaw[t]), False, violated)
            success[t] = ok
            reward[t] = sum(weights[k] * v for k, v in terms.items())
        out.append((task, dict(goal.fields), success, reward))
    return out


# ------------------------------------------------------------------ relational state features
# width (m) of the peaked relational features: exp(-d^2 / 2 w^2) of a distance d
RELATIONAL_WIDTH = 0.5


def relational_state(states: np.ndarray) -> np.ndarray:
    """Where the robot is relative to each ball and to the midpoint of each pair of balls.

    Args:
        states: (N, 30) privileged states (``NavigationEnv``'s layout: the robot's x, y, cos and
            sin of its yaw at [0:4], the balls' x, y at [6:14]).

    Returns:
        float32 (N, 32): the robot's distance to each ball (4); for each pair (i, j), i < j, in the
        order (0, 1), (0, 2), ..., (2, 3), the pair's midpoint in the robot's frame (ahead, left; 12)
        and the distance to it (6); then the same distances peaked, exp(-d^2 / 2 w^2) with w =
        ``RELATIONAL_WIDTH``, to each ball (4) and each midpoint (6), which are near 0 except close
        by. A reward fitted with ``state_features`` regresses these besides the state, so that its
        image tower learns the relations goto-between and approach-avoid are judged by (at the
        midpoint of two distant balls the robot is near neither), not only where each thing is.
    """
    states = np.asarray(states, np.float64)
    if states.ndim != 2 or states.shape[1] < 14:
        raise ValueError(f"states must be (N, 30) navigation states, got {states.shape}")
    xy, c, s = states[:, 0:2], states[:, 2], states[:, 3]
    balls = states[:, 6:14].reshape(len(states), len(COLORS), 2)
    to_balls = np.linalg.norm(balls - xy[:, None], axis=-1)
    offsets, dists = [], []
    for i in range(len(COLORS)):
        for j in range(i + 1, len(COLORS)):
            rel = 0.5 * (balls[:, i] + balls[:, j]) - xy
            offsets += [rel[:, 0] * c + rel[:, 1] * s, -rel[:, 0] * s + rel[:, 1] * c]
            dists.append(np.linalg.norm(rel, axis=-1))
    to_mids = np.stack(dists, 1)
    peak = lambda d: np.exp(-0.5 * (d / RELATIONAL_WIDTH) ** 2)  # noqa: E731
    return np.concatenate([to_balls, np.stack(offsets, 1), to_mids, peak(to_balls), peak(to_mids)],
                          axis=1).astype(np.float32)
