"""Rollouts through vector environments: what the policy sees must not depend on ``vector``."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import sim  # noqa: F401  (configures headless GL before mujoco is imported)
from embodied.core.policy import Policy
from embodied.core.registry import make_env
from embodied.runtime.rollout import run_episodes


class RecordingPolicy(Policy):
    """Returns zero actions and remembers every instruction and image batch it was given."""

    n_obs_steps, horizon, n_action_steps = 1, 4, 4

    def __init__(self) -> None:
        super().__init__()
        self.instructions: list[str] = []
        self.images: list[np.ndarray] = []

    def predict_chunk(self, obs_batch, noise=None):
        self.instructions += list(obs_batch["instruction"])
        self.images.append(np.asarray(obs_batch["image"]))
        return np.zeros((len(obs_batch["instruction"]), self.horizon, 4), np.float32)


@pytest.mark.parametrize("vector", ["sync", "async"])
def test_policy_sees_the_real_instruction_and_images(vector):
    make = functools.partial(make_env, "press-button", obs_mode="pixels", image_size=32, max_episode_steps=8)
    policy = RecordingPolicy()
    results = run_episodes(make, seeds=[0, 1, 2], policy=policy, num_envs=2, vector=vector)
    assert {r.instruction for r in results} == set(policy.instructions)  # not a placeholder string
    assert all("button" in s for s in policy.instructions)
    first = make()
    obs, _ = first.reset(seed=0)
    np.testing.assert_array_equal(policy.images[0][0, 0], obs["image"])  # the env's own frame
    first.close()
