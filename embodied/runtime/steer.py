"""``embodied steer``: improve a frozen flow/diffusion checkpoint by RL on its initial noise.

    embodied steer checkpoint=RUN/checkpoint task=reach reward=sparse env_steps=30000
    embodied steer checkpoint=RUN/checkpoint suite=manipulation reward=clip reward.checkpoint=FIT/reward
    embodied steer checkpoint=RUN/checkpoint suite=manipulation reward=constant    # the control
    embodied steer checkpoint=... task=reach steer=na demos=20          # DSRL-NA, from 20 expert episodes
    embodied steer checkpoint=... task=reach compare=[raw_sac,residual_sac,dsrl_na]   # side by side

One noise policy serves every task of the run (``task=`` one, ``tasks=[...]`` or a whole
``suite=``): it observes the frozen policy's features, which hold the instruction's text
features, so it is conditioned on language; each training episode plays a task drawn from
the run's tasks (``sim.mixture.TaskMixture``) with a training wording.

Rewards: ``sparse`` and ``dense`` read the simulator and are the oracle references (episodes
end on success). Any other reward -- a learned ``RewardModel`` (``clip``, ``prefer``) or the
``constant`` control -- never sees the simulator's success: its envs are made with
``end_on_success=False``, so episodes end at the time limit or on the reward model's own
call (``reward.success_threshold``); success is measured only in evaluation.

Steps: (1) load the checkpoint (refused when its chunk does not depend on noise, e.g. the
MLP floor) and evaluate it on fixed held-out seeds (``eval_seed`` on; the training
episodes use seeds from ``seed``), on training and held-out wordings; (2) train the noise
policy (``steer``: SB3 SAC by default, ``policies.steering``) on ``num_envs`` envs of the
task's training wordings for ``env_steps`` environment steps, with a progress bar,
TensorBoard (``tb/``) and an evaluation every ``eval_every`` env steps (``select=best``: on
validation seeds, and the noise policy keeps the weights of its best evaluation instead of its
last); (3) evaluate the steered policy as in (1) and save it to ``checkpoint/`` (the base weights plus the noise
actor: ``embodied eval checkpoint=RUN/checkpoint`` and ``embodied play`` load it as any
other); (4) run each ``compare`` method on the same env-step budget and seeds.

Writes ``metrics.json`` (``success_before``, ``success_after``, ``env_steps``,
``wall_time_s``, ``curve``: success vs env steps, ``compare``: each method's curve, final
success and the env steps its curve needed to reach ``target_success``, the steered policy's
held-out success on training wordings, with the ratio to the steered curve's), ``steer_curve.png``,
``report.md`` and videos of the policy before (``before/videos``) and after (``after/videos``).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from embodied.core.errors import UnknownNameError
from embodied.core.registry import load_object, make_env, resolve_tasks
from embodied.core.reward import RewardModel
from embodied.runtime.checkpoints import check_trained_task, load_for_eval, policy_env_kwargs
from embodied.runtime.evaluate import evaluate, pct, save_videos, write_json
from policies.steering.config import SteerConfig
from rewards.registry import REWARDS as REWARD_MODELS
from rewards.registry import make_reward
from rewards.wrappers import frame_env_kwargs
from sim.mixture import TaskMixture

log = logging.getLogger("embodied.steer")

#: rewards that read the simulator (its success, its shaped reward): the oracle references
ORACLES = ("sparse", "dense")

#: methods a run can compare with its own (``compare=[...]``); dsrl_<algo> is steering with that algorithm
COMPARE = ("raw_sac", "residual_sac", "dsrl_sac", "dsrl_td3", "dsrl_ppo", "dsrl_na")


@dataclass
class SteerRunConfig:
    """Schema of ``configs/steer.yaml`` (the noise policy's own fields live in ``configs/steer/``)."""

    checkpoint: str = ""  # RUN/checkpoint of `embodied train` (a flow or diffusion policy)
    task: str = ""  # one task; or tasks=[...]; or suite=NAME (all its tasks): one noise policy for all
    tasks: list[str] = field(default_factory=list)
    suite: str = ""
    # the reward: the config group configs/reward/ (reward=sparse|dense|constant|clip|prefer, its settings
    # as reward.<key>=value), or from Python also "sparse", "dense", "constant" or "module:Class" of a
    # RewardModel
    reward: Any = field(default_factory=lambda: {"name": "sparse"})
    reward_kwargs: dict[str, Any] = field(default_factory=dict)  # "module:Class": its constructor arguments
    env_steps: int = 30_000  # environment steps (executed actions) of training, per method
    # steer=sac|td3|ppo|na (config group configs/steer/); any field as steer.<field>=value
    steer: SteerConfig = field(default_factory=SteerConfig)
    compare: list[str] = field(default_factory=list)  # other methods on the same budget (COMPARE)
    # the compare methods' budget (0: env_steps). A baseline that does not reach the steered
    # policy's success within env_steps only bounds the ratio; a longer budget measures it
    compare_env_steps: int = 0
    demos: int = 0  # DSRL-NA: scripted-expert episodes whose chunks seed the action critic
    residual_scale: float = 0.3  # residual_sac: residual = scale x action in [-1, 1]
    baseline_utd: int = 1  # raw_sac / residual_sac: gradient steps per transition
    num_envs: int = 4  # training envs (one batched decode per step)
    eval_every: int = 5000  # env steps between evaluations (0: before and after only)
    eval_episodes: int = 20  # periodic evaluation, per task and wording split
    final_episodes: int = 50  # before/after evaluation, per task and wording split
    eval_envs: int = 8  # envs stepped together in evaluation (results do not depend on it)
    eval_seed: int = 100_000  # held-out seeds: episode k uses eval_seed + k
    # last: each method ends with its last weights; best: with the weights of its best periodic
    # evaluation, which then runs on validation seeds (val_seed + k), disjoint from eval_seed's
    select: str = "last"
    val_seed: int = 300_000
    splits: list[str] = field(default_factory=lambda: ["train", "heldout"])
    seed: int = 0  # training episodes' seeds and the learners' seeds
    videos: int = 2  # episodes recorded before and after (one success and one failure saved)
    num_inference_steps: int = 0  # 0: the checkpoint's sampler steps
    device: str = "cpu"
    threads: int = 1  # torch CPU threads
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("checkpoint is required: give checkpoint=RUN/checkpoint (a flow or diffusion policy "
                             "trained by `embodied train`)")
        given = [k for k in ("task", "tasks", "suite") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("give exactly one of task=NAME, tasks=[...] or suite=NAME (the tasks to steer on), "
                             f"got {', '.join(given) or 'none'}")
        for name in ("env_steps", "num_envs", "eval_episodes", "final_episodes", "threads", "baseline_utd",
                     "eval_envs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is not allowed: must be >= 1")
        for name in ("eval_every", "demos", "videos", "num_inference_steps", "compare_env_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} is not allowed: must be >= 0")
        if not self.residual_scale > 0:
            raise ValueError(f"residual_scale={self.residual_scale} is not allowed: must be > 0")
        bad = [m for m in self.compare if m not in COMPARE]
        if bad:
            raise UnknownNameError("compare method", bad[0], list(COMPARE))
        if isinstance(self.reward, Mapping):
            self.reward = dict(self.reward)
            threshold = self.reward.get("success_threshold")
            if self.reward.get("name") in ORACLES:
                self.reward = str(self.reward["name"])
            elif self.reward.get("name") != "constant" and self.reward.get("name") not in REWARD_MODELS:
                raise UnknownNameError("reward", str(self.reward.get("name")), [*ORACLES, "constant", *REWARD_MODELS])
            if threshold is not None and not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
                raise ValueError(f"reward.success_threshold={threshold!r} is not allowed: a finite number (a step "
                                 "whose learned reward reaches it ends the episode) or null (time limit only)")
        elif self.reward == "constant":
            self.reward = {"name": "constant", "value": 0.0}
        elif not isinstance(self.reward, str) or (self.reward not in ORACLES and ":" not in self.reward):
            raise ValueError(f"reward={self.reward!r} is not allowed: must be 'sparse', 'dense', 'constant', one of "
                             f"{list(REWARD_MODELS)} (reward=NAME reward.<key>=value) or 'module:Class' of a RewardModel")
        if self.select not in ("last", "best"):
            raise ValueError(f"select={self.select!r} is not allowed: must be 'last' or 'best'")
        if self.select == "best":
            if not self.eval_every:
                raise ValueError("select=best picks among the periodic evaluations: give eval_every > 0")
            if (self.val_seed < self.eval_seed + self.final_episodes
                    and self.eval_seed < self.val_seed + self.eval_episodes):
                raise ValueError(f"val_seed={self.val_seed} overlaps the held-out seeds eval_seed={self.eval_seed} "
                                 f"... {self.eval_seed + self.final_episodes - 1}: selection must not see them")
        if not self.splits or any(s not in ("train", "heldout") for s in self.splits):
            raise ValueError(f"splits={self.splits} is not allowed: a non-empty list of 'train', 'heldout'")


def merge_frame_kwargs(policy_kw: Mapping[str, Any], frame_kw: Mapping[str, Any]) -> dict[str, Any]:
    """Env arguments under which an env gives the policy its observations (``policy_kw``) and a
    reward model its frames (``frame_kw``, from ``frame_env_kwargs``). A state policy gains the
    reward's camera as an extra observation image; a pixel policy must already observe it at
    that side. Anti-aliasing changes observation images too, so a pixel policy refuses it."""
    kw = dict(policy_kw)
    pixels = kw.get("obs_mode", "state") != "state"
    if "render_mode" in frame_kw:
        kw.update(render_mode=frame_kw["render_mode"], render_size=frame_kw["render_size"])
    else:
        cam, side = frame_kw["cameras"][0], frame_kw["image_size"]
        if not pixels:
            kw.update(obs_mode="state+pixels", cameras=[cam], image_size=side)
        elif list(kw.get("cameras", []))[:1] != [cam] or kw.get("image_size") != side:
            raise ValueError(f"the reward reads the {cam!r} camera at {side} px, but this pixel policy observes "
                             f"{kw.get('cameras')} at {kw.get('image_size')} px: use a reward fitted on the "
                             "policy's own view, or one that reads render() frames")
    k = int(frame_kw.get("supersample", 1))
    if k != 1:
        if pixels:
            raise ValueError(f"the reward reads frames anti-aliased with supersample={k}, which would change this "
                             "pixel policy's observation images: use a reward fitted with supersample=1")
        kw["supersample"] = k
    return kw


def make_reward_model(spec: str, kwargs: dict[str, Any]) -> RewardModel:
    """Instantiate the ``RewardModel`` named by ``"module:Class"``."""
    model = load_object(spec, "reward")(**kwargs)
    if not isinstance(model, RewardModel):
        raise ValueError(f"reward={spec!r} is a {type(model).__name__}, not an embodied.core.reward.RewardModel")
    return model


@dataclass
class Run:
    """One method's training: its curve, the policy it ends with and what it cost."""

    name: str
    policy: Any
    curve: list[dict[str, Any]]
    env_steps: int
    wall_time_s: float
    train_success: float | None
    extra: dict[str, Any] = field(default_factory=dict)


class Steering:
    """Everything a run shares: the base policy, the envs' settings, evaluation and logging."""

    def __init__(self, cfg: SteerRunConfig, out: Path):
        import torch

        from policies.steering.noise import NoiseSpace, check_steerable
        from policies.steering.policy import SteeredPolicy

        self.cfg, self.out = cfg, out
        torch.set_num_threads(cfg.threads)
        self.tasks = resolve_tasks(cfg.suite or None, cfg.tasks or ([cfg.task] if cfg.task else None))
        self.base = load_for_eval(cfg.checkpoint, cfg.device, cfg.num_inference_steps)
        if isinstance(self.base, SteeredPolicy):
            raise ValueError(f"checkpoint {cfg.checkpoint!r} is already steered (it has a steering.json); give the "
                             "checkpoint of `embodied train` it was steered from")
        check_steerable(self.base)
        for task in self.tasks:
            check_trained_task(self.base, task, cfg.checkpoint)
        # the run's seed reaches the learner too (SB3 also seeds the training envs from it)
        self.steer_cfg = replace(cfg.steer, seed=cfg.steer.seed + cfg.seed)
        self.main = f"dsrl_{self.steer_cfg.algo}"  # the run's own method; cfg.compare's are the others
        self.space = NoiseSpace.for_policy(self.base, self.steer_cfg)
        self.env_kw = policy_env_kwargs(self.base, self.tasks)
        self.reward, train_kw, self.episode_end = self._reward(dict(self.env_kw, instruction_split="train"))
        if len(self.tasks) == 1:
            self.make_train_env: Callable[[], Any] = partial(make_env, self.tasks[0], **train_kw)
        else:
            self.make_train_env = partial(TaskMixture, self.tasks, **train_kw)
        onehot = self.base.unwrapped.config.text_encoder == "onehot"
        if onehot and len(self.tasks) > 1 and cfg.compare:
            raise ValueError("compare=[...] runs single-task baselines: with a one-hot policy, give one task=NAME")
        self.task_arg = self.tasks[0] if onehot and len(self.tasks) == 1 else None
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(out / "tb"))

    def _reward(self, env_kw: dict[str, Any]) -> tuple[Any, dict[str, Any], str]:
        """(the reward source or name, the training envs' arguments, how episodes end).

        An oracle reward keeps the tasks' success ends. Any other reward's envs never end on
        success, and draw the frames a reward model reads (its camera, frame side and
        anti-aliasing: ``rewards.wrappers.frame_env_kwargs``)."""
        from policies.steering.env import ConstantReward, ModelReward

        reward = self.cfg.reward
        if isinstance(reward, str) and reward in ORACLES:
            return reward, env_kw, "success or time limit (oracle)"
        env_kw = dict(env_kw, end_on_success=False)
        if isinstance(reward, dict) and reward["name"] == "constant":
            return ConstantReward(float(reward.get("value", 0.0))), env_kw, "time limit"
        threshold = reward.get("success_threshold") if isinstance(reward, dict) else None
        model = (make_reward(reward) if isinstance(reward, dict) else make_reward_model(reward, self.cfg.reward_kwargs))
        if "frames" in model.inputs:
            env_kw = merge_frame_kwargs(env_kw, frame_env_kwargs(model.camera, model.image_size or 64,
                                                                 model.supersample))
        end = "time limit" if threshold is None else f"time limit, or the reward model's reward >= {threshold}"
        return ModelReward(model, threshold), env_kw, end

    # ---- evaluation -----------------------------------------------------------------------
    def evaluate(self, policy: Any, episodes: int, videos: int = 0,
                 seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Success on the held-out seeds (or from ``seed``), mean over the run's tasks: ``success``
        (training wordings), ``heldout`` (held-out wordings), ``per_task``."""
        seed = self.cfg.eval_seed if seed is None else seed
        metrics, results = evaluate(policy, self.tasks, episodes, self.cfg.splits, seed,
                                    num_envs=self.cfg.eval_envs, vector="sync", env_kwargs=self.env_kw,
                                    videos=videos, progress=False)
        per_task = {t: {"success": p.get("success_rate"), "heldout": p.get("heldout", {}).get("success_rate")}
                    for t, p in metrics["per_task"].items()}
        ci = None
        if len(self.tasks) == 1 and "ci_low" in metrics["per_task"][self.tasks[0]]:
            p = metrics["per_task"][self.tasks[0]]
            ci = [p["ci_low"], p["ci_high"]]
        summary = {"success": metrics.get("success_rate"), "heldout": metrics.get("heldout_paraphrase_success_rate"),
                   "ci": ci, "episodes": episodes, "per_task": per_task}
        return summary, results

    def point(self, name: str, policy: Any, env_steps: int, curve: list[dict[str, Any]]) -> dict[str, float]:
        """Evaluate ``policy`` at ``env_steps``, append to ``curve`` and TensorBoard; the bar's postfix."""
        t = time.time()
        s, _ = self.evaluate(policy, self.cfg.eval_episodes,
                             seed=self.cfg.val_seed if self.cfg.select == "best" else None)
        curve.append({"env_steps": int(env_steps), **{k: v for k, v in s.items() if k != "per_task"},
                      "eval_time_s": time.time() - t})
        for key in ("success", "heldout"):
            if s[key] is not None:
                self.tb.add_scalar(f"{name}/{key}", s[key], env_steps)
        log.info("%s: %d env steps, success %s (held-out wordings %s)", name, env_steps, pct(s["success"]),
                 pct(s["heldout"]))
        return {k: s[k] for k in ("success", "heldout") if s[k] is not None}

    # ---- methods ----------------------------------------------------------------------------
    def budget(self, name: str) -> int:
        """Env steps method ``name`` trains for: ``env_steps`` for the run's own steering method,
        ``compare_env_steps`` (when set) for the methods it is compared with."""
        return self.cfg.compare_env_steps if name != self.main and self.cfg.compare_env_steps else self.cfg.env_steps

    def run(self, name: str) -> Run:
        """Train method ``name`` (``dsrl_<algo>``, ``raw_sac`` or ``residual_sac``) on the budget."""
        from policies.steering.progress import Progress

        t0 = time.time()
        curve: list[dict[str, Any]] = []
        learner, policy, extra = self._build(name)
        best: dict[str, Any] = {}

        def point(steps: int) -> dict[str, float]:
            postfix = self.point(name, policy, steps, curve)
            score = np.mean(list(postfix.values())) if postfix else 0.0
            if self.cfg.select == "best" and (not best or score >= best["score"]):  # a tie goes to the later
                best.update(score=score, env_steps=int(steps),
                            tensors={k: v.detach().clone() for k, v in policy.actor.tensors().items()})
            return postfix

        point(0)
        progress = Progress(self.budget(name), point, self.cfg.eval_every, desc=name, show=self.cfg.progress)
        try:
            learner(progress)
        finally:
            progress.close()
        point(progress.env_steps)
        self.tb.flush()
        if best:
            policy.actor.load_tensors(best["tensors"])
            extra = {**extra, "selected_env_steps": best["env_steps"], "selected_val_success": float(best["score"])}
            log.info("%s: kept the weights of %d env steps (validation success %s)", name, best["env_steps"],
                     pct(best["score"]))
        return Run(name, policy, curve, progress.env_steps, time.time() - t0, progress.train_success, extra)

    def _build(self, name: str) -> tuple[Callable[[Any], Any], Any, dict[str, Any]]:
        """(learn(progress), the policy it trains, extras for metrics.json) of method ``name``."""
        from policies.steering.sb3 import ProgressCallback, SB3Actor, make_algorithm

        cfg, n = self.cfg, self.cfg.num_envs
        if name.startswith("dsrl_"):
            return self._build_dsrl(replace(self.steer_cfg, algo=name[len("dsrl_"):]))
        from stable_baselines3.common.vec_env import DummyVecEnv

        from policies.steering.baselines import RawActionEnv, RawActionPolicy, ResidualEnv, ResidualPolicy

        base_cfg = replace(self.steer_cfg, algo="sac", utd=cfg.baseline_utd)
        if name == "raw_sac":
            fns = [lambda: RawActionEnv(self.make_train_env(), self.base, self.reward, self.task_arg)] * n
        elif name == "residual_sac":
            fns = [partial(lambda i: ResidualEnv(self.make_train_env(), self.base, self.reward, self.task_arg,
                                                 cfg.residual_scale, seed=cfg.seed + i), i) for i in range(n)]
        else:
            raise UnknownNameError("steering method", name, list(COMPARE))
        vec = DummyVecEnv(fns)
        vec.seed(cfg.seed)
        model = make_algorithm(base_cfg, vec, tensorboard_log=str(self.out / "tb"))
        actor = SB3Actor.of(model, base_cfg)
        if name == "raw_sac":
            policy: Any = RawActionPolicy(self.base, actor, self.task_arg)
        else:
            policy = ResidualPolicy(self.base, actor, cfg.residual_scale, self.base.unwrapped.action_spec)

        def learn(progress: Any) -> None:
            model.learn(self.budget(name), callback=ProgressCallback(progress), tb_log_name=name)

        return learn, policy, {"utd": base_cfg.utd}

    def _build_dsrl(self, scfg: Any) -> tuple[Callable[[Any], Any], Any, dict[str, Any]]:
        from policies.steering.env import NoiseVecEnv
        from policies.steering.policy import SteeredPolicy

        cfg, name = self.cfg, f"dsrl_{scfg.algo}"
        k = scfg.na_alias_samples if scfg.algo == "na" else 0
        vec = NoiseVecEnv([self.make_train_env] * cfg.num_envs, self.base, self.space, self.reward, self.task_arg,
                          alias_samples=k, seed=cfg.seed)
        vec.seed(cfg.seed)
        extra: dict[str, Any] = {"steer": {**vars(scfg), "net_arch": list(scfg.net_arch)}, "noise_dim": self.space.dim}
        if scfg.algo == "na":
            from policies.steering.na import NoiseAliasing, expert_transitions

            learner = NoiseAliasing(vec, scfg, log=self.tb.add_scalar)
            if cfg.demos:
                env = self.make_train_env()
                try:
                    data, steps, rate = expert_transitions(env, self.base, self.reward, cfg.demos, cfg.seed + 50_000,
                                                           self.task_arg)
                finally:
                    env.close()
                learner.add_transitions(**data)
                extra.update(demo_episodes=cfg.demos, demo_env_steps=steps, demo_success=rate)
                log.info("%s: %d expert episodes (%d env steps, success %s) in the action critic's replay",
                         name, cfg.demos, steps, pct(rate))
            policy = SteeredPolicy(self.base, learner.noise_actor(), self.space)
            return learner.learn, policy, extra
        from policies.steering.sb3 import ProgressCallback, SB3Actor, make_algorithm

        model = make_algorithm(scfg, vec, tensorboard_log=str(self.out / "tb"))
        policy = SteeredPolicy(self.base, SB3Actor.of(model, scfg), self.space)

        def learn(progress: Any) -> None:
            model.learn(self.budget(name), callback=ProgressCallback(progress), tb_log_name=name)

        return learn, policy, extra


def steps_to_reach(curve: list[dict[str, Any]], target: float) -> int | None:
    """Env steps of the first curve point whose success is at least ``target`` (None if none)."""
    for p in curve:
        if p.get("success") is not None and p["success"] >= target - 1e-9:
            return int(p["env_steps"])
    return None


def compare_steps(main_curve: list[dict[str, Any]], others: dict[str, tuple[list[dict[str, Any]], int]],
                  target: float) -> dict[str, dict[str, Any]]:
    """Env steps each method's curve needs to first reach ``target``, and its ratio to the
    steered method's (``main_curve``). ``others`` maps a method to its curve and env-step
    budget. A method that never reaches the target gets only a lower bound, its budget over the
    steered method's steps (``steps_ratio_at_least``); when the steered curve starts at or
    above the target (0 steps) or never reaches it, there is no ratio."""
    reach_main = steps_to_reach(main_curve, target)
    out = {}
    for name, (curve, budget) in others.items():
        reach = steps_to_reach(curve, target)
        out[name] = {"steps_to_reach": reach,
                     "steps_ratio": reach / reach_main if reach is not None and reach_main else None,
                     "steps_ratio_at_least": budget / reach_main if reach is None and reach_main else None}
    return out


def steer(cfg: SteerRunConfig, out: Path) -> dict[str, Any]:
    """Run ``embodied steer``; returns the metrics written to ``out/metrics.json``."""
    from policies import save_policy

    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    s = Steering(cfg, out)
    main = s.main
    before, res = s.evaluate(s.base, cfg.final_episodes, videos=cfg.videos)
    videos = {"before": save_videos(out / "before", res) if cfg.videos else {}}
    log.info("before: success %s (held-out wordings %s) on %d held-out seeds", pct(before["success"]),
             pct(before["heldout"]), cfg.final_episodes)
    runs = [s.run(main)] + [s.run(m) for m in cfg.compare if m != main]
    steered = runs[0]
    # saved before the final evaluation, so that an interrupt during it keeps the trained weights
    save_policy(steered.policy, out / "checkpoint")
    log.info("steered checkpoint saved to %s", out / "checkpoint")
    after, res = s.evaluate(steered.policy, cfg.final_episodes, videos=cfg.videos)
    videos["after"] = save_videos(out / "after", res) if cfg.videos else {}
    # the steered policy's success is its held-out figure (final_episodes seeds per split), the
    # most precise estimate the run makes; every method's curve is read against it
    target = after["success"] or 0.0
    table = compare_steps(steered.curve, {r.name: (r.curve, r.env_steps) for r in runs[1:]}, target)
    compare = {}
    for r in runs[1:]:
        final, _ = s.evaluate(r.policy, cfg.final_episodes)
        compare[r.name] = {"curve": r.curve, "success_after": final["success"], "heldout_after": final["heldout"],
                           "env_steps": r.env_steps, "wall_time_s": r.wall_time_s, "train_success": r.train_success,
                           **r.extra, **table[r.name]}
    metrics = {
        "task": s.tasks[0] if len(s.tasks) == 1 else cfg.suite or ",".join(s.tasks), "tasks": s.tasks,
        "checkpoint": cfg.checkpoint, "method": main, "reward": cfg.reward,
        "reward_kind": ("oracle" if isinstance(cfg.reward, str) and cfg.reward in ORACLES
                        else "control" if isinstance(cfg.reward, dict) and cfg.reward["name"] == "constant"
                        else "learned"),
        "episode_end": s.episode_end,
        "success_before": before["success"], "heldout_before": before["heldout"],
        "success_after": after["success"], "heldout_after": after["heldout"],
        "per_task_before": before["per_task"], "per_task_after": after["per_task"],
        "ci_before": before["ci"], "ci_after": after["ci"], "final_episodes": cfg.final_episodes,
        "env_steps": steered.env_steps, "steps_to_reach": steps_to_reach(steered.curve, target),
        "target_success": target,
        "train_success": steered.train_success, "curve": steered.curve, "steer_wall_time_s": steered.wall_time_s,
        **steered.extra, "compare": compare, "videos": videos, "eval_seed": cfg.eval_seed, "seed": cfg.seed,
        "select": cfg.select, "val_seed": cfg.val_seed if cfg.select == "best" else None,
        "compare_env_steps": (cfg.compare_env_steps or cfg.env_steps) if cfg.compare else None,
        "checkpoint_out": str(out / "checkpoint"),
    }
    metrics["wall_time_s"] = time.time() - t0
    s.tb.add_scalar(f"{main}/success_after", after["success"] or 0.0, steered.env_steps)
    s.tb.close()
    write_json(out / "metrics.json", metrics)
    plot_curves(out / "steer_curve.png", metrics)
    write_report(out, metrics)
    return metrics


def kept_steps(run: Mapping[str, Any]) -> int:
    """Env steps of the weights a method ended with (its metrics, or its ``compare`` entry): the
    point ``select=best`` kept, else its last step."""
    kept = run.get("selected_env_steps")
    return int(run["env_steps"] if kept is None else kept)


def curve_ylabel(metrics: Mapping[str, Any]) -> str:
    """The curve plot's y label: which seeds the curve and the star were evaluated on."""
    curve_seeds = "validation seeds" if metrics.get("select") == "best" else "held-out seeds"
    return (f"success, training wordings\n(curve: {metrics['curve'][0]['episodes']} episodes, {curve_seeds};\n"
            f"star: {metrics['final_episodes']}, held-out seeds)")


def plot_curves(path: Path, metrics: dict[str, Any]) -> Path:
    """Success (training wordings) vs env steps of every method of a run; a star marks each
    method's final evaluation (``final_episodes``, held-out seeds) at the env steps of the
    weights it ended with (``kept_steps``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    series = [(metrics["method"], metrics["curve"], metrics["success_after"], kept_steps(metrics))]
    series += [(k, v["curve"], v["success_after"], kept_steps(v)) for k, v in metrics["compare"].items()]
    for name, curve, after, steps in series:
        pts = [(p["env_steps"], p["success"]) for p in curve if p.get("success") is not None]
        line = ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", label=name,
                       lw=2 if name == metrics["method"] else 1)[0]
        if after is not None:  # the larger before/after evaluation
            ax.plot([steps], [after], "*", ms=12, color=line.get_color())
    if metrics.get("success_before") is not None:
        ax.axhline(metrics["success_before"], color="grey", ls="--", lw=1, label="base policy")
    ax.set_xlabel("environment steps")
    ax.set_ylabel(curve_ylabel(metrics), fontsize=8)
    ax.set_ylim(-0.03, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    reward = metrics["reward"]["name"] if isinstance(metrics["reward"], dict) else metrics["reward"]
    ax.set_title(f"{metrics['task']}: steering a frozen policy ({reward} reward, {metrics['reward_kind']})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def format_ratio(ratio: float | None, at_least: float | None) -> str:
    """A steps ratio for the report: two decimals, or ``> x`` with x rounded down when the
    method never reached the target (its budget over the steered policy's steps is only a
    lower bound, so rounding it up would claim more than was measured)."""
    if ratio is not None:
        return f"{ratio:.2f}x"
    if at_least:
        return f"> {math.floor(at_least * 100) / 100:.2f}x"
    return "–"


def write_report(out: Path, m: dict[str, Any]) -> Path:
    lines = [f"# Steering {m['checkpoint']} on {', '.join(m['tasks'])}", "",
             f"{m['method']}, {m['reward']} reward, {m['env_steps']} env steps, {m['wall_time_s']:.0f} s. Success on "
             f"{m['final_episodes']} held-out seeds per wording split:", "",
             "| | training wordings | held-out wordings |", "|---|---|---|",
             f"| before | {pct(m['success_before'])} | {pct(m['heldout_before'])} |",
             f"| after | {pct(m['success_after'])} | {pct(m['heldout_after'])} |", "",
             f"Reward: {m['reward_kind']}; training episodes end at: {m['episode_end']}.", ""]
    if len(m["tasks"]) > 1:
        lines += ["| task | before | after | held-out wordings before | after |", "|---|---|---|---|---|"]
        for t in m["tasks"]:
            b, a = m["per_task_before"][t], m["per_task_after"][t]
            lines.append(f"| {t} | {pct(b['success'])} | {pct(a['success'])} | {pct(b['heldout'])} | "
                         f"{pct(a['heldout'])} |")
        lines.append("")
    if m.get("select") == "best":
        lines += [f"select=best: the weights kept are those of {m['selected_env_steps']} env steps, the best periodic "
                  f"evaluation ({pct(m['selected_val_success'])}, both wording splits) on validation seeds from "
                  f"{m['val_seed']}; the table above is on the held-out seeds from {m['eval_seed']}.", ""]
    if m["compare"]:
        longer = m.get("compare_env_steps") or 0
        same = (f"Same seeds; budget {longer} env steps for the compared methods (compare_env_steps), against "
                f"{m['method']}'s {m['env_steps']}" if longer > m["env_steps"] else "Same budget, same seeds")
        lines += [f"{same}; env steps each curve needs to reach {pct(m['target_success'])}, the "
                  f"steered policy's held-out success ({m['method']}: {m['steps_to_reach']}):", "",
                  "| method | success after | held-out wordings | env steps to reach | ratio | wall time |",
                  "|---|---|---|---|---|---|"]
        for k, v in m["compare"].items():
            ratio = format_ratio(v["steps_ratio"], v["steps_ratio_at_least"])
            lines.append(f"| {k} | {pct(v['success_after'])} | {pct(v['heldout_after'])} | "
                         f"{v['steps_to_reach'] if v['steps_to_reach'] is not None else 'not reached'} | {ratio} | "
                         f"{v['wall_time_s']:.0f} s |")
        lines.append("")
    lines += ["![success vs env steps](steer_curve.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
