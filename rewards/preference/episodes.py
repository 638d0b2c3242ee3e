"""Playing an episode into a ``Trajectory``, and the behaviours that play them.

Episodes that end in success before the time limit are padded to it with their final step
(an absorbing state), so that a segment or return never favours failing slowly over
succeeding quickly.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from embodied.core.policy import check_chunk
from embodied.core.registry import make_env
from embodied.core.reward import RewardModel
from rewards.preference.model import PreferenceReward
from rewards.preference.segments import Trajectory

HELDOUT_SEED = 1_000_000  # held-out episodes use seed + HELDOUT_SEED + k; evaluation + 2 * HELDOUT_SEED


def rollout(env: Any, seed: int, act: Callable[[Any, np.random.Generator, Any], np.ndarray], frames: bool,
            info: dict[str, Any]) -> tuple[Trajectory, int]:
    """One episode with ``act(env.unwrapped, rng, obs) -> action``; returns it padded to the time
    limit, and its real steps."""
    obs, inf = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    u = env.unwrapped
    states, actions, rewards, imgs = [], [], [], []
    success, steps = bool(inf["success"]), 0
    for _ in range(u.max_episode_steps):
        a = np.asarray(act(u, rng, obs), np.float32)
        states.append(u.privileged_state())
        if frames:
            imgs.append(env.render())
        obs, r, term, trunc, inf = env.step(a)
        actions.append(a)
        rewards.append(r)
        steps += 1
        success = success or bool(inf["success"])
        if term or trunc:
            break
    for _ in range(u.max_episode_steps - steps):  # absorbing final step (see the module docstring)
        states.append(states[-1]), actions.append(np.zeros_like(actions[-1])), rewards.append(rewards[-1])
        if frames:
            imgs.append(imgs[-1])
    traj = Trajectory(np.array(states, np.float32), np.array(actions, np.float32), np.array(rewards, np.float32),
                      u.instruction, success, np.array(imgs, np.uint8) if frames else None,
                      {**info, "seed": seed, "steps": steps})
    return traj, steps


def candidate_behaviour(seed: int, k: int, action_dim: int) -> Callable[[Any, np.random.Generator, Any], np.ndarray]:
    """Behaviour k of episode ``seed``: the scripted expert with probability p, else a fixed random
    push (plus noise); p and the push are drawn per (seed, k), so candidates range from expert to aimless."""
    r = np.random.default_rng([seed, k, 7])
    p, push = float(r.uniform(0.0, 1.0)), r.uniform(-1.0, 1.0, action_dim)

    def act(u: Any, rng: np.random.Generator, obs: Any = None) -> np.ndarray:
        if rng.random() < p:
            return np.clip(u.expert_action(), -1, 1)
        return np.clip(push + 0.3 * rng.normal(size=action_dim), -1, 1)

    return act


def trajectory_return(reward: RewardModel, t: Trajectory) -> float:
    """Σ_t r̂ over a trajectory under any ``RewardModel`` (states for state rewards, frames for image ones)."""
    states = t.states
    if isinstance(reward, PreferenceReward) and reward.cfg.input == "state_action":
        states = np.concatenate([t.states, t.actions], -1)
    frames = t.frames if "frames" in reward.inputs else None
    return float(np.sum(reward(frames, states if "states" in reward.inputs else None, t.instruction).reward))


def frame_env(task: str, frames: bool, size: int, camera: str = "", supersample: int = 1, **kw: Any) -> Any:
    """``make_env(task, **kw)`` whose ``render()`` gives (size, size) frames of ``camera`` (default:
    the task's render camera), anti-aliased by ``supersample``, when ``frames``; the same pixels as
    that camera's observation images at that size, which is what a camera-fitted reward (the VLM
    teacher's) reads."""
    if frames:
        kw.update(render_mode="rgb_array", render_size=size)
        if supersample != 1:
            kw["supersample"] = supersample
    env = make_env(task, **kw)
    if frames and camera:
        u = env.unwrapped
        valid = [u.model.camera(i).name for i in range(u.model.ncam)]
        if camera not in valid:
            raise ValueError(f"render_camera={camera!r} is not a camera of task {task!r}; its cameras: {valid}")
        u.render_camera = camera
    return env


def policy_behaviour(policy: Any, task: str | None) -> Callable[[Any, np.random.Generator, Any], np.ndarray]:
    """A trained ``Policy`` as a behaviour for ``rollout`` (chunk by chunk, its own sampler noise);
    one-hot policies get ``task``. A fresh behaviour per episode."""
    ep = policy.new_episode()

    def act(u: Any, rng: np.random.Generator, obs: Any) -> np.ndarray:
        ep.push(policy.observe(ep, obs))
        if ep.needs_chunk:
            batch = ep.batch()
            if task is not None:
                batch["task"] = [task]
            ep.fill(check_chunk(policy.predict_chunk(batch), 1)[0])
        return ep.pop()

    return act
