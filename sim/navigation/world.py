"""The navigation world: a differential-drive robot in the four-room arena.

Action (2,) in [-1, 1]:
    ``forward``: forward speed, times ``MAX_SPEED`` = 1.0 m/s (negative drives backward).
    ``turn``: yaw rate, times ``MAX_TURN`` = 2.0 rad/s (positive turns left, counter-clockwise).
The command is held for one control step of 0.1 s (5 physics steps of 20 ms, so 10 Hz);
velocity actuators on the x, y and yaw joints track the world-frame velocity
(v cos(yaw), v sin(yaw), w) with a ~30 ms time constant, so the robot moves like a
unicycle. Walls and balls are solid; contacts are frictionless (a bumper that slides
along walls), so the robot can always turn away from an obstacle it touches.

State (30,) float32, the same layout for every task:
    [0:2] robot x, y (m); [2:4] cos(yaw), sin(yaw); [4] forward speed (m/s);
    [5] yaw rate (rad/s) -- these 6 are ``proprio_dims``, kept in pixel mode;
    [6:14] x, y (m) of the red, green, blue and yellow balls, in that order;
    [14:22] the same balls in the robot's frame (x ahead, y to the left; m), what an
        onboard detector reports -- a policy need not learn the rotation itself;
    [22:30] range readings (m, clipped to 2.5) of 8 horizontal rays from the robot centre,
        every 45 degrees counter-clockwise from straight ahead (MuJoCo rangefinders; walls
        and balls). Like the real sensor they lag one 20 ms physics step.

Cameras: ``ego`` (on the robot, looking ahead; pixel observations) and ``overhead``
(the whole arena; ``render()``).

Trail (``trail=True``; off by default): ``render()`` frames (what the VLM reward and videos
read) show the path the robot has driven since reset as magenta discs on the floor
(``TRAIL_*``), so that a single frame tells where the episode has been (approach-avoid fails
once the robot came near the avoided ball, which the robot's current position alone does not
show). Only the drawn scene changes: observation images (what pixel policies read) and the
simulation are the same either way. Off by default: the CLIP reward fitted on frames with the
trail scores the navigation suite worse on the whole (see docs/results/vlm-rewards.md). A reward
fitted on frames with the trail must be used on such frames.

Reward terms (each in [0, 1]):
    ``progress``: 1 - (planner cost-to-go to the goal region) / 8 m, clipped.
    ``heading``: alignment of the robot's heading with the planned path direction.
    ``safety``: 0 while the robot touches a wall or a ball, else 1.
    ``avoid``: (approach-avoid) distance beyond 0.8 m from the avoided ball, clipped at 0.5 m;
        1 for the other tasks, where its weight is 0.
Weights: progress 0.6, heading 0.2, safety 0.2 (approach-avoid: 0.5, 0.15, 0.1, avoid 0.25).
Success ends the episode. In approach-avoid, once the robot has come within 0.8 m of
the avoided ball the episode can no longer succeed (it runs to the time limit).
"""

from __future__ import annotations

import math
from typing import Any

import mujoco
import numpy as np

from sim.base import TaskEnv
from sim.navigation.arena import ARENA_XML, BALL_R, COLORS, N_RANGES, RANGE_MAX, ROOMS, Scene, sample_in_room, \
    sample_scene
from sim.navigation.planner import Plan, pursue
from sim.navigation.tasks import GOALS, GRID, Goal, goal_step, goal_weights, solve

MAX_SPEED = 1.0  # m/s at forward = 1
MAX_TURN = 2.0  # rad/s at turn = 1
START_BALL_CLEAR = 1.0  # the robot starts at least this far from every ball centre (m)
START_MIN_GEO = 1.0  # ... and at least this far (planner cost) from the goal
# The trail drawn in render() frames. Magenta is a hue found nowhere else in the scene: the balls
# are red, green, blue and yellow, the floors tan, pale lavender, light blue-grey and dark grey, the
# walls beige, the robot white with a black nose (a white or black trail would read as the robot).
# Drawn emissive, so it shows as full magenta (255, 0, 255) whatever the lighting.
TRAIL_RGBA = (1.0, 0.0, 1.0, 1.0)
TRAIL_RADIUS = 0.08  # disc radius (m); in a 64 px overhead frame one pixel is ~8.6 cm
TRAIL_Z = 0.004  # disc centre height (m), just above the floor top (z = 0); the robot covers the newest discs
TRAIL_SPACING = 0.05  # a new trail point once the robot is this far from the last one (m)
MAX_TRAIL_GEOMS = 300  # at most this many discs (an evenly thinned subset of the points beyond it)


