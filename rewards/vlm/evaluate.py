"""Reward quality of any ``RewardModel`` on a rollout bank (``embodied reward eval``).

Every frame of a held-out bank (held-out seeds, held-out wordings) is scored with its
episode's instruction; per task: success AUROC, VOC of successful expert episodes, return
Spearman and EPIC against the task's dense reward (``rewards.quality``), beside the dense
reward's own figures; sensitivity to alpha and to wording when asked.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from embodied.core.errors import EmbodiedError
from embodied.core.registry import get_task, resolve_tasks
from embodied.core.reward import RewardModel
from rewards.vlm.bank import BankConfig, RolloutBank, bank_for, seed_range, suite_of


@dataclass
class RewardEvalConfig:
    """Schema of ``configs/reward_eval.yaml``: reward quality on a held-out rollout bank."""

    suite: str = "manipulation"
    tasks: list[str] = field(default_factory=list)
    # reward=clip (config group configs/reward/): any model of rewards.registry
    reward: dict[str, Any] = field(default_factory=lambda: {"name": "clip"})
    # held-out seeds and wordings: 40 seeds per task (40 successful expert episodes for VOC); with 10
    # the per-task figures of one checkpoint moved by up to 0.05 AUROC and 0.2 VOC (docs/results.md,
    # issue 16, eighth round). A suite may choose otherwise in configs/reward_eval_suite/<suite>.yaml
    bank: BankConfig = field(default_factory=lambda: BankConfig(seeds=40, seed=1_000_000, split="heldout"))
    image_size: int = 64  # frame side for a reward that reads any size
    # sensitivity to alpha (the goal-baseline projection, with the reward's own baselines)
    alphas: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    wordings: bool = True  # sensitivity to wording: every training and held-out template of each task
    gamma: float = 0.99  # EPIC's discount
    epic_pool: int = 512  # coverage states EPIC canonicalises over, per task
    bank_path: str = ""
    save_bank: str = ""
    plots: bool = True
    threads: int = 1
    progress: bool = True

    def __post_init__(self) -> None:
        if any(not 0.0 <= a <= 1.0 for a in self.alphas):
            raise ValueError(f"alphas must lie in [0, 1], got {self.alphas}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.epic_pool < 2 or self.threads < 1:
            raise ValueError(f"epic_pool must be >= 2 and threads >= 1, got {self.epic_pool}, {self.threads}")


class _Scorer:
    """Scores bank rows with a reward model; a CLIP-like model's image embeddings are computed
    once and reused for every instruction and option (alpha, wording)."""

    def __init__(self, model: RewardModel, bank: RolloutBank, chunk: int = 1024):
        self.model, self.bank, self.chunk = model, bank, chunk
        self.reuse = callable(getattr(model, "embed_images", None)) and callable(
            getattr(model, "score_embeddings", None))
        self._emb: dict[int, Any] = {}

    def __call__(self, rows: np.ndarray, instructions: Sequence[str], model: RewardModel | None = None
                 ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        m = model or self.model
        out_r, out_t = [], []
        for i in range(0, len(rows), self.chunk):
            r, ins = rows[i:i + self.chunk], list(instructions[i:i + self.chunk])
            if self.reuse:
                key = int(r[0]) * 1_000_003 + len(r)
                if key not in self._emb:
                    self._emb[key] = self.model.embed_images(self.bank.frames[r])
                o = m.score_embeddings(self._emb[key], ins)
            else:
                o = m(self.bank.frames[r] if "frames" in m.inputs else None,
                      self.bank.states[r] if "states" in m.inputs else None, ins)
            out_r.append(np.asarray(o.reward, np.float32))
            out_t.append(o.terms)
        terms = {k: np.concatenate([t[k] for t in out_t]) for k in out_t[0]} if out_t else {}
        return np.concatenate(out_r) if out_r else np.zeros(0, np.float32), terms


def _smooth_rows(bank: RolloutBank, rows: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """Causal mean over the last ``k`` frames within each episode (rows are in episode order)."""
    if k <= 1:
        return values
    from rewards.vlm.model import causal_mean

    out = values.copy()
    ep = bank.episode[rows]
    for e in np.unique(ep):
        sel = np.flatnonzero(ep == e)
        out[sel] = causal_mean(values[sel], k)
    return out


def quality(bank: RolloutBank, rows: np.ndarray, reward: np.ndarray, gamma: float, pool: int,
            rng: np.random.Generator) -> dict[str, Any]:
    """Success AUROC, VOC, return Spearman and EPIC of ``reward`` (per row of ``rows``)."""
    import torch

    from rewards.quality import auroc, epic_distance, next_state_reward, spearman, voc

    ep = bank.episode[rows]
    post = bank.post[rows]
    vocs, rets, gts = [], [], []
    for e in np.unique(ep):
        sel = np.flatnonzero((ep == e) & ~post)
        info = bank.episodes[int(e)]
        if info["behaviour"] == "expert" and info["success"] and len(sel) >= 2:
            vocs.append(voc(reward[sel]))
        rets.append(float(reward[sel].sum()))
        gts.append(float(bank.gt_reward[rows[sel]].sum()))
    # EPIC over consecutive kept frames of each episode, canonicalised over coverage states
    local = np.arange(len(rows))
    cont = np.flatnonzero(ep[1:] == ep[:-1])
    s, s_next = torch.from_numpy(local[cont]), torch.from_numpy(local[cont + 1])
    pool_idx = torch.from_numpy(rng.choice(len(rows), min(pool, len(rows)), replace=False))
    epic = epic_distance(next_state_reward(torch.from_numpy(reward.astype(np.float64))),
                         next_state_reward(torch.from_numpy(bank.gt_reward[rows].astype(np.float64))),
                         s, s_next, pool_idx, gamma) if len(cont) >= 2 else float("nan")
    vocs = [v for v in vocs if np.isfinite(v)]
    return {"auroc": auroc(reward, bank.success[rows]), "voc": float(np.mean(vocs)) if vocs else float("nan"),
            "voc_min": float(np.min(vocs)) if vocs else float("nan"), "voc_episodes": len(vocs),
            "return_spearman": spearman(np.array(rets), np.array(gts)), "epic": epic,
            "frames": int(len(rows)), "success_frames": int(bank.success[rows].sum()), "episodes": len(rets)}


def _mean(values: list[float]) -> float:
    v = [x for x in values if x is not None and np.isfinite(x)]
    return float(np.mean(v)) if v else float("nan")


def evaluate_reward(model: RewardModel, bank: RolloutBank, tasks: Sequence[str], alphas: Sequence[float] = (),
                    wordings: bool = True, gamma: float = 0.99, epic_pool: int = 512,
                    seed: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reward quality of any ``RewardModel`` on a bank: (metrics, per-task curves for plots).

    Each frame is scored with its episode's instruction (the bank's split). ``alphas`` and
    ``wordings`` add sensitivity analyses (alpha needs a model with ``with_options``).
    """
    scorer = _Scorer(model, bank)
    k = int(getattr(model, "smoothing", 1))
    rng = np.random.default_rng(seed)
    per_task, gt_ref, curves = {}, {}, {}
    sens_alpha: dict[str, dict[str, Any]] = {}
    sens_words: dict[str, Any] = {}
    for task in tasks:
        rows = bank.rows(task)
        if len(rows) == 0:
            raise EmbodiedError(f"the rollout bank has no frames of task {task!r}")
        ins = [bank.episodes[int(e)]["instruction"] for e in bank.episode[rows]]
        raw, terms = scorer(rows, ins)
        reward = _smooth_rows(bank, rows, raw, k)
        per_task[task] = quality(bank, rows, reward, gamma, epic_pool, rng)
        gt_ref[task] = quality(bank, rows, bank.gt_reward[rows], gamma, epic_pool, rng)
        curves[task] = {"rows": rows, "reward": reward, "terms": terms}
        if alphas and callable(getattr(model, "with_options", None)):
            for a in alphas:
                variant = model.with_options(alpha=float(a))
                r = _smooth_rows(bank, rows, scorer(rows, ins, variant)[0], k)
                q = quality(bank, rows, r, gamma, epic_pool, rng)
                sens_alpha.setdefault(f"{a:g}", {})[task] = {m: q[m] for m in ("auroc", "voc", "epic")}
        if wordings:
            sens_words[task] = _wording_sensitivity(bank, rows, task, scorer, k, gamma, epic_pool, rng)
    keys = ("auroc", "voc", "return_spearman", "epic")
    metrics: dict[str, Any] = {m: _mean([per_task[t][m] for t in tasks]) for m in keys}
    metrics.update({f"{m}_min": float(np.nanmin([per_task[t][m] for t in tasks])) for m in ("auroc", "voc")})
    metrics["per_task"] = per_task
    metrics["ground_truth_dense_reward"] = {**{m: _mean([gt_ref[t][m] for t in tasks]) for m in keys},
                                            "per_task": gt_ref}
    if sens_alpha:
        metrics["alpha_sensitivity"] = {a: {**{m: _mean([v[t][m] for t in tasks]) for m in ("auroc", "voc", "epic")},
                                            "per_task": v} for a, v in sens_alpha.items()}
    if sens_words:
        metrics["wording_sensitivity"] = sens_words
    return metrics, curves


