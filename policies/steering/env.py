"""The frozen policy as part of the environment: env'(s, w) = env(s, decode(s, w)).

``NoiseEnv`` wraps one gymnasium task env, ``NoiseVecEnv`` several (a stable-baselines3
``VecEnv`` that decodes every sub-env's noise in one batch). Both observe the frozen
policy's features (C,) of the current observation history, take a noise action (Dw,)
in [-bound, bound], decode it into a chunk (H, Da) with ``predict_chunk(obs, noise)``,
execute its first Ta actions (fewer when the episode ends), and return the summed reward
of the executed steps with the last step's ``info`` plus ``env_steps`` (actions executed)
and ``reward_terms`` of the reward source. The history is the one ``Policy.act`` keeps
(``Episode``: every executed step's observation, through ``policy.observe``), so a
``SteeredPolicy`` acting step by step sees exactly the features it was trained on.

Reward sources (``make_reward``): ``"sparse"`` (1 on a step whose ``info["success"]``
is true; the tasks terminate on success), ``"dense"`` (the task's shaped reward) or any
``embodied.core.reward.RewardModel`` (its frames come from ``env.render()``, so build the
env with ``render_mode="rgb_array"`` for a model that reads frames; its states are the
task's privileged state, ``env.unwrapped.privileged_state()``, as the contract says).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env import VecEnv

from embodied.core.policy import Episode, Policy, check_chunk
from embodied.core.reward import RewardModel
from policies.steering.noise import NoiseSpace, check_steerable, feature_dim, features

REWARDS = ("sparse", "dense")


class RewardSource:
    """Reward of one executed step: ``(env, obs, env_reward, info) -> (reward, terms)``."""

    name = "reward"

    def __call__(self, env: gym.Env, obs: dict[str, Any], env_reward: float, info: dict[str, Any]
                 ) -> tuple[float, dict[str, float]]:
        raise NotImplementedError


class SparseReward(RewardSource):
    name = "sparse"

    def __call__(self, env, obs, env_reward, info):
        r = float(bool(info.get("success", False)))
        return r, {"success": r}


class DenseReward(RewardSource):
    name = "dense"

    def __call__(self, env, obs, env_reward, info):
        return float(env_reward), {k: float(v) for k, v in dict(info.get("reward_terms", {})).items()}


class ModelReward(RewardSource):
    """A ``RewardModel``'s score of the step's frame and/or state against the instruction."""

    def __init__(self, model: RewardModel):
        self.model, self.name = model, type(model).__name__

    def __call__(self, env, obs, env_reward, info):
        frames = states = None
        if "frames" in self.model.inputs:
            frame = env.render()
            if frame is None:
                raise ValueError(f"reward model {self.name} reads frames but env.render() returned None: build the "
                                 "env with render_mode='rgb_array'")
            frames = np.asarray(frame, np.uint8)[None]
        if "states" in self.model.inputs:  # the contract's states: the task's privileged state, as banks record
            u = env.unwrapped
            state = u.privileged_state() if hasattr(u, "privileged_state") else obs["state"]
            states = np.asarray(state, np.float32).reshape(1, -1)
        out = self.model(frames, states, str(obs["instruction"]))
        return float(out.reward[0]), {k: float(v[0]) for k, v in out.terms.items()}


def make_reward(reward: str | RewardModel | RewardSource) -> RewardSource:
    """A reward source from ``"sparse"``, ``"dense"``, a ``RewardModel`` or a ``RewardSource``."""
    if isinstance(reward, RewardSource):
        return reward
    if isinstance(reward, RewardModel):
        return ModelReward(reward)
    if reward == "sparse":
        return SparseReward()
    if reward == "dense":
        return DenseReward()
    raise ValueError(f"reward={reward!r} is not allowed: must be one of {REWARDS} or a RewardModel")


class ChunkRunner:
    """One env played chunk by chunk with a frozen policy's history (the shared core of both envs)."""

    def __init__(self, env: gym.Env, policy: Policy, reward: RewardSource, n_action_steps: int | None = None):
        self.env, self.policy, self.reward = env, policy, reward
        self.n_action_steps = int(n_action_steps or policy.n_action_steps)
        self.episode = self.new_episode()
        self.ret, self.length, self.t0 = 0.0, 0, time.time()

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.episode = self.new_episode()
        self.episode.push(self.policy.observe(self.episode, obs))
        self.ret, self.length, self.t0 = 0.0, 0, time.time()
        return info

    def new_episode(self) -> Episode:
        return Episode(self.policy.n_obs_steps, self.n_action_steps)

    def batch(self) -> dict[str, Any]:
        """The current history as a batch of one (``stack_history``)."""
        return self.episode.batch()

    def execute(self, chunk: np.ndarray | Callable[[], np.ndarray]) -> tuple[float, bool, bool, dict[str, Any]]:
        """Run the first Ta actions of ``chunk`` (H, Da), or Ta actions of ``chunk()`` asked step by
        step (a scripted expert); returns (summed reward, terminated, truncated, info), with the
        actions executed in ``info["executed"]`` (Ta, Da; zero rows after an episode's end)."""
        total, terms_sum = 0.0, {}
        terminated = truncated = False
        info: dict[str, Any] = {}
        steps = 0
        ta = self.n_action_steps
        executed = np.zeros((ta, self.env.action_space.shape[0]), np.float32)
        for k in range(ta):
            executed[k] = chunk() if callable(chunk) else chunk[k]
            obs, env_reward, terminated, truncated, info = self.env.step(executed[k])
            steps += 1
            r, terms = self.reward(self.env, obs, float(env_reward), info)
            total += r
            for k, v in terms.items():
                terms_sum[k] = terms_sum.get(k, 0.0) + v
            self.episode.push(self.policy.observe(self.episode, obs))
            if terminated or truncated:
                break
        self.ret += total
        self.length += steps
        info = {**info, "env_steps": steps, "reward_terms": terms_sum, "executed": executed}
        if terminated or truncated:  # SB3's conventions (its Monitor wrapper and success logging)
            info["is_success"] = bool(info.get("success", False))
            info["episode"] = {"r": self.ret, "l": self.length, "t": round(time.time() - self.t0, 6)}
        return total, bool(terminated), bool(truncated), info


