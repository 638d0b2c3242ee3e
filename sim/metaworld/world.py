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

Reward: Meta-World's shaped reward (in [0, 10]) divided by 10, the one named term
``"metaworld"``. Success is Meta-World's ``info["success"]``; the episode terminates on
success (our convention) and is truncated at ``max_episode_steps`` (default 200; Meta-World
uses 500). Meta-World's own step limit is lifted, so the env can be stepped past
truncation as our other worlds can.
"""

from __future__ import annotations

import atexit
import copy
import os
import pickle
import threading
import warnings
import weakref
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.core.errors import InvalidActionError
from embodied.core.registry import TaskSpec, get_task
from embodied.core.specs import ActionSpec, ObservationSpec
from sim.base import INSTRUCTION_CHARSET, check_env_args
from sim.render import make_renderer

STATE_DIM = 39
REWARD_SCALE = 10.0  # Meta-World rewards lie in [0, 10]
_NO_STEP_LIMIT = 2**62  # replaces Meta-World's max_path_length (500), which raises when reached
_LIVE_ENVS: "weakref.WeakSet[MetaWorldEnv]" = weakref.WeakSet()


def _close_renderers() -> None:
    # Free GL contexts before MuJoCo's exit hook terminates the EGL display (see sim.base).
    for env in list(_LIVE_ENVS):
        env.close()


class MetaWorldEnv(gym.Env):
    """One Meta-World v3 task with our observation, instruction and episode conventions.

    Args:
        task: registered task name, a Meta-World v3 name such as ``"reach-v3"``.
        obs_mode: ``"state"``, ``"pixels"`` (image + 4 proprioceptive entries) or
            ``"state+pixels"``.
        cameras: Meta-World camera names for pixel observations (default ``("corner",)``);
            any of ``corner``, ``corner2``, ``corner3``, ``corner4``, ``topview``,
            ``behindGripper``, ``gripperPOV``.
        image_size: square image side in pixels for pixel observations.
        instruction_split: ``"train"`` or ``"heldout"`` paraphrases.
        instructions: override the task's paraphrases with your own wording.
        render_mode: ``None`` or ``"rgb_array"`` (``render()`` returns (S, S, 3) uint8).
        render_size: side of ``render()`` frames.
        max_episode_steps: override the time limit (default 200 control steps).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}
    action_names = ("dx", "dy", "dz", "gripper")
    default_cameras = ("corner", "corner2", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")
    render_camera = "corner"
    proprio_dims = 4

    def __init__(
        self,
        task: str,
        obs_mode: str = "state",
        cameras: list[str] | tuple[str, ...] | None = None,
        image_size: int = 64,
        instruction_split: str = "train",
        instructions: list[str] | tuple[str, ...] | str | None = None,
        render_mode: str | None = None,
        render_size: int = 224,
        max_episode_steps: int | None = None,
    ):
        self.spec_task: TaskSpec = get_task(task)
        check_env_args(obs_mode, render_mode, image_size, max_episode_steps)
        self.obs_mode, self.render_mode = obs_mode, render_mode
        self.image_size, self.render_size = int(image_size), int(render_size)
        if isinstance(instructions, str):
            instructions = [instructions]
        self._templates = tuple(instructions) if instructions else self.spec_task.instructions(instruction_split)
        self.instruction_split = "custom" if instructions else instruction_split
        self.max_episode_steps = int(max_episode_steps or self.spec_task.max_episode_steps)

        self.mw = _make_metaworld_env(self.spec_task.name)
        self.model, self.data = self.mw.model, self.mw.data
        from metaworld.policies import ENV_POLICY_MAP

        self._policy = ENV_POLICY_MAP[self.spec_task.name]()

        cams = tuple(cameras) if cameras else self.default_cameras[:1]
        valid = [self.model.camera(i).name for i in range(self.model.ncam)]
        bad = [c for c in cams if c not in valid]
        if bad:
            raise ValueError(f"unknown camera(s) {bad}; Meta-World has {valid}")
        self.cameras = cams if obs_mode != "state" else ()
        # Meta-World's corner cameras are rolled upside down (their up axis points at the
        # floor); a 180-degree rotation of the image fixes that without mirroring it.
        self._upside_down = {c: bool(self.data.cam_xmat[self.model.camera(c).id].reshape(3, 3)[2, 1] < 0)
                             for c in valid}
        self._renderers: dict[int, Any] = {}

        self._raw = np.zeros(STATE_DIM)  # Meta-World's last observation (float64), for the expert
        self._step_count = 0
        self._success = False
        self.instruction = ""
        self.params: dict[str, Any] = {}
        state_dim = self.proprio_dims if obs_mode == "pixels" else STATE_DIM
        self.observation_spec = ObservationSpec(state_dim, self.cameras, self.image_size if self.cameras else 0)
        self.action_spec = ActionSpec(4, -1.0, 1.0, self.action_names)
        spaces: dict[str, gym.Space] = {
            "state": gym.spaces.Box(-np.inf, np.inf, (state_dim,), np.float32),
            "instruction": gym.spaces.Text(256, charset=INSTRUCTION_CHARSET),
        }
        img = gym.spaces.Box(0, 255, (self.image_size, self.image_size, 3), np.uint8)
        if self.cameras:
            spaces["image"] = img
        if len(self.cameras) > 1:
            spaces["images"] = gym.spaces.Dict({c: img for c in self.cameras})
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)

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
        options = options or {}
        if "instruction" in options:
            template = str(options["instruction"])
        else:
            template = self._templates[int(self.np_random.integers(len(self._templates)))]
        self.instruction = self.format_instruction(template)
        # Meta-World judges success and reward only in step(); a fresh episode is not solved.
        return self._obs(), {"success": False, "reward_terms": {"metaworld": 0.0}, "params": dict(self.params)}

    def format_instruction(self, template: str) -> str:
        try:
            return template.format(**self.params)
        except (KeyError, IndexError) as e:
            raise ValueError(f"instruction {template!r} uses field {e} that task "
                             f"{self.spec_task.name!r} does not have; fields: {sorted(self.params)}") from None

    def step(self, action: np.ndarray):
        a = np.asarray(action, dtype=np.float32)
        if a.shape != self.action_space.shape:
            raise InvalidActionError(f"action must have shape {self.action_space.shape} "
                                     f"({', '.join(self.action_names)}), got {a.shape}")
        if not np.isfinite(a).all():
            raise InvalidActionError(f"action contains NaN or inf: {a}; refusing to step")
        raw, reward, _, _, mw_info = self.mw.step(np.clip(a, -1.0, 1.0))  # out-of-range values are clipped
        self._raw = raw
        self._step_count += 1
        self._success = bool(mw_info["success"])
        terms = {"metaworld": min(max(float(reward) / REWARD_SCALE, 0.0), 1.0)}
        truncated = self._step_count >= self.max_episode_steps
        info = {"success": self._success, "reward_terms": terms}
        return self._obs(), terms["metaworld"], self._success, truncated, info

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

    def privileged_state(self) -> np.ndarray:
        """The full 39-d Meta-World observation, whatever the observation mode (see ``TaskEnv``)."""
        return self._raw.astype(np.float32)

    # ------------------------------------------------------------- rendering
    def _obs(self) -> dict[str, Any]:
        state = self._raw.astype(np.float32)
        if self.obs_mode == "pixels":
            state = state[: self.proprio_dims]
        obs: dict[str, Any] = {"state": state, "instruction": self.instruction}
        if self.cameras:
            imgs = {c: self._render(c, self.image_size) for c in self.cameras}
            obs["image"] = imgs[self.cameras[0]]
            if len(self.cameras) > 1:
                obs["images"] = imgs
        return obs

    def _render(self, camera: str, size: int) -> np.ndarray:
        r = self._renderers.get(size)
        if r is None:
            r = self._renderers[size] = make_renderer(self.model, size, size)
            if not _LIVE_ENVS:
                atexit.unregister(_close_renderers)
                atexit.register(_close_renderers)
            _LIVE_ENVS.add(self)
        r.update_scene(self.data, camera)
        img = r.render()
        return np.ascontiguousarray(img[::-1, ::-1]) if self._upside_down[camera] else img

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        return self._render(self.render_camera, self.render_size)

    def close(self) -> None:
        for r in self._renderers.values():
            r.close()
        self._renderers.clear()


_COMPILED: dict[tuple[str, int, int], Any] = {}  # (xml path, mtime, size) -> pristine MjModel
_COMPILE_LOCK = threading.Lock()


def _initialize_from_compiled(env: Any) -> tuple[Any, Any]:
    """``MujocoEnv._initialize_simulation`` with each XML compiled once per process.

    Compiling a Meta-World scene takes ~0.11 s, nearly all of building the env, and an
    evaluation builds ``num_envs`` envs for every task and wording split (MT50 at
    ``num_envs=10``: a minute of compiling per worker). A copy of the compiled model takes
    ~0.014 s and is the same model, array for array; each env gets its own copy, since
    Meta-World moves bodies in its model at reset. Otherwise as gymnasium's method.
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
    from metaworld.types import Task

    mw.seed(seed)
    mw._freeze_rand_vec = False
    mw.reset_model()
    data = {"env_cls": type(mw), "rand_vec": np.array(mw._last_rand_vec), "partially_observable": False}
    return Task(env_name=name, data=pickle.dumps(data))
