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

Reward sources (``make_reward``): the oracles ``"sparse"`` (1 on a step whose
``info["success"]`` is true; the tasks terminate on success) and ``"dense"`` (the task's
shaped reward); the control ``"constant"``; or any ``embodied.core.reward.RewardModel``
(frames from its camera's observation image or ``env.render()``, states the task's
privileged state, as the contract says). A source that is not an oracle runs only on envs
made with ``end_on_success=False`` and its learner never sees ``info["success"]``: its
episodes end at the time limit or on the source's own success call. The sub-envs of a
``NoiseVecEnv`` step in lockstep through a chunk, so a reward model scores every sub-env's
frame of a step in one batch.
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

REWARDS = ("sparse", "dense", "constant")


class RewardSource:
    """Reward of executed steps, scored for several envs at once.

    ``batch(envs, obs, env_rewards, infos) -> (rewards (n,), terms {name: (n,)}, ends (n,) bool)``:
    one entry per env that stepped; ``ends`` is the source's own call that an episode is
    over (a learned reward's success threshold), False for every step by default.

    ``oracle``: the source reads the simulator (its success or shaped reward). Only an
    oracle source may run on envs that end episodes on success. Every other source (a
    learned reward model, the constant-reward control) runs on envs made with
    ``end_on_success=False``, and ``info["success"]`` is removed before any learner sees
    the step: a learned-reward run never learns from the simulator's success.
    """

    name = "reward"
    oracle = False

    def __call__(self, env: gym.Env, obs: dict[str, Any], env_reward: float, info: dict[str, Any]
                 ) -> tuple[float, dict[str, float]]:
        raise NotImplementedError

    def batch(self, envs: Sequence[gym.Env], obs: Sequence[dict[str, Any]], env_rewards: Sequence[float],
              infos: Sequence[dict[str, Any]]) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        rows = [self(e, o, r, i) for e, o, r, i in zip(envs, obs, env_rewards, infos)]
        rewards = np.array([r for r, _ in rows], np.float64)
        terms = {k: np.array([t.get(k, 0.0) for _, t in rows], np.float64) for k in (rows[0][1] if rows else {})}
        return rewards, terms, np.zeros(len(rows), bool)


class SparseReward(RewardSource):
    """1 on a step whose ``info["success"]`` holds (the oracle reference)."""

    name = "sparse"
    oracle = True

    def __call__(self, env, obs, env_reward, info):
        r = float(bool(info.get("success", False)))
        return r, {"success": r}


class DenseReward(RewardSource):
    """The task's own shaped reward (privileged: an oracle)."""

    name = "dense"
    oracle = True

    def __call__(self, env, obs, env_reward, info):
        return float(env_reward), {k: float(v) for k, v in dict(info.get("reward_terms", {})).items()}


class ConstantReward(RewardSource):
    """The same reward on every step: the control that shows whether a learned reward carries
    information (under the same episode ends, it cannot)."""

    name = "constant"

    def __init__(self, value: float = 0.0):
        if not np.isfinite(value):
            raise ValueError(f"constant reward value={value} is not allowed: must be finite")
        self.value = float(value)

    def __call__(self, env, obs, env_reward, info):
        return self.value, {"constant": self.value}