def _wording_sensitivity(bank: RolloutBank, rows: np.ndarray, task: str, scorer: _Scorer, k: int, gamma: float,
                         pool: int, rng: np.random.Generator) -> dict[str, Any]:
    """AUROC and VOC with each template of the task (training and held-out) filled per episode."""
    from rewards.vlm.fit import goal_wordings

    spec = get_task(task)
    out: dict[str, Any] = {"train": {}, "heldout": {}}
    for split, templates in (("train", spec.train_instructions), ("heldout", spec.heldout_instructions)):
        for tpl in templates:
            ins = [goal_wordings([tpl], {a: b for a, b in bank.episodes[int(e)]["params"].items()
                                         if isinstance(b, str)})[0] for e in bank.episode[rows]]
            r = _smooth_rows(bank, rows, scorer(rows, ins)[0], k)
            q = quality(bank, rows, r, gamma, pool, rng)
            out[split][tpl] = {"auroc": q["auroc"], "voc": q["voc"]}
    for split in ("train", "heldout"):
        a = [v["auroc"] for v in out[split].values()]
        vv = [v["voc"] for v in out[split].values()]
        out[f"{split}_auroc_mean"], out[f"{split}_auroc_min"] = _mean(a), float(np.nanmin(a))
        out[f"{split}_voc_mean"], out[f"{split}_voc_min"] = _mean(vv), float(np.nanmin(vv))
    return out


