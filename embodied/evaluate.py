"""Evaluation: per-task success with 95% confidence intervals, reports and videos.

Used by ``embodied eval``, by ``embodied train`` (periodic and final evaluation) and by
``embodied bench``. Seeds are fixed: episode k of a task uses ``seed + k``, the same for
every split and every policy, so numbers are comparable across runs.
"""

from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from embodied.policy import Policy
from embodied.registry import make_env
from embodied.rollout import EpisodeResult, run_episodes, wilson_interval

SPLITS = ("train", "heldout")


def _summary(results: Sequence[EpisodeResult]) -> dict[str, Any]:
    k, n = sum(r.success for r in results), len(results)
    lo, hi = wilson_interval(k, n)
    return {"success_rate": k / n if n else 0.0, "ci_low": lo, "ci_high": hi, "episodes": n,
            "mean_return": float(np.mean([r.ret for r in results])) if n else 0.0,
            "mean_length": float(np.mean([r.length for r in results])) if n else 0.0}


def evaluate(
    policy: Policy | str,
    tasks: Sequence[str],
    episodes: int = 20,
    splits: Sequence[str] = SPLITS,
    seed: int = 100_000,
    num_envs: int = 4,
    vector: str = "sync",
    env_kwargs: Mapping[str, Any] | None = None,
    instructions: Mapping[str, Sequence[str]] | None = None,
    videos: int = 0,
    progress: bool = True,
) -> tuple[dict[str, Any], dict[str, list[EpisodeResult]]]:
    """Evaluate ``policy`` on each task and instruction split.

    Args:
        policy: a ``Policy`` or ``"expert"``.
        tasks: task names.
        episodes: episodes per task and split.
        splits: instruction splits to evaluate (``"train"``, ``"heldout"``).
        seed: first seed; episode k uses ``seed + k``.
        instructions: optional task -> instruction templates of your own wording,
            evaluated as an extra split ``"custom"``.
        videos: episodes per task (train split) whose frames are kept for videos.

    Returns:
        (metrics, results) where metrics has ``success_rate`` (mean over tasks, train
        paraphrases), ``heldout_paraphrase_success_rate``, ``per_task`` and
        ``wall_time_s``; results maps ``"task/split"`` to episode records.
    """
    from tqdm.auto import tqdm

    for s in splits:
        if s not in SPLITS:
            raise ValueError(f"splits may contain {SPLITS}, got {s!r}")
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    instructions = dict(instructions or {})
    unknown = [t for t in instructions if t not in tasks]
    if unknown:
        raise ValueError(f"instructions given for tasks not being evaluated: {unknown}; tasks: {list(tasks)}")
    env_kwargs = dict(env_kwargs or {})
    t0 = time.time()
    runs = [(t, s, None) for t in tasks for s in splits] + [(t, "custom", v) for t, v in instructions.items()]
    bar = tqdm(total=len(runs) * episodes, desc="eval", unit="ep", disable=not progress, leave=False)
    per_task: dict[str, dict[str, Any]] = {t: {} for t in tasks}
    all_results: dict[str, list[EpisodeResult]] = {}
    for task, split, custom in runs:
        kw = dict(env_kwargs, instruction_split="train" if split == "custom" else split)
        if custom is not None:
            kw["instructions"] = list(custom)
        rec = videos if split == "train" else 0
        if rec:
            kw["render_mode"] = "rgb_array"
        res = run_episodes(partial(make_env, task, **kw), range(seed, seed + episodes), policy,
                           num_envs=num_envs, vector=vector, record=rec, progress=bar, task=task)
        all_results[f"{task}/{split}"] = res
        summ = _summary(res)
        if split == "train":
            per_task[task].update(summ)
        else:
            per_task[task][split] = summ
    bar.close()

    def mean_of(split: str) -> float | None:
        vals = [(p if split == "train" else p.get(split, {})).get("success_rate") for p in per_task.values()]
        vals = [v for v in vals if v is not None]
        return float(np.mean(vals)) if vals else None

    metrics: dict[str, Any] = {
        "success_rate": mean_of("train"),
        "heldout_paraphrase_success_rate": mean_of("heldout"),
        "per_task": per_task,
        "episodes_per_task": episodes,
        "seed": seed,
        "wall_time_s": time.time() - t0,
    }
    if instructions:
        metrics["custom_instruction_success_rate"] = mean_of("custom")
    return metrics, all_results


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write JSON atomically (a crash never leaves a half-written file)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=float))
    os.replace(tmp, path)