class ModelReward(RewardSource):
    """A ``RewardModel``'s score of each step's frame and/or state against the instruction.

    Frames are the observation image of ``model.camera`` when the model names one (build the
    env with that camera, ``rewards.wrappers.frame_env_kwargs``), else ``env.render()``.
    States are the task's privileged state, as the contract says. ``success_threshold``: a
    step whose reward reaches it ends the episode (the model's own success call); None:
    episodes end at the time limit only.
    """

    def __init__(self, model: RewardModel, success_threshold: float | None = None):
        if success_threshold is not None and not np.isfinite(success_threshold):
            raise ValueError(f"success_threshold={success_threshold} is not allowed: must be finite or None")
        self.model, self.name = model, type(model).__name__
        self.success_threshold = None if success_threshold is None else float(success_threshold)

    def _frame(self, env: gym.Env, obs: dict[str, Any]) -> np.ndarray:
        cam = self.model.camera
        if cam:
            images = obs.get("images")
            if isinstance(images, dict) and cam in images:
                return images[cam]
            if "image" in obs and tuple(getattr(env.unwrapped, "cameras", ()))[:1] == (cam,):
                return obs["image"]
            raise ValueError(f"reward model {self.name} reads the {cam!r} camera's images: make the env with "
                             f"obs_mode='state+pixels' and cameras=[{cam!r}] (rewards.wrappers.frame_env_kwargs)")
        frame = env.render()
        if frame is None:
            raise ValueError(f"reward model {self.name} reads frames but env.render() returned None: build the "
                             "env with render_mode='rgb_array' (rewards.wrappers.frame_env_kwargs)")
        return frame

    def batch(self, envs, obs, env_rewards, infos):
        frames = states = None
        if "frames" in self.model.inputs:
            frames = np.stack([np.asarray(self._frame(e, o), np.uint8) for e, o in zip(envs, obs)])
        if "states" in self.model.inputs:  # the contract's states: the task's privileged state, as banks record
            states = np.stack([np.asarray(e.unwrapped.privileged_state() if hasattr(e.unwrapped, "privileged_state")
                                          else o["state"], np.float32).reshape(-1) for e, o in zip(envs, obs)])
        out = self.model(frames, states, [str(o["instruction"]) for o in obs])
        rewards = np.asarray(out.reward, np.float64).reshape(-1)
        terms = {k: np.asarray(v, np.float64).reshape(-1) for k, v in out.terms.items()}
        ends = (rewards >= self.success_threshold if self.success_threshold is not None
                else np.zeros(len(rewards), bool))
        return rewards, terms, ends

    def __call__(self, env, obs, env_reward, info):
        r, terms, _ = self.batch([env], [obs], [env_reward], [info])
        return float(r[0]), {k: float(v[0]) for k, v in terms.items()}


def make_reward(reward: str | RewardModel | RewardSource) -> RewardSource:
    """A reward source from ``"sparse"``, ``"dense"``, ``"constant"`` (0 per step), a
    ``RewardModel`` or a ``RewardSource``."""
    if isinstance(reward, RewardSource):
        return reward
    if isinstance(reward, RewardModel):
        return ModelReward(reward)
    if reward == "sparse":
        return SparseReward()
    if reward == "dense":
        return DenseReward()
    if reward == "constant":
        return ConstantReward()
    raise ValueError(f"reward={reward!r} is not allowed: must be one of {REWARDS} or a RewardModel")


def check_episode_ends(env: gym.Env, reward: RewardSource) -> None:
    """Refuse an env that ends episodes on success under a reward that is not the oracle's."""
    if reward.oracle:
        return
    if getattr(env.unwrapped, "end_on_success", None) is not False:
        raise ValueError(f"the {reward.name} reward is not the simulator's, so its episodes must not end on the "
                         "simulator's success (the learner would read success from when episodes end): make the "
                         "env with end_on_success=False")


class ChunkRunner:
    """One env played chunk by chunk with a frozen policy's history (the shared core of both envs)."""

    def __init__(self, env: gym.Env, policy: Policy, reward: RewardSource, n_action_steps: int | None = None):
        check_episode_ends(env, reward)
        self.env, self.policy, self.reward = env, policy, reward
        self.n_action_steps = int(n_action_steps or policy.n_action_steps)
        self.episode = self.new_episode()
        self.ret, self.length, self.t0 = 0.0, 0, time.time()

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.episode = self.new_episode()
        self.episode.push(self.policy.observe(self.episode, obs))
        self.ret, self.length, self.t0 = 0.0, 0, time.time()
        return self.visible(info)

    def visible(self, info: dict[str, Any]) -> dict[str, Any]:
        """``info`` as a learner may see it: without the simulator's success unless the reward is the oracle."""
        if self.reward.oracle:
            return info
        return {k: v for k, v in info.items() if k not in ("success", "is_success")}

    def new_episode(self) -> Episode:
        return Episode(self.policy.n_obs_steps, self.n_action_steps)

    def task_name(self) -> str | None:
        """The registered task the env plays now (a ``TaskMixture`` changes it per episode)."""
        spec = getattr(self.env.unwrapped, "spec_task", None)
        return getattr(spec, "name", None)

    def batch(self) -> dict[str, Any]:
        """The current history as a batch of one (``stack_history``)."""
        return self.episode.batch()

    def execute(self, chunk: np.ndarray | Callable[[], np.ndarray]) -> tuple[float, bool, bool, dict[str, Any]]:
        """Run the first Ta actions of ``chunk`` (H, Da), or Ta actions of ``chunk()`` asked step by
        step (a scripted expert); returns (summed reward, terminated, truncated, info), with the
        actions executed in ``info["executed"]`` (Ta, Da; zero rows after an episode's end)."""
        return run_chunks([self], [chunk])[0]