class NavigationEnv(TaskEnv):
    """Instruction-following navigation (see the module docstring for units and layout)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    xml = ARENA_XML
    n_substeps = 5
    action_names = ("forward", "turn")
    default_cameras = ("ego", "overhead")
    render_camera = "overhead"
    proprio_dims = 6

    def __init__(self, task: str, trail: bool = False, **kwargs: Any):
        """Arguments as ``BaseEnv``; ``trail``: draw the robot's path in ``render()`` frames."""
        self.trail = bool(trail)
        self._trail: list[tuple[float, float]] = []  # robot (x, y) at reset and after steps (m)
        super().__init__(task, **kwargs)

    def _setup(self) -> None:
        self._sample_goal = GOALS[self.spec_task.name]
        self._mocap = [int(self.model.body_mocapid[self.model.body(f"ball_{c}").id]) for c in COLORS]
        self._buf = np.zeros(6 + 4 * len(COLORS) + N_RANGES, dtype=np.float32)
        self._range_adr = [int(self.model.sensor_adr[self.model.sensor(f"range_{k}").id]) for k in range(N_RANGES)]
        self._weights: dict[str, float] = {}
        self._avoid: np.ndarray | None = None
        self._violated = False
        self.scene: Scene | None = None
        self.goal: Goal | None = None
        self.plan: Plan | None = None

    # ------------------------------------------------------------------ reset
    def _reset_world(self, rng: np.random.Generator) -> dict[str, Any]:
        for _ in range(100):
            scene = sample_scene(rng)
            for _ in range(10):
                start = self._sample_start(rng, scene)
                for _ in range(5):  # a goal the robot can reach, but has not reached yet
                    goal = self._sample_goal(scene, start, rng)
                    plan = solve(scene, goal)
                    cell = GRID.cell(start[0], start[1])
                    if plan.reachable[cell] and plan.dist[cell] >= START_MIN_GEO:
                        return self._place(scene, goal, plan, start)
        raise RuntimeError(f"task {self.spec_task.name!r}: no feasible episode in 5000 tries")

    @staticmethod
    def _sample_start(rng: np.random.Generator, scene: Scene) -> np.ndarray:
        """(x, y, yaw): anywhere in a room, clear of the walls and the balls."""
        names = list(ROOMS)
        for _ in range(10000):  # two or more rooms hold no ball, so this ends quickly
            p = sample_in_room(rng, names[int(rng.integers(len(names)))])
            if np.linalg.norm(scene.landmarks - p, axis=1).min() >= START_BALL_CLEAR:
                return np.array([p[0], p[1], rng.uniform(-math.pi, math.pi)])
        raise RuntimeError("no free start pose in this scene")

    def _place(self, scene: Scene, goal: Goal, plan: Plan, start: np.ndarray) -> dict[str, Any]:
        self.scene, self.goal, self.plan = scene, goal, plan
        self._violated = False
        self._weights = goal_weights(goal)
        self._avoid = None if goal.avoid is None else scene.landmarks[goal.avoid]
        self.data.qpos[:3] = start
        for m, p in zip(self._mocap, scene.landmarks):
            self.data.mocap_pos[m] = (p[0], p[1], BALL_R)
        self._buf[6:14] = scene.landmarks.reshape(-1)
        self._trail = [(float(start[0]), float(start[1]))]
        return dict(goal.fields)

    # ------------------------------------------------------------------ trail
    def step(self, action: np.ndarray):
        """``TaskEnv.step``, then, with ``trail``, the robot's position joins the trail (every
        step, not in ``render()``: callers may render only some frames)."""
        out = super().step(action)
        if not self.trail:
            return out
        x, y = float(self.data.qpos[0]), float(self.data.qpos[1])
        lx, ly = self._trail[-1]
        if math.hypot(x - lx, y - ly) >= TRAIL_SPACING:
            self._trail.append((x, y))
        return out

    def _mark_render_scene(self, scene: Any) -> None:
        """Add the trail's discs to ``render()``'s scene (see the module docstring), as many as
        ``MAX_TRAIL_GEOMS`` and the scene's free geom slots allow (evenly thinned beyond that)."""
        if not self.trail:
            return
        room = min(MAX_TRAIL_GEOMS, scene.maxgeom - scene.ngeom)
        if room <= 0:
            return
        pts = self._trail
        if len(pts) > room:
            pts = [pts[k] for k in np.linspace(0, len(pts) - 1, room).round().astype(int)]
        size = np.array([TRAIL_RADIUS, 0.001, 0.0])
        mat = np.eye(3).reshape(-1)
        rgba = np.array(TRAIL_RGBA, dtype=np.float32)
        for x, y in pts:
            g = scene.geoms[scene.ngeom]
            mujoco.mjv_initGeom(g, mujoco.mjtGeom.mjGEOM_CYLINDER, size, np.array([x, y, TRAIL_Z]), mat, rgba)
            g.emission = 1.0
            g.category = mujoco.mjtCatBit.mjCAT_DECOR
            scene.ngeom += 1

    # ------------------------------------------------------------------ hooks
    def _apply_action(self, action: np.ndarray) -> None:
        v = float(action[0]) * MAX_SPEED
        yaw = float(self.data.qpos[2])
        self.data.ctrl[:] = (v * math.cos(yaw), v * math.sin(yaw), float(action[1]) * MAX_TURN)

    def _state(self) -> np.ndarray:
        q, qd, b = self.data.qpos, self.data.qvel, self._buf
        c, s = math.cos(q[2]), math.sin(q[2])
        b[:6] = (q[0], q[1], c, s, qd[0] * c + qd[1] * s, qd[2])
        rel = b[6:14].reshape(-1, 2) - (q[0], q[1])
        b[14:22:2] = rel[:, 0] * c + rel[:, 1] * s
        b[15:22:2] = -rel[:, 0] * s + rel[:, 1] * c
        r = self.data.sensordata[self._range_adr]
        b[22:30] = np.where(r < 0, RANGE_MAX, np.minimum(r, RANGE_MAX))
        return b.copy()

    def _evaluate(self) -> tuple[bool, dict[str, float], dict[str, float]]:
        q = self.data.qpos
        ok, terms, self._violated = goal_step(self.goal, self.plan, self._avoid, float(q[0]), float(q[1]),
                                              float(q[2]), self.data.ncon > 0, self._violated)
        return ok, terms, self._weights

    def expert_action(self) -> np.ndarray:
        """Plan-following pure pursuit (see ``sim.navigation.planner``); (2,) float32."""
        q = self.data.qpos
        pos = np.array([q[0], q[1]])
        target = self.plan.waypoint(pos, None if self.goal.point is None else self.goal.point)
        return pursue(pos, float(q[2]), target, k_turn=4.0, max_turn=MAX_TURN)
