"""The ``pebble`` learner: PEBBLE (Lee et al. 2021) on stable-baselines3 SAC in raw action space."""

from __future__ import annotations

from typing import Any, Callable

import gymnasium as gym
import numpy as np

from embodied.core.reward import RewardModel
from rewards.preference.config import PreferConfig, register_learner
from rewards.preference.episodes import HELDOUT_SEED, frame_env
from rewards.preference.segments import Trajectory


def knn_entropy_reward(x: np.ndarray, k: int) -> np.ndarray:
    """PEBBLE's state-entropy bonus of each row of ``x`` (B, D): log(1 + distance to its k-th
    nearest other row), the particle estimate of the states' entropy up to constants."""
    d = np.linalg.norm(x[:, None, :] - x[None], axis=-1)
    k = min(k, len(x) - 1)
    return np.log1p(np.partition(d, k, axis=1)[:, k]).astype(np.float32)  # column 0 is the row itself


def _relabel_buffer_class() -> type:
    from stable_baselines3.common.buffers import ReplayBuffer

    class RelabelBuffer(ReplayBuffer):
        """SB3's replay buffer whose stored rewards ``relabel`` rewrites in place with a new reward
        (PEBBLE: after every reward update, the whole buffer), and which hands out the state-entropy
        bonus of the sampled next states instead while ``intrinsic_k`` > 0 (unsupervised pre-training)."""

        intrinsic_k = 0

        def relabel(self, reward_fn: Callable[[np.ndarray], np.ndarray]) -> int:
            n = self.buffer_size if self.full else self.pos
            if n:
                obs = self.observations[:n].reshape(n * self.n_envs, -1)
                r = np.concatenate([reward_fn(obs[i:i + 4096]) for i in range(0, len(obs), 4096)])
                self.rewards[:n] = r.reshape(n, self.n_envs)
            return n * self.n_envs

        def _get_samples(self, batch_inds: np.ndarray, env: Any = None) -> Any:
            data = super()._get_samples(batch_inds, env)
            if self.intrinsic_k:
                r = knn_entropy_reward(data.next_observations.cpu().numpy(), self.intrinsic_k)
                data = data._replace(rewards=self.to_torch(r.reshape(-1, 1)))
            return data

    return RelabelBuffer


