"""Meta-World v3 behind our env contract: seeded episodes, instructions, pixels, experts.

Each env wraps one Meta-World task environment (``metaworld.env_dict.ALL_V3_ENVIRONMENTS``),
in the multi-task (MT) setting: the goal position is part of the observation.

Episodes: ``reset(seed=s)`` fixes the episode completely. The seed drives our generator,
which draws (a) the seed of Meta-World's own generator, from which Meta-World samples a
layout (object and goal positions, its ``rand_vec``) with its own rejection sampling, and
(b) the instruction. The layout is then set as a task, exactly as ``metaworld.MT1`` sets
one of the 50 layouts it pre-samples per task (``set_task``), so an episode here is the
episode Meta-World plays for that layout; only where layouts come from differs (a fresh
one per seed instead of a fixed list of 50).

Action (4,) in [-1, 1] (Meta-World's): end-effector displacement (dx, dy, dz), 1 cm per
unit per control step (mocap), and the gripper effort (-1 open, +1 closed). A control
step is 5 x 2.5 ms = 12.5 ms (80 Hz).

State (39,) float32 (Meta-World's observation, metres):
    0:3   end-effector position
    3     gripper opening (normalised, 0 closed .. 1 open)
    4:18  up to two objects: position (3) and quaternion (4) each, zero-padded
    18:36 entries 0:18 of the previous step (Meta-World's frame stacking)
    36:39 goal position
Pixel mode keeps the first 4 entries (proprioception) and adds camera images.

Rendering: ``render()`` (what the VLM reward and videos read) draws the goal site of the
tasks whose goal is a point in free space (``GOAL_MARKED_TASKS``: reach, push and pick-place
and their variants, where nothing else in the scene shows where success is) as a
translucent magenta sphere of radius ``GOAL_MARKER_RADIUS``; Meta-World draws it as a 2 cm
sphere, about one pixel of a 64 px corner frame, red for reach-v3 like the arm. Tasks whose
goal is a state of an object (a window, a drawer, a door) are drawn as Meta-World draws them.
Observation images (what pixel policies read) keep Meta-World's drawing.

Reward: Meta-World's shaped reward (in [0, 10]) divided by 10, the one named term
``"metaworld"``. Success is Meta-World's ``info["success"]``; the episode terminates on
success (our convention; ``end_on_success=False`` turns that off) and is truncated at ``max_episode_steps`` (default 200; Meta-World
uses 500). Meta-World's own step limit is lifted, so the env can be stepped past
truncation as our other worlds can.
"""

from __future__ import annotations

import copy
import os
import pickle
import threading
import warnings
from typing import Any

import numpy as np

from sim.base import BaseEnv

STATE_DIM = 39
REWARD_SCALE = 10.0  # Meta-World rewards lie in [0, 10]
_NO_STEP_LIMIT = 2**62  # replaces Meta-World's max_path_length (500), which raises when reached
#: task-name prefixes whose goal is a point in free space, marked in render() frames
GOAL_MARKED_TASKS = ("reach", "push", "pick-place")
GOAL_MARKER_RADIUS = 0.05  # metres: reach-v3's and push-v3's success distance
GOAL_MARKER_RGBA = (1.0, 0.0, 1.0, 0.5)  # magenta, a colour no MT10 scene uses; translucent, so what is inside shows


