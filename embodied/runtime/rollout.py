"""Running episodes: batched policy inference over vector environments.

``run_episodes`` plays a fixed list of episodes (task, seed, instruction split) with a
policy and returns one record per episode. Episodes are spread over ``num_envs``
gymnasium vector sub-environments (in this process, or in worker processes with
``vector="async"``); the policy sees a batch of the environments that need a new action
chunk. Seeds fix each episode completely, so results do not depend on ``num_envs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from embodied.core.policy import Episode, Policy, check_chunk


@dataclass
class EpisodeResult:
    seed: int
    instruction: str
    success: bool
    length: int
    ret: float
    frames: list[np.ndarray] = field(default_factory=list, repr=False)
    grounded: str | None = None  # the wording the policy acted on, when it grounded ``instruction`` to another


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate (well behaved at 0 and n)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))  # p inside despite rounding


class BatchActor:
    """``Policy.act`` for several environments at once: one ``Episode`` per environment.

    ``act(obs_list, active)`` returns one action per active env. Each env's step is the
    one ``Policy.act`` takes (``policy.observe``, then the episode's history and queue),
    except that ``policy.predict_chunk`` runs once for all envs whose queue is empty.
    """

    def __init__(self, policy: Policy, num_envs: int):
        self.policy = policy
        self.episodes: list[Episode] = [policy.new_episode() for _ in range(num_envs)]

    def reset(self, i: int) -> None:
        self.episodes[i] = self.policy.new_episode()

    def acted_on(self, i: int) -> str | None:
        """The instruction env ``i``'s policy acts on in its episode (after ``observe``)."""
        return self.episodes[i].instruction

    def act(self, obs: list[dict[str, Any]], active: Sequence[int], extra: dict[str, list[Any]] | None = None
            ) -> dict[int, np.ndarray]:
        for i in active:
            ep = self.episodes[i]
            ep.push(self.policy.observe(ep, obs[i]))
        need = [i for i in active if self.episodes[i].needs_chunk]
        if need:
            parts = [self.episodes[i].batch() for i in need]
            batch: dict[str, Any] = {"instruction": [p["instruction"][0] for p in parts],
                                     "state": np.concatenate([p["state"] for p in parts])}
            if "image" in parts[0]:
                batch["image"] = np.concatenate([p["image"] for p in parts])
            if "images" in parts[0]:  # several cameras
                batch["images"] = {c: np.concatenate([p["images"][c] for p in parts]) for c in parts[0]["images"]}
            for k, v in (extra or {}).items():
                batch[k] = [v[i] for i in need]
            chunk = check_chunk(self.policy.predict_chunk(batch), len(need))
            for j, i in enumerate(need):
                self.episodes[i].fill(chunk[j])
        return {i: self.episodes[i].pop() for i in active}


def _unbatch(obs: dict[str, Any], n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        o = {"state": obs["state"][i], "instruction": obs["instruction"][i]}
        if "image" in obs:
            o["image"] = obs["image"][i]
        if "images" in obs:
            o["images"] = {c: v[i] for c, v in obs["images"].items()}
        out.append(o)
    return out


VIDEO_FPS = 20  # frames per second of saved videos (``evaluate.save_videos``)


def frame_stride(metadata: dict[str, Any]) -> int:
    """Steps between recorded frames: ``render_fps / VIDEO_FPS``, rounded (at least 1). A Meta-World
    env steps at 80 Hz, so every fourth step is kept; a 20 Hz env keeps every step."""
    return max(1, round(float(metadata.get("render_fps") or VIDEO_FPS) / VIDEO_FPS))


def run_episodes(
    make_env: Callable[[], gym.Env],
    seeds: Sequence[int],
    policy: Policy | str,
    num_envs: int = 4,
    vector: str = "sync",
    record: int = 0,
    progress: Any = None,
    task: str | None = None,
) -> list[EpisodeResult]:
    """Play one episode per seed (all of one task and instruction set), in seed order.

    Args:
        make_env: builds one environment (with ``render_mode="rgb_array"`` when
            ``record`` > 0). Its constructor fixes the task and instruction split.
        seeds: one episode per seed; a seed fixes the episode completely.
        policy: a ``Policy``, or ``"expert"`` for the task's scripted expert.
        num_envs: parallel sub-environments.
        vector: ``"sync"`` (this process) or ``"async"`` (worker processes).
        record: keep rendered frames of the first ``record`` episodes (for videos): the first
            frame, then every ``frame_stride(env)``-th step and the last, so that the video plays at
            ``VIDEO_FPS`` in the environment's own time.
        progress: optional tqdm bar, advanced once per finished episode.
        task: the task name, passed to the policy as ``task`` (the one-hot baseline uses it).
    """
    if vector not in ("sync", "async"):
        raise ValueError(f"vector must be 'sync' or 'async', got {vector!r}")
    if not isinstance(policy, Policy) and policy != "expert":
        raise TypeError(f"policy must be a Policy or 'expert', got {policy!r}")
    seeds = list(seeds)
    num_envs = max(1, min(int(num_envs), len(seeds)))
    cls = gym.vector.AsyncVectorEnv if vector == "async" and num_envs > 1 else gym.vector.SyncVectorEnv
    # spawn: fork + GL/torch threads can deadlock. No shared memory: gymnasium writes a Text space
    # (the instruction) into shared memory as a string of "a"s, so the policy would never see it.
    kw = {"context": "spawn", "shared_memory": False} if cls is gym.vector.AsyncVectorEnv else {}
    envs = cls([make_env] * num_envs, autoreset_mode=gym.vector.AutoresetMode.DISABLED, **kw)
    stride = frame_stride(envs.metadata) if record else 1
    results: list[EpisodeResult | None] = [None] * len(seeds)
    slot = [-1] * num_envs  # index into seeds of the episode each env plays, -1 = idle
    ret, length = np.zeros(num_envs), np.zeros(num_envs, int)
    frames: list[list[np.ndarray]] = [[] for _ in range(num_envs)]
    instr = [""] * num_envs
    obs_list: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    actor = BatchActor(policy, num_envs) if isinstance(policy, Policy) else None
    nxt = 0

    def start(idle: list[int]) -> None:
        nonlocal nxt
        mask, sd = np.zeros(num_envs, bool), [None] * num_envs
        for i in idle:  # idle envs are reset too: the vector env refuses to step a finished one
            slot[i], mask[i] = -1, True
            if nxt < len(seeds):
                slot[i], sd[i] = nxt, seeds[nxt]
                nxt += 1
        obs, _ = envs.reset(seed=sd, options={"reset_mask": mask})
        fresh = _unbatch(obs, num_envs)
        for i in idle:
            ret[i], length[i], frames[i] = 0.0, 0, []
            obs_list[i], instr[i] = fresh[i], fresh[i]["instruction"]
            if actor is not None:
                actor.reset(i)
        _record(mask)

    def _record(mask: np.ndarray) -> None:
        want = [i for i in np.flatnonzero(mask) if 0 <= slot[i] < record]
        if not want:
            return
        if isinstance(envs, gym.vector.SyncVectorEnv):
            for i in want:
                frames[i].append(envs.envs[i].render())
        else:
            all_frames = envs.call("render")
            for i in want:
                frames[i].append(all_frames[i])

    try:
        start(list(range(num_envs)))
        while any(s >= 0 for s in slot):
            active = [i for i in range(num_envs) if slot[i] >= 0]
            actions = np.zeros((num_envs,) + envs.single_action_space.shape, np.float32)
            if actor is None:
                expert = envs.call("expert_action")
                for i in active:
                    actions[i] = expert[i]
            else:
                extra = {"task": [task] * num_envs} if task else None
                for i, a in actor.act(obs_list, active, extra).items():
                    actions[i] = a
            obs, rew, term, trunc, info = envs.step(actions)
            fresh = _unbatch(obs, num_envs)
            mask = np.zeros(num_envs, bool)
            ends = np.logical_or(term, trunc)
            mask[[i for i in active if (length[i] + 1) % stride == 0 or ends[i]]] = True
            _record(mask)
            done = []
            for i in active:
                obs_list[i] = fresh[i]
                ret[i] += float(rew[i])
                length[i] += 1
                if term[i] or trunc[i]:
                    acted = actor.acted_on(i) if actor is not None else None
                    results[slot[i]] = EpisodeResult(seeds[slot[i]], instr[i], bool(info["success"][i]),
                                                     int(length[i]), float(ret[i]), frames[i],
                                                     acted if acted != instr[i] else None)
                    done.append(i)
                    if progress is not None:
                        progress.update(1)
            if done and any(s >= 0 for s in slot) or nxt < len(seeds):
                if done:
                    start(done)
    finally:
        envs.close()
    return [r for r in results if r is not None]
