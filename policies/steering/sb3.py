"""Noise policies trained with stock stable-baselines3 (DSRL-SAC; TD3 and PPO selectable).

Only public SB3 API: the algorithm classes on our ``VecEnv`` (``NoiseVecEnv``), a
``BaseCallback`` for the env-step budget and periodic evaluation, ``policy.predict`` for
acting, and the policy's ``state_dict`` / constructor for saving and restoring the actor.

    model = make_algorithm(SteerConfig(), vec_env, tensorboard_log="RUN/tb")
    model.learn(budget, callback=ProgressCallback(progress))
    steered = SteeredPolicy(base, SB3Actor.of(model, cfg), space)
"""

from __future__ import annotations

from typing import Any, Mapping

import gymnasium as gym
import numpy as np
from stable_baselines3 import PPO, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.noise import NormalActionNoise, VectorizedActionNoise
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper
from torch import nn

from policies.steering.config import SteerConfig
from policies.steering.na import zero_
from policies.steering.noise import NoiseSpace
from policies.steering.policy import NoiseActor
from policies.steering.progress import Progress

#: SB3 algorithm classes by ``SteerConfig.algo``
ALGOS: dict[str, type[BaseAlgorithm]] = {"sac": SAC, "td3": TD3, "ppo": PPO}


def policy_kwargs(cfg: SteerConfig) -> dict[str, Any]:
    """The SB3 ``policy_kwargs`` of a config (JSON-able: saved with the actor)."""
    return {"net_arch": list(cfg.net_arch)}


def make_algorithm(cfg: SteerConfig, env: VecEnv, tensorboard_log: str | None = None, device: str = "cpu",
                   verbose: int = 0) -> BaseAlgorithm:
    """An SB3 ``cfg.algo`` learner on ``env`` (any Box action space: noise or raw actions),
    which sees rewards minus ``cfg.reward_offset`` and minus ``cfg.prior_coef`` times the mean
    squared noise it played (``ShapedReward``).

    ``cfg.utd`` gradient steps per collected transition: SB3's ``gradient_steps`` is
    ``utd * env.num_envs`` (it counts per vector step).
    """
    if cfg.reward_offset or cfg.prior_coef:
        env = ShapedReward(env, cfg.reward_offset, cfg.prior_coef)
    if cfg.algo not in ALGOS:
        raise ValueError(f"algo={cfg.algo!r} is not an SB3 algorithm: must be one of {sorted(ALGOS)} "
                         "('na' runs policies.steering.na.NoiseAliasing)")
    common: dict[str, Any] = dict(learning_rate=cfg.learning_rate, gamma=cfg.gamma, seed=cfg.seed, device=device,
                                  tensorboard_log=tensorboard_log, verbose=verbose, policy_kwargs=policy_kwargs(cfg))
    algo = _make(cfg, env, common)
    if cfg.zero_init:
        zero_mean(algo)
    if tensorboard_log is None and not verbose:
        # SB3's default logger would make an empty SB3-<date> folder in the temp dir at every learn()
        algo.set_logger(Logger(folder=None, output_formats=[]))
    return algo


def zero_mean(algo: BaseAlgorithm) -> None:
    """Zero the layer that gives the actor's mean action, so that its deterministic action is the
    middle of the (symmetric) box: the zero noise. TD3's target actor is set to the same weights."""
    if isinstance(algo, SAC):
        layer = algo.actor.mu
    elif isinstance(algo, TD3):
        layer = [m for m in algo.actor.mu if isinstance(m, nn.Linear)][-1]
    else:
        layer = algo.policy.action_net
    zero_(layer)
    if isinstance(algo, TD3):
        algo.actor_target.load_state_dict(algo.actor.state_dict())


def _make(cfg: SteerConfig, env: VecEnv, common: dict[str, Any]) -> BaseAlgorithm:
    if cfg.algo == "ppo":
        return PPO("MlpPolicy", env, n_steps=cfg.n_steps, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs, **common)
    off = dict(buffer_size=cfg.buffer_size, learning_starts=cfg.learning_starts, batch_size=cfg.batch_size,
               tau=cfg.tau, train_freq=1, gradient_steps=cfg.utd * env.num_envs)
    if cfg.algo == "sac":
        ent = cfg.ent_coef if cfg.ent_coef.startswith("auto") else float(cfg.ent_coef)
        target = "auto" if cfg.target_entropy is None else float(cfg.target_entropy)
        return SAC("MlpPolicy", env, ent_coef=ent, target_entropy=target, **off, **common)
    box = env.action_space
    assert isinstance(box, gym.spaces.Box)
    sigma = cfg.action_noise * (box.high - box.low) / 2
    noise = NormalActionNoise(np.zeros(box.shape), sigma)
    if env.num_envs > 1:
        noise = VectorizedActionNoise(noise, env.num_envs)
    return TD3("MlpPolicy", env, action_noise=noise, **off, **common)