def evaluate_on_bank(cfg: RewardEvalConfig, model: RewardModel | None = None
                     ) -> tuple[dict[str, Any], RolloutBank, dict[str, Any]]:
    """Evaluate ``model`` (else the one ``cfg.reward`` names) on the bank ``cfg.bank`` (played, or
    loaded from ``cfg.bank_path``): (metrics, the bank, per-task curves), what the report reads."""
    import torch

    from rewards.registry import make_reward

    torch.set_num_threads(cfg.threads)
    tasks = resolve_tasks(cfg.suite, cfg.tasks)
    suite = suite_of(tasks)
    model = model if model is not None else make_reward(cfg.reward)
    model.check_suite(suite)
    fitted = getattr(model, "meta", {}).get("fitted") or {}
    if fitted.get("seeds"):
        lo, hi = fitted["seeds"]
        elo, ehi = seed_range(cfg.bank, len(tasks))
        if elo < hi and lo < ehi:
            raise ValueError(f"evaluation seeds [{elo}, {ehi}) overlap the seeds the reward was fitted on "
                             f"[{lo}, {hi}): choose bank.seed >= {hi}")
    size = model.image_size or cfg.image_size
    t0 = time.perf_counter()
    bank = bank_for(tasks, cfg.bank, size, model.camera, cfg.bank_path, cfg.save_bank, cfg.progress,
                    model.supersample)
    t1 = time.perf_counter()
    metrics, curves = evaluate_reward(model, bank, tasks, cfg.alphas, cfg.wordings, cfg.gamma, cfg.epic_pool)
    describe = getattr(model, "describe", None)
    metrics.update({"suite": suite, "tasks": tasks,
                    "reward": describe() if callable(describe) else type(model).__name__,
                    "bank": {"episodes": len(bank.episodes), "frames": int(len(bank.step)), **asdict(cfg.bank)},
                    "bank_time_s": t1 - t0, "score_time_s": time.perf_counter() - t1,
                    "wall_time_s": time.perf_counter() - t0})
    return metrics, bank, curves
