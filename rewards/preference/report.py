"""The figure comparing ``embodied prefer`` runs (``embodied prefer plot``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np



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
