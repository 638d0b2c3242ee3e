"""The loop of ``embodied prefer`` (``run_prefer``) and ``embodied prefer eval`` (``evaluate_reward``).

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
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from embodied.core.registry import get_task, load_object
from embodied.core.reward import RewardModel
from rewards.preference.config import LEARNERS, PreferConfig
from rewards.preference.episodes import trajectory_return
from rewards.preference.model import PreferenceReward
from rewards.preference.queries import schedule, select
from rewards.preference.ranking import RankingLearner, ranking_learner
from rewards.preference.segments import Query, Trajectory, sample_pairs
from rewards.preference.store import LabelStore
from rewards.preference.teachers import PRESETS, RewardModelTeacher, Teacher, make_simulated
from rewards.quality import auroc, expected_calibration_error, preference_accuracy, spearman

log = logging.getLogger("embodied.prefer")


def oracle_targets(queries: Sequence[Query]) -> np.ndarray:
    """Exact ground-truth preference P[right ≻ left] (0.5 on an exact tie)."""
    return np.array([0.5 if q.left.ret == q.right.ret else float(q.right.ret > q.left.ret) for q in queries])


def reward_quality(model: PreferenceReward, pairs: Sequence[Query], targets: np.ndarray,
                   trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Held-out preference accuracy, ECE, return Spearman and success AUROC of a learned reward."""
    p = model.predict(pairs).mean(0)
    learned = np.array([trajectory_return(model, t) for t in trajs])
    return {"accuracy": preference_accuracy(p, targets), "ece": expected_calibration_error(p, targets),
            "return_spearman": spearman(learned, [t.ret for t in trajs]),
            "success_auroc": auroc(learned, [t.success for t in trajs])}


def load_vlm(cfg: PreferConfig) -> RewardModel:
    """The VLM teacher's reward: a ``rewards.registry`` name with ``vlm_settings``, or
    ``module:factory`` called with them; it must read frames and may score ``cfg.task``'s suite."""
    if ":" in cfg.vlm_reward:
        model = load_object(cfg.vlm_reward, "vlm_reward")(**cfg.vlm_settings)
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


def run_prefer(cfg: PreferConfig, run_dir: Path) -> dict[str, Any]:
    """The loop of the module docstring; writes the reward (``reward.pt``) each round."""
    spec = get_task(cfg.task)
    if cfg.segment_length > spec.max_episode_steps:
        raise ValueError(f"segment_length={cfg.segment_length} is longer than {cfg.task}'s episodes "
                         f"({spec.max_episode_steps} steps)")
    vlm = load_vlm(cfg) if cfg.teacher == "vlm" else None
    if vlm is not None:  # record the frames the VLM reads: its camera, its side
        cfg = replace(cfg, render_size=vlm.image_size or cfg.render_size, render_camera=vlm.camera or cfg.render_camera,
                      render_supersample=vlm.supersample)
    frames = cfg.needs_frames
    learner = LEARNERS[cfg.learner](cfg, frames)
    if hasattr(learner, "out"):
        learner.out = run_dir
    coverage = learner if isinstance(learner, RankingLearner) else ranking_learner(cfg, frames)
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
    coverage = learner if isinstance(learner, RankingLearner) else ranking_learner(cfg, frames)
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
            out["store_accuracy"] = preference_accuracy(p, np.array(ys))
            out["store_ece"] = expected_calibration_error(p, np.array(ys))
            out["store_labels"] = len(qs)
    out["policy"] = learner.evaluate(cfg.eval_episodes, model)
    return out
