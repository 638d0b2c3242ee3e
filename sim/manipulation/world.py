"""The tabletop manipulation world: one scene, many tasks chosen by name.

Action (4,) in [-1, 1]: end-effector displacement (dx, dy, dz) scaled by 2 cm per
control step (20 Hz, so up to 0.4 m/s), and the gripper command g (-1 fully open,
+1 fully closed; each finger's target gap is 4.5 cm * (1 - g) / 2).

State (27,) float32, metres, the same layout for every task (see ``state.py``): gripper
position and opening, the three blocks, bin, zone, drawer and buttons. Pixel mode keeps
the first 4 entries (proprioception) and adds camera images.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.base import TaskEnv
from sim.manipulation.scene import BLOCK_COLORS, BUTTON_COLORS, FINGER_MAX, SCENE_XML
from sim.manipulation.state import PROPRIO_DIMS, STATE_DIM, STEP_M
from sim.manipulation.tasks import TASKS
WORKSPACE_LOW = np.array([-0.35, -0.3, 0.012])
WORKSPACE_HIGH = np.array([0.35, 0.35, 0.3])
CABINET_Y = 0.3
HANDLE_OFFSET = np.array([0.0, -0.125, 0.03])  # handle relative to the cabinet origin, drawer closed


class ManipulationEnv(TaskEnv):
    """Tabletop scene with blocks, bin, zone, drawer and buttons; see module docstring."""

    xml = SCENE_XML
    n_substeps = 10  # 10 x 5 ms = 50 ms per control step
    action_names = ("dx", "dy", "dz", "gripper")
    default_cameras = ("side", "front", "top")  # side first: sees all three blocks unoccluded
    render_camera = "front"
    proprio_dims = PROPRIO_DIMS
    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def _setup(self) -> None:
        m = self.model
        self.task = TASKS[self.spec_task.name]
        jq = lambda name: int(m.jnt_qposadr[m.joint(name).id])  # noqa: E731
        jv = lambda name: int(m.jnt_dofadr[m.joint(name).id])  # noqa: E731
        self._ee_q = np.array([jq("ee_x"), jq("ee_y"), jq("ee_z")])
        self._ee_v = np.array([jv("ee_x"), jv("ee_y"), jv("ee_z")])
        self._finger_q = np.array([jq("finger_l"), jq("finger_r")])
        self._block_q = {c: jq(f"block_{c}") for c in BLOCK_COLORS}
        self._block_v = {c: jv(f"block_{c}") for c in BLOCK_COLORS}
        self._drawer_q = jq("drawer")
        self._button_q = {c: jq(f"button_{c}") for c in BUTTON_COLORS}
        self._bin_body = m.body("bin").id
        self._cabinet_body = m.body("cabinet").id
        self._button_body = {c: m.body(f"button_{c}").id for c in BUTTON_COLORS}
        self._zone_geom = m.geom("zone").id
        # state = static (per episode) + dynamic entries gathered from qpos in one index
        self._dyn_src = np.concatenate([self._ee_q] + [np.arange(self._block_q[c], self._block_q[c] + 3)
                                                       for c in BLOCK_COLORS] + [[self._drawer_q]])
        self._dyn_dst = np.concatenate([np.arange(0, 3), np.arange(4, 13), [17]])
        self._static = np.zeros(STATE_DIM, np.float32)
        self._expert_mem: dict[str, Any] = {}
        self._handle_y0 = CABINET_Y + HANDLE_OFFSET[1]
        self._button_z0 = (0.03, 0.03)

    # ------------------------------------------------------------------ world
    def _reset_world(self, rng: np.random.Generator) -> dict[str, Any]:
        m, d = self.model, self.data
        m.body_pos[self._cabinet_body] = [rng.uniform(-0.22, -0.16), CABINET_Y, 0.0]
        m.body_pos[self._bin_body] = [rng.uniform(0.17, 0.23), rng.uniform(0.18, 0.24), 0.0]
        m.geom_pos[self._zone_geom][:2] = [rng.uniform(-0.2, -0.1), rng.uniform(-0.2, -0.11)]
        bx = rng.uniform(0.22, 0.3, size=2)
        by = _separated(rng, 2, (-0.2, 0.05), 0.09)
        for i, c in enumerate(BUTTON_COLORS):
            m.body_pos[self._button_body[c]] = [bx[i], by[i], 0.0]
        xy = _separated_2d(rng, len(BLOCK_COLORS), (-0.06, 0.12), (-0.12, 0.1), 0.075)
        for (c, q), p in zip(self._block_q.items(), xy):
            d.qpos[q:q + 7] = [p[0], p[1], 0.02, 1, 0, 0, 0]
        d.qpos[self._ee_q] = [rng.uniform(-0.05, 0.05), rng.uniform(-0.2, -0.15), rng.uniform(0.12, 0.16)]
        d.qpos[self._finger_q] = rng.uniform(0.0, FINGER_MAX)
        d.qpos[self._drawer_q] = rng.uniform(0.04, 0.12)
        d.ctrl[:3] = d.qpos[self._ee_q]
        d.ctrl[3:5] = d.qpos[self._finger_q]
        self._expert_mem = {}
        # static part of the state
        s = self._static
        s[13:15] = m.body_pos[self._bin_body][:2]
        s[15:17] = m.geom_pos[self._zone_geom][:2]
        s[18:21] = m.body_pos[self._cabinet_body] + HANDLE_OFFSET
        for i, c in enumerate(BUTTON_COLORS):
            s[21 + 3 * i:24 + 3 * i] = m.body_pos[self._button_body[c]] + [0, 0, 0.03]
        self._handle_y0 = s[19]
        self._button_z0 = s[23], s[26]
        return self.task.sample(self, rng)

    def _apply_action(self, action: np.ndarray) -> None:
        target = self.data.qpos[self._ee_q] + action[:3] * STEP_M
        self.data.ctrl[:3] = np.clip(target, WORKSPACE_LOW, WORKSPACE_HIGH)
        self.data.ctrl[3:5] = FINGER_MAX * (1.0 - action[3]) * 0.5

    def _state(self) -> np.ndarray:
        q = self.data.qpos
        s = self._static.copy()
        s[self._dyn_dst] = q[self._dyn_src]
        s[3] = q[self._finger_q[0]] + q[self._finger_q[1]]
        s[19] = self._handle_y0 - q[self._drawer_q]
        s[23] = self._button_z0[0] + q[self._button_q["red"]]
        s[26] = self._button_z0[1] + q[self._button_q["blue"]]
        return s

    def _evaluate(self) -> tuple[bool, dict[str, float], dict[str, float]]:
        return self.task.evaluate(self, self._state())

    def expert_action(self) -> np.ndarray:
        return np.asarray(self.task.expert(self, self._state(), self._expert_mem), np.float32)


def _separated(rng: np.random.Generator, n: int, rng_range: tuple[float, float], min_gap: float) -> np.ndarray:
    for _ in range(1000):
        v = rng.uniform(*rng_range, size=n)
        if n < 2 or np.min(np.diff(np.sort(v))) >= min_gap:
            return v
    raise RuntimeError("could not place objects apart; widen the range")


def _separated_2d(rng: np.random.Generator, n: int, xr: tuple[float, float], yr: tuple[float, float],
                  min_gap: float) -> np.ndarray:
    pts: list[np.ndarray] = []
    while len(pts) < n:
        p = np.array([rng.uniform(*xr), rng.uniform(*yr)])
        if all(np.linalg.norm(p - q) >= min_gap for q in pts):
            pts.append(p)
    return np.array(pts)