class MetaWorldEnv(BaseEnv):
    """One Meta-World v3 task with our observation, instruction and episode conventions.

    Arguments as ``sim.base.BaseEnv``; here ``task`` is a Meta-World v3 name such as
    ``"reach-v3"``, ``cameras`` are Meta-World's (default ``("corner",)``; any of
    ``corner``, ``corner2``, ``corner3``, ``corner4``, ``topview``, ``behindGripper``,
    ``gripperPOV``), ``"pixels"`` keeps 4 proprioceptive state entries, and the default
    time limit is 200 control steps.

    Attributes:
        mw: the wrapped Meta-World env (also ``native_env``, see ``embodied.core.env``).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}
    action_names = ("dx", "dy", "dz", "gripper")
    default_cameras = ("corner", "corner2", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")
    render_camera = "corner"
    proprio_dims = 4

    def _build(self) -> tuple[Any, Any]:
        self.mw = _make_metaworld_env(self.spec_task.name)
        return self.mw.model, self.mw.data

    def _setup(self) -> None:
        from metaworld.policies import ENV_POLICY_MAP

        self._policy = ENV_POLICY_MAP[self.spec_task.name]()
        # Meta-World's corner cameras are rolled upside down (their up axis points at the
        # floor); a 180-degree rotation of the image fixes that without mirroring it.
        self._rotated = frozenset(self.model.camera(i).name for i in range(self.model.ncam)
                                  if self.data.cam_xmat[i].reshape(3, 3)[2, 1] < 0)
        import mujoco

        marked = self.spec_task.name.startswith(GOAL_MARKED_TASKS)
        # the site render() marks: the goal's, on tasks whose goal is a free point; -1: none
        self._marked_site = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, "goal") if marked else -1
        self._raw = np.zeros(STATE_DIM)  # Meta-World's last observation (float64), for the expert
        self._success = False
        self._plain: Any = None  # (Meta-World env, its policy) for the native_* baselines, built on first use

    @property
    def n_substeps(self) -> int:  # type: ignore[override]
        """``mujoco.mj_step`` calls per control step: Meta-World's ``frame_skip``."""
        return int(self.mw.frame_skip)

    @property
    def native_env(self) -> Any:  # type: ignore[override]
        """Meta-World's own env, the one ``step`` drives (its ``step`` is Meta-World's)."""
        return self.mw

    def _mark_render_scene(self, scene: Any) -> None:
        """``render()`` frames show the goal site as a larger translucent marker (the module
        docstring); only the drawn scene changes, not the model, so observation images and
        the simulation are as Meta-World's."""
        if self._marked_site < 0:
            return
        import mujoco

        for i in range(scene.ngeom):
            g = scene.geoms[i]
            if g.objtype == mujoco.mjtObj.mjOBJ_SITE and g.objid == self._marked_site:
                g.size[:] = GOAL_MARKER_RADIUS
                g.rgba[:] = GOAL_MARKER_RGBA

    # ------------------------------------------------------------- gymnasium
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        mw_seed = int(self.np_random.integers(2**31 - 1))
        self.mw.set_task(_sample_layout(self.mw, self.spec_task.name, mw_seed))
        raw, _ = self.mw.reset()
        self._raw = raw
        self._step_count, self._success = 0, False
        self.params = {"mw_seed": mw_seed, "goal": [float(v) for v in raw[36:39]],
                       "object": [float(v) for v in raw[4:7]]}
        self._draw_instruction(options)
        # Meta-World judges success and reward only in step(); a fresh episode is not solved.
        return self._obs(), {"success": False, "reward_terms": {"metaworld": 0.0}, "params": dict(self.params)}

    def step(self, action: np.ndarray):
        raw, reward, _, _, mw_info = self.mw.step(self._checked_action(action))
        self._raw = raw
        self._step_count += 1
        self._success = bool(mw_info["success"])
        terms = {"metaworld": min(max(float(reward) / REWARD_SCALE, 0.0), 1.0)}
        truncated = self._step_count >= self.max_episode_steps
        info = {"success": self._success, "reward_terms": terms}
        return self._obs(), terms["metaworld"], self._success and self.end_on_success, truncated, info

    def _state(self) -> np.ndarray:
        return self._raw.astype(np.float32)

    def expert_action(self) -> np.ndarray:
        """Meta-World's scripted policy for this task, on the current raw observation; (4,) float32."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its gains trip a "may be too high" warning; the env clips
            a = self._policy.get_action(self._raw)
        return np.clip(np.asarray(a, np.float32), -1.0, 1.0)

    @property
    def success(self) -> bool:
        """Meta-World's success flag after the last step (False right after reset)."""
        return self._success

    # ------------------------------------------- Meta-World itself, as a baseline
    def native_expert_success(self, steps: int) -> bool:
        """Meta-World's scripted policy run on a fresh Meta-World env of this task, on the
        current episode's layout (its ``rand_vec``, set with ``set_task``); whether
        ``info["success"]`` is set within ``steps`` steps. A paired check that the adapter
        loses nothing: the same layout, nothing of ours in the loop."""
        data = {"env_cls": type(self.mw), "rand_vec": np.array(self.mw._last_rand_vec), "partially_observable": False}
        return self._native_expert_success([_task(self.spec_task.name, data)], steps)[0]

    def native_benchmark_success(self, episodes: int, steps: int, seed: int = 0) -> list[bool]:
        """Meta-World's scripted policy on Meta-World's env, the documented way:
        ``metaworld.MT1(task, seed)`` pre-samples 50 layouts and ``set_task`` sets each in
        turn (seeds ``seed + 1``, ... add 50 more each when ``episodes > 50``); per-episode
        success within ``steps`` steps. An independent sample of the layout distribution."""
        import metaworld

        tasks: list[Any] = []
        while len(tasks) < episodes:
            tasks += metaworld.MT1(self.spec_task.name, seed=seed + len(tasks) // 50).train_tasks
        return self._native_expert_success(tasks[:episodes], steps)

    def _native_expert_success(self, tasks: list[Any], steps: int) -> list[bool]:
        """Per-layout success of Meta-World's scripted policy on a plain Meta-World env of
        this task (built as Meta-World builds it, once per adapter)."""
        if self._plain is None:
            from metaworld.env_dict import ALL_V3_ENVIRONMENTS
            from metaworld.policies import ENV_POLICY_MAP

            self._plain = ALL_V3_ENVIRONMENTS[self.spec_task.name](), ENV_POLICY_MAP[self.spec_task.name]()
        (env, policy), wins = self._plain, []
        for t in tasks:
            env.set_task(t)
            obs, _ = env.reset()
            won = False
            for _ in range(min(steps, env.max_path_length)):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    action = policy.get_action(obs)
                obs, _, _, _, info = env.step(action)
                if info["success"]:
                    won = True
                    break
            wins.append(won)
        return wins

    def close(self) -> None:
        super().close()
        if self._plain is not None:
            self._plain[0].close()
            self._plain = None


def _task(name: str, data: dict[str, Any]) -> Any:
    from metaworld.types import Task

    return Task(env_name=name, data=pickle.dumps(data))


_COMPILED: dict[tuple[str, int, int], Any] = {}  # (xml path, mtime, size) -> pristine MjModel
_COMPILE_LOCK = threading.Lock()


def _initialize_from_compiled(env: Any) -> tuple[Any, Any]:
    """``MujocoEnv._initialize_simulation`` with each XML compiled once per process.

    Compiling a Meta-World scene is nearly all of building the env, and an evaluation
    builds ``num_envs`` envs for every task and wording split. A copy of the compiled
    model costs a fraction of a compile and is the same model, array for array; each env
    gets its own copy, since Meta-World moves bodies in its model at reset. Otherwise as
    gymnasium's method.
    """
    import mujoco

    st = os.stat(env.fullpath)
    key = (env.fullpath, st.st_mtime_ns, st.st_size)
    if key not in _COMPILED:
        _COMPILED[key] = mujoco.MjModel.from_xml_path(env.fullpath)
    model = copy.copy(_COMPILED[key])
    model.vis.global_.offwidth = max(model.vis.global_.offwidth, env.width)
    model.vis.global_.offheight = max(model.vis.global_.offheight, env.height)
    return model, mujoco.MjData(model)


def _make_metaworld_env(name: str) -> Any:
    """Meta-World's env for ``name``, unrendered; ``reset`` sets its task before each episode."""
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    with _COMPILE_LOCK:  # the compiled-model cache stands in for gymnasium's compile meanwhile
        compile_xml = MujocoEnv.__dict__["_initialize_simulation"]
        MujocoEnv._initialize_simulation = _initialize_from_compiled
        try:
            mw = ALL_V3_ENVIRONMENTS[name]()  # no render_mode: we render with our own light renderer
        finally:
            MujocoEnv._initialize_simulation = compile_xml
    mw.seeded_rand_vec = True  # sample layouts from mw.np_random, not numpy's global generator
    mw.max_path_length = _NO_STEP_LIMIT  # we truncate; Meta-World would raise after 500 steps
    return mw


def _sample_layout(mw: Any, name: str, seed: int) -> Any:
    """A Meta-World ``Task`` for the MT setting (goal observed) with a layout drawn from ``seed``.

    Meta-World draws layouts inside ``reset_model`` (rejection sampling differs per task);
    ``metaworld.MT1`` unfreezes the layout, resets and keeps ``_last_rand_vec``. We do the
    same with a seeded generator. The task's ``set_task`` freezes it again.
    """
    mw.seed(seed)
    mw._freeze_rand_vec = False
    mw.reset_model()
    return _task(name, {"env_cls": type(mw), "rand_vec": np.array(mw._last_rand_vec), "partially_observable": False})