def _fmt(p: Mapping[str, Any] | None) -> str:
    if not p:
        return "–"
    return f"{100 * p['success_rate']:.0f}% [{100 * p['ci_low']:.0f}, {100 * p['ci_high']:.0f}]"


def write_report(out_dir: str | os.PathLike[str], metrics: Mapping[str, Any], title: str = "Evaluation",
                 videos: Mapping[str, str] | None = None) -> Path:
    """Markdown report + bar chart (success with 95% CIs per task) in ``out_dir``."""
    out = Path(out_dir)
    png = plot_success(out / "success.png", metrics)
    per = metrics["per_task"]
    has_custom = any("custom" in p for p in per.values())
    lines = [f"# {title}", "",
             f"Mean success (training paraphrases): **{_pct(metrics.get('success_rate'))}**; "
             f"held-out paraphrases: **{_pct(metrics.get('heldout_paraphrase_success_rate'))}**; "
             f"{metrics.get('episodes_per_task')} episodes per task and split, seeds from {metrics.get('seed')}; "
             f"{metrics.get('wall_time_s', 0):.0f} s.", "",
             "| task | train paraphrases (95% CI) | held-out paraphrases | " + ("custom | " if has_custom else "")
             + "mean length | videos |",
             "|---|---|---|" + ("---|" if has_custom else "") + "---|---|"]
    for t, p in per.items():
        vids = " ".join(f"[{k.split('/')[-1]}]({v})" for k, v in (videos or {}).items() if k.startswith(t + "/"))
        row = f"| {t} | {_fmt(p if 'success_rate' in p else None)} | {_fmt(p.get('heldout'))} | "
        if has_custom:
            row += f"{_fmt(p.get('custom'))} | "
        lines.append(row + f"{p.get('mean_length', 0):.0f} | {vids} |")
    lines += ["", f"![success per task]({png.name})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def plot_success(path: Path, metrics: Mapping[str, Any]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = metrics["per_task"]
    tasks = list(per)
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(tasks) + 2), 3.8))
    x = np.arange(len(tasks))
    series = [("train", "training paraphrases", lambda p: p if "success_rate" in p else None),
              ("heldout", "held-out paraphrases", lambda p: p.get("heldout")),
              ("custom", "custom instructions", lambda p: p.get("custom"))]
    series = [s for s in series if any(s[2](per[t]) for t in tasks)]
    w = 0.8 / max(1, len(series))
    for k, (_, label, get) in enumerate(series):
        vals = [get(per[t]) or {"success_rate": 0, "ci_low": 0, "ci_high": 0} for t in tasks]
        y = np.array([v["success_rate"] for v in vals])
        err = np.array([[v["success_rate"] - v["ci_low"] for v in vals], [v["ci_high"] - v["success_rate"] for v in vals]])
        ax.bar(x + (k - (len(series) - 1) / 2) * w, y, w, yerr=err, capsize=2, label=label)
    ax.set_xticks(x, tasks, rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95% CI)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save_videos(out_dir: str | os.PathLike[str], results: Mapping[str, list[EpisodeResult]], fps: int = 20
                ) -> dict[str, str]:
    """Save one success and one failure video per task (MP4, GIF if no encoder). Returns name -> path."""
    import imageio.v2 as imageio

    out = Path(out_dir) / "videos"
    saved: dict[str, str] = {}
    for key, res in results.items():
        task, split = key.split("/")
        if split != "train":
            continue
        for kind, want in (("success", True), ("failure", False)):
            ep = next((r for r in res if r.frames and r.success == want), None)
            if ep is None:
                continue
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"{task}_{kind}_seed{ep.seed}.mp4"
            try:
                imageio.mimwrite(path, ep.frames, fps=fps, macro_block_size=1)
            except Exception:  # no ffmpeg: fall back to GIF
                path = path.with_suffix(".gif")
                imageio.mimwrite(path, ep.frames, duration=1000 / fps, loop=0)
            saved[f"{task}/{kind}"] = str(path.relative_to(Path(out_dir)))
    return saved
