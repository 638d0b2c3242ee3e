"""``embodied collect``: record scripted-expert demonstrations to an on-disk dataset.

    embodied collect suite=manipulation episodes=100 out=data/manip

Episodes are appended one by one (a crash or Ctrl-C loses no finished episode) and
collection resumes: a dataset that already holds k episodes of a task gets
``episodes - k`` more, with new seeds. ``action_noise`` > 0 executes noisy expert
actions but records the clean ones, so the data shows how to recover from mistakes.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embodied.app import hydra_command, run_dir
from embodied.evaluate import write_json
from embodied.registry import make_env, resolve_tasks

log = logging.getLogger("embodied.collect")
OBS_MODES = ("state", "pixels", "state+pixels")


@dataclass
class CollectConfig:
    """Schema of ``configs/collect.yaml``."""

    suite: str = "manipulation"
    tasks: list[str] = field(default_factory=list)  # overrides suite when given
    episodes: int = 100  # successful episodes per task
    out: str = ""  # dataset directory; default data/<suite>-<obs_mode>
    obs_mode: str = "state"
    image_size: int = 64
    cameras: list[str] = field(default_factory=list)
    seed: int = 0  # episode seeds are seed + task_index * 1_000_000 + k
    action_noise: float = 0.0  # std of Gaussian noise on executed actions
    only_success: bool = True  # drop failed expert episodes
    max_attempts_factor: float = 2.0  # give up on a task after factor * episodes attempts
    progress: bool = True

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if self.obs_mode not in OBS_MODES:
            raise ValueError(f"obs_mode must be one of {OBS_MODES}, got {self.obs_mode!r}")
        if not 0.0 <= self.action_noise <= 1.0:
            raise ValueError(f"action_noise must be in [0, 1], got {self.action_noise}")
        if self.max_attempts_factor < 1.0:
            raise ValueError(f"max_attempts_factor must be >= 1, got {self.max_attempts_factor}")


def env_kwargs(obs_mode: str, image_size: int, cameras: list[str] | tuple[str, ...]) -> dict[str, Any]:
    kw: dict[str, Any] = {"obs_mode": obs_mode}
    if obs_mode != "state":
        kw["image_size"] = image_size
        if cameras:
            kw["cameras"] = list(cameras)
    return kw


def reward_term_names(tasks: list[str]) -> list[str]:
    names: set[str] = set()
    for t in tasks:
        env = make_env(t)
        names |= set(env.reset(seed=0)[1]["reward_terms"])
        env.close()
    return sorted(names)


def collect(tasks: list[str], out: str | Path, episodes: int, obs_mode: str = "state", image_size: int = 64,
            cameras: list[str] | tuple[str, ...] = (), seed: int = 0, action_noise: float = 0.0,
            only_success: bool = True, max_attempts_factor: float = 2.0, progress: bool = True,
            suite: str = "") -> dict[str, Any]:
    """Fill ``out`` with ``episodes`` expert episodes per task (resuming); return a summary."""
    from tqdm.auto import tqdm

    from embodied.data import Dataset, EpisodeRecorder, features_for

    kw = env_kwargs(obs_mode, image_size, cameras)
    probe = make_env(tasks[0], **kw)
    terms = reward_term_names(tasks)
    features = features_for(probe.unwrapped.observation_spec, probe.unwrapped.action_spec, terms)
    info = {"suite": suite, "tasks": list(tasks), "obs_mode": obs_mode,
            "observation_spec": probe.unwrapped.observation_spec.to_dict(),
            "action_spec": probe.unwrapped.action_spec.to_dict(), "reward_terms": terms}
    probe.close()
    ds = Dataset.create(out, features, info, exist_ok=True)
    have = Counter(m.get("task") for m in ds.episodes_meta)
    todo = {t: max(0, episodes - have[t]) for t in tasks}
    t0 = time.time()
    summary: dict[str, Any] = {}
    bar = tqdm(total=sum(todo.values()), desc="collect", unit="ep", disable=not progress)
    rec = EpisodeRecorder(ds)
    try:
        for ti, task in enumerate(tasks):
            env = make_env(task, **kw)
            u = env.unwrapped
            rng = np.random.default_rng(seed + ti)
            ok = fail = 0
            base = seed + ti * 1_000_000
            used = [m["seed"] - base for m in ds.episodes_meta if m.get("task") == task and m.get("seed") is not None]
            k = max(used) + 1 if used else 0  # resume with fresh seeds
            while ok < todo[task] and ok + fail < max_attempts_factor * todo[task] + 5:
                ep_seed = seed + ti * 1_000_000 + k
                k += 1
                obs, reset_info = env.reset(seed=ep_seed)
                rec.start(task=task, seed=ep_seed, instruction=obs["instruction"], instruction_split="train",
                          params=reset_info.get("params", {}))
                while True:
                    action = u.expert_action()
                    executed = action
                    if action_noise > 0:
                        executed = np.clip(action + rng.normal(0, action_noise, action.shape), -1, 1).astype(np.float32)
                    nobs, rew, term, trunc, step_info = env.step(executed)
                    step_info = dict(step_info, reward_terms={n: step_info["reward_terms"].get(n, 0.0) for n in terms})
                    rec.add(obs, action, rew, step_info)
                    obs = nobs
                    if term or trunc:
                        break
                success = bool(step_info["success"])
                if only_success and not success:
                    rec.discard()
                    fail += 1
                    continue
                rec.finish(success=success)
                ok += 1
                bar.update(1)
            env.close()
            summary[task] = {"recorded": ok, "failed_discarded": fail, "total": have[task] + ok}
            if ok < todo[task]:
                log.warning("task %s: only %d of %d episodes recorded (expert failed %d times)", task, ok, todo[task], fail)
    except KeyboardInterrupt:
        if rec.recording:
            rec.discard()
        log.warning("interrupted: %d complete episodes are safe in %s", len(ds), out)
        raise
    finally:
        bar.close()
    return {"dataset": str(Path(out).resolve()), "episodes": len(ds), "per_task": summary,
            "wall_time_s": time.time() - t0}


@hydra_command("collect", CollectConfig)
def main(cfg: CollectConfig) -> dict[str, Any]:
    tasks = resolve_tasks(cfg.suite, cfg.tasks)
    out = cfg.out or f"data/{cfg.suite if not cfg.tasks else '-'.join(cfg.tasks)}-{cfg.obs_mode}"
    metrics = collect(tasks, out, cfg.episodes, cfg.obs_mode, cfg.image_size, cfg.cameras, cfg.seed,
                      cfg.action_noise, cfg.only_success, cfg.max_attempts_factor, cfg.progress, cfg.suite)
    write_json(run_dir() / "metrics.json", metrics)
    log.info("dataset %s: %d episodes (%s)", metrics["dataset"], metrics["episodes"],
             ", ".join(f"{t}: {v['total']}" for t, v in metrics["per_task"].items()))
    return metrics