def run_chunks(runners: Sequence[ChunkRunner], chunks: Sequence[np.ndarray | Callable[[], np.ndarray]]
               ) -> list[tuple[float, bool, bool, dict[str, Any]]]:
    """Execute one chunk per runner, the envs in lockstep, each step's rewards scored in one batch.

    Each runner runs the first Ta actions of its chunk (H, Da), or Ta actions of ``chunk()``,
    and stops early when its episode ends (terminated, truncated, or the reward source's own
    call). Returns per runner (summed reward, terminated, truncated, info) as ``execute``.
    """
    n = len(runners)
    source = runners[0].reward
    ta = runners[0].n_action_steps
    totals, steps = np.zeros(n), np.zeros(n, int)
    terms_sum: list[dict[str, float]] = [{} for _ in range(n)]
    term, trunc, called = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
    last: list[dict[str, Any]] = [{} for _ in range(n)]
    executed = [np.zeros((ta, r.env.action_space.shape[0]), np.float32) for r in runners]
    alive = list(range(n))
    for k in range(ta):
        if not alive:
            break
        stepped = []
        for i in alive:
            executed[i][k] = chunks[i]() if callable(chunks[i]) else chunks[i][k]
            stepped.append(runners[i].env.step(executed[i][k]))
        rewards, terms, ends = source.batch([runners[i].env for i in alive], [s[0] for s in stepped],
                                            [float(s[1]) for s in stepped], [s[4] for s in stepped])
        for j, i in enumerate(alive):
            obs, _, t, tr, info = stepped[j]
            r = runners[i]
            totals[i] += rewards[j]
            steps[i] += 1
            for name, v in terms.items():
                terms_sum[i][name] = terms_sum[i].get(name, 0.0) + float(v[j])
            r.episode.push(r.policy.observe(r.episode, obs))
            term[i], trunc[i], called[i], last[i] = bool(t) or bool(ends[j]), bool(tr), bool(ends[j]), info
        alive = [i for i in alive if not (term[i] or trunc[i])]
    out = []
    for i, r in enumerate(runners):
        r.ret += float(totals[i])
        r.length += int(steps[i])
        info = {**last[i], "env_steps": int(steps[i]), "reward_terms": terms_sum[i], "executed": executed[i]}
        if not source.oracle:
            info["reward_success"] = bool(called[i])  # the reward source's own call, never the simulator's
        if term[i] or trunc[i]:  # SB3's conventions (its Monitor wrapper and success logging)
            info["is_success"] = bool(info.get("success", False))
            info["episode"] = {"r": r.ret, "l": r.length, "t": round(time.time() - r.t0, 6)}
        out.append((float(totals[i]), bool(term[i]), bool(trunc[i]), r.visible(info)))
    return out


def uses_task_names(policy: Policy) -> bool:
    """Whether ``policy`` reads task names (``text_encoder="onehot"``) beside the instruction."""
    return getattr(getattr(policy.unwrapped, "config", None), "text_encoder", None) == "onehot"


def with_task(runner: ChunkRunner, task: str | None, onehot: bool) -> dict[str, Any]:
    """The runner's history as a batch of one, with ``task`` (the fixed name given, else, for a
    policy that reads task names, the task the env plays now)."""
    b = runner.batch()
    name = task if task is not None else (runner.task_name() if onehot else None)
    if name is not None:
        b["task"] = [name]
    return b


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
        task: the task name, given to one-hot policies as ``task`` (None: the env's own task,
            which a ``TaskMixture`` changes per episode).
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
        return with_task(self.runner, self.task, uses_task_names(self.policy))

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
        self._onehot = uses_task_names(policy)
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
        return [with_task(self.runners[i], self.task, self._onehot) for i in rows]

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
        for i, (r, term, trunc, info) in enumerate(run_chunks(self.runners, list(chunks[:, 0]))):
            rewards[i] = r
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
