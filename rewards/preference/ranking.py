"""The ``ranking`` learner: best-of-K selection among scripted candidate behaviours."""

from __future__ import annotations

from typing import Any

import numpy as np

from embodied.core.reward import RewardModel
from rewards.preference.config import PreferConfig, register_learner
from rewards.preference.episodes import HELDOUT_SEED, candidate_behaviour, frame_env, rollout, trajectory_return
from rewards.preference.segments import Trajectory


class RankingLearner:
    """Best-of-K: each episode is played by K candidate behaviours (``candidate_behaviour``) and the
    policy's episode is the one the reward ranks highest — the zeroth-order form of steering (the
    candidates play the role of K noise draws). Improvement needs no gradient step: a new reward
    changes the ranking. Seeds fix each candidate's episode, so the learned and the ground-truth
    reward rank the very same trajectories (equal env steps)."""

    def __init__(self, task: str, candidates: int, seed: int, frames: bool, render_size: int, camera: str = "",
                 supersample: int = 1):
        self.env = frame_env(task, frames, render_size, camera, supersample)
        self.k, self.frames, self.next_seed = candidates, frames, seed
        self.seed, self.env_steps = seed, 0
        self.reward: RewardModel | None = None
        self._cache: dict[tuple[int, int], Trajectory] = {}

    def episode(self, seed: int) -> list[Trajectory]:
        out = []
        for k in range(self.k):
            if (seed, k) not in self._cache:
                act = candidate_behaviour(seed, k, self.env.action_space.shape[0])
                self._cache[seed, k], steps = rollout(self.env, seed, act, self.frames, {"candidate": k})
                self.env_steps += steps
            out.append(self._cache[seed, k])
        return out

    def rollout(self, episodes: int) -> list[Trajectory]:
        seeds = range(self.next_seed, self.next_seed + episodes)
        self.next_seed += episodes
        return [t for s in seeds for t in self.episode(s)]

    def improve(self, reward: RewardModel) -> dict[str, Any]:
        self.reward = reward
        return {}

    def evaluate(self, episodes: int, reward: RewardModel) -> dict[str, Any]:
        base, before = self.seed + 2 * HELDOUT_SEED, self.env_steps
        picked, best, mean, steps = [], [], [], 0
        for s in range(base, base + episodes):
            trajs = self.episode(s)
            steps += sum(t.info["steps"] for t in trajs)
            learned = [trajectory_return(reward, t) for t in trajs]
            picked.append(trajs[int(np.argmax(learned))].success)
            best.append(trajs[int(np.argmax([t.ret for t in trajs]))].success)
            mean.append(np.mean([t.success for t in trajs]))
        self.env_steps = before
        out = {"success_learned": float(np.mean(picked)), "success_ground_truth": float(np.mean(best)),
               "success_before": float(np.mean(mean)), "episodes": episodes, "candidates": self.k,
               "env_steps": steps}  # the same trajectories for every reward: equal env steps
        out["ratio"] = out["success_learned"] / out["success_ground_truth"] if out["success_ground_truth"] else None
        return out

    def heldout(self, episodes: int) -> list[Trajectory]:
        """Episodes of held-out seeds played by every candidate: the coverage distribution on which
        any learned reward is judged (whatever the learner)."""
        base, steps = self.seed + HELDOUT_SEED, self.env_steps
        out = [t for s in range(base, base + episodes) for t in self.episode(s)]
        self.env_steps = steps  # judging the reward is not the learner's interaction
        return out


@register_learner("ranking")
def ranking_learner(cfg: PreferConfig, frames: bool) -> RankingLearner:
    return RankingLearner(cfg.task, cfg.candidates, cfg.seed, frames, cfg.render_size, cfg.render_camera,
                          cfg.render_supersample)
