"""Reward throughput on this machine (``embodied reward bench``): frames/s of scoring alone, and
the SB3 loop's rate with the reward as a fraction of the same loop rendering frames without it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from embodied.core.registry import get_task, make_env, resolve_tasks
from rewards.wrappers import frame_env_kwargs

log = logging.getLogger("embodied.reward")


@dataclass
class RewardBenchConfig:
    """Schema of ``configs/reward_bench.yaml``: reward throughput on this machine, as ratios."""

    suite: str = "manipulation"
    task: str = ""  # default: the suite's first task
    reward: dict[str, Any] = field(default_factory=lambda: {"name": "clip"})
    image_size: int = 64  # frame side for a reward that reads any size
    frames: int = 2048  # frames scored per round (embedding + similarity)
    steps: int = 200  # vector-env steps per round (step + render, with and without the reward)
    num_envs: int = 8  # sub-envs of the SB3 vector env (frames scored per batch)
    rounds: int = 3  # measurements alternate; the median of each figure is reported
    threads: int = 1  # threads of torch and of the image tower's runtime (one: one core)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("frames", "steps", "num_envs", "rounds", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def _sb3_envs(task: str, n: int, size: int, seed: int, states: bool, camera: str | None,
              supersample: int = 1) -> Any:
    """An SB3 DummyVecEnv of ``n`` copies of ``task`` whose steps carry frames in ``info``."""
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rewards.wrappers import RewardInputs

    def make(k: int) -> Callable[[], Any]:
        def thunk() -> Any:
            env = make_env(task, **frame_env_kwargs(camera, size, supersample))
            return gym.wrappers.FilterObservation(RewardInputs(env, states=states, camera=camera), ["state"])
        return thunk

    venv = DummyVecEnv([make(k) for k in range(n)])
    venv.seed(seed)
    return venv


def bench_reward(cfg: RewardBenchConfig) -> dict[str, Any]:
    """Frames/s of scoring alone, and the SB3 loop's rate with the reward as a fraction of
    the same loop rendering frames without it (alternating rounds, one process)."""
    import torch

    from rewards.registry import make_reward
    from rewards.wrappers import VecRewardWrapper

    torch.set_num_threads(cfg.threads)
    task = cfg.task or resolve_tasks(cfg.suite)[0]
    model = make_reward(cfg.reward)
    model.check_suite(get_task(task).suite)
    size = model.image_size or cfg.image_size
    states_needed = "states" in model.inputs
    venv = _sb3_envs(task, cfg.num_envs, size, cfg.seed, states_needed, model.camera, model.supersample)
    rng = np.random.default_rng(cfg.seed)
    shape = (cfg.num_envs,) + venv.action_space.shape
    venv.reset()
    frames: list[np.ndarray] = []
    instruction = ""
    while len(frames) * cfg.num_envs < min(cfg.frames, 4096):
        _, _, _, infos = venv.step(rng.uniform(-1, 1, shape).astype(np.float32))
        frames.append(np.stack([i["frame"] for i in infos]))
        instruction = infos[0]["instruction"]
    bank = np.concatenate(frames)
    reps = int(np.ceil(cfg.frames / len(bank)))
    batch = int(getattr(model, "batch_size", 64))
    scored = VecRewardWrapper(venv, model)

    def score_rate() -> float:
        states = np.zeros((batch, 1), np.float32) if states_needed else None
        t = time.perf_counter()
        n = 0
        for _ in range(reps):
            for i in range(0, len(bank), batch):
                f = bank[i:i + batch]
                model(f, None if states is None else states[:len(f)], instruction)
                n += len(f)
        return n / (time.perf_counter() - t)

    def loop_rate(v: Any) -> float:
        t = time.perf_counter()
        for _ in range(cfg.steps):
            v.step(rng.uniform(-1, 1, shape).astype(np.float32))
        return cfg.steps * cfg.num_envs / (time.perf_counter() - t)

    score_rate()  # warm-up: the text cache, the allocator, the image tower's graph
    runtime = getattr(model, "runtime", None)  # what embeds the frames (ClipReward)
    rounds = []
    for _ in range(cfg.rounds):
        venv.reset()
        render = loop_rate(venv)
        scored.reset()
        both = loop_rate(scored)
        rounds.append({"score_frames_per_s": score_rate(), "step_render_frames_per_s": render,
                       "step_render_reward_frames_per_s": both, "end_to_end_fraction": both / render})
    venv.close()
    med = {k: float(np.median([r[k] for r in rounds])) for k in rounds[0]}
    metrics = {"task": task, "image_size": size, "supersample": model.supersample, "threads": cfg.threads,
               "num_envs": cfg.num_envs, "batch_size": batch, "image_tower_runtime": runtime, **med,
               "rounds": rounds,
               "reward": getattr(model, "describe", lambda: None)()}
    log.info("%s at %dx%d, %d thread(s)%s: reward scoring %.0f frames/s (embedding + similarity); SB3 loop of "
             "%d envs: step+render %.0f frames/s, with the reward %.0f frames/s = %.0f%% of step+render "
             "(medians of %d alternating rounds)", task, size, size, cfg.threads,
             f", image tower on {runtime}" if runtime else "", med["score_frames_per_s"],
             cfg.num_envs, med["step_render_frames_per_s"], med["step_render_reward_frames_per_s"],
             100 * med["end_to_end_fraction"], cfg.rounds)
    return metrics
