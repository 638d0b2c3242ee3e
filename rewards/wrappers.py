"""A reward model inside training loops: a gymnasium wrapper and a stable-baselines3 batch path.

Both give ``reward = env_weight * env_reward + model_weight * model_reward`` (by default the
model's reward alone: the task is given in words, not in reward code) and put the parts in
``info``: ``info["env_reward"]`` (float) and ``info["reward_model"]`` (``{"reward": float,
<term>: float, ...}``, the model's named terms). With ``smoothing`` = k > 1 the model reward is
the mean over the episode's last k frames.

- ``RewardWrapper(env, model)``: one gymnasium env; takes each step's frame (the observation
  image of ``model.camera``, else ``env.render()``) and scores it against the episode's
  instruction (``obs["instruction"]``). ``frame_env_kwargs(model.camera, model.image_size,
  model.supersample)`` gives the ``make_env`` arguments that make such an env.
- ``RewardInputs(env)`` + ``VecRewardWrapper(venv, model)``: for SB3 vector envs. The first
  runs inside each sub-env (in the worker process for ``SubprocVecEnv``, so rendering is
  parallel; pass ``camera=model.camera``) and puts the frame, the instruction and the privileged state of every step in
  ``info`` -- before SB3 auto-resets, so the last step of an episode is scored on its own
  frame. The second scores the whole batch of frames in one forward pass per step.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env import VecEnvWrapper

from embodied.core.reward import RewardInputError, RewardModel


def frame_env_kwargs(camera: str | None, image_size: int, supersample: int = 1) -> dict[str, Any]:
    """``make_env`` keyword arguments under which an env yields the frames a reward reads:
    observation images of ``camera`` (the state kept beside them), else ``render()`` frames,
    of side ``image_size``, anti-aliased by ``supersample`` (a model's ``camera``,
    ``image_size`` and ``supersample``)."""
    extra = {"supersample": int(supersample)} if supersample != 1 else {}
    if camera:
        return {"obs_mode": "state+pixels", "cameras": [camera], "image_size": image_size, **extra}
    return {"render_mode": "rgb_array", "render_size": image_size, **extra}


def read_frame(env: gym.Env, obs: Any, camera: str | None) -> np.ndarray:
    """The frame a reward reads after a step: ``camera``'s observation image, else ``env.render()``."""
    if not camera:
        return env.render()
    if isinstance(obs, dict) and isinstance(obs.get("images"), dict) and camera in obs["images"]:
        return obs["images"][camera]
    cams = tuple(getattr(env.unwrapped, "cameras", ()))
    if isinstance(obs, dict) and "image" in obs and cams[:1] == (camera,):
        return obs["image"]
    raise RewardInputError(f"this reward reads the {camera!r} camera's images: make the env with "
                           f"obs_mode='state+pixels' (or 'pixels'), cameras=[{camera!r}] (it has {list(cams)})")


def _check_weights(env_weight: float, model_weight: float, smoothing: int) -> None:
    if not (np.isfinite(env_weight) and np.isfinite(model_weight)):
        raise ValueError(f"env_weight and model_weight must be finite, got {env_weight}, {model_weight}")
    if smoothing < 1:
        raise ValueError(f"smoothing must be >= 1 (frames averaged), got {smoothing}")


def _check_supersample(have: Any, model: RewardModel) -> None:
    want = model.supersample
    if "frames" in model.inputs and have is not None and int(have) != want:
        raise RewardInputError(f"{type(model).__name__} reads frames drawn with supersample={want}, but the env "
                               f"draws them with supersample={have}: make the env with supersample={want} "
                               f"(rewards.wrappers.frame_env_kwargs gives every argument)")


def _check_render(env: gym.Env, model: RewardModel) -> None:
    if "frames" not in model.inputs:
        return
    _check_supersample(getattr(env.unwrapped, "supersample", None), model)
    if model.camera:
        return
    if getattr(env, "render_mode", None) != "rgb_array":
        raise RewardInputError(f"{type(model).__name__} reads rendered frames: make the env with "
                               f"render_mode='rgb_array'" + (f", render_size={model.image_size}" if model.image_size
                                                             else "") + f" (got render_mode={env.render_mode!r})")


def _instruction(obs: Any, fixed: str | None) -> str:
    if fixed is not None:
        return fixed
    if isinstance(obs, dict) and isinstance(obs.get("instruction"), str):
        return obs["instruction"]
    raise RewardInputError("the observation carries no 'instruction' string: pass instruction=... to the wrapper")


