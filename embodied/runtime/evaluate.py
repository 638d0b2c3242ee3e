"""Evaluation: per-task success with 95% confidence intervals, reports and videos.

Used by ``embodied eval``, by ``embodied train`` (periodic and final evaluation) and by
``embodied bench``. Seeds are fixed: episode k of a task uses ``seed + k``, the same for
every split and every policy, so numbers are comparable across runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from embodied.core.errors import UnknownNameError
from embodied.core.files import write_json  # noqa: F401  (re-exported: the commands and steer import it here)
from embodied.core.policy import Episode, Policy, PolicyWrapper, batch_row
from embodied.core.registry import get_task, make_env
from embodied.runtime.rollout import VIDEO_FPS, EpisodeResult, run_episodes, wilson_interval
from policies.common.config import check_noise_scale

SPLITS = ("train", "heldout")


def _summary(results: Sequence[EpisodeResult], task: str) -> dict[str, Any]:
    k, n = sum(r.success for r in results), len(results)
    lo, hi = wilson_interval(k, n)
    out = {"success_rate": k / n if n else 0.0, "ci_low": lo, "ci_high": hi, "episodes": n,
           "mean_return": float(np.mean([r.ret for r in results])) if n else 0.0,
           "mean_length": float(np.mean([r.length for r in results])) if n else 0.0}
    grounded = [r for r in results if r.grounded is not None]
    if grounded:  # the policy acted on another wording than the one given (see Policy.observe, GroundedPolicy)
        out["grounded_episodes"] = len(grounded)
        own = _own_wordings(task)
        if own is not None:
            out["grounded_to_own_task"] = sum(r.grounded in own for r in grounded) / len(grounded)
    return out


def _own_wordings(task: str) -> frozenset[str] | None:
    """The task's training wordings, when they are plain sentences (no ``{parameters}``)."""
    try:
        words = get_task(task).train_instructions
    except UnknownNameError:  # a task registered elsewhere only loses this statistic
        return None
    return None if any("{" in w for w in words) else frozenset(words)


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
    noise_stream: int = 0,
    noise_scale: float | None = None,
) -> tuple[dict[str, Any], dict[str, list[EpisodeResult]]]:
    """Evaluate ``policy`` on each task and instruction split.

    A ``Policy`` is run through ``RowwisePolicy``, so each episode depends only on its
    task, split and seed (not on ``num_envs`` nor on how episodes are batched or sharded);
    ``embodied.runtime.distributed.evaluate_ray`` gives the same results on Ray workers.

    Args:
        policy: a ``Policy`` or ``"expert"``.
        tasks: task names.
        episodes: episodes per task and split.
        splits: instruction splits to evaluate (``"train"``, ``"heldout"``).
        seed: first seed; episode k uses ``seed + k``.
        instructions: optional task -> instruction templates of your own wording,
            evaluated as an extra split ``"custom"``.
        videos: episodes per task (train split) whose frames are kept for videos.
        noise_stream: which stream of per-observation initial noise a generative policy gets
            (``RowwisePolicy``); 0 is the stream every other evaluation uses.
        noise_scale: factor on that initial noise (1: N(0, I) as trained; 0: always the
            zero noise, the flow's mode); None: the policy's own ``noise_scale``.

    Returns:
        (metrics, results) where metrics has ``success_rate`` (mean over tasks, train
        paraphrases), ``heldout_paraphrase_success_rate``, ``per_task`` and
        ``wall_time_s``; results maps ``"task/split"`` to episode records.
    """
    from tqdm.auto import tqdm

    runs = eval_runs(tasks, episodes, splits, instructions)
    env_kwargs = dict(env_kwargs or {})
    if isinstance(policy, Policy) and not isinstance(policy, RowwisePolicy):
        policy = RowwisePolicy(policy, noise_stream, noise_scale)
    elif isinstance(policy, RowwisePolicy) and (noise_stream, noise_scale) != (0, None):
        policy = RowwisePolicy(policy.policy, noise_stream, noise_scale)
    t0 = time.time()
    bar = tqdm(total=len(runs) * episodes, desc="eval", unit="ep", disable=not progress, leave=False)
    all_results: dict[str, list[EpisodeResult]] = {}
    for task, split, custom in runs:
        all_results[f"{task}/{split}"] = run_group(policy, task, split, custom, range(seed, seed + episodes),
                                                   env_kwargs, num_envs, vector, videos, progress=bar)
    bar.close()
    return summarize(tasks, all_results, episodes, seed, time.time() - t0), all_results


