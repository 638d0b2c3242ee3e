"""The reward-quality report: ``report.md`` with tables and plots a person can read at a glance.

Plots (PNG, next to the report):
    ``reward_along_episode.png``: per task, the reward (solid) and the ground-truth dense
        reward (dashed) along one expert, one partial and one random episode, success
        frames shaded; rewards are min-max scaled per task so both fit one axis.
    ``roc.png``: per-frame success ROC curve of every task, with its AUROC.
    ``sensitivity.png``: AUROC against alpha, and AUROC per wording (training vs held-out).

Reads a bank through duck typing (``episodes``, ``episode``, ``step``, ``success``,
``gt_reward``, ``post``), so it needs nothing from the runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from rewards.quality import roc_curve


def _fmt(v: Any) -> str:
    return "–" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f"{v:.3f}"


def _scaled(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


def plot_episodes(path: Path, bank: Any, curves: Mapping[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(curves)
    fig, axes = plt.subplots(len(tasks), 3, figsize=(12, 2.2 * len(tasks)), squeeze=False)
    for i, task in enumerate(tasks):
        rows, reward = curves[task]["rows"], curves[task]["reward"]
        lo, hi = float(reward.min()), float(reward.max())
        ep = bank.episode[rows]
        for j, behaviour in enumerate(("expert", "partial", "random")):
            ax = axes[i, j]
            ids = [e for e in np.unique(ep) if bank.episodes[int(e)]["behaviour"] == behaviour]
            if not ids:
                ax.axis("off")
                continue
            sel = np.flatnonzero(ep == ids[0])
            t = bank.step[rows[sel]]
            ax.plot(t, _scaled(reward[sel], lo, hi), label="reward (scaled)")
            g = bank.gt_reward[rows[sel]]
            ax.plot(t, g, "--", label="ground-truth dense reward")
            ok = bank.success[rows[sel]]
            ax.fill_between(t, 0, 1, where=ok, color="green", alpha=0.15, step="mid", label="success")
            ax.set_ylim(-0.05, 1.05)
            info = bank.episodes[int(ids[0])]
            ax.set_title(f"{task} · {behaviour} · seed {info['seed']}", fontsize=8)
            if i == len(tasks) - 1:
                ax.set_xlabel("step")
        if i == 0:
            axes[0, 0].legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_roc(path: Path, bank: Any, curves: Mapping[str, Any], per_task: Mapping[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    for task, c in curves.items():
        labels = bank.success[c["rows"]]
        if labels.all() or not labels.any():
            continue
        fpr, tpr = roc_curve(c["reward"], labels)
        ax.plot(fpr, tpr, label=f"{task} ({per_task[task]['auroc']:.3f})")
    ax.plot([0, 1], [0, 1], ":", color="grey")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title("per-frame success ROC (AUROC)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_sensitivity(path: Path, metrics: Mapping[str, Any]) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alpha = metrics.get("alpha_sensitivity") or {}
    words = metrics.get("wording_sensitivity") or {}
    if not alpha and not words:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    if alpha:
        xs = sorted(alpha, key=float)
        for m in ("auroc", "voc"):
            axes[0].plot([float(a) for a in xs], [alpha[a][m] for a in xs], "o-", label=m)
        axes[0].set_xlabel("alpha (goal-baseline projection)")
        axes[0].set_title("mean over tasks")
        axes[0].legend()
    else:
        axes[0].axis("off")
    if words:
        tasks = list(words)
        for k, split in enumerate(("train", "heldout")):
            for i, t in enumerate(tasks):
                vals = [v["auroc"] for v in words[t][split].values()]
                axes[1].scatter(np.full(len(vals), i + (k - 0.5) * 0.3), vals, s=10,
                                color="C0" if split == "train" else "C3", label=split if i == 0 else None)
        axes[1].set_xticks(range(len(tasks)))
        axes[1].set_xticklabels(tasks, rotation=45, ha="right", fontsize=7)
        axes[1].set_ylabel("success AUROC")
        axes[1].set_title("one point per wording")
        axes[1].legend()
    else:
        axes[1].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def write_reward_report(out: Path, metrics: Mapping[str, Any], bank: Any, curves: Mapping[str, Any],
                        plots: bool = True) -> Path:
    """Write ``report.md`` (and the plots when ``plots``) to ``out``."""
    out = Path(out)
    per, gt = metrics["per_task"], metrics["ground_truth_dense_reward"]["per_task"]
    b = metrics.get("bank", {})
    lines = [f"# Reward quality: {metrics.get('suite', '')}", "",
             f"Reward: `{metrics.get('reward')}`", "",
             f"Rollout bank: {b.get('episodes')} episodes, {b.get('frames')} frames; {b.get('seeds')} seeds per "
             f"task from {b.get('seed')}, {b.get('split')} wordings, behaviours {b.get('behaviours')}.", "",
             "| task | AUROC | VOC (min) | return Spearman | EPIC | frames (success) | GT dense AUROC | GT VOC |",
             "|---|---|---|---|---|---|---|---|"]
    for t, p in per.items():
        lines.append(f"| {t} | {_fmt(p['auroc'])} | {_fmt(p['voc'])} ({_fmt(p['voc_min'])}) | "
                     f"{_fmt(p['return_spearman'])} | {_fmt(p['epic'])} | {p['frames']} ({p['success_frames']}) | "
                     f"{_fmt(gt[t]['auroc'])} | {_fmt(gt[t]['voc'])} |")
    lines.append(f"| **mean** | {_fmt(metrics['auroc'])} | {_fmt(metrics['voc'])} | "
                 f"{_fmt(metrics['return_spearman'])} | {_fmt(metrics['epic'])} | | "
                 f"{_fmt(metrics['ground_truth_dense_reward']['auroc'])} | "
                 f"{_fmt(metrics['ground_truth_dense_reward']['voc'])} |")
    lines += ["", "AUROC: per-frame success classification. VOC: Spearman of reward with time on successful "
              "expert episodes (up to the first success). Return Spearman: episode return vs. ground-truth "
              "return. EPIC: distance to the ground-truth dense reward (0 = equivalent, 1 = opposite). "
              "GT columns: the ground-truth dense reward scored the same way (the ceiling).", ""]
    if plots:
        plot_episodes(out / "reward_along_episode.png", bank, curves)
        plot_roc(out / "roc.png", bank, curves, per)
        lines += ["![reward along episodes](reward_along_episode.png)", "", "![ROC](roc.png)", ""]
    if metrics.get("alpha_sensitivity"):
        lines += ["## Sensitivity to alpha", "", "| alpha | AUROC | VOC | EPIC |", "|---|---|---|---|"]
        for a, v in sorted(metrics["alpha_sensitivity"].items(), key=lambda kv: float(kv[0])):
            lines.append(f"| {a} | {_fmt(v['auroc'])} | {_fmt(v['voc'])} | {_fmt(v['epic'])} |")
        lines.append("")
    if metrics.get("wording_sensitivity"):
        lines += ["## Sensitivity to wording", "",
                  "| task | train AUROC mean (min) | held-out AUROC mean (min) | train VOC mean | held-out VOC mean |",
                  "|---|---|---|---|---|"]
        for t, v in metrics["wording_sensitivity"].items():
            lines.append(f"| {t} | {_fmt(v['train_auroc_mean'])} ({_fmt(v['train_auroc_min'])}) | "
                         f"{_fmt(v['heldout_auroc_mean'])} ({_fmt(v['heldout_auroc_min'])}) | "
                         f"{_fmt(v['train_voc_mean'])} | {_fmt(v['heldout_voc_mean'])} |")
        lines.append("")
    if plots and plot_sensitivity(out / "sensitivity.png", metrics):
        lines += ["![sensitivity](sensitivity.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