class RewardWrapper(gym.Wrapper):
    """Adds ``model``'s reward to a gymnasium env (see the module docstring)."""

    def __init__(self, env: gym.Env, model: RewardModel, env_weight: float = 0.0, model_weight: float = 1.0,
                 smoothing: int | None = None, instruction: str | None = None):
        super().__init__(env)
        self.model = model
        self.env_weight, self.model_weight = float(env_weight), float(model_weight)
        self.smoothing = int(smoothing if smoothing is not None else getattr(model, "smoothing", 1))
        _check_weights(self.env_weight, self.model_weight, self.smoothing)
        _check_render(env, model)
        self.fixed_instruction = instruction
        self._instruction = instruction or ""
        self._recent: deque[float] = deque(maxlen=self.smoothing)

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self._instruction = _instruction(obs, self.fixed_instruction)
        self._recent.clear()
        return obs, info

    def step(self, action: Any):
        obs, env_reward, terminated, truncated, info = self.env.step(action)
        frames = read_frame(self.env, obs, self.model.camera)[None] if "frames" in self.model.inputs else None
        states = self.env.unwrapped.privileged_state()[None] if "states" in self.model.inputs else None
        out = self.model(frames, states, self._instruction)
        self._recent.append(float(out.reward[0]))
        model_reward = float(np.mean(self._recent))
        info = dict(info)
        info["env_reward"] = float(env_reward)
        info["reward_model"] = {"reward": model_reward, **{k: float(v[0]) for k, v in out.terms.items()}}
        reward = self.env_weight * float(env_reward) + self.model_weight * model_reward
        return obs, reward, terminated, truncated, info


class RewardInputs(gym.Wrapper):
    """Puts each step's rendered frame (``info["frame"]``), instruction (``info["instruction"]``)
    and, with ``states=True``, privileged state (``info["privileged_state"]``) in ``info``.

    Wrap the env itself (inside any observation filter), so the instruction is still in
    the observation at reset.
    """

    def __init__(self, env: gym.Env, frames: bool = True, states: bool = False, instruction: str | None = None,
                 camera: str | None = None):
        super().__init__(env)
        if frames and not camera and getattr(env, "render_mode", None) != "rgb_array":
            raise RewardInputError(f"RewardInputs renders frames: make the env with render_mode='rgb_array' "
                                   f"(got {env.render_mode!r}), or name the camera whose images to pass")
        self.frames, self.states, self.fixed_instruction, self.camera = frames, states, instruction, camera
        self._instruction = instruction or ""

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self._instruction = _instruction(obs, self.fixed_instruction)
        return obs, info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        info["instruction"] = self._instruction
        if self.frames:
            info["frame"] = read_frame(self.env, obs, self.camera)
        if self.states:
            info["privileged_state"] = self.env.unwrapped.privileged_state()
        return obs, reward, terminated, truncated, info


class VecRewardWrapper(VecEnvWrapper):
    """SB3 ``VecEnvWrapper`` scoring every sub-env's frame in one batch per step.

    Each sub-env must be wrapped in ``RewardInputs`` (frames, and states for a model that
    reads them). Rewards are replaced by ``env_weight * env + model_weight * model``.
    """

    def __init__(self, venv: Any, model: RewardModel, env_weight: float = 0.0, model_weight: float = 1.0,
                 smoothing: int | None = None):
        super().__init__(venv)
        self.model = model
        self.env_weight, self.model_weight = float(env_weight), float(model_weight)
        self.smoothing = int(smoothing if smoothing is not None else getattr(model, "smoothing", 1))
        _check_weights(self.env_weight, self.model_weight, self.smoothing)
        if "frames" in model.inputs:
            try:
                have = set(venv.get_attr("supersample"))
            except AttributeError:  # envs that do not say how they draw
                have = set()
            for k in have:
                _check_supersample(k, model)
        # each env's last ``smoothing`` model rewards (a ring, zeros where none yet) and how many it has
        self._recent = np.zeros((self.num_envs, self.smoothing))
        self._count = np.zeros(self.num_envs, np.int64)
        self._rows = np.arange(self.num_envs)

    def reset(self):
        self._recent[:] = 0.0
        self._count[:] = 0
        return self.venv.reset()

    def step_wait(self):
        obs, env_rewards, dones, infos = self.venv.step_wait()
        need = [k for k, on in (("frame", "frames" in self.model.inputs),
                                ("privileged_state", "states" in self.model.inputs)) if on] + ["instruction"]
        missing = [k for k in need if k not in infos[0]]
        if missing:
            raise RewardInputError(f"VecRewardWrapper needs {missing} in info: wrap each sub-env in "
                                   "rewards.wrappers.RewardInputs (states=True for a model that reads states)")
        frames = np.stack([i["frame"] for i in infos]) if "frames" in self.model.inputs else None
        states = np.stack([i["privileged_state"] for i in infos]) if "states" in self.model.inputs else None
        out = self.model(frames, states, [i["instruction"] for i in infos])
        self._recent[self._rows, self._count % self.smoothing] = out.reward
        self._count += 1
        model_rewards = self._recent.sum(1) / np.minimum(self._count, self.smoothing)
        env_rewards = np.asarray(env_rewards, np.float64)
        rewards = (self.env_weight * env_rewards + self.model_weight * model_rewards).astype(np.float32)
        terms = {n: np.asarray(v, np.float64).tolist() for n, v in out.terms.items()}
        for k, (info, env_r, r) in enumerate(zip(infos, env_rewards.tolist(), model_rewards.tolist())):
            info["env_reward"] = env_r
            info["reward_model"] = {"reward": r, **{n: v[k] for n, v in terms.items()}}
        done = np.asarray(dones, bool)
        self._recent[done] = 0.0  # a new episode starts its own window
        self._count[done] = 0
        return obs, rewards, dones, infos