def eval_runs(tasks: Sequence[str], episodes: int, splits: Sequence[str],
              instructions: Mapping[str, Sequence[str]] | None) -> list[tuple[str, str, list[str] | None]]:
    """Check the arguments of an evaluation; return its (task, split, custom instructions) runs in order."""
    for s in splits:
        if s not in SPLITS:
            raise ValueError(f"splits may contain {SPLITS}, got {s!r}")
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    instructions = dict(instructions or {})
    unknown = [t for t in instructions if t not in tasks]
    if unknown:
        raise ValueError(f"instructions given for tasks not being evaluated: {unknown}; tasks: {list(tasks)}")
    return [(t, s, None) for t in tasks for s in splits] + [(t, "custom", list(v)) for t, v in instructions.items()]


def run_group(policy: Policy | str, task: str, split: str, custom: Sequence[str] | None, seeds: Sequence[int],
              env_kwargs: Mapping[str, Any], num_envs: int, vector: str, videos: int, first: int = 0,
              progress: Any = None) -> list[EpisodeResult]:
    """Play ``seeds`` of one (task, split): the unit of work of the local and the Ray runner.

    ``first`` is the position of ``seeds[0]`` among the run's episodes: frames are kept
    for the run's first ``videos`` episodes (train split only).

    With ``vector="sync"`` the episodes play one after another in a single environment
    when the policy acts one row at a time (the expert, or a ``RowwisePolicy`` over a policy
    without ``batches_rows``): more in-process environments would batch nothing and only
    add construction time.
    """
    if vector == "sync" and (policy == "expert" or (isinstance(policy, RowwisePolicy)
                                                    and not getattr(policy.policy, "batches_rows", False))):
        num_envs = 1
    kw = dict(env_kwargs, instruction_split="train" if split == "custom" else split)
    if custom is not None:
        kw["instructions"] = list(custom)
    rec = videos if split == "train" else 0
    if rec:
        kw["render_mode"] = "rgb_array"
    return run_episodes(partial(make_env, task, **kw), seeds, policy, num_envs=num_envs, vector=vector,
                        record=max(0, rec - first), progress=progress, task=task)


def summarize(tasks: Sequence[str], results: Mapping[str, Sequence[EpisodeResult]], episodes: int, seed: int,
              wall_time_s: float) -> dict[str, Any]:
    """Metrics of an evaluation from its episode records (``"task/split"`` -> records, in run order)."""
    per_task: dict[str, dict[str, Any]] = {t: {} for t in tasks}
    for key, res in results.items():
        task, split = key.rsplit("/", 1)
        summ = _summary(res, task)
        if split == "train":
            per_task[task].update(summ)
        else:
            per_task[task][split] = summ

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
        "wall_time_s": wall_time_s,
    }
    if any(key.rsplit("/", 1)[1] == "custom" for key in results):
        metrics["custom_instruction_success_rate"] = mean_of("custom")
    return metrics


