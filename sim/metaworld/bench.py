"""Measurements of the Meta-World adapter against Meta-World itself.

    python -m sim.metaworld.bench experts [--episodes 50] [--steps 200] [--tasks reach-v3,...]
    python -m sim.metaworld.bench speed [--tasks ...]
    python -m sim.metaworld.bench render [--tasks ...]

``experts`` runs Meta-World's scripted policy per task (a) through the adapter, one episode
per seed 0..N-1; (b) directly on Meta-World's env on the same layouts (the object/goal
vector each adapter episode drew, given to Meta-World's ``set_task``), a paired check that
the adapter loses nothing; and (c) directly on Meta-World's env the documented way:
``metaworld.MT1(task, seed=0)`` pre-samples 50 goals and ``env.set_task`` sets each in turn
(MT1 seeds 1, 2, ... add 50 more each when N > 50), an independent sample of the same
distribution. An episode succeeds
if Meta-World's ``info["success"]`` is set at any step within ``--steps``. It prints one
markdown table row per task.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import numpy as np

import sim  # noqa: F401  (headless GL before mujoco is imported)
from embodied.core.registry import make_env
from sim.metaworld.tasks import ALL_TASKS


def adapter_expert_success(task: str, episodes: int, steps: int) -> tuple[list[bool], list[np.ndarray]]:
    """Per-episode success of the scripted expert through the adapter over seeds
    0..episodes-1, and the layout vector (Meta-World's ``rand_vec``) of each episode."""
    env = make_env(task, max_episode_steps=steps)
    wins, layouts = [], []
    for seed in range(episodes):
        env.reset(seed=seed)
        layouts.append(np.array(env.unwrapped.mw._last_rand_vec))  # what Meta-World sampled
        for _ in range(steps):
            _, _, term, trunc, info = env.step(env.unwrapped.expert_action())
            if term or trunc:
                break
        wins.append(bool(info["success"]))
    env.close()
    return wins, layouts


def metaworld_expert_success(task: str, episodes: int, steps: int, layouts: list[np.ndarray] | None = None,
                             seed: int = 0) -> list[bool]:
    """Per-episode success of the same policy run directly on Meta-World's env, on ``layouts`` (paired
    with the adapter) or else on ``metaworld.MT1(task, seed)``'s 50 pre-sampled goals."""
    import pickle

    import metaworld
    from metaworld.policies import ENV_POLICY_MAP
    from metaworld.types import Task

    cls = metaworld.env_dict.ALL_V3_ENVIRONMENTS[task]
    if layouts is None:  # 50 goals per MT1 instance; more episodes take the next seed's goals
        tasks = []
        while len(tasks) < episodes:
            tasks += metaworld.MT1(task, seed=seed + len(tasks) // 50).train_tasks
        tasks = tasks[:episodes]
    else:
        tasks = [Task(env_name=task, data=pickle.dumps({"env_cls": cls, "rand_vec": v, "partially_observable": False}))
                 for v in layouts]
    env = cls()
    policy = ENV_POLICY_MAP[task]()
    wins = []
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
    env.close()
    return wins


def step_speed(task: str, n: int = 499) -> tuple[float, float]:
    """Env steps/s with random actions, state observations: (adapter, Meta-World's env)."""
    env = make_env(task, max_episode_steps=10**9)
    actions = np.random.default_rng(0).uniform(-1, 1, (n, 4)).astype(np.float32)
    env.reset(seed=0)
    t0 = time.perf_counter()
    for a in actions:
        env.step(a)
    ours = n / (time.perf_counter() - t0)
    mw = env.unwrapped.mw  # the wrapped Meta-World env, stepped directly
    env.reset(seed=0)
    t0 = time.perf_counter()
    for a in actions:
        mw.step(a)
    theirs = n / (time.perf_counter() - t0)
    env.close()
    return ours, theirs


def render_speed(task: str, size: int, n: int = 200) -> float:
    """Frames/s of pixel observations (one camera) at ``size`` px, stepping included."""
    env = make_env(task, obs_mode="pixels", image_size=size, max_episode_steps=10**9)
    env.reset(seed=0)
    a = np.zeros(4, np.float32)
    env.step(a)  # warm up the GL context
    t0 = time.perf_counter()
    for _ in range(n):
        env.step(a)
    fps = n / (time.perf_counter() - t0)
    env.close()
    return fps


def _tasks(arg: str | None) -> list[str]:
    return arg.split(",") if arg else list(ALL_TASKS)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("experts", "speed", "render"))
    p.add_argument("--tasks", default=None, help="comma-separated task names (default: all 50)")
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args(argv)
    rows: list[Any] = []
    if args.what == "experts":
        n = args.episodes
        print(f"| task | adapter ({n} seeds) | Meta-World, same layouts | Meta-World, MT1 goals | "
              f"adapter >= same layouts |  ({args.steps} steps)")
        print("|---|---|---|---|---|")
        for t in _tasks(args.tasks):
            a, layouts = adapter_expert_success(t, n, args.steps)
            paired = metaworld_expert_success(t, n, args.steps, layouts)
            mt1 = metaworld_expert_success(t, n, args.steps)
            same = sum(x == y for x, y in zip(a, paired))
            print(f"| {t} | {np.mean(a):.2f} | {np.mean(paired):.2f} | {np.mean(mt1):.2f} | "
                  f"{'yes' if sum(a) >= sum(paired) else 'NO'} ({same}/{n} episodes agree) |", flush=True)
            rows.append((sum(a), sum(paired), sum(mt1)))
        r = np.array(rows, float) / n
        print(f"mean: adapter {r[:, 0].mean():.3f}, Meta-World same layouts {r[:, 1].mean():.3f}, "
              f"Meta-World MT1 goals {r[:, 2].mean():.3f}")
    elif args.what == "speed":
        print("| task | adapter steps/s | Meta-World steps/s |\n|---|---|---|")
        for t in _tasks(args.tasks):
            ours, theirs = step_speed(t)
            print(f"| {t} | {ours:.0f} | {theirs:.0f} |", flush=True)
    else:
        print("| task | 64 px frames/s | 128 px frames/s |\n|---|---|---|")
        for t in _tasks(args.tasks):
            print(f"| {t} | {render_speed(t, 64):.0f} | {render_speed(t, 128):.0f} |", flush=True)


if __name__ == "__main__":
    main()