def decode_rows(policy: Policy, space: NoiseSpace, batches: Sequence[dict[str, Any]], w: Any) -> np.ndarray:
    """Chunks (B, H, Da) of B batches of one and their noise actions w (B, Dw), in one call."""
    w = space.check(w, rows=len(batches))
    return check_chunk(policy.predict_chunk(stack_batches(batches), space.to_chunk(w)), len(batches))


def stack_batches(batches: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate batches of one (``Episode.batch``) into one batch of B rows."""
    out: dict[str, Any] = {"instruction": [b["instruction"][0] for b in batches],
                           "state": np.concatenate([b["state"] for b in batches])}
    for key in ("image",):
        if key in batches[0]:
            out[key] = np.concatenate([b[key] for b in batches])
    if "images" in batches[0]:
        out["images"] = {c: np.concatenate([b["images"][c] for b in batches]) for c in batches[0]["images"]}
    if "task" in batches[0]:
        out["task"] = [b["task"][0] for b in batches]
    return out


class NoiseEnv(gym.Wrapper):
    """One task env whose action is the frozen policy's initial noise (see the module docstring).

    Args:
        env: a task env (dict observations with ``state`` and ``instruction``).
        policy: the frozen flow/diffusion policy (or wrappers around one, e.g. grounding).
        space: the noise action space (``NoiseSpace.for_policy``).
        reward: ``"sparse"``, ``"dense"``, a ``RewardModel`` or a ``RewardSource``.
        task: the task name, given to one-hot policies as ``task``.
    """

    def __init__(self, env: gym.Env, policy: Policy, space: NoiseSpace, reward: Any = "sparse",
                 task: str | None = None):
        super().__init__(env)
        check_steerable(policy)
        self.policy, self.space, self.task = policy, space, task
        self.runner = ChunkRunner(env, policy, make_reward(reward))
        self.action_space = space.box()
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (feature_dim(policy),), np.float32)

    def _batch(self) -> dict[str, Any]:
        b = self.runner.batch()
        if self.task is not None:
            b["task"] = [self.task]
        return b

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        info = self.runner.reset(seed=seed, options=options)
        return features(self.policy, self._batch())[0], info

    def step(self, action: Any):
        chunk = decode_rows(self.policy, self.space, [self._batch()], np.asarray(action)[None])
        reward, terminated, truncated, info = self.runner.execute(chunk[0])
        return features(self.policy, self._batch())[0], reward, terminated, truncated, info


class NoiseVecEnv(VecEnv):
    """Several task envs as one stable-baselines3 ``VecEnv`` over the noise space.

    Every ``step`` decodes all sub-envs' noise in one ``predict_chunk`` call and computes
    their next features in one ``encode_obs`` call. A sub-env whose episode ends is reset
    at once (SB3's convention): its ``info`` then holds ``terminal_observation`` (the
    features of the last history) and ``TimeLimit.truncated``.

    Every ``info`` has ``chunk``: the executed part (Ta, Da) of the decoded chunk. With
    ``alias_samples`` K > 0 the same call also decodes K noises per sub-env drawn from
    N(0, I) clipped to the bound, returned as ``alias_noise`` (K, Dw) and ``alias_chunk``
    (K, Ta, Da): the (state, noise, action) pairs DSRL-NA distils its noise critic on.

    Args:
        env_fns: one constructor per sub-env.
        policy, space, reward, task: as in ``NoiseEnv``.
        alias_samples: K, extra noises decoded per sub-env and step.
        seed: seed of those extra noises.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], policy: Policy, space: NoiseSpace,
                 reward: Any = "sparse", task: str | None = None, alias_samples: int = 0, seed: int = 0):
        check_steerable(policy)
        if alias_samples < 0:
            raise ValueError(f"alias_samples={alias_samples} is not allowed: must be >= 0")
        self.policy, self.space, self.task = policy, space, task
        self.alias_samples, self._rng = int(alias_samples), np.random.default_rng(seed)
        source = make_reward(reward)
        self.runners = [ChunkRunner(fn(), policy, source) for fn in env_fns]
        if len({id(r.env) for r in self.runners}) != len(self.runners):
            raise ValueError("env_fns must build a new env on every call (they returned the same env twice)")
        obs_space = gym.spaces.Box(-np.inf, np.inf, (feature_dim(policy),), np.float32)
        self._actions: np.ndarray | None = None
        super().__init__(len(self.runners), obs_space, space.box())

    def _batches(self, rows: Sequence[int] | None = None) -> list[dict[str, Any]]:
        rows = range(self.num_envs) if rows is None else rows
        out = [self.runners[i].batch() for i in rows]
        if self.task is not None:
            for b in out:
                b["task"] = [self.task]
        return out

    def _features(self) -> np.ndarray:
        return features(self.policy, stack_batches(self._batches()))

    def reset(self) -> np.ndarray:
        for i, runner in enumerate(self.runners):
            opts = self._options[i] or None
            self.reset_infos[i] = runner.reset(seed=self._seeds[i], options=opts)
        self._reset_seeds()
        self._reset_options()
        return self._features()

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self):
        if self._actions is None:
            raise RuntimeError("step_wait() called before step_async()")
        batches, w = self._batches(), self.space.check(self._actions, rows=self.num_envs)
        self._actions = None
        k = self.alias_samples
        alias = np.clip(self._rng.standard_normal((self.num_envs, k, self.space.dim)), -self.space.bound,
                        self.space.bound).astype(np.float32)
        rows = np.concatenate([w[:, None], alias], axis=1).reshape(-1, self.space.dim)  # env-major, chosen first
        chunks = decode_rows(self.policy, self.space, [b for b in batches for _ in range(k + 1)], rows)
        chunks = chunks.reshape(self.num_envs, k + 1, *chunks.shape[1:])[:, :, : self.policy.n_action_steps]
        rewards = np.zeros(self.num_envs, np.float32)
        dones = np.zeros(self.num_envs, bool)
        infos: list[dict[str, Any]] = []
        ended = []
        for i, runner in enumerate(self.runners):
            rewards[i], term, trunc, info = runner.execute(chunks[i, 0])
            info["chunk"] = chunks[i, 0]
            if k:
                info["alias_noise"], info["alias_chunk"] = alias[i], chunks[i, 1:]
            dones[i] = term or trunc
            info["TimeLimit.truncated"] = trunc and not term
            infos.append(info)
            if dones[i]:
                ended.append(i)
        if ended:  # the features of the last histories, then a fresh episode
            final = features(self.policy, stack_batches(self._batches(ended)))
            for j, i in enumerate(ended):
                infos[i]["terminal_observation"] = final[j]
                self.reset_infos[i] = self.runners[i].reset()
        return self._features(), rewards, dones, infos

    def close(self) -> None:
        for r in self.runners:
            r.env.close()

    # SB3's VecEnv interface, on the task envs (explicit: no attribute forwarding beyond it)
    def _targets(self, indices: Any) -> list[gym.Env]:
        return [self.runners[i].env for i in self._get_indices(indices)]

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [env.get_wrapper_attr(attr_name) for env in self._targets(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        for env in self._targets(indices):
            setattr(env, attr_name, value)

    def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
        return [env.get_wrapper_attr(method_name)(*args, **kwargs) for env in self._targets(indices)]

    def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
        from stable_baselines3.common.env_util import is_wrapped

        return [is_wrapped(env, wrapper_class) for env in self._targets(indices)]

    def get_images(self) -> list[Any]:
        return [r.env.render() for r in self.runners]
