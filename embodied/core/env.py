"""The env protocol: what every task env provides, whichever world or suite it comes from.

``embodied.make_env(task)`` returns a gymnasium env; its ``unwrapped`` object satisfies
``EmbodiedEnv`` below. Our own MuJoCo worlds (``sim.base.TaskEnv``) and adapters of
external suites (``sim.metaworld.world.MetaWorldEnv``) implement it; rollouts, datasets,
evaluation, the bench and the robot bridge rely on nothing else.

Gymnasium API (``gymnasium.Env``; ``gymnasium.utils.env_checker.check_env`` passes):
    ``reset(*, seed=None, options=None) -> (obs, info)``: the seed fixes the episode
        completely (layout, episode parameters and instruction); ``options={"instruction":
        template}`` uses that template instead of drawing one of the split's.
    ``step(action) -> (obs, reward, terminated, truncated, info)``:
        ``action``: float32 (Da,) in [-1, 1]; each world documents the units it maps to.
        Values outside [-1, 1] are clipped; a wrong shape or a NaN/inf raises
        ``embodied.core.errors.InvalidActionError`` and leaves the state unchanged.
        ``reward``: float in [0, 1], the weighted sum of ``info["reward_terms"]``.
        ``terminated``: True on success. ``truncated``: True once ``max_episode_steps``
        control steps are done (stepping on past it is allowed).
    ``render() -> (S, S, 3) uint8``, S = ``render_size``, when ``render_mode ==
        "rgb_array"``; else None.
    ``close()``: frees the env's GL contexts; safe to call twice.
    ``observation_space``: ``Dict`` of the observation below; ``action_space``:
        ``Box(-1, 1, (Da,), float32)``.

Observation (one step), a dict:
    ``state``: float32 (Ds,); each world's module docstring gives the layout (metres,
        radians, m/s). With ``obs_mode="pixels"`` only the first ``proprio_dims`` entries.
    ``image``: uint8 (H, W, 3), H = W = ``image_size``, the first camera; only when
        ``obs_mode`` is ``"pixels"`` or ``"state+pixels"``.
    ``images``: dict camera name -> uint8 (H, W, 3); only with more than one camera.
    ``instruction``: str, the episode's template with its fields filled in (at most 256
        characters of ``sim.instructions.INSTRUCTION_CHARSET``).

Info, from ``reset`` and from every ``step``:
    ``success``: bool, whether the task is solved in the current state (an adapter may
        report False after reset when its suite judges success only in ``step``).
    ``reward_terms``: dict name -> float in [0, 1], the named terms of the reward (the same
        names at every step of a task).
From ``reset`` only:
    ``params``: dict, the episode's parameters: the fields its instruction templates use
        (e.g. ``{"color": "red"}``) and, for adapters, what fixes the layout (Meta-World:
        ``mw_seed`` int, ``goal`` and ``object`` positions, lists of 3 floats in metres).
No other info keys are set.

Physics, for measurements (``embodied bench``):
    ``model``, ``data``: the ``mujoco.MjModel`` / ``mujoco.MjData`` being simulated.
    ``n_substeps``: ``mujoco.mj_step`` calls per control step; a control step lasts
        ``n_substeps * model.opt.timestep`` seconds. Every ``step`` writes its inputs
        (``data.ctrl``, and ``data.mocap_pos``/``mocap_quat`` where the world drives
        mocap bodies) and then advances the physics by exactly
        ``mujoco.mj_step(model, data, nstep=n_substeps)``; the rest of ``step`` is
        reading the state and judging it.
    ``native_env``: for an adapter, the external suite's own env object that this env
        steps (gymnasium API, its own observation and reward); None for worlds defined in
        ``sim/``. When it is not None the env also has ``native_expert_success`` and
        ``native_benchmark_success`` (below), the suite's own expert on the suite's own env.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from embodied.core.registry import TaskSpec
from embodied.core.specs import ActionSpec, ObservationSpec


@runtime_checkable
class EmbodiedEnv(Protocol):
    """The ``unwrapped`` object of every task env (see the module docstring for shapes and units).

    Attributes:
        spec_task: the registered task.
        observation_spec: state size, cameras and image size of the observations.
        action_spec: action size, bounds and names.
        action_names: name of each action entry, e.g. ``("dx", "dy", "dz", "gripper")``.
        obs_mode: ``"state"``, ``"pixels"`` or ``"state+pixels"``.
        cameras: cameras of the pixel observations, the first is ``obs["image"]``; empty
            in ``"state"`` mode.
        image_size: side of observation images (pixels).
        render_mode: None or ``"rgb_array"``.
        render_size: side of ``render()`` frames (pixels).
        render_camera: the camera ``render()`` shows.
        supersample: anti-aliasing factor of every frame (1: none; k: drawn at k times the side,
            each k x k block averaged).
        proprio_dims: leading state entries kept in ``"pixels"`` mode.
        instruction: the current episode's instruction ("" before the first reset).
        instruction_split: ``"train"``, ``"heldout"`` or ``"custom"`` (the user's own wording).
        params: the current episode's parameters (``info["params"]`` of the last reset).
        max_episode_steps: control steps after which ``step`` reports ``truncated``.
        model: the ``mujoco.MjModel`` being simulated.
        data: its ``mujoco.MjData``.
        n_substeps: physics steps (``mujoco.mj_step``) per control step.
        native_env: the adapted suite's own env, or None for worlds defined in ``sim/``.
    """

    spec_task: TaskSpec
    observation_spec: ObservationSpec
    action_spec: ActionSpec
    action_names: tuple[str, ...]
    obs_mode: str
    cameras: tuple[str, ...]
    image_size: int
    render_mode: str | None
    render_size: int
    render_camera: str
    supersample: int
    proprio_dims: int
    instruction: str
    instruction_split: str
    params: dict[str, Any]
    max_episode_steps: int
    model: Any
    data: Any
    n_substeps: int
    native_env: Any | None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode fixed by ``seed``; return (observation, info)."""
        ...

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """One control step with ``action`` (Da,); return (obs, reward, terminated, truncated, info)."""
        ...

    def render(self) -> np.ndarray | None:
        """(render_size, render_size, 3) uint8 in ``"rgb_array"`` mode, else None."""
        ...

    def close(self) -> None:
        """Free GL contexts (idempotent)."""
        ...

    def expert_action(self) -> np.ndarray:
        """The scripted expert's action (Da,) float32 in [-1, 1] for the current state.

        The expert may keep memory within an episode; ``reset`` clears it.
        """
        ...

    def privileged_state(self) -> np.ndarray:
        """The full state (the ``obs_mode="state"`` layout) as float32, whatever the mode.

        Pixel datasets record it beside the images for auxiliary losses; a policy never sees it.
        """
        ...

    def format_instruction(self, template: str) -> str:
        """``template`` with the episode's fields filled in.

        Raises:
            ValueError: the template uses a field this task does not have (the message
                names it and lists the task's fields).
        """
        ...

    @property
    def success(self) -> bool:
        """Whether the task is solved now (``info["success"]`` of the last reset or step)."""
        ...
