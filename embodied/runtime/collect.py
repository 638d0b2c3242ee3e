"""``embodied collect``: record scripted-expert demonstrations to an on-disk dataset.

    embodied collect suite=manipulation episodes=100 out=data/manip
    embodied collect suite=metaworld-mt50 episodes=50 workers=0   # one worker process per CPU core

Episodes are appended one by one (a crash or Ctrl-C loses no finished episode) and
collection resumes: a dataset that already holds k episodes of a task gets
``episodes - k`` more, with new seeds. ``action_noise`` > 0 executes noisy expert
actions but records the clean ones, so the data shows how to recover from mistakes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from embodied.core.registry import make_env
from embodied.runtime.checkpoints import env_kwargs
from embodied.runtime.data import ON_CORRUPT
from embodied.runtime.distributed import RayOptions, ray_options

log = logging.getLogger("embodied.collect")
OBS_MODES = ("state", "pixels", "state+pixels")


def check_image_args(obs_mode: str, image_size: int, cameras: list[str]) -> None:
    """Refuse an image size out of range, and cameras that a state-only run would ignore."""
    if not 8 <= image_size <= 512:
        raise ValueError(f"image_size must be in [8, 512] pixels, got {image_size}")
    if any(not isinstance(c, str) or not c.strip() for c in cameras) or len(set(cameras)) != len(cameras):
        raise ValueError(f"cameras must be distinct camera names, got {cameras}")
    if cameras and obs_mode == "state":
        raise ValueError(f"cameras={cameras} has no effect with obs_mode=state (no images are observed): "
                         "drop it, or set obs_mode=pixels")


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
    # a corrupt episode file already in `out`: raise (name it), skip it, or quarantine it (move it to
    # out/quarantine/ and go on); `embodied data repair path=...` does the last without collecting
    on_corrupt: str = "raise"
    progress: bool = True
    runner: str = "local"  # local | ray: episodes sharded over Ray workers (embodied/runtime/distributed.py)
    workers: int = 1  # runner=local: worker processes (0: one per CPU core); the same dataset either way
    ray_address: str = ""  # runner=ray: "" starts Ray here; "auto" or HOST:PORT joins a running cluster
    ray_num_cpus: int = 0  # runner=ray, local instance: CPUs (0: all)
    ray_shard_episodes: int = 0  # runner=ray: episodes per shard (0: about two shards per worker)
    ray_retries: int = 2  # runner=ray: retries of a shard whose worker died

    def __post_init__(self) -> None:
        from embodied.core.registry import resolve_tasks

        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0 (episode seeds are seed + task_index * 1_000_000 + k), got {self.seed}")
        if self.obs_mode not in OBS_MODES:
            raise ValueError(f"obs_mode must be one of {OBS_MODES}, got {self.obs_mode!r}")
        check_image_args(self.obs_mode, self.image_size, self.cameras)
        if not 0.0 <= self.action_noise <= 1.0:
            raise ValueError(f"action_noise must be in [0, 1], got {self.action_noise}")
        if not 1.0 <= self.max_attempts_factor < float("inf"):  # NaN fails too
            raise ValueError(f"max_attempts_factor must be a finite number >= 1, got {self.max_attempts_factor}")
        if self.on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt must be one of {ON_CORRUPT}, got {self.on_corrupt!r}")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0: one per CPU core), got {self.workers}")
        ray_options(self)
        resolve_tasks(self.suite, self.tasks)  # an unknown suite or task is named before anything is written


def reward_term_names(tasks: list[str]) -> list[str]:
    names: set[str] = set()
    for t in tasks:
        env = make_env(t)
        names |= set(env.reset(seed=0)[1]["reward_terms"])
        env.close()
    return sorted(names)


class _Held:
    """Stands in for a Dataset in ``EpisodeRecorder``: keeps the finished episode in memory."""

    def __init__(self, features: dict[str, dict[str, Any]]):
        self.features = features
        self.episode: tuple[dict[str, np.ndarray], dict[str, Any]] | None = None

    def append(self, episode: dict[str, np.ndarray], **meta: Any) -> int:
        self.episode = (episode, meta)
        return 0


def expert_episodes(env: Any, task: str, seeds: Iterable[int], features: dict[str, dict[str, Any]],
                    terms: list[str], action_noise: float = 0.0
                    ) -> Iterator[tuple[dict[str, np.ndarray], dict[str, Any]]]:
    """Play the scripted expert once per seed, in order; yield each episode's (arrays, meta).

    ``arrays``: feature -> (T, ...) per ``features`` (a dataset's); ``meta``: task, seed,
    instruction, instruction_split, params, success -- what ``Dataset.append`` takes. The
    executed actions' noise comes from a generator seeded by the episode seed (a stream
    apart from the env's), so an episode depends only on (task, seed, action_noise) and a
    Ray worker replays it exactly.
    """
    from embodied.runtime.data import EpisodeRecorder

    held = _Held(features)
    rec = EpisodeRecorder(held)  # type: ignore[arg-type]
    u = env.unwrapped
    privileged = "privileged_state" in features
    for ep_seed in seeds:
        rng = np.random.default_rng([ep_seed, 1])
        obs, reset_info = env.reset(seed=ep_seed)
        rec.start(task=task, seed=ep_seed, instruction=obs["instruction"], instruction_split="train",
                  params=reset_info.get("params", {}), action_noise=float(action_noise))
        while True:
            if privileged:  # the full state of the step the action is taken in
                obs = {**obs, "privileged_state": u.privileged_state()}
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
        rec.finish(success=bool(step_info["success"]))
        yield held.episode  # type: ignore[misc]


def expert_shard(task: str, seeds: tuple[int, ...], kw: dict[str, Any], features: dict[str, dict[str, Any]],
                 terms: list[str], action_noise: float, only_success: bool
                 ) -> list[tuple[dict[str, np.ndarray] | None, dict[str, Any]]]:
    """A worker's part of ``collect`` (Ray or local processes): the episodes of ``seeds`` (no arrays for dropped failures)."""
    import sim  # noqa: F401  (chooses the headless GL backend before MuJoCo loads)

    env = make_env(task, **kw)
    try:
        return [(None if only_success and not meta["success"] else arrays, meta)
                for arrays, meta in expert_episodes(env, task, seeds, features, terms, action_noise)]
    finally:
        env.close()


def collect(tasks: list[str], out: str | Path, episodes: int, obs_mode: str = "state", image_size: int = 64,
            cameras: list[str] | tuple[str, ...] = (), seed: int = 0, action_noise: float = 0.0,
            only_success: bool = True, max_attempts_factor: float = 2.0, progress: bool = True,
            suite: str = "", runner: str = "local", ray_options: RayOptions | None = None, workers: int = 1,
            on_corrupt: str = "raise") -> dict[str, Any]:
    """Fill ``out`` with ``episodes`` expert episodes per task (resuming); return a summary.

    ``runner="ray"`` plays the episodes on Ray workers (``ray_options``), and ``workers`` > 1
    (local runner) on that many local processes; either way they are appended here in the
    same order, so the dataset is the one a single process writes.
    """
    from tqdm.auto import tqdm

    from embodied.runtime.data import Dataset, features_for

    kw = env_kwargs(obs_mode, image_size, cameras)
    probe = make_env(tasks[0], **kw)
    terms = reward_term_names(tasks)
    # pixel datasets also keep the full state: a training-only target (the policy never reads it)
    privileged_dim = len(probe.unwrapped.privileged_state()) if obs_mode == "pixels" else 0
    if privileged_dim and (Path(out) / "meta.json").exists() and \
            "privileged_state" not in Dataset.open(out, on_corrupt="skip").features:
        privileged_dim = 0  # an older pixel dataset: keep appending in its own format
    features = features_for(probe.unwrapped.observation_spec, probe.unwrapped.action_spec, terms,
                            privileged_dim=privileged_dim)
    info = {"suite": suite, "tasks": list(tasks), "obs_mode": obs_mode,
            "observation_spec": probe.unwrapped.observation_spec.to_dict(),
            "action_spec": probe.unwrapped.action_spec.to_dict(), "reward_terms": terms}
    probe.close()
    ds = Dataset.create(out, features, info, exist_ok=True, on_corrupt=on_corrupt)
    have = Counter(m.get("task") for m in ds.episodes_meta)
    other = sorted({m["action_noise"] for m in ds.episodes_meta
                    if m.get("task") in tasks and m.get("action_noise", action_noise) != action_noise})
    if other:  # resuming would mix demonstrations of two recipes in one dataset
        raise ValueError(f"dataset {out} holds demonstrations recorded with action_noise={other}, not "
                         f"{action_noise}: give another out=/dataset= path for these settings")
    todo = {t: max(0, episodes - have[t]) for t in tasks}
    first_seed = {}
    for ti, task in enumerate(tasks):
        base = seed + ti * 1_000_000
        used = [m["seed"] - base for m in ds.episodes_meta if m.get("task") == task and m.get("seed") is not None]
        first_seed[task] = base + (max(used) + 1 if used else 0)  # resume with fresh seeds
    t0 = time.time()
    summary: dict[str, Any] = {}
    bar = tqdm(total=sum(todo.values()), desc="collect", unit="ep", disable=not progress)
    retried: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        shards = None
        pool = workers if runner == "local" and workers > 1 else 0
        if (runner == "ray" or pool) and any(todo.values()):
            from embodied.runtime.distributed import ordered_shards

            shards = stack.enter_context(ordered_shards(
                expert_shard, (kw, ds.features, terms, action_noise, only_success),
                {t: (first_seed[t], todo[t]) for t in tasks}, ray_options or RayOptions(), workers=pool))
            retried = shards.runner.retried
        try:
            for task in tasks:
                env = make_env(task, **kw) if shards is None else None
                stream = (shards.stream(task) if shards is not None else
                          expert_episodes(env, task, itertools.count(first_seed[task]), ds.features, terms, action_noise))
                ok = fail = 0
                try:
                    while ok < todo[task] and ok + fail < max_attempts_factor * todo[task] + 5:
                        arrays, meta = next(stream)
                        if only_success and not meta["success"]:
                            fail += 1
                            continue
                        ds.append(arrays, **meta)
                        ok += 1
                        bar.update(1)
                finally:
                    stream.close()
                    if env is not None:
                        env.close()
                    if shards is not None:
                        shards.drop(task)
                summary[task] = {"recorded": ok, "failed_discarded": fail, "total": have[task] + ok}
                if ok < todo[task]:
                    log.warning("task %s: only %d of %d episodes recorded (expert failed %d times)", task, ok,
                                todo[task], fail)
        except KeyboardInterrupt:
            log.warning("interrupted: %d complete episodes are safe in %s", len(ds), out)
            raise
        finally:
            bar.close()
    extra = {"runner": "ray", "retried_shards": retried} if runner == "ray" else {"workers": max(1, pool)}
    return {"dataset": str(Path(out).resolve()), "episodes": len(ds), "per_task": summary,
            "wall_time_s": time.time() - t0, **extra}
