"""The navigation tasks: what each instruction asks for, registered next to its definition.

The wordings of each task are data, in ``instructions.yaml`` beside this file.

A task is a goal sampler ``(scene, start, rng) -> Goal``: it picks what the instruction
refers to in an already sampled scene and start pose (their distribution is the same for
every task) and returns the instruction fields plus a goal region.
``sim.navigation.world.NavigationEnv`` looks the sampler up by task name in ``GOALS`` and
turns the goal into a success predicate, a planner field (``solve``) and reward terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from embodied.core.registry import TaskSpec, register_task
from sim.navigation.arena import BALL_R, COLORS, HALF, ROBOT_R, ROOM_MARGIN, ROOMS, Scene, room_of, \
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
