"""``embodied prefer``: learn a reward from preferences with any teacher, and improve a policy with it.

    embodied prefer task=press-button teacher=oracle                   # simulated teacher (B-Pref presets)
    embodied prefer task=press-button teacher=mistake labels=labels/pb  # reuse and extend a label store
    embodied prefer task=press-button teacher=human budget=40           # a person, on the label page
    embodied prefer task=press-button teacher=vlm vlm_reward=clip +vlm_settings.checkpoint=RUN/reward abstain=0.02
    embodied prefer task=reach learner=steer checkpoint=RUN/checkpoints/step_0000400 steer_env_steps=10000
    embodied prefer task=press-button learner=pebble pebble_unsup_steps=1000       # PEBBLE on SB3 SAC
    embodied prefer eval task=press-button reward_path=outputs/prefer/.../reward.pt
    embodied prefer plot runs=[outputs/prefer/a,outputs/prefer/b] out=curve.png

Learners (``LEARNERS``): ``ranking`` selects the best of K scripted candidate trajectories by the
learned reward (no policy is trained); ``steer`` trains a policy by latent-noise steering of a
checkpoint (``SteerLearner``); ``pebble`` is PEBBLE on SAC in raw action space (``PebbleLearner``).

One round (PEBBLE's loop, with the learner behind ``Learner``):
  1. the learner rolls out episodes (with its current reward) -> trajectories join the pool;
  2. candidate pairs of segments are drawn from the pool (``oversample`` × the round's labels)
     and the most informative are kept (``rewards.preference.queries``);
  3. each query is written to the store, the teacher answers, each answer is appended;
  4. the ensemble is trained on every label in the store (earlier runs' included);
  5. the learner improves with the new reward; held-out reward quality is recorded.

Held-out quality (per round, in ``metrics.json["curve"]``): preference accuracy and ECE on
pairs from held-out episodes labelled by the exact ground truth, Spearman of learned vs
ground-truth episode return, and success AUROC of the learned return.

Episodes that end in success before the time limit are padded to it with their final step
(an absorbing state), so that a segment or return never favours failing slowly over
succeeding quickly.
"""

from __future__ import annotations

import importlib
import logging
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence

import gymnasium as gym
import numpy as np

from embodied.core.policy import check_chunk
from embodied.core.registry import get_task, make_env
from embodied.core.reward import RewardModel
from rewards.preference import metrics as M
from rewards.preference.model import PreferenceReward, RewardConfig
from rewards.preference.queries import SCHEDULES, SELECTIONS, check_choice, schedule, select
from rewards.preference.segments import Query, Trajectory, sample_pairs
from rewards.preference.store import ON_MALFORMED, LabelStore
from rewards.preference.teachers import PRESETS, RewardModelTeacher, Teacher, make_simulated

log = logging.getLogger("embodied.prefer")
ACTIONS = ("run", "eval", "plot")
TEACHERS = (*PRESETS, "vlm", "human")
HELDOUT_SEED = 1_000_000  # held-out episodes use seed + HELDOUT_SEED + k; evaluation + 2 * HELDOUT_SEED