class ShapedReward(VecEnvWrapper):
    """What the learner sees: each step's reward minus ``offset`` (``SteerConfig.reward_offset``)
    and minus ``prior_coef`` times the mean of the squared action over its dimensions
    (``SteerConfig.prior_coef``). On a noise env the action is the initial noise, whose prior is
    N(0, I): the penalty is a scaled negative log-density of the prior, largest away from its mode.
    The ``info`` dicts are untouched (they keep the reward source's own reward)."""

    def __init__(self, venv: VecEnv, offset: float = 0.0, prior_coef: float = 0.0):
        super().__init__(venv)
        self.offset, self.prior_coef = float(offset), float(prior_coef)
        self._actions: np.ndarray | None = None

    def reset(self) -> Any:
        return self.venv.reset()

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions, np.float64).reshape(self.num_envs, -1)
        self.venv.step_async(actions)

    def step_wait(self) -> Any:
        obs, rewards, dones, infos = self.venv.step_wait()
        rewards = rewards - self.offset
        if self.prior_coef:
            assert self._actions is not None, "step_wait before step_async"
            rewards = rewards - self.prior_coef * np.mean(self._actions ** 2, axis=1)
        return obs, rewards.astype(np.float32), dones, infos


class SB3Actor(NoiseActor):
    """An SB3 policy's deterministic action (``predict(..., deterministic=True)``) as a noise actor.

    Saved as the SB3 policy's ``state_dict`` plus the algorithm name and its
    ``policy_kwargs``; restored by building the algorithm's ``MlpPolicy`` class on the same
    spaces and loading the weights (strictly).
    """

    kind = "sb3"

    def __init__(self, policy: BasePolicy, algo: str, kwargs: Mapping[str, Any]):
        self.policy, self.algo, self.kwargs = policy, algo, dict(kwargs)

    @classmethod
    def of(cls, model: BaseAlgorithm, cfg: SteerConfig) -> "SB3Actor":
        return cls(model.policy, cfg.algo, policy_kwargs(cfg))

    def __call__(self, feats: np.ndarray) -> np.ndarray:
        action, _ = self.policy.predict(np.asarray(feats, np.float32), deterministic=True)
        return np.asarray(action, np.float32).reshape(len(feats), -1)

    def describe(self) -> dict[str, Any]:
        return {"algo": self.algo, "policy_kwargs": self.kwargs}

    def tensors(self) -> dict[str, Any]:
        return dict(self.policy.state_dict())

    def load_tensors(self, tensors: Mapping[str, Any]) -> None:
        self.policy.load_state_dict(dict(tensors), strict=True)

    @classmethod
    def restore(cls, meta: Mapping[str, Any], tensors: Mapping[str, Any], space: NoiseSpace,
                feature_dim: int) -> "SB3Actor":
        algo = str(meta.get("algo"))
        if algo not in ALGOS:
            raise ValueError(f"steering actor algo={algo!r} is not allowed: must be one of {sorted(ALGOS)}")
        kwargs = dict(meta.get("policy_kwargs", {}))
        policy_cls = ALGOS[algo].policy_aliases["MlpPolicy"]
        obs_space = gym.spaces.Box(-np.inf, np.inf, (feature_dim,), np.float32)
        policy = policy_cls(obs_space, space.box(), lambda _: 0.0, **kwargs)
        try:
            policy.load_state_dict(dict(tensors), strict=True)
        except RuntimeError as e:
            raise ValueError(f"the saved {algo} steering weights do not fit its policy_kwargs {kwargs}: {e}") from None
        policy.set_training_mode(False)
        return cls(policy, algo, kwargs)


class ProgressCallback(BaseCallback):
    """SB3 callback: count env steps in ``progress`` (budget, bar, evaluation); stop when spent."""

    def __init__(self, progress: Progress):
        super().__init__()
        self.progress = progress

    def _on_step(self) -> bool:
        go = self.progress.update(self.locals["infos"])
        self.logger.record("steer/env_steps", self.progress.env_steps)
        if self.progress.train_success is not None:
            self.logger.record("steer/train_success", self.progress.train_success)
        return go
