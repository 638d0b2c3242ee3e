"""Raw-action baselines for steering, on the same features and reward sources.

* ``RawActionEnv``: SAC in the task's own action space from scratch, one env step per
  action; it observes the frozen policy's features (C,) so it sees the instruction as the
  steered actor does (the policy's actions are never used).
* ``ResidualEnv``: a residual on the frozen policy's executed chunk: the base decodes a
  chunk from fresh N(0, I) noise, the agent sees features (C,) + that chunk's executed part
  (Ta*Da,) and adds ``scale`` x its action in [-1, 1]^(Ta*Da) (clipped to the action
  bounds), so it starts at the base policy's behaviour.

``RawActionPolicy`` and ``ResidualPolicy`` turn the trained actors into ``Policy`` objects
for evaluation. Both envs count ``info["env_steps"]`` as ``NoiseEnv`` does.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import gymnasium as gym
import numpy as np

from embodied.core.policy import Policy, PolicyWrapper, check_chunk
from policies.steering.env import ChunkRunner, make_reward
from policies.steering.noise import feature_dim, features

Actor = Callable[[np.ndarray], np.ndarray]


def _with_task(batch: dict[str, Any], task: str | None) -> dict[str, Any]:
    if task is not None:
        batch["task"] = [task] * len(batch["instruction"])
    return batch


class RawActionEnv(gym.Wrapper):
    """A task env seen through the frozen policy's features; actions are the task's own (Da,)."""

    def __init__(self, env: gym.Env, policy: Policy, reward: Any = "sparse", task: str | None = None):
        super().__init__(env)
        self.policy, self.task = policy, task
        self.runner = ChunkRunner(env, policy, make_reward(reward), n_action_steps=1)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (feature_dim(policy),), np.float32)

    def _obs(self) -> np.ndarray:
        return features(self.policy, _with_task(self.runner.batch(), self.task))[0]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        info = self.runner.reset(seed=seed, options=options)
        return self._obs(), info

    def step(self, action: Any):
        a = np.asarray(action, np.float32).reshape(1, -1)
        reward, terminated, truncated, info = self.runner.execute(a)
        return self._obs(), reward, terminated, truncated, info


class ResidualEnv(gym.Wrapper):
    """The frozen policy's executed chunk plus a learned residual (see the module docstring)."""

    def __init__(self, env: gym.Env, policy: Policy, reward: Any = "sparse", task: str | None = None,
                 scale: float = 0.3, seed: int = 0):
        super().__init__(env)
        if not scale > 0:
            raise ValueError(f"residual scale={scale} is not allowed: must be > 0")
        self.policy, self.task, self.scale = policy, task, float(scale)
        self.runner = ChunkRunner(env, policy, make_reward(reward))
        self.rng = np.random.default_rng(seed)
        self.ta, self.da = policy.n_action_steps, int(env.action_space.shape[0])
        self.action_space = gym.spaces.Box(-1.0, 1.0, (self.ta * self.da,), np.float32)
        c = feature_dim(policy)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (c + self.ta * self.da,), np.float32)
        self._base: np.ndarray | None = None

    def _obs(self) -> np.ndarray:
        batch = _with_task(self.runner.batch(), self.task)
        noise = self.rng.standard_normal((1, *self.policy.unwrapped.noise_shape)).astype(np.float32)  # type: ignore[attr-defined]
        self._base = check_chunk(self.policy.predict_chunk(batch, noise), 1)[0, : self.ta]
        return np.concatenate([features(self.policy, batch)[0], self._base.ravel()])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        info = self.runner.reset(seed=seed, options=options)
        return self._obs(), info

    def step(self, action: Any):
        delta = np.asarray(action, np.float32).reshape(self.ta, self.da)
        chunk = residual_chunk(self._base, delta, self.scale, self.env.action_space)
        reward, terminated, truncated, info = self.runner.execute(chunk)
        return self._obs(), reward, terminated, truncated, info


def residual_chunk(base: np.ndarray, delta: np.ndarray, scale: float, space: Any) -> np.ndarray:
    """``base + scale * delta`` clipped to the action space's bounds (same shape as ``base``)."""
    return np.clip(base + scale * np.clip(delta, -1.0, 1.0), space.low, space.high).astype(np.float32)


class RawActionPolicy(PolicyWrapper):
    """A raw-action actor as a ``Policy``: one action per chunk, from the frozen policy's features."""

    def __init__(self, policy: Policy, actor: Actor, task: str | None = None):
        super().__init__(policy)
        self.actor, self.task = actor, task
        self.horizon = self.n_action_steps = 1

    def predict_chunk(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None) -> np.ndarray:
        a = np.asarray(self.actor(features(self.policy, obs_batch)), np.float32)
        return np.clip(a, -1.0, 1.0)[:, None, :]


class ResidualPolicy(PolicyWrapper):
    """The frozen policy's chunk (from the given noise) with a residual actor's correction on its first Ta steps."""

    def __init__(self, policy: Policy, actor: Actor, scale: float, action_space: Any):
        super().__init__(policy)
        self.actor, self.scale, self.space = actor, float(scale), action_space

    def predict_chunk(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None) -> np.ndarray:
        chunk = check_chunk(self.policy.predict_chunk(obs_batch, noise), len(obs_batch["instruction"])).copy()
        ta = self.n_action_steps
        obs = np.concatenate([features(self.policy, obs_batch), chunk[:, :ta].reshape(len(chunk), -1)], axis=1)
        delta = np.asarray(self.actor(obs), np.float32).reshape(len(chunk), ta, -1)
        chunk[:, :ta] = residual_chunk(chunk[:, :ta], delta, self.scale, self.space)
        return chunk