def noise_stream_summary(streams: Sequence[Mapping[str, Sequence[EpisodeResult]]]) -> dict[str, Any]:
    """Success over several noise streams of the same seeds (``evaluate(..., noise_stream=k)``).

    For each ``"task/split"``: ``mean`` (success over all streams and seeds), ``pass_at_k``
    (the share of seeds that at least one stream solves: what choosing each episode's initial
    noise could reach, the ceiling of latent-noise steering for this policy), ``unsolved_seeds``
    and ``k``; and the means over tasks per split.
    """
    k = len(streams)
    out: dict[str, Any] = {"k": k, "per_task": {}}
    for key in streams[0]:
        seeds = [r.seed for r in streams[0][key]]
        if any([r.seed for r in s[key]] != seeds for s in streams):
            raise ValueError(f"noise streams of {key} played other seeds: compare the same seeds")
        wins = np.array([[r.success for r in s[key]] for s in streams], dtype=bool)  # (k, seeds)
        solved = wins.any(axis=0)
        out["per_task"][key] = {"mean": float(wins.mean()), "pass_at_k": float(solved.mean()),
                                "unsolved_seeds": [s for s, ok in zip(seeds, solved) if not ok]}
    for split in sorted({key.rsplit("/", 1)[1] for key in out["per_task"]}):
        rows = [v for key, v in out["per_task"].items() if key.rsplit("/", 1)[1] == split]
        out[split] = {"mean": float(np.mean([r["mean"] for r in rows])),
                      "pass_at_k": float(np.mean([r["pass_at_k"] for r in rows]))}
    return out


def drawn_noise_scale(policy: Policy, override: float | None = None) -> float | None:
    """The factor on the initial noise ``policy`` plays with: ``override``, else the policy's own
    ``noise_scale``; None for a policy that draws no noise (an MLP, the experts)."""
    inner = policy.unwrapped
    if getattr(inner, "noise_shape", None) is None or not getattr(inner, "generative", True):
        return None
    return float(override if override is not None else getattr(inner, "noise_scale", 1.0))