class StateRewardEnv(gym.Wrapper):
    """A task env for SAC in its own action space: observations are the privileged state, the
    reward of a step is ``reward(the state it was taken in (1, Ds), instruction)`` (0 while it is
    None), or the task's own (``"dense"``) or success (``"sparse"``). Finished episodes are kept
    as ``Trajectory`` objects padded as ``rollout`` pads them (``take``)."""

    def __init__(self, env: gym.Env, reward: Any = None, frames: bool = False, record: bool = True):
        super().__init__(env)
        n = len(env.unwrapped.privileged_state())
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (n,), np.float32)
        self.reward, self.frames, self.record = reward, frames, record
        self.finished: list[Trajectory] = []
        self.steps = 0
        self._ep: dict[str, Any] = {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        _, info = self.env.reset(seed=seed, options=options)
        self._ep = {"states": [], "actions": [], "rewards": [], "frames": [], "success": bool(info["success"]),
                    "seed": seed}
        return self.env.unwrapped.privileged_state(), info

    def step(self, action: Any):
        u = self.env.unwrapped
        s = u.privileged_state()
        frame = self.env.render() if self.record and self.frames else None
        obs, r_env, term, trunc, info = self.env.step(action)
        self.steps += 1
        ok = bool(info["success"])
        if self.reward == "dense":
            r = float(r_env)
        elif self.reward == "sparse":
            r = float(ok)
        elif self.reward is None:
            r = 0.0
        else:
            r = float(self.reward(s[None], u.instruction)[0])
        if self.record:
            e = self._ep
            e["states"].append(s)
            e["actions"].append(np.asarray(action, np.float32))
            e["rewards"].append(float(r_env))
            if frame is not None:
                e["frames"].append(frame)
            e["success"] = e["success"] or ok
            if term or trunc:
                self._finish()
        return u.privileged_state(), r, term, trunc, info

    def _finish(self) -> None:
        e, u = self._ep, self.env.unwrapped
        steps, pad = len(e["actions"]), u.max_episode_steps - len(e["actions"])
        frames = np.array(e["frames"] + [e["frames"][-1]] * pad, np.uint8) if self.frames else None
        self.finished.append(Trajectory(np.array(e["states"] + [e["states"][-1]] * pad, np.float32),
                                        np.array(e["actions"] + [np.zeros_like(e["actions"][-1])] * pad, np.float32),
                                        np.array(e["rewards"] + [e["rewards"][-1]] * pad, np.float32),
                                        u.instruction, e["success"], frames,
                                        {"learner": "pebble", "seed": e["seed"], "steps": steps}))

    def take(self) -> list[Trajectory]:
        """The episodes finished since the last call."""
        out, self.finished = self.finished, []
        return out


class PebbleLearner:
    """PEBBLE (Lee et al. 2021) on stable-baselines3 SAC in the task's raw action space.

    Round 0's ``rollout`` first pre-trains without reward for ``pebble_unsup_steps`` env steps,
    SAC maximising the k-NN particle estimate of its states' entropy (``knn_entropy_reward`` of
    the sampled next states), then plays ``episodes`` episodes; later rounds play ``episodes``
    episodes with the current learned reward (SAC keeps learning all along). Queries come from
    those episodes. ``improve`` relabels every transition of the replay buffer with the new
    reward (shifted below zero, as ``load_reward`` does) and gives it to the env for new steps.
    ``evaluate`` compares the deterministic SAC policy with one SAC trained from scratch on the
    ground-truth reward (``pebble_ground_truth``) for the same env steps and seed, on held-out
    seeds; ``success_before`` is the untrained policy's.
    """

    def __init__(self, cfg: PreferConfig, frames: bool):
        self.cfg, self.frames = cfg, frames
        self.task = cfg.task_names[0]  # one task (PreferConfig refuses several for pebble)
        self.env = frame_env(self.task, frames, cfg.render_size, cfg.render_camera, cfg.render_supersample)
        self.wrapped = StateRewardEnv(self.env, None, frames)
        self.model = self._sac(self.wrapped)
        self.model.replay_buffer.intrinsic_k = cfg.pebble_knn if cfg.pebble_unsup_steps else 0
        self.pretrained = cfg.pebble_unsup_steps == 0
        self.success_before = None
        self.updates = 0

    @property
    def env_steps(self) -> int:
        return self.wrapped.steps

    def _sac(self, env: Any) -> Any:
        from stable_baselines3 import SAC
        from stable_baselines3.common.logger import Logger

        model = SAC("MlpPolicy", env, replay_buffer_class=_relabel_buffer_class(),
                    learning_starts=self.cfg.pebble_learning_starts, seed=self.cfg.seed, device="cpu", verbose=0)
        # SB3's default logger would make an empty SB3-<date> folder in the temp dir at every learn()
        model.set_logger(Logger(folder=None, output_formats=[]))
        return model

    def _learn(self, model: Any, steps: int = 0, episodes: int = 0) -> None:
        """SAC for ``steps`` env steps, or until ``episodes`` more episodes have ended."""
        from stable_baselines3.common.callbacks import BaseCallback

        class Stop(BaseCallback):
            ended = 0

            def _on_step(self) -> bool:  # SB3 stores a step only after this returns True
                if episodes and self.ended >= episodes:
                    return False  # the step that opened the next episode: dropped, and that episode restarted below
                self.ended += int(np.sum(self.locals["dones"]))
                return True

        limit = steps or (episodes + 1) * self.env.unwrapped.max_episode_steps
        model.learn(limit, callback=Stop(), reset_num_timesteps=False, progress_bar=False)
        if episodes:
            model._last_obs = model.env.reset()

    def rollout(self, episodes: int) -> list[Trajectory]:
        if self.success_before is None:
            self.success_before = self._success(self.model, self.cfg.eval_episodes)
        if not self.pretrained:
            self._learn(self.model, steps=self.cfg.pebble_unsup_steps)
            self.pretrained = True
        self._learn(self.model, episodes=episodes)
        return self.wrapped.take()

    def improve(self, reward: RewardModel) -> dict[str, Any]:
        top = float(reward.reward_range[1])

        def fn(states: np.ndarray, instruction: str | None = None) -> np.ndarray:
            return reward(None, states, instruction or self.env.unwrapped.instruction).reward - top

        buf = self.model.replay_buffer
        buf.intrinsic_k = 0  # pre-training is over once there is a learned reward
        self.wrapped.reward = fn
        n = buf.relabel(fn)
        self.updates += 1
        return {"relabelled": n}

    def _success(self, model: Any, episodes: int) -> float:
        env = StateRewardEnv(frame_env(self.task, False, 0), "sparse", record=False)
        base, wins = self.cfg.seed + 2 * HELDOUT_SEED, 0
        for k in range(episodes):
            obs, info = env.reset(seed=base + k)
            ok = bool(info["success"])
            for _ in range(env.unwrapped.max_episode_steps):
                a, _ = model.predict(obs, deterministic=True)
                obs, _, term, trunc, info = env.step(a)
                ok = ok or bool(info["success"])
                if term or trunc:
                    break
            wins += ok
        env.close()
        return wins / episodes

    def evaluate(self, episodes: int, reward: RewardModel) -> dict[str, Any]:
        gt_env = StateRewardEnv(frame_env(self.task, False, 0), self.cfg.pebble_ground_truth, record=False)
        gt = self._sac(gt_env)
        self._learn(gt, steps=self.env_steps)
        out = {"success_learned": self._success(self.model, episodes),
               "success_ground_truth": self._success(gt, episodes),
               "success_before": self.success_before, "episodes": episodes, "env_steps": self.env_steps,
               "env_steps_ground_truth": gt_env.steps, "ground_truth": self.cfg.pebble_ground_truth,
               "unsupervised_steps": self.cfg.pebble_unsup_steps, "reward_updates": self.updates}
        out["ratio"] = out["success_learned"] / out["success_ground_truth"] if out["success_ground_truth"] else None
        return out


@register_learner("pebble")
def _pebble(cfg: PreferConfig, frames: bool) -> PebbleLearner:
    return PebbleLearner(cfg, frames)