@dataclass
class PreferConfig:
    """Schema of ``configs/prefer.yaml``."""

    action: str = "run"  # run | eval | plot
    task: str = "press-button"
    teacher: str = "oracle"  # a B-Pref preset (oracle, stochastic, mistake, skip, equal, myopic), vlm or human
    beta: Optional[float] = None  # override the preset's rationality (B-Pref β)
    gamma: Optional[float] = None  # ... its myopic discount
    eps: Optional[float] = None  # ... its mistake probability
    skip: Optional[float] = None  # ... its skip threshold (fraction of the segment-return margin)
    equal: Optional[float] = None  # ... its equal threshold (fraction of the margin)
    vlm_reward: str = ""  # teacher=vlm: a rewards.registry name (clip) or "module:factory" of a frame RewardModel
    vlm_settings: dict[str, Any] = field(default_factory=dict)  # teacher=vlm: +vlm_settings.checkpoint=DIR
    abstain: float = 0.0  # teacher=vlm: skip when the two clips' scores differ by less than this
    labels: str = ""  # label store directory (reused and extended); default <run dir>/labels
    labels_on_malformed: str = "raise"  # raise (name each bad line) | quarantine (move them aside)
    budget: int = 300  # labels asked in this run
    rounds: int = 6
    schedule: str = "constant"  # constant | hyperbolic | inverse_quadratic
    selection: str = "disagreement"  # uniform | disagreement | entropy
    oversample: int = 10  # candidate pairs per label asked
    segment_length: int = 25  # steps per segment
    episodes_per_round: int = 3  # learner episodes per round (the ranking learner plays each with every candidate)
    reward: RewardConfig = field(default_factory=RewardConfig)
    learner: str = "ranking"  # ranking (best-of-K selection) | steer (latent-noise steering of a checkpoint)
    candidates: int = 8  # ranking learner: behaviours per episode
    checkpoint: str = ""  # learner=steer: the flow/diffusion checkpoint of `embodied train` to steer
    steer_env_steps: int = 10_000  # learner=steer: env steps of steering, with the learned and the ground-truth reward
    steer_ground_truth: str = "sparse"  # learner=steer: the ground-truth reward it is compared with (sparse | dense)
    steer_reference: str = ""  # learner=steer: a finished ground-truth `embodied steer` run to reuse (same settings)
    steer_eval_every: int = 2500  # learner=steer: env steps between evaluations of the curve
    steer: dict[str, Any] = field(default_factory=lambda: {"utd": 2})  # learner=steer: SteerConfig fields
    pebble_unsup_steps: int = 1000  # learner=pebble: env steps of unsupervised pre-training (state entropy)
    pebble_knn: int = 5  # learner=pebble: k of the k-NN particle entropy estimate
    pebble_ground_truth: str = "dense"  # learner=pebble: the reward of the SAC it is compared with (dense | sparse)
    pebble_learning_starts: int = 500  # learner=pebble: SAC's random-action steps before its first update
    heldout_episodes: int = 10
    heldout_pairs: int = 400
    eval_episodes: int = 30
    render: bool = False  # record frames (forced on for the vlm and human teachers and image rewards)
    render_size: int = 64  # side of recorded frames (teacher=vlm: the reward's own, when it says)
    render_camera: str = ""  # camera of recorded frames (default: the task's; teacher=vlm: the reward's own)
    port: int = 8765  # teacher=human: the label page's port (loopback)
    seed: int = 0
    reward_path: str = ""  # action=eval: a reward written by `embodied prefer` (reward.pt)
    runs: list[str] = field(default_factory=list)  # action=plot: run directories
    out: str = ""  # action=plot: the figure's path; default <run dir>/curve.png

    def __post_init__(self) -> None:
        check_choice("action", self.action, ACTIONS)
        check_choice("teacher", self.teacher, TEACHERS)
        check_choice("learner", self.learner, tuple(LEARNERS))
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("selection", self.selection, SELECTIONS)
        check_choice("labels_on_malformed", self.labels_on_malformed, ON_MALFORMED)
        for name in ("rounds", "oversample", "segment_length", "episodes_per_round", "candidates",
                     "heldout_episodes", "heldout_pairs", "eval_episodes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.budget < 0 or self.seed < 0:
            raise ValueError(f"budget and seed must be >= 0, got budget={self.budget}, seed={self.seed}")
        if self.teacher == "vlm" and not self.vlm_reward:
            from rewards.registry import REWARDS

            raise ValueError(f"teacher=vlm needs vlm_reward=NAME (one of {sorted(REWARDS)}, with vlm_settings="
                             "{checkpoint:DIR}) or vlm_reward=module:factory (a callable returning a frame "
                             "RewardModel)")
        if self.action == "eval" and not self.reward_path:
            raise ValueError("`embodied prefer eval` needs reward_path=PATH (the reward.pt of a prefer run)")
        if self.action == "plot" and not self.runs:
            raise ValueError("`embodied prefer plot` needs runs=[DIR,...] (prefer run directories)")
        if isinstance(self.reward, dict):
            self.reward = RewardConfig(**self.reward)
        if self.learner == "steer":
            if not self.checkpoint:
                raise ValueError("learner=steer needs checkpoint=RUN/checkpoint (a flow or diffusion policy of "
                                 "`embodied train`)")
            check_choice("steer_ground_truth", self.steer_ground_truth, ("sparse", "dense"))
            if self.steer_env_steps < 1 or self.steer_eval_every < 0:
                raise ValueError(f"steer_env_steps must be >= 1 and steer_eval_every >= 0, got "
                                 f"{self.steer_env_steps}, {self.steer_eval_every}")
        if self.learner == "pebble":
            check_choice("pebble_ground_truth", self.pebble_ground_truth, ("sparse", "dense"))
            if self.pebble_unsup_steps < 0 or self.pebble_knn < 1 or self.pebble_learning_starts < 0:
                raise ValueError(f"pebble_unsup_steps and pebble_learning_starts must be >= 0 and pebble_knn >= 1, got "
                                 f"{self.pebble_unsup_steps}, {self.pebble_learning_starts}, {self.pebble_knn}")
        if self.learner in ("steer", "pebble"):
            if self.reward.input != "state":
                raise ValueError(f"learner={self.learner} learns with a state reward (the privileged state of each "
                                 f"step): reward.input must be 'state', got {self.reward.input!r}")

    @property
    def needs_frames(self) -> bool:
        return self.render or self.teacher in ("vlm", "human") or self.reward.input == "image"


# ------------------------------------------------------------------ trajectories
def rollout(env: Any, seed: int, act: Callable[[Any, np.random.Generator, Any], np.ndarray], frames: bool,
            info: dict[str, Any]) -> tuple[Trajectory, int]:
    """One episode with ``act(env.unwrapped, rng, obs) -> action``; returns it padded to the time
    limit, and its real steps."""
    obs, inf = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    u = env.unwrapped
    states, actions, rewards, imgs = [], [], [], []
    success, steps = bool(inf["success"]), 0
    for _ in range(u.max_episode_steps):
        a = np.asarray(act(u, rng, obs), np.float32)
        states.append(u.privileged_state())
        if frames:
            imgs.append(env.render())
        obs, r, term, trunc, inf = env.step(a)
        actions.append(a)
        rewards.append(r)
        steps += 1
        success = success or bool(inf["success"])
        if term or trunc:
            break
    for _ in range(u.max_episode_steps - steps):  # absorbing final step (see the module docstring)
        states.append(states[-1]), actions.append(np.zeros_like(actions[-1])), rewards.append(rewards[-1])
        if frames:
            imgs.append(imgs[-1])
    traj = Trajectory(np.array(states, np.float32), np.array(actions, np.float32), np.array(rewards, np.float32),
                      u.instruction, success, np.array(imgs, np.uint8) if frames else None,
                      {**info, "seed": seed, "steps": steps})
    return traj, steps


def candidate_behaviour(seed: int, k: int, action_dim: int) -> Callable[[Any, np.random.Generator, Any], np.ndarray]:
    """Behaviour k of episode ``seed``: the scripted expert with probability p, else a fixed random
    push (plus noise); p and the push are drawn per (seed, k), so candidates range from expert to aimless."""
    r = np.random.default_rng([seed, k, 7])
    p, push = float(r.uniform(0.0, 1.0)), r.uniform(-1.0, 1.0, action_dim)

    def act(u: Any, rng: np.random.Generator, obs: Any = None) -> np.ndarray:
        if rng.random() < p:
            return np.clip(u.expert_action(), -1, 1)
        return np.clip(push + 0.3 * rng.normal(size=action_dim), -1, 1)

    return act


def trajectory_return(reward: RewardModel, t: Trajectory) -> float:
    """Σ_t r̂ over a trajectory under any ``RewardModel`` (states for state rewards, frames for image ones)."""
    states = t.states
    if isinstance(reward, PreferenceReward) and reward.cfg.input == "state_action":
        states = np.concatenate([t.states, t.actions], -1)
    frames = t.frames if "frames" in reward.inputs else None
    return float(np.sum(reward(frames, states if "states" in reward.inputs else None, t.instruction).reward))


def frame_env(task: str, frames: bool, size: int, camera: str = "", **kw: Any) -> Any:
    """``make_env(task, **kw)`` whose ``render()`` gives (size, size) frames of ``camera`` (default:
    the task's render camera) when ``frames``; the same pixels as that camera's observation images
    at that size, which is what a camera-fitted reward (the VLM teacher's) reads."""
    if frames:
        kw.update(render_mode="rgb_array", render_size=size)
    env = make_env(task, **kw)
    if frames and camera:
        u = env.unwrapped
        valid = [u.model.camera(i).name for i in range(u.model.ncam)]
        if camera not in valid:
            raise ValueError(f"render_camera={camera!r} is not a camera of task {task!r}; its cameras: {valid}")
        u.render_camera = camera
    return env


# ----------------------------------------------------------------------- learners
class Learner(Protocol):
    """What improves a policy with a reward, registered by name in ``LEARNERS``.

    ``rollout`` plays the learner's policy and returns its episodes (privileged states, actions,
    ground-truth rewards, frames when asked); ``improve`` updates it with ``reward`` (any
    ``RewardModel``, read through the contract only); ``evaluate`` compares the policy improved
    with the learned reward to one improved with the ground-truth reward for the same number of
    env steps. ``evaluate`` returns at least ``success_learned``, ``success_ground_truth``,
    ``success_before``, ``episodes`` and ``env_steps``. A learner with an ``out`` attribute gets
    the run directory there (for what it writes).
    """

    env_steps: int  # environment steps taken so far (the x-axis of a fair comparison)

    def rollout(self, episodes: int) -> list[Trajectory]:
        """Play ``episodes`` new episodes with the current policy: the data queries are drawn from."""

    def improve(self, reward: RewardModel) -> dict[str, Any]:
        """Update the policy with the (new) reward; return what to log."""

    def evaluate(self, episodes: int, reward: RewardModel) -> dict[str, Any]:
        """Success of the policy improved with ``reward``, of the same with the ground-truth reward,
        and of the policy before improvement, on the same held-out seeds and env steps."""


class RankingLearner:
    """Best-of-K: each episode is played by K candidate behaviours (``candidate_behaviour``) and the
    policy's episode is the one the reward ranks highest — the zeroth-order form of steering (the
    candidates play the role of K noise draws). Improvement needs no gradient step: a new reward
    changes the ranking. Seeds fix each candidate's episode, so the learned and the ground-truth
    reward rank the very same trajectories (equal env steps)."""

    def __init__(self, task: str, candidates: int, seed: int, frames: bool, render_size: int, camera: str = ""):
        self.env = frame_env(task, frames, render_size, camera)
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


LearnerFactory = Callable[[PreferConfig, bool], Learner]  # (cfg, record frames) -> Learner
#: learners by name; ``learner=NAME`` picks one (steering registers here)
LEARNERS: dict[str, LearnerFactory] = {}


def register_learner(name: str) -> Callable[[LearnerFactory], LearnerFactory]:
    def add(factory: LearnerFactory) -> LearnerFactory:
        LEARNERS[name] = factory
        return factory

    return add


@register_learner("ranking")
def _ranking(cfg: PreferConfig, frames: bool) -> RankingLearner:
    return RankingLearner(cfg.task, cfg.candidates, cfg.seed, frames, cfg.render_size, cfg.render_camera)


def policy_behaviour(policy: Any, task: str | None) -> Callable[[Any, np.random.Generator, Any], np.ndarray]:
    """A trained ``Policy`` as a behaviour for ``rollout`` (chunk by chunk, its own sampler noise);
    one-hot policies get ``task``. A fresh behaviour per episode."""
    ep = policy.new_episode()

    def act(u: Any, rng: np.random.Generator, obs: Any) -> np.ndarray:
        ep.push(policy.observe(ep, obs))
        if ep.needs_chunk:
            batch = ep.batch()
            if task is not None:
                batch["task"] = [task]
            ep.fill(check_chunk(policy.predict_chunk(batch), 1)[0])
        return ep.pop()

    return act


class SteerLearner:
    """Latent-noise steering (DSRL; ``embodied steer``) of a demonstration-trained checkpoint, with
    the learned reward and, for comparison, with the ground-truth reward.

    Two stages. ``rollout`` plays the checkpoint's own policy (its sampler's noise varies, so do
    its episodes): queries are cut from what the policy to be improved does. Once the reward is
    learned, ``evaluate`` steers the checkpoint from scratch for ``steer_env_steps`` env steps with
    it (``rewards.preference.model:load_reward``: the reward shifted below zero) and, on the same
    seeds, settings and env steps, with the ground-truth reward (``steer_ground_truth``; or reuses
    the finished run ``steer_reference``). Each is an ordinary ``embodied steer`` run, written under
    the prefer run's ``steer_learned/`` and ``steer_ground_truth/`` (metrics, curve, the steered
    checkpoint). The noise policy trains once, on the final reward, so there is no replay buffer to
    relabel between reward updates (the PEBBLE learner, ``learner=pebble``, relabels).

    ``env_steps`` counts the query episodes; the steering runs' own env steps are in ``evaluate``'s
    ``env_steps`` (equal for both rewards).
    """

    def __init__(self, cfg: PreferConfig, frames: bool):
        from embodied.runtime.checkpoints import load_for_eval, policy_env_kwargs

        self.cfg, self.frames = cfg, frames
        self.policy = load_for_eval(cfg.checkpoint, "cpu")
        self.env = frame_env(cfg.task, frames, cfg.render_size, cfg.render_camera,
                             **policy_env_kwargs(self.policy, [cfg.task]))
        self.task_arg = cfg.task if self.policy.unwrapped.config.text_encoder == "onehot" else None
        self.next_seed, self.env_steps = cfg.seed, 0
        self.out: Path = Path(".")  # set by run_prefer to the run directory
        self.rounds = 0

    def rollout(self, episodes: int) -> list[Trajectory]:
        out = []
        for s in range(self.next_seed, self.next_seed + episodes):
            t, steps = rollout(self.env, s, policy_behaviour(self.policy, self.task_arg), self.frames,
                               {"policy": "checkpoint"})
            self.env_steps += steps
            out.append(t)
        self.next_seed += episodes
        return out

    def improve(self, reward: RewardModel) -> dict[str, Any]:
        self.rounds += 1  # stage two (steering) runs once, in evaluate, on the final reward
        return {}

    def heldout(self, episodes: int) -> list[Trajectory]:
        """Episodes of held-out seeds played by the checkpoint: the distribution the reward steers
        on (reported as ``policy_*`` beside the candidates' coverage); not counted in env steps."""
        steps, seed = self.env_steps, self.next_seed
        self.next_seed = self.cfg.seed + HELDOUT_SEED
        try:
            return self.rollout(episodes)
        finally:
            self.env_steps, self.next_seed = steps, seed

    def _steer_config(self, reward: str, kwargs: dict[str, Any], episodes: int) -> Any:
        from embodied.runtime.steer import SteerRunConfig
        from policies.steering.config import SteerConfig

        c = self.cfg
        return SteerRunConfig(checkpoint=c.checkpoint, task=c.task, reward=reward, reward_kwargs=kwargs,
                              env_steps=c.steer_env_steps, eval_every=c.steer_eval_every, final_episodes=episodes,
                              seed=c.seed, videos=0, progress=False, threads=1, steer=SteerConfig(**c.steer))

    def _reference(self, want: Any) -> dict[str, Any] | None:
        """The metrics of ``steer_reference`` if it is a finished run with the same settings."""
        import json

        if not self.cfg.steer_reference:
            return None
        p = Path(self.cfg.steer_reference) / "metrics.json"
        if not p.is_file():
            raise FileNotFoundError(f"steer_reference={self.cfg.steer_reference!r} holds no metrics.json: give the "
                                    "directory of a finished `embodied steer` run")
        m = json.loads(p.read_text())
        mine = {"checkpoint": want.checkpoint, "task": want.task, "reward": want.reward, "seed": want.seed,
                "final_episodes": want.final_episodes}
        theirs = {k: m.get(k) for k in mine}
        # a run records the learner's own seed, steer.seed + seed (`embodied steer` adds them)
        steer_cfg = {**vars(want.steer), "seed": want.steer.seed + want.seed, "net_arch": list(want.steer.net_arch)}
        if theirs != mine or m.get("steer") != steer_cfg or abs(m["env_steps"] - want.env_steps) > 2 * 8:
            raise ValueError(f"steer_reference={self.cfg.steer_reference!r} was run with other settings "
                             f"({theirs}, {m['env_steps']} env steps) than this comparison needs ({mine}, "
                             f"{want.env_steps} env steps, steer={steer_cfg})")
        return m

    def evaluate(self, episodes: int, reward: RewardModel) -> dict[str, Any]:
        from embodied.runtime.steer import steer

        path = self.out / "steer_reward.pt"
        if not isinstance(reward, PreferenceReward):
            raise ValueError(f"the steer learner steers with a learned PreferenceReward, got {type(reward).__name__}")
        reward.save(path)
        learned = steer(self._steer_config("rewards.preference.model:load_reward", {"path": str(path)}, episodes),
                        self.out / "steer_learned")
        gt_cfg = self._steer_config(self.cfg.steer_ground_truth, {}, episodes)
        truth = self._reference(gt_cfg) or steer(gt_cfg, self.out / "steer_ground_truth")
        out = {"success_learned": learned["success_after"], "success_ground_truth": truth["success_after"],
               "success_before": learned["success_before"], "heldout_learned": learned["heldout_after"],
               "heldout_ground_truth": truth["heldout_after"], "episodes": episodes,
               "env_steps": learned["env_steps"], "env_steps_ground_truth": truth["env_steps"],
               "query_env_steps": self.env_steps, "ground_truth": self.cfg.steer_ground_truth,
               "curve_learned": learned["curve"], "curve_ground_truth": truth["curve"],
               "steer_learned": str(self.out / "steer_learned"),
               "steer_ground_truth": self.cfg.steer_reference or str(self.out / "steer_ground_truth")}
        gt = out["success_ground_truth"]
        out["ratio"] = out["success_learned"] / gt if gt else None
        return out


@register_learner("steer")
def _steer(cfg: PreferConfig, frames: bool) -> SteerLearner:
    return SteerLearner(cfg, frames)


# ------------------------------------------------------------------- PEBBLE on SAC
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
        self.env = frame_env(cfg.task, frames, cfg.render_size, cfg.render_camera)
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

        return SAC("MlpPolicy", env, replay_buffer_class=_relabel_buffer_class(),
                   learning_starts=self.cfg.pebble_learning_starts, seed=self.cfg.seed, device="cpu", verbose=0)

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
        env = StateRewardEnv(frame_env(self.cfg.task, False, 0), "sparse", record=False)
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
        gt_env = StateRewardEnv(frame_env(self.cfg.task, False, 0), self.cfg.pebble_ground_truth, record=False)
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


# ---------------------------------------------------------------- reward quality
def oracle_targets(queries: Sequence[Query]) -> np.ndarray:
    """Exact ground-truth preference P[right ≻ left] (0.5 on an exact tie)."""
    return np.array([0.5 if q.left.ret == q.right.ret else float(q.right.ret > q.left.ret) for q in queries])


def reward_quality(model: PreferenceReward, pairs: Sequence[Query], targets: np.ndarray,
                   trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Held-out preference accuracy, ECE, return Spearman and success AUROC of a learned reward."""
    p = model.predict(pairs).mean(0)
    learned = np.array([trajectory_return(model, t) for t in trajs])
    return {"accuracy": M.preference_accuracy(p, targets), "ece": M.expected_calibration_error(p, targets),
            "return_spearman": M.spearman(learned, [t.ret for t in trajs]),
            "success_auroc": M.auroc(learned, [t.success for t in trajs])}


# ------------------------------------------------------------------------ teachers
def load_vlm(cfg: PreferConfig) -> RewardModel:
    """The VLM teacher's reward: a ``rewards.registry`` name with ``vlm_settings``, or
    ``module:factory`` called with them; it must read frames and may score ``cfg.task``'s suite."""
    if ":" in cfg.vlm_reward:
        module, _, attr = cfg.vlm_reward.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"vlm_reward={cfg.vlm_reward!r} cannot be loaded: {e}") from None
        model = factory(**cfg.vlm_settings)
    else:
        from rewards.registry import make_reward

        model = make_reward({"name": cfg.vlm_reward, **cfg.vlm_settings})
    if not isinstance(model, RewardModel):
        raise ValueError(f"vlm_reward={cfg.vlm_reward!r} gave a {type(model).__name__}, not a RewardModel")
    model.check_suite(get_task(cfg.task).suite)
    return model


def make_teacher(cfg: PreferConfig, margin: float, server: Any = None, vlm: RewardModel | None = None) -> Teacher:
    if cfg.teacher in PRESETS:
        return make_simulated(cfg.teacher, margin, cfg.seed, beta=cfg.beta, gamma=cfg.gamma, eps=cfg.eps,
                              skip=cfg.skip, equal=cfg.equal)
    if cfg.teacher == "vlm":
        return RewardModelTeacher(vlm if vlm is not None else load_vlm(cfg), cfg.abstain)
    from rewards.preference.server import HumanTeacher

    return HumanTeacher(server)


# ---------------------------------------------------------------------------- loop
def run_prefer(cfg: PreferConfig, run_dir: Path) -> dict[str, Any]:
    """The loop of the module docstring; writes the reward (``reward.pt``) each round."""
    spec = get_task(cfg.task)
    if cfg.segment_length > spec.max_episode_steps:
        raise ValueError(f"segment_length={cfg.segment_length} is longer than {cfg.task}'s episodes "
                         f"({spec.max_episode_steps} steps)")
    vlm = load_vlm(cfg) if cfg.teacher == "vlm" else None
    if vlm is not None:  # record the frames the VLM reads: its camera, its side
        cfg = replace(cfg, render_size=vlm.image_size or cfg.render_size, render_camera=vlm.camera or cfg.render_camera)
    frames = cfg.needs_frames
    learner = LEARNERS[cfg.learner](cfg, frames)
    if hasattr(learner, "out"):
        learner.out = run_dir
    coverage = learner if isinstance(learner, RankingLearner) else _ranking(cfg, frames)
    env = coverage.env.unwrapped
    ds, da = len(env.privileged_state()), env.action_space.shape[0]
    store = LabelStore(cfg.labels or run_dir / "labels",
                       {"task": cfg.task, "state_dim": ds, "action_dim": da, "segment_length": cfg.segment_length},
                       cfg.labels_on_malformed)
    rng = np.random.default_rng(cfg.seed)
    heldout = coverage.heldout(cfg.heldout_episodes)
    hpairs = sample_pairs(heldout, cfg.heldout_pairs, cfg.segment_length, np.random.default_rng(cfg.seed + 1))
    htargets = oracle_targets(hpairs)
    own = learner.heldout(cfg.heldout_episodes) if coverage is not learner and hasattr(learner, "heldout") else []
    opairs = (sample_pairs(own, cfg.heldout_pairs, cfg.segment_length, np.random.default_rng(cfg.seed + 2))
              if own else [])
    otargets = oracle_targets(opairs)
    model = PreferenceReward(cfg.reward, ds, da, cfg.seed)
    server = None
    if cfg.teacher == "human":
        from rewards.preference.server import LabelServer

        server = LabelServer(store, port=cfg.port).start()
        log.info("label page: %s (answer there; every answer is saved at once)", server.url)
    pool: list[Trajectory] = []
    curve: list[dict[str, Any]] = []
    teacher: Teacher | None = None
    agree = [0, 0]  # strict answers of this run's teacher that match the ground truth, strict answers
    old_queries, old_targets = store.training_set(frames=cfg.reward.input == "image")
    reused = len(old_queries)
    if reused:  # so that the first round's queries are already chosen by an informed ensemble
        log.info("%s: reusing %d label(s) (%s)", store.root, reused, store.counts())
        model.train(old_queries, old_targets)
    del old_queries
    try:
        for r, n in enumerate(schedule(cfg.budget, cfg.rounds, cfg.schedule)):
            pool += learner.rollout(cfg.episodes_per_round)
            if teacher is None:  # B-Pref's margin: mean episode return scaled to a segment
                margin = float(np.mean([t.ret for t in pool])) * cfg.segment_length / spec.max_episode_steps
                teacher = make_teacher(cfg, margin, server, vlm)
            asked = [store.query(q, frames) for q in store.pending()]  # posed by an interrupted run: answer them first
            if n:
                cands = sample_pairs(pool, n * cfg.oversample, cfg.segment_length, rng)
                probs = model.predict(cands) if model.labels_seen else None
                for q in select(cands, n, cfg.selection, probs):
                    store.add_query(q)
                    asked.append(q)
            answers = teacher.label(asked) if asked else []
            if not teacher.records_labels:
                for q, a in zip(asked, answers):
                    store.add_label(q.id, a, teacher.name)
            for a, truth in zip(answers, oracle_targets(asked)):  # the teacher's label accuracy vs ground truth
                if a in ("left", "right") and truth != 0.5:
                    agree[0] += (a == "right") == (truth == 1.0)
                    agree[1] += 1
            queries, targets = store.training_set(frames=cfg.reward.input == "image")
            fit = model.train(queries, targets) if queries else {}
            improved = learner.improve(model) or {}
            point = {"round": r, "labels": len(queries), "asked": len(asked), **store.counts(), **fit, **improved,
                     "teacher_accuracy": agree[0] / agree[1] if agree[1] else None,
                     **(reward_quality(model, hpairs, htargets, heldout) if queries else {}),
                     **({f"policy_{k}": v for k, v in reward_quality(model, opairs, otargets, own).items()}
                        if queries and own else {}),
                     "env_steps": learner.env_steps}
            curve.append(point)
            log.info("round %d: %d labels, held-out accuracy %.3f, return Spearman %.3f%s", r, len(queries),
                     point.get("accuracy", math.nan), point.get("return_spearman", math.nan),
                     f"; on the learner's own held-out episodes {point['policy_accuracy']:.3f}, "
                     f"{point['policy_return_spearman']:.3f}" if "policy_accuracy" in point else "")
            if queries:
                model.save(run_dir / "reward.pt")
    finally:
        if server is not None:
            server.stop()
        store.close()
    final = learner.evaluate(cfg.eval_episodes, model) if model.labels_seen else {}
    if final:
        log.info("%s learner, %d episodes: success %.2f with the learned reward, %.2f with the ground truth, "
                 "%.2f before", cfg.learner, final["episodes"], final["success_learned"],
                 final["success_ground_truth"], final["success_before"])
    return {"task": cfg.task, "teacher": teacher.name if teacher else cfg.teacher, "learner": cfg.learner,
            "labels_path": str(store.root), "labels": store.counts(), "reused_labels": reused, "curve": curve,
            "final": curve[-1] if curve else {}, "policy": final, "config": asdict(cfg)}


def evaluate_reward(cfg: PreferConfig, run_dir: Path | None = None) -> dict[str, Any]:
    """``embodied prefer eval``: held-out quality of a saved reward, its stored labels' accuracy
    (``labels=PATH``, e.g. a person's) and the learner's success with it (``learner=steer``:
    steering runs under ``run_dir``)."""
    model = PreferenceReward.load(cfg.reward_path)
    frames = model.cfg.input == "image"
    learner = LEARNERS[cfg.learner](cfg, frames)
    if hasattr(learner, "out"):
        learner.out = Path(run_dir or ".")
    coverage = learner if isinstance(learner, RankingLearner) else _ranking(cfg, frames)
    env = coverage.env.unwrapped
    if len(env.privileged_state()) != model.state_dim:
        raise ValueError(f"reward {cfg.reward_path} reads {model.state_dim}-D states, task {cfg.task} has "
                         f"{len(env.privileged_state())}")
    heldout = coverage.heldout(cfg.heldout_episodes)
    pairs = sample_pairs(heldout, cfg.heldout_pairs, cfg.segment_length, np.random.default_rng(cfg.seed + 1))
    out: dict[str, Any] = {"task": cfg.task, "reward_path": cfg.reward_path,
                           **reward_quality(model, pairs, oracle_targets(pairs), heldout)}
    if cfg.labels:
        store = LabelStore(cfg.labels, None, cfg.labels_on_malformed)
        qs, ys = store.training_set()
        if qs:
            p = model.predict(qs).mean(0)
            out["store_accuracy"] = M.preference_accuracy(p, np.array(ys))
            out["store_ece"] = M.expected_calibration_error(p, np.array(ys))
            out["store_labels"] = len(qs)
    out["policy"] = learner.evaluate(cfg.eval_episodes, model)
    return out


def plot_runs(runs: Sequence[str], out: Path) -> dict[str, Any]:
    """Held-out accuracy and return Spearman vs labels (mean over seeds, band: min to max), and the
    learner's success with the learned reward, the ground truth and before improvement: one line
    or bar group per (teacher, task)."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        p = Path(run) / "metrics.json"
        if not p.is_file():
            raise FileNotFoundError(f"{p} does not exist: give directories of finished `embodied prefer` runs")
        m = json.loads(p.read_text())
        groups.setdefault(f"{m['teacher']} ({m['task']}, {m.get('learner', 'ranking')})", []).append(m)
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    table: dict[str, Any] = {}
    for name, ms in groups.items():
        pts: dict[int, list[dict[str, Any]]] = {}
        for m in ms:
            for c in m["curve"]:
                if "accuracy" in c:
                    pts.setdefault(c["labels"], []).append(c)
        xs = sorted(pts)
        row: dict[str, Any] = {"seeds": len(ms), "labels": xs}
        for ax, key in zip(axes, ("accuracy", "return_spearman")):
            v = [[c[key] for c in pts[x]] for x in xs]
            mean = [float(np.mean(a)) for a in v]
            line, = ax.plot(xs, mean, marker="o", label=f"{name}, {len(ms)} seed(s)")
            ax.fill_between(xs, [min(a) for a in v], [max(a) for a in v], color=line.get_color(), alpha=0.15)
            row[key] = mean
        row["ece"] = [float(np.mean([c["ece"] for c in pts[x]])) for x in xs]
        pol = [m["policy"] for m in ms if m.get("policy")]
        if pol:
            row["success"] = {k: float(np.mean([q[k] for q in pol]))
                              for k in ("success_before", "success_learned", "success_ground_truth")}
            row["env_steps"] = [q["env_steps"] for q in pol]
        table[name] = row
    for ax, title in zip(axes, ("held-out preference accuracy", "Spearman: learned vs true episode return")):
        ax.set_xlabel("labels")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    names = [n for n in table if "success" in table[n]]
    for j, (key, label) in enumerate((("success_before", "before"),
                                      ("success_learned", "learned reward"),
                                      ("success_ground_truth", "ground-truth reward"))):
        axes[2].bar(np.arange(len(names)) + (j - 1) * 0.27, [table[n]["success"][key] for n in names], 0.27,
                    label=label)
    axes[2].set_xticks(np.arange(len(names)), names, rotation=20, ha="right", fontsize=8)
    axes[2].set_title("learner's success: before, learned reward, ground truth (same env steps)", fontsize=9)
    axes[2].set_ylim(0, 1.05)
    axes[2].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return {"figure": str(out), "runs": table}


# ---------------------------------------------------------------------- label page
@dataclass
class LabelConfig:
    """Schema of ``configs/label.yaml``."""

    labels: str = ""  # the label store directory
    task: str = ""  # with queries > 0: record new queries of this task first (a new store needs it)
    queries: int = 0  # new queries to record before serving (from the ranking learner's candidates)
    segment_length: int = 25
    episodes: int = 4  # episodes (each played by every candidate) the new queries are cut from
    candidates: int = 8
    render_size: int = 96
    host: str = "127.0.0.1"  # loopback only
    port: int = 8765
    exit_when_done: bool = False  # stop serving once every query is answered
    labels_on_malformed: str = "raise"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.labels:
            raise ValueError("give the label store: labels=DIR (made by `embodied prefer` or by queries=N task=NAME)")
        if self.queries < 0 or self.seed < 0:
            raise ValueError(f"queries and seed must be >= 0, got queries={self.queries}, seed={self.seed}")
        if self.queries and not self.task:
            raise ValueError("queries=N records new queries of a task: give task=NAME")
        check_choice("labels_on_malformed", self.labels_on_malformed, ON_MALFORMED)


def record_queries(cfg: LabelConfig, store_path: str) -> LabelStore:
    """Add ``cfg.queries`` uniformly drawn queries, with frames, to the store (made if absent)."""
    learner = RankingLearner(cfg.task, cfg.candidates, cfg.seed, True, cfg.render_size)
    env = learner.env.unwrapped
    meta = {"task": cfg.task, "state_dim": len(env.privileged_state()), "action_dim": env.action_space.shape[0],
            "segment_length": cfg.segment_length}
    store = LabelStore(store_path, meta, cfg.labels_on_malformed)
    learner.next_seed = cfg.seed + 3 * HELDOUT_SEED + len(store.query_ids)  # fresh episodes for every call
    trajs = learner.rollout(cfg.episodes)
    rng = np.random.default_rng([cfg.seed, len(store.query_ids)])
    for q in sample_pairs(trajs, cfg.queries, cfg.segment_length, rng):
        store.add_query(q)
    return store


def serve_labels(cfg: LabelConfig) -> dict[str, Any]:
    """``embodied label``: serve the page until interrupted (or until done with ``exit_when_done``)."""
    import signal
    import time

    from rewards.preference.server import LabelServer

    store = record_queries(cfg, cfg.labels) if cfg.queries else LabelStore(cfg.labels, None, cfg.labels_on_malformed)
    if not store.query_ids:
        raise ValueError(f"label store {cfg.labels} holds no query: record some with queries=N task=NAME")
    server = LabelServer(store, cfg.host, cfg.port).start()
    print(f"label page: {server.url}  ({len(store.pending())} of {len(store.query_ids)} queries to answer; "
          "every answer is saved at once; Ctrl-C stops)", flush=True)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        while not (cfg.exit_when_done and not store.pending()):
            time.sleep(0.2)
    except KeyboardInterrupt:
        log.info("stopped; answers so far are on disk in %s", store.labels_path)
    finally:
        signal.signal(signal.SIGTERM, old)
        server.stop()
        store.close()
    return {"labels_path": str(store.root), "url": server.url, **store.counts(), "pending": len(store.pending())}