class RowwisePolicy(PolicyWrapper):
    """``policy`` run one batch row at a time, with each row's initial noise drawn from that row.

    Why (see ``embodied.runtime.distributed``): with a plain batched call an episode depends on the
    episodes that share its batches -- CPU matmuls are not bitwise batch-invariant (a batch
    of 1 takes another kernel), and a generative policy's own generator hands each row
    whatever noise is next in its stream. So results would change with ``num_envs`` and
    with how episodes are sharded over workers. Here a row's chunk depends only on the row:
    when no ``noise`` is given, a generative policy gets (1, H, Da) N(0, I) noise from a
    generator seeded with a hash of (``policy.config.seed``, the row's observation history,
    instruction and task) -- the same hashing idea as the diffusion policy's ddpm sampler.
    ``noise_scale`` multiplies that drawn noise (0: the zero noise, the flow's mode; None: the
    policy's own ``noise_scale``, as its ``predict_chunk`` would use).
    Explicit ``noise`` (steering) is passed through unscaled, row by row. A torch policy whose
    ``batches_rows`` is true computes the rows as one batch with ``predict_rows``, which
    gives each row bitwise what it gives alone, for less time per row than a loop; others
    run row by row. Rows run on one torch thread: the result of a reduction
    (the text encoder's, for one) depends on how many threads share it, and a Ray worker
    has one CPU where this process may have many.
    """

    def __init__(self, policy: Policy, noise_stream: int = 0, noise_scale: float | None = None):
        super().__init__(policy)
        inner = policy.unwrapped
        if noise_scale is None:
            noise_scale = getattr(inner, "noise_scale", 1.0)
        check_noise_scale(noise_scale)
        self.noise_stream, self.noise_scale = noise_stream, float(noise_scale)
        self.noise_shape = getattr(inner, "noise_shape", None) if getattr(inner, "generative", True) else None
        self.seed = int(getattr(getattr(inner, "config", None), "seed", 0))
        # stream k > 0 hashes (seed, k): another draw of every row's noise, as reproducible as stream 0
        self.noise_key: int | str = self.seed if noise_stream == 0 else f"{self.seed}/{noise_stream}"

    def observe(self, episode: Episode, obs: Mapping[str, Any]) -> Mapping[str, Any]:
        with _one_torch_thread():  # a grounding encoder's vector must not depend on this process's threads
            return self.policy.observe(episode, obs)

    def predict_chunk(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None) -> np.ndarray:
        b = len(obs_batch["instruction"])
        rows = [batch_row(obs_batch, i) for i in range(b)]
        if noise is None and self.noise_shape is not None:
            noise = np.concatenate([_row_noise(self.noise_key, row, tuple(self.noise_shape)) for row in rows])
            if self.noise_scale != 1.0:
                noise = (noise * self.noise_scale).astype(np.float32)
        with _one_torch_thread():
            if b > 1 and getattr(self.policy, "batches_rows", False):
                return np.asarray(self.policy.predict_rows(obs_batch, noise))  # bitwise the rows alone
            chunks = [self.policy.predict_chunk(row, None if noise is None else noise[i: i + 1])
                      for i, row in enumerate(rows)]
            return np.concatenate([np.asarray(c) for c in chunks])

    def predict_rows(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None) -> np.ndarray:
        """``predict_chunk``: its rows are already each as if alone. A batching policy server
        (``embodied.bridge.batching``) merges several clients' rows into one such call."""
        return self.predict_chunk(obs_batch, noise)


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    torch = sys.modules.get("torch")  # only a torch policy has loaded it
    if torch is None:
        yield
        return
    n = torch.get_num_threads()
    if n == 1:  # setting it again is not free: OpenMP re-checks its pool on the next parallel region
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _row_noise(seed: int | str, row: Mapping[str, Any], shape: tuple[int, ...]) -> np.ndarray:
    """(1, *shape) float32 N(0, I) noise, a function of ``seed`` and the row's contents."""
    h = hashlib.blake2b(str(seed).encode(), digest_size=8)

    def feed(key: str, value: Any) -> None:
        h.update(key.encode())
        if isinstance(value, Mapping):
            for k in sorted(value):
                feed(f"{key}/{k}", value[k])
        elif isinstance(value, (list, tuple)):
            h.update(repr([str(v) for v in value]).encode())
        else:
            arr = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
            h.update(np.ascontiguousarray(arr).tobytes())

    for k in sorted(row):
        feed(k, row[k])
    rng = np.random.default_rng(int.from_bytes(h.digest(), "little"))
    return rng.standard_normal((1, *shape)).astype(np.float32)


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
             f"Mean success (training paraphrases): **{pct(metrics.get('success_rate'))}**; "
             f"held-out paraphrases: **{pct(metrics.get('heldout_paraphrase_success_rate'))}**; "
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
    lines += _grounding_lines(per)
    if metrics.get("checkpoints"):
        lines += _series_section(out, metrics["checkpoints"])
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _grounding_lines(per: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the policy did with wordings it was not trained on (``Policy.observe``: ``GroundedPolicy``)."""
    parts = [(t, split, q) for t, p in per.items() for split, q in [("train", p), *p.items()]
             if isinstance(q, Mapping) and q.get("grounded_episodes")]
    if not parts:
        return []
    n = sum(q["grounded_episodes"] for _, _, q in parts)
    known = [(t, s, q) for t, s, q in parts if "grounded_to_own_task" in q]
    own = sum(q["grounded_to_own_task"] * q["grounded_episodes"] for _, _, q in known)
    line = (f"Grounded in the scene: in {n} episodes the policy acted on one of its training wordings instead "
            "of the wording given (`policies/common/grounding.py`)")
    if known:
        m = sum(q["grounded_episodes"] for _, _, q in known)
        others = ", ".join(f"{t} {100 * q['grounded_to_own_task']:.0f}%" for t, _, q in known
                           if q["grounded_to_own_task"] < 1)
        line += f"; {100 * own / m:.1f}% of them on a wording of the episode's own task"
        line += f" (less on {others})" if others else ""
    return [line + ".", ""]


def checkpoint_entry(checkpoint: str, step: int, metrics: Mapping[str, Any], step_source: str = "name"
                     ) -> dict[str, Any]:
    """One checkpoint's row of a several-checkpoint evaluation (``metrics["checkpoints"]``).

    ``ci``/``heldout_ci`` are 95% Wilson intervals of the mean success over tasks, from the
    episodes of all tasks pooled (every task has the same number of episodes).
    """
    per = metrics["per_task"]

    def pooled(split: str) -> list[float] | None:
        parts = [p if split == "train" else p.get(split) for p in per.values()]
        parts = [q for q in parts if q and "success_rate" in q]
        if not parts:
            return None
        k = sum(round(q["success_rate"] * q["episodes"]) for q in parts)
        return list(wilson_interval(k, sum(q["episodes"] for q in parts)))

    entry = {"checkpoint": str(checkpoint), "step": int(step), "step_source": step_source,
             "success_rate": metrics.get("success_rate"), "ci": pooled("train"),
             "heldout_paraphrase_success_rate": metrics.get("heldout_paraphrase_success_rate"),
             "heldout_ci": pooled("heldout"), "per_task": metrics["per_task"],
             "episodes_per_task": metrics.get("episodes_per_task"), "wall_time_s": metrics.get("wall_time_s", 0.0)}
    if "custom_instruction_success_rate" in metrics:
        entry["custom_instruction_success_rate"] = metrics["custom_instruction_success_rate"]
        entry["custom_ci"] = pooled("custom")
    return entry


def _series_section(out: Path, entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """Report section of a several-checkpoint evaluation: the success curve and its table."""
    png = plot_success_curve(out / "success_curve.png", entries)
    # instructions=/instructions_file= wordings: each checkpoint's figure, not only the last one's
    custom = any(e.get("custom_instruction_success_rate") is not None for e in entries)

    def cell(rate: float | None, ci: Sequence[float] | None) -> str:
        if rate is None:
            return "–"
        return f"{100 * rate:.0f}%" + (f" [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]" if ci else "")

    lines = ["## Success vs training step", "",
             f"{len(entries)} checkpoints, each evaluated with the same seeds; the tables above are the last one "
             f"(step {entries[-1]['step']}). Intervals: 95% Wilson, episodes of all tasks pooled.", "",
             f"![success vs training step]({png.name})", "",
             "| step | training paraphrases (95% CI) | held-out paraphrases (95% CI) |"
             + (" custom wordings (95% CI) |" if custom else "") + " checkpoint |",
             "|---|---|---|" + ("---|" if custom else "") + "---|"]
    for e in entries:
        own = f"{cell(e.get('custom_instruction_success_rate'), e.get('custom_ci'))} | " if custom else ""
        lines.append(f"| {e['step']} | {cell(e.get('success_rate'), e.get('ci'))} | "
                     f"{cell(e.get('heldout_paraphrase_success_rate'), e.get('heldout_ci'))} | {own}"
                     f"`{e['checkpoint']}` |")
    return lines + [""]


def plot_success_curve(path: Path, entries: Sequence[Mapping[str, Any]]) -> Path:
    """Mean success vs training step (training and held-out paraphrases, custom wordings when given) with
    95% CI bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    steps = np.array([e["step"] for e in entries])
    for key, ci_key, label, color in (("success_rate", "ci", "training paraphrases", "tab:blue"),
                                      ("heldout_paraphrase_success_rate", "heldout_ci", "held-out paraphrases",
                                       "tab:orange"),
                                      ("custom_instruction_success_rate", "custom_ci", "custom wordings",
                                       "tab:green")):
        pts = [(s, e[key], e.get(ci_key)) for s, e in zip(steps, entries) if e.get(key) is not None]
        if not pts:
            continue
        x = [s for s, _, _ in pts]
        ax.plot(x, [v for _, v, _ in pts], "o-", color=color, label=label)
        if all(ci for _, _, ci in pts):
            ax.fill_between(x, [ci[0] for _, _, ci in pts], [ci[1] for _, _, ci in pts], color=color, alpha=0.15)
    by_index = any(e.get("step_source") == "index" for e in entries)
    ax.set_xlabel("checkpoint (position in the list)" if by_index else "training step")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylim(-0.03, 1.05)  # markers at 0 stay visible
    ax.set_ylabel("mean success rate (95% CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pct(v: float | None) -> str:
    """A rate as a percentage, "–" when there is none."""
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
        err = np.maximum(err, 0.0)  # wilson_interval can round ci_high to just below 1.0 at 6/6 successes
        ax.bar(x + (k - (len(series) - 1) / 2) * w, y, w, yerr=err, capsize=2, label=label)
    ax.set_xticks(x, tasks, rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95% CI)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save_videos(out_dir: str | os.PathLike[str], results: Mapping[str, list[EpisodeResult]],
                fps: int = VIDEO_FPS) -> dict[str, str]:
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
