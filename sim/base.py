"""The env plumbing every task env shares, and the base class of our own MuJoCo worlds.

``BaseEnv`` implements the part of the env protocol (``embodied.core.env``) that does not
depend on where the physics comes from: argument checks, instructions (their paraphrase
split, the seeded draw and the filling-in of fields), action checks, observation dicts and
spaces, pixel observations and rendering, and freeing GL contexts before MuJoCo's exit
hook runs. A subclass builds the model (``_build``) and steps it.

``TaskEnv`` is the base of the worlds defined here: a subclass supplies the MJCF model and
five hooks (``_reset_world``, ``_apply_action``, ``_state``, ``_evaluate``,
``expert_action``). Rewards are a weighted sum of named terms in [0, 1] (weights sum to 1,
so the reward is in [0, 1]); the terms are returned in ``info["reward_terms"]``. Episodes
terminate on success (unless ``end_on_success=False``) and are truncated at
``max_episode_steps``. Adapters of external
suites (``sim.metaworld.world.MetaWorldEnv``) derive from ``BaseEnv`` directly.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np

from embodied.core.errors import InvalidActionError
from embodied.core.registry import TaskSpec, get_task
from embodied.core.specs import ActionSpec, ObservationSpec
from sim.instructions import INSTRUCTION_CHARSET, MAX_INSTRUCTION_CHARS
from sim.render import make_renderer

OBS_MODES = ("state", "pixels", "state+pixels")
_LIVE_ENVS: "weakref.WeakSet[BaseEnv]" = weakref.WeakSet()  # envs holding a GL context

__all__ = ["BaseEnv", "INSTRUCTION_CHARSET", "OBS_MODES", "TaskEnv", "check_env_args", "check_instructions"]


def _scene_view() -> Any:
    """The drawing options of ``render()`` frames: MuJoCo's defaults without rangefinder rays.

    MuJoCo draws every rangefinder's ray in every view; on the navigation robot (8 rays, up to
    2.5 m) they cover much of an overhead frame and hide the landmarks (a 64 px frame showed
    them as 1-2 px dots under yellow rays), which the VLM reward must see.
    """
    opt = mujoco.MjvOption()
    opt.flags[mujoco.mjtVisFlag.mjVIS_RANGEFINDER] = False
    return opt


def _close_renderers() -> None:
    # Free GL contexts before MuJoCo's own exit hook terminates the EGL display. Registered
    # after the first context exists, so that it runs before that hook (atexit is LIFO).
    for env in list(_LIVE_ENVS):
        env.close()


MAX_SUPERSAMPLE = 4


def check_env_args(obs_mode: str, render_mode: str | None, image_size: int, max_episode_steps: int | None,
                   render_size: int = 224, supersample: int = 1) -> None:
    """Validate the constructor arguments every world shares (ours and adapters)."""
    if obs_mode not in OBS_MODES:
        raise ValueError(f"obs_mode must be one of {OBS_MODES}, got {obs_mode!r}")
    if render_mode not in (None, "rgb_array"):
        raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
    if not 8 <= int(image_size) <= 512:
        raise ValueError(f"image_size must be in [8, 512] pixels, got {image_size}")
    if not 8 <= int(render_size) <= 2048:
        raise ValueError(f"render_size must be in [8, 2048] pixels (the side of render() frames), got {render_size}")
    if max_episode_steps is not None and int(max_episode_steps) < 1:
        raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
    if isinstance(supersample, bool) or int(supersample) != supersample or not 1 <= supersample <= MAX_SUPERSAMPLE:
        raise ValueError(f"supersample must be an integer in [1, {MAX_SUPERSAMPLE}] (1: off; k: every frame drawn "
                         f"at k times its side, each k x k block averaged), got {supersample!r}")
    drawn = max(int(image_size), int(render_size)) * supersample
    if drawn > 2048:
        raise ValueError(f"supersample={supersample} draws frames of {drawn} pixels (image_size {image_size}, "
                         f"render_size {render_size}); at most 2048: lower one of them")


def check_instructions(instructions: list[str] | tuple[str, ...] | str | None) -> tuple[str, ...] | None:
    """Custom templates as a tuple (one string is one template), None for the task's own.

    Raises:
        ValueError: an empty list (it would silently mean the task's own wordings) or an
            empty or non-string template.
    """
    if instructions is None:
        return None
    words = (instructions,) if isinstance(instructions, str) else tuple(instructions)
    if not words:
        raise ValueError("instructions=[] is empty: give at least one instruction, or instructions=None for the "
                         "task's own wordings (instruction_split='train' or 'heldout')")
    bad = [w for w in words if not isinstance(w, str) or not w.strip()]
    if bad:
        raise ValueError(f"instructions must be non-empty strings, got {bad!r} in {list(words)!r}")
    return words


class BaseEnv(gym.Env):
    """A language-conditioned task env over a MuJoCo model (the env protocol's shared part).

    Args:
        task: registered task name.
        obs_mode: ``"state"`` (state + instruction), ``"pixels"`` (image + proprioceptive
            state + instruction) or ``"state+pixels"``.
        cameras: camera names for pixel observations (default: the world's first).
        image_size: square image side in pixels for pixel observations.
        instruction_split: ``"train"`` or ``"heldout"`` paraphrases.
        instructions: override the task's templates with your own wording
            (fields such as ``{color}`` are filled in).
        render_mode: ``None`` or ``"rgb_array"`` (``render()`` returns (S, S, 3) uint8).
        render_size: side of ``render()`` frames. ``render()`` shows the scene without
            MuJoCo's sensor visualisation (rangefinder rays) and with a world's own marks
            (``_mark_render_scene``: Meta-World's goal marker drawn larger, the navigation
            robot's path since reset with ``trail=True``); observation images keep MuJoCo's
            default drawing, so what pixel policies see is unchanged.
        max_episode_steps: override the task's time limit.
        supersample: anti-aliasing of every frame (observation images and ``render()``): drawn
            at ``supersample`` times its side and each ``supersample`` x ``supersample`` block
            averaged, so an edge that crosses a pixel leaves a blend of its two colours and a
            small object's position shows below one pixel. 1 (the default) draws at the side
            itself, as MuJoCo does without multisampling.
        end_on_success: terminate the episode on the step its success predicate first holds
            (the default). ``False``: episodes run to ``max_episode_steps`` whatever happens
            (``info["success"]`` still says whether the goal holds), so that a learner trained
            on a learned reward cannot read the simulator's success from when episodes end.

    Raises:
        ValueError: an argument out of range (``render_size`` included), an unknown camera or
            instruction split, an empty ``instructions`` list.
        UnknownNameError: an unregistered task.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}
    # Subclasses set these.
    action_names: tuple[str, ...] = ()
    default_cameras: tuple[str, ...] = ()
    render_camera: str = ""  # default: the first of default_cameras
    proprio_dims: int = 0  # leading state entries kept in pixel mode
    n_substeps: int = 1  # mj_step calls per control step
    native_env: Any = None  # an adapter's wrapped env (see embodied.core.env)

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
        supersample: int = 1,
        end_on_success: bool = True,
    ):
        self.spec_task: TaskSpec = get_task(task)
        if not isinstance(end_on_success, (bool, np.bool_)):
            raise ValueError(f"end_on_success must be True or False, got {end_on_success!r}")
        self.end_on_success = bool(end_on_success)
        check_env_args(obs_mode, render_mode, image_size, max_episode_steps, render_size, supersample)
        self.supersample = int(supersample)
        self.obs_mode, self.render_mode = obs_mode, render_mode
        self.image_size, self.render_size = int(image_size), int(render_size)
        custom = check_instructions(instructions)
        self._templates = custom or self.spec_task.instructions(instruction_split)
        self.instruction_split = "custom" if custom else instruction_split
        self.max_episode_steps = int(max_episode_steps or self.spec_task.max_episode_steps)

        self.model, self.data = self._build()
        cams = tuple(cameras) if cameras else self.default_cameras[:1]
        valid = [self.model.camera(i).name for i in range(self.model.ncam)]
        bad = [c for c in cams if c not in valid]
        if bad:
            raise ValueError(f"unknown camera(s) {bad} for task {self.spec_task.name!r}; its cameras: {valid}")
        self.cameras = cams if obs_mode != "state" else ()
        self.render_camera = self.render_camera or self.default_cameras[0]
        self._renderers: dict[int, Any] = {}
        self._render_view: Any = None  # render()'s drawing options (_scene_view), made on first use
        self._rotated: frozenset[str] = frozenset()  # cameras whose frames are turned 180 degrees

        self._step_count = 0
        self._episode_started = False  # set by the first reset(): step() before it is refused
        self.instruction = ""
        self.params: dict[str, Any] = {}
        self._setup()
        state_dim = self.proprio_dims if obs_mode == "pixels" else len(self._state())
        self.observation_spec = ObservationSpec(state_dim, self.cameras, self.image_size if self.cameras else 0)
        self.action_spec = ActionSpec(len(self.action_names), -1.0, 1.0, self.action_names)
        spaces: dict[str, gym.Space] = {
            "state": gym.spaces.Box(-np.inf, np.inf, (state_dim,), np.float32),
            "instruction": gym.spaces.Text(MAX_INSTRUCTION_CHARS, charset=INSTRUCTION_CHARSET),
        }
        img = gym.spaces.Box(0, 255, (self.image_size, self.image_size, 3), np.uint8)
        if self.cameras:
            spaces["image"] = img
        if len(self.cameras) > 1:
            spaces["images"] = gym.spaces.Dict({c: img for c in self.cameras})
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (len(self.action_names),), np.float32)

    # ----------------------------------------------------------------- hooks
    def _build(self) -> tuple[Any, Any]:
        """Build the simulation; return its ``(mujoco.MjModel, mujoco.MjData)``."""
        raise NotImplementedError

    def _setup(self) -> None:
        """Cache ids and addresses after the model is built."""

    def _state(self) -> np.ndarray:
        """The state vector (Ds,) float32."""
        raise NotImplementedError

    def expert_action(self) -> np.ndarray:
        """The scripted expert's action (Da,) for the current state."""
        raise NotImplementedError

    # ---------------------------------------------------------- instructions
    def _draw_instruction(self, options: dict[str, Any] | None) -> None:
        """Set ``instruction`` for a new episode: the template in ``options["instruction"]``,
        else one of the split's, drawn from ``np_random`` (after the episode's parameters).

        Every ``reset`` calls it, so it also marks the episode as started (``step`` may run)."""
        self._episode_started = True
        options = options or {}
        if "instruction" in options:
            template = str(options["instruction"])
        else:
            template = self._templates[int(self.np_random.integers(len(self._templates)))]
        self.instruction = self.format_instruction(template)

    def format_instruction(self, template: str) -> str:
        """``template`` with the episode's fields (``params``) filled in."""
        try:
            return template.format(**self.params)
        except (KeyError, IndexError) as e:
            raise ValueError(f"instruction {template!r} uses field {e} that task "
                             f"{self.spec_task.name!r} does not have; fields: {sorted(self.params)}") from None

    # --------------------------------------------------------------- actions
    def _checked_action(self, action: np.ndarray) -> np.ndarray:
        """``action`` as float32 (Da,), clipped to [-1, 1].

        Raises:
            InvalidActionError: a wrong shape, or NaN/inf values (nothing is stepped).
            gymnasium.error.ResetNeeded: no episode yet (``step()`` before the first ``reset()``).
        """
        if not self._episode_started:
            raise gym.error.ResetNeeded(f"step() before reset() on task {self.spec_task.name!r}: call "
                                        "env.reset(seed=...) first (it places the objects and draws the instruction)")
        a = np.asarray(action, dtype=np.float32)
        if a.shape != self.action_space.shape:
            raise InvalidActionError(f"action must have shape {self.action_space.shape} "
                                     f"({', '.join(self.action_names)}), got {a.shape}")
        lo, hi = a.min(), a.max()  # NaN fails both comparisons below
        if not (lo >= -1.0 and hi <= 1.0):
            if not np.isfinite(a).all():
                raise InvalidActionError(f"action contains NaN or inf: {a}; refusing to step")
            a = np.minimum(np.maximum(a, -1.0), 1.0)  # out-of-range values are clipped (documented)
        return a

    # ---------------------------------------------------------- observations
    def _obs(self) -> dict[str, Any]:
        state = self._state()
        if self.obs_mode == "pixels":
            state = state[: self.proprio_dims]
        obs: dict[str, Any] = {"state": state, "instruction": self.instruction}
        if self.cameras:
            imgs = {c: self._render(c, self.image_size) for c in self.cameras}
            obs["image"] = imgs[self.cameras[0]]
            if len(self.cameras) > 1:
                obs["images"] = imgs
        return obs

    def privileged_state(self) -> np.ndarray:
        """The full state vector (the ``obs_mode="state"`` layout), whatever the observation mode.

        Pixel datasets record it beside the images as ``privileged_state`` so that a pixel
        policy can learn to locate objects from an auxiliary loss; a policy never sees it.
        """
        return np.array(self._state(), dtype=np.float32)

    # ------------------------------------------------------------- rendering
    def _render(self, camera: str, size: int, scene_option: Any = None, mark: bool = False) -> np.ndarray:
        k = self.supersample
        if k == 1:
            return self._draw(camera, size, scene_option, mark)
        big = self._draw(camera, size * k, scene_option, mark).astype(np.uint16)
        return ((big.reshape(size, k, size, k, 3).sum((1, 3)) + k * k // 2) // (k * k)).astype(np.uint8)

    def _draw(self, camera: str, size: int, scene_option: Any = None, mark: bool = False) -> np.ndarray:
        r = self._renderers.get(size)
        if r is None:
            r = self._renderers[size] = make_renderer(self.model, size, size)
            if not _LIVE_ENVS:
                atexit.unregister(_close_renderers)
                atexit.register(_close_renderers)
            _LIVE_ENVS.add(self)
        r.update_scene(self.data, camera, scene_option=scene_option)
        if mark:
            self._mark_render_scene(r.scene)
        img = r.render()
        return np.ascontiguousarray(img[::-1, ::-1]) if camera in self._rotated else img

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        if self._render_view is None:
            self._render_view = _scene_view()
        return self._render(self.render_camera, self.render_size, self._render_view, mark=True)

    def _mark_render_scene(self, scene: Any) -> None:
        """Change what ``render()`` draws after MuJoCo has built its scene (``mjvScene``):
        restyle its geoms, or add decoration geoms (``mujoco.mjv_initGeom`` into
        ``scene.geoms[scene.ngeom]``, then ``scene.ngeom += 1``, never past ``scene.maxgeom``).
        Observation images are never passed here, and the model and data must not change. A
        world overrides it (Meta-World draws its goal marker larger; navigation draws the
        robot's path since reset); the default draws the scene as MuJoCo built it."""

    def close(self) -> None:
        for r in self._renderers.values():
            r.close()
        self._renderers.clear()


class TaskEnv(BaseEnv):
    """A language-conditioned MuJoCo task defined here: an MJCF model and five hooks.

    Arguments as ``BaseEnv``. Each control step writes the controls (``_apply_action``) and
    advances the physics by ``n_substeps`` calls of ``mujoco.mj_step``.
    """

    # Subclasses set these (and BaseEnv's action_names, default_cameras, ...).
    xml: str = ""
    n_substeps: int = 10

    def _build(self) -> tuple[Any, Any]:
        model = mujoco.MjModel.from_xml_string(self.xml)
        return model, mujoco.MjData(model)

    # ----------------------------------------------------------------- hooks
    def _reset_world(self, rng: np.random.Generator) -> dict[str, Any]:
        """Randomise the initial state; return the episode's parameters (e.g. colour)."""
        raise NotImplementedError

    def _apply_action(self, action: np.ndarray) -> None:
        """Write controls for one control step from an action in [-1, 1]."""
        raise NotImplementedError

    def _evaluate(self) -> tuple[bool, dict[str, float], dict[str, float]]:
        """Return (success, reward terms in [0, 1], weights summing to 1)."""
        raise NotImplementedError

    # ------------------------------------------------------------- gymnasium
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        mujoco.mj_resetData(self.model, self.data)
        self.params = self._reset_world(self.np_random)
        mujoco.mj_forward(self.model, self.data)
        self._step_count = 0
        self._draw_instruction(options)
        success, terms, _ = self._evaluate()
        return self._obs(), {"success": success, "reward_terms": terms, "params": dict(self.params)}

    def step(self, action: np.ndarray):
        a = self._checked_action(action)
        self._apply_action(a)
        mujoco.mj_step(self.model, self.data, nstep=self.n_substeps)
        self._step_count += 1
        success, terms, weights = self._evaluate()
        reward = sum(weights[k] * terms[k] for k in weights)
        truncated = self._step_count >= self.max_episode_steps
        info = {"success": success, "reward_terms": terms}
        return self._obs(), float(reward), success and self.end_on_success, truncated, info

    @property
    def success(self) -> bool:
        return self._evaluate()[0]
