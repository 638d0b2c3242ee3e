"""The job of ``embodied eval``: success per task with 95% CIs on training and held-out paraphrases.

    embodied eval policy=expert suite=manipulation episodes=50
    embodied eval checkpoint=outputs/train/.../checkpoint suite=manipulation episodes=50
    embodied eval checkpoint=... tasks=[pick] '+instructions.pick=["lift the red cube please"]'
    embodied eval checkpoint=... instructions_file=my_wording.yaml   # task -> [templates]
    embodied eval checkpoint=outputs/train/.../checkpoints episodes=20  # every step_* snapshot: success vs step
    embodied eval checkpoint=... workers=0          # episodes over one worker process per CPU core

Writes ``metrics.json``, ``report.md``, ``success.png`` and videos (one success and one
failure per task) to ``hydra.run.dir``. Several checkpoints (a folder of ``step_*``
checkpoints, or ``checkpoints=[A,B,...]``) are evaluated one at a time with the same seeds;
``metrics.json`` then lists each under ``checkpoints`` (top-level keys: the highest step),
``success_curve.png`` plots success vs training step and the report tabulates it.

This module reads the command's settings (which policy or checkpoints, which wordings, which
device) and runs them; the evaluation itself (episodes, summaries, reports, videos) is the
library ``embodied.runtime.evaluate``, which ``embodied train`` and ``embodied steer`` use too.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from embodied.core.registry import resolve_tasks
from embodied.runtime.checkpoints import load_for_eval, load_remote, policy_env_kwargs
from embodied.runtime.distributed import PolicySource, evaluate_sharded, ray_options
from embodied.runtime.evaluate import (
    check_noise_scale,
    drawn_noise_scale,
    evaluate,
    pct,
    save_videos,
    write_json,
    write_report,
)

log = logging.getLogger("embodied.eval")
VECTOR = ("auto", "sync", "async")
DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_device(device: str) -> None:
    """Refuse a ``device`` that is not a torch device name (whether it exists here is checked on use)."""
    if not isinstance(device, str) or not DEVICE.fullmatch(device):
        raise ValueError(f"device={device!r} is not allowed: use auto (the GPU when there is one), cpu, "
                         "cuda[:N] or mps")


@dataclass
class EvalConfig:
    """Schema of ``configs/eval.yaml``."""

    suite: str = "manipulation"
    tasks: list[str] = field(default_factory=list)  # overrides suite when given
    # policy=expert (config group configs/policy/); a checkpoint=PATH replaces it.
    policy: dict[str, Any] = field(default_factory=lambda: {"name": "expert"})
    checkpoint: str = ""  # a checkpoint, or a folder of step_* checkpoints (RUN/checkpoints)
    checkpoints: list[str] = field(default_factory=list)  # several checkpoints, evaluated one after the other
    url: str = ""  # policy=remote: the policy server, ws://HOST:PORT (embodied serve, or openpi's)
    api_key: str = ""  # policy=remote: sent as `Authorization: Api-Key ...`
    episodes: int = 20  # per task and instruction split
    splits: list[str] = field(default_factory=lambda: ["train", "heldout"])
    instructions: dict[str, list[str]] = field(default_factory=dict)  # task -> your own templates
    instructions_file: str = ""  # YAML/JSON file mapping task -> list of templates
    swap_instructions: bool = False  # also evaluate each task with another task's instructions
    noise_streams: int = 1  # > 1: play every seed with this many initial-noise streams; reports pass@k
    # factor on a flow/diffusion policy's initial noise (1: N(0, I); 0: always the zero noise, its mode);
    # null: the checkpoint's own setting (policy.noise_scale at training)
    noise_scale: Optional[float] = None
    seed: int = 100_000  # evaluation seeds are disjoint from collection seeds
    num_envs: int = 8
    vector: str = "auto"  # auto: async (worker processes) for pixels, sync for state
    videos: int = 2  # episodes per task whose frames are kept (one success + one failure saved)
    num_inference_steps: int = 0  # 0: the checkpoint's setting
    ground_instructions: Optional[bool] = None  # null: the checkpoint's setting (policies.common.grounding)
    device: str = "auto"
    progress: bool = True
    runner: str = "local"  # local | ray: episodes sharded over Ray workers (embodied/runtime/distributed.py)
    workers: int = 1  # runner=local: worker processes (>1 needs checkpoint=PATH; 0: one per CPU core)
    ray_address: str = ""  # runner=ray: "" starts Ray here; "auto" or HOST:PORT joins a running cluster
    ray_num_cpus: int = 0  # runner=ray, local instance: CPUs (0: all)
    ray_shard_episodes: int = 0  # runner=ray: episodes per shard (0: about two shards per worker)
    ray_retries: int = 2  # runner=ray: retries of a shard whose worker died

    def __post_init__(self) -> None:
        name = self.policy.get("name")
        if self.checkpoint and self.checkpoints:
            raise ValueError("give checkpoint=PATH or checkpoints=[PATH,...], not both")
        if any(not str(c).strip() for c in self.checkpoints):
            raise ValueError(f"checkpoints must be checkpoint paths, got an empty one in {self.checkpoints}")
        if (name == "remote") != bool(self.url):
            raise ValueError(f"policy=remote and url=ws://HOST:PORT go together; got policy={name!r}, url={self.url!r}")
        if self.api_key and name != "remote":
            raise ValueError(f"api_key has no effect with policy={name!r}: it is sent to the server of policy=remote url=...")
        if name == "remote" and (self.checkpoint or self.checkpoints):
            raise ValueError("policy=remote evaluates the server at url=...: do not also give checkpoint(s)")
        trained = bool(self.checkpoint or self.checkpoints)
        if not trained and name not in ("expert", "remote"):
            raise ValueError(f"policy={name!r} cannot be evaluated without weights: give checkpoint=PATH "
                             "(the output of `embodied train`), or use policy=expert")
        if name != "remote":  # the server decides its sampler and grounding
            check_policy_settings(self.policy, trained, self.num_inference_steps, self.ground_instructions)
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0 (episode k uses seed + k), got {self.seed}")
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")
        if self.vector not in VECTOR:
            raise ValueError(f"vector must be one of {VECTOR}, got {self.vector!r}")
        if self.num_inference_steps < 0:
            raise ValueError(f"num_inference_steps must be >= 0, got {self.num_inference_steps}")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0: one per CPU core), got {self.workers}")
        if self.videos < 0:
            raise ValueError(f"videos must be >= 0, got {self.videos}")
        bad = [s for s in self.splits if s not in ("train", "heldout")]
        if bad or len(set(self.splits)) != len(self.splits) or not (self.splits or self.instructions
                                                                     or self.instructions_file):
            raise ValueError(f"splits must be distinct names of train and heldout (an empty list only with "
                             f"your own instructions), got {self.splits}")
        for task, words in self.instructions.items():
            check_wordings(f"instructions.{task}", words)
        if self.swap_instructions and (self.instructions or self.instructions_file):
            raise ValueError("swap_instructions=true replaces custom instructions: give one or the other")
        if self.noise_scale is not None:
            check_noise_scale(self.noise_scale)
        if not 1 <= self.noise_streams <= 1000:
            raise ValueError(f"noise_streams must be in [1, 1000], got {self.noise_streams}")
        if self.noise_streams > 1:
            if not self.checkpoint or self.checkpoints:
                raise ValueError("noise_streams > 1 replays a flow or diffusion checkpoint's seeds with other initial "
                                 "noise: give checkpoint=PATH (one checkpoint; not the experts, a server or checkpoints=)")
            if self.runner == "ray" or self.workers != 1:
                raise ValueError(f"noise_streams > 1 runs in this process: use runner=local workers=1, got "
                                 f"runner={self.runner}, workers={self.workers}")
        check_device(self.device)
        ray_options(self)
        tasks = resolve_tasks(self.suite, self.tasks)  # an unknown suite or task is named before anything is written
        unknown = [t for t in self.instructions if t not in tasks]
        if unknown:
            raise ValueError(f"instructions given for tasks not being evaluated: {unknown}; tasks: {tasks}")
        if self.checkpoint and not Path(self.checkpoint).exists():
            raise FileNotFoundError(f"checkpoint {self.checkpoint!r} does not exist; checkpoint= takes a checkpoint "
                                    "folder (e.g. RUN/checkpoint) or a folder of step_* checkpoints (RUN/checkpoints)")
        missing = [c for c in self.checkpoints if not Path(str(c)).exists()]
        if missing:
            raise FileNotFoundError(f"checkpoints: {missing} do not exist")
        if self.instructions_file and not Path(self.instructions_file).is_file():
            raise FileNotFoundError(f"instructions_file {self.instructions_file!r} does not exist")


def check_policy_settings(policy: dict[str, Any], trained: bool, num_inference_steps: int,
                          ground_instructions: bool | None) -> None:
    """Refuse policy settings that would have no effect (``eval`` and ``play``).

    A checkpoint holds its policy (family and config, in its ``config.json``), so ``policy=...``
    and ``policy.<field>=...`` beside ``checkpoint=`` would be ignored; the scripted experts have
    no sampler and no grounding.
    """
    if trained and policy.get("name") != "expert":
        fields = sorted(k for k in policy if k != "name")
        raise ValueError(f"policy={policy.get('name')!r}{' (and its fields)' if fields else ''} has no effect "
                         "with checkpoint=: the checkpoint's config.json says which policy it is. Drop policy=... "
                         "and policy.<field>=...; what an evaluation may change is num_inference_steps=N and "
                         "ground_instructions=true|false")
    if not trained and num_inference_steps:
        raise ValueError(f"num_inference_steps={num_inference_steps} has no effect on the scripted experts: "
                         "give checkpoint=PATH, or drop it")
    if not trained and ground_instructions is not None:
        raise ValueError(f"ground_instructions={ground_instructions} has no effect on the scripted experts: "
                         "give checkpoint=PATH, or drop it")


def check_wordings(what: str, words: Any) -> list[str]:
    """``words`` as a non-empty list of non-empty strings (one string is a list of one), else ValueError naming ``what``."""
    words = [words] if isinstance(words, str) else words
    if not isinstance(words, (list, tuple)) or not words or \
            not all(isinstance(w, str) and w.strip() for w in words):
        raise ValueError(f"{what} must be a non-empty list of instructions (non-empty strings), got {words!r}: "
                         "an empty list would evaluate the task's own wordings under the name of yours")
    return list(words)


def load_instructions(path: str) -> dict[str, list[str]]:
    """Read a YAML/JSON file mapping task -> instruction template(s)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"instructions_file {path!r} does not exist")
    try:
        data = json.loads(p.read_text()) if p.suffix == ".json" else yaml.safe_load(p.read_text())
    except (ValueError, yaml.YAMLError) as e:
        raise ValueError(f"instructions_file {path!r} is not valid {'JSON' if p.suffix == '.json' else 'YAML'}: "
                         f"{' '.join(str(e).split())}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"instructions_file {path!r} must map task names to lists of instructions"
                         + (", and names none" if isinstance(data, dict) or data is None else ""))
    return {str(task): check_wordings(f"instructions_file {path!r}: task {task!r}", v) for task, v in data.items()}


def check_custom_instructions(instructions: dict[str, list[str]]) -> None:
    """Fill in every custom template with a task's episode fields before any episode runs.

    A template naming a field the task does not have (``{colour}`` for ``{color}``) would
    otherwise fail only when its split's first episode starts, after the other splits ran.
    """
    from embodied.core.registry import make_env

    for task, templates in instructions.items():
        env = make_env(task)
        try:
            env.reset(seed=0)
            for template in templates:
                env.unwrapped.format_instruction(template)
        finally:
            env.close()


def swapped_instructions(tasks: list[str]) -> dict[str, list[str]]:
    """For each task, the training instructions of another task of the same scene.

    The partner is the next task (cyclically) whose templates only use fields the task
    also has, so the words are well formed but ask for something else. Success on the
    instructed task should then drop to chance if the policy reads the instruction.
    """
    import string

    from embodied.core.registry import get_task

    def fields(t: str) -> set[str]:
        return {f for tpl in get_task(t).train_instructions for _, f, _, _ in string.Formatter().parse(tpl) if f}

    out = {}
    for i, t in enumerate(tasks):
        for k in range(1, len(tasks)):
            other = tasks[(i + k) % len(tasks)]
            if fields(other) <= fields(t) and get_task(other).suite == get_task(t).suite:
                out[t] = list(get_task(other).train_instructions)
                break
    if not out:
        raise ValueError(f"no task of {tasks} has a partner whose instructions fit its fields")
    return out


STEP_DIR = re.compile(r"step_(\d+)")


def _is_checkpoint(path: Path, partial: bool = False) -> bool:
    """Whether ``path`` holds a checkpoint's files (all of them; with ``partial``, any)."""
    from policies.common.checkpoint import CONFIG_FILE, WEIGHTS_FILE

    have = [(path / f).is_file() for f in (CONFIG_FILE, WEIGHTS_FILE)]
    return any(have) if partial else all(have)


def checkpoint_step(path: str | Path, index: int) -> tuple[int, str]:
    """(training step, where it came from) of a checkpoint: its ``step_N`` name, else the
    ``step`` in its ``trainer_state.pt``, else ``index`` (its position in the list)."""
    p = Path(path)
    m = STEP_DIR.fullmatch(p.name)
    if m:
        return int(m.group(1)), "name"
    if (p / "trainer_state.pt").is_file():
        import torch

        try:
            state = torch.load(p / "trainer_state.pt", map_location="cpu", weights_only=True)
            return int(state["step"]), "trainer_state"
        except Exception as e:  # unreadable or no step: fall back to the list position
            log.warning("%s: no step in trainer_state.pt (%s); using its position %d", p, e, index)
    return index, "index"


def resolve_checkpoints(cfg: EvalConfig) -> list[tuple[str, int, str]] | None:
    """The checkpoints of a several-checkpoint evaluation as (path, step, step source), by
    increasing step; None when ``cfg`` asks for one checkpoint (or the experts)."""
    allowed = ("a checkpoint folder (config.json + model.safetensors, e.g. RUN/checkpoint) or a folder of "
               "step_* checkpoints (e.g. RUN/checkpoints, written by `embodied train snapshot_every=N`)")
    if cfg.checkpoints:
        paths = [Path(c) for c in cfg.checkpoints]
        for p in paths:
            if not p.exists():
                raise FileNotFoundError(f"checkpoints: {str(p)!r} does not exist")
            if not _is_checkpoint(p):
                raise ValueError(f"checkpoints: {str(p)!r} is not a checkpoint folder (config.json + "
                                 "model.safetensors); give checkpoint=FOLDER for a folder of step_* checkpoints")
    elif cfg.checkpoint:
        root = Path(cfg.checkpoint)
        if not root.exists():
            raise FileNotFoundError(f"checkpoint {cfg.checkpoint!r} does not exist; checkpoint= takes {allowed}")
        if root.is_dir() and _is_checkpoint(root, partial=True):
            return None  # one checkpoint (load_policy names any file it lacks)
        subdirs = sorted(d for d in root.iterdir() if d.is_dir() and STEP_DIR.fullmatch(d.name)) \
            if root.is_dir() else []
        if not subdirs:
            what = "is an empty folder" if root.is_dir() and not any(root.iterdir()) else \
                "is neither a checkpoint nor a folder of step_* checkpoints"
            raise ValueError(f"checkpoint {cfg.checkpoint!r} {what}; checkpoint= takes {allowed}")
        bad = [d.name for d in subdirs if not _is_checkpoint(d)]
        if bad:
            raise ValueError(f"checkpoint {cfg.checkpoint!r}: {bad} lack config.json/model.safetensors "
                             "(not complete checkpoints): move them away or list the good ones in checkpoints=[...]")
        paths = subdirs
    else:
        return None
    found = [(str(p), *checkpoint_step(p, i)) for i, p in enumerate(paths)]
    return sorted(found, key=lambda c: c[1])  # stable: equal steps keep the given order


def run_eval(cfg: EvalConfig, out: Path, policy: Any = None) -> dict[str, Any]:
    tasks = resolve_tasks(cfg.suite, cfg.tasks)
    instructions = dict(cfg.instructions)
    if cfg.instructions_file:
        instructions.update(load_instructions(cfg.instructions_file))
    if cfg.swap_instructions:
        if instructions:
            raise ValueError("swap_instructions=true replaces custom instructions: give one or the other")
        instructions = swapped_instructions(tasks)
    unknown = [t for t in instructions if t not in tasks]
    if unknown:
        raise ValueError(f"instructions given for tasks not being evaluated: {unknown}; tasks: {tasks}")
    check_custom_instructions(instructions)
    series = resolve_checkpoints(cfg) if policy is None else None
    if series:
        return _run_series(cfg, out, tasks, instructions, series)
    metrics, results = _evaluate_one(cfg, tasks, instructions, cfg.checkpoint, cfg.videos, policy)
    if cfg.noise_streams > 1:
        metrics["noise_streams"] = _noise_streams(cfg, tasks, instructions, results)
    videos = save_videos(out, results) if cfg.videos else {}
    metrics["videos"] = videos
    metrics["policy"] = cfg.checkpoint or cfg.url or cfg.policy["name"]
    write_json(out / "metrics.json", metrics)
    write_report(out, metrics, f"Evaluation of {metrics['policy']}", videos)
    return metrics


def _run_series(cfg: EvalConfig, out: Path, tasks: list[str], instructions: dict[str, list[str]],
                series: list[tuple[str, int, str]]) -> dict[str, Any]:
    """Evaluate each checkpoint (same seeds and settings); the top-level metrics are the last one's."""
    from embodied.runtime.evaluate import checkpoint_entry

    entries, metrics, results = [], {}, {}
    for k, (path, step, source) in enumerate(series):
        last = k == len(series) - 1
        log.info("checkpoint %d/%d: %s (step %d)", k + 1, len(series), path, step)
        metrics, results = _evaluate_one(cfg, tasks, instructions, path, cfg.videos if last else 0)
        entries.append(checkpoint_entry(path, step, metrics, step_source=source))
        own = metrics.get("custom_instruction_success_rate")
        log.info("step %d: success %s, held-out %s%s", step, pct(metrics["success_rate"]),
                 pct(metrics["heldout_paraphrase_success_rate"]),
                 "" if own is None else f", custom wordings {pct(own)}")
    videos = save_videos(out, results) if cfg.videos else {}
    metrics["videos"] = videos
    metrics["policy"] = series[-1][0]
    metrics["checkpoints"] = entries
    metrics["total_wall_time_s"] = sum(e["wall_time_s"] for e in entries)
    write_json(out / "metrics.json", metrics)
    write_report(out, metrics, f"Evaluation of {cfg.checkpoint or 'checkpoints'} ({len(series)} checkpoints)", videos)
    return metrics


def _evaluate_one(cfg: EvalConfig, tasks: list[str], instructions: dict[str, list[str]], checkpoint: str,
                  videos: int, policy: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """One evaluation of ``policy``, else of ``checkpoint``, else of the experts."""
    env_kwargs: dict[str, Any] = {}
    if policy is None and cfg.url:
        policy = load_remote(cfg.url, cfg.api_key)
    if policy is None and checkpoint:
        policy = load_for_eval(checkpoint, cfg.device, cfg.num_inference_steps, cfg.ground_instructions)
    if policy is None:
        policy = "expert"
    else:
        env_kwargs = policy_env_kwargs(policy, tasks)
    # the factor the episodes are played with: this run's, else the checkpoint's (None: no noise drawn here)
    played = None if policy == "expert" or cfg.url else drawn_noise_scale(policy, cfg.noise_scale)
    if cfg.noise_scale is not None and played is None:
        raise ValueError(f"noise_scale={cfg.noise_scale} has no effect here: only a flow or diffusion checkpoint "
                         "evaluated in this process or its workers draws initial noise (not the experts, a server "
                         "or an MLP policy)")
    vector = cfg.vector if cfg.vector != "auto" else ("async" if env_kwargs.get("obs_mode", "state") != "state"
                                                      else "sync")
    workers = 0 if cfg.runner == "ray" else (cfg.workers or os.cpu_count() or 1)
    if cfg.runner == "ray" or workers > 1:
        if not checkpoint and policy != "expert":
            raise ValueError(f"{'runner=ray' if cfg.runner == 'ray' else f'workers={workers}'} loads the policy "
                             "on each worker from checkpoint=PATH; this policy has none")
        source = PolicySource(checkpoint, cfg.device, cfg.num_inference_steps, cfg.ground_instructions, cfg.noise_scale)
        metrics, results = evaluate_sharded(source, tasks, cfg.episodes, cfg.splits, cfg.seed, cfg.num_envs, vector,
                                            env_kwargs, instructions, videos, cfg.progress, ray_options(cfg),
                                            workers=workers)
    else:
        metrics, results = evaluate(policy, tasks, cfg.episodes, cfg.splits, cfg.seed, cfg.num_envs, vector,
                                    env_kwargs, instructions, videos, cfg.progress, noise_scale=cfg.noise_scale)
    metrics["noise_scale"] = played
    return metrics, results


def _noise_streams(cfg: EvalConfig, tasks: list[str], instructions: dict[str, list[str]],
                   first: dict[str, Any]) -> dict[str, Any]:
    """pass@k over ``cfg.noise_streams`` streams of initial noise (stream 0 is ``first``)."""
    from embodied.runtime.evaluate import noise_stream_summary

    policy = load_for_eval(cfg.checkpoint, cfg.device, cfg.num_inference_steps, cfg.ground_instructions)
    if getattr(policy.unwrapped, "noise_shape", None) is None or not getattr(policy.unwrapped, "generative", True):
        raise ValueError(f"noise_streams={cfg.noise_streams}: {cfg.checkpoint} does not draw initial noise (a flow or "
                         "diffusion checkpoint does), so every stream would play the same episodes")
    env_kwargs = policy_env_kwargs(policy, tasks)
    vector = cfg.vector if cfg.vector != "auto" else ("async" if env_kwargs.get("obs_mode", "state") != "state"
                                                      else "sync")
    streams = [first]
    for k in range(1, cfg.noise_streams):
        log.info("noise stream %d/%d", k + 1, cfg.noise_streams)
        streams.append(evaluate(policy, tasks, cfg.episodes, cfg.splits, cfg.seed, cfg.num_envs, vector, env_kwargs,
                                instructions, 0, cfg.progress, noise_stream=k, noise_scale=cfg.noise_scale)[1])
    summary = noise_stream_summary(streams)
    for key, v in summary["per_task"].items():
        log.info("%-24s mean %5.1f%%  pass@%d %5.1f%%", key, 100 * v["mean"], summary["k"], 100 * v["pass_at_k"])
    log.info("pass@%d: %s", summary["k"], ", ".join(f"{s} {pct(summary[s]['pass_at_k'])} (mean {pct(summary[s]['mean'])})"
                                                    for s in summary if s not in ("k", "per_task")))
    return summary


def log_table(metrics: dict[str, Any]) -> None:
    for t, p in metrics["per_task"].items():
        h = p.get("heldout", {})
        c = p.get("custom", {})
        trained = (f"{100 * p['success_rate']:5.1f}% [{100 * p['ci_low']:4.1f}, {100 * p['ci_high']:5.1f}]"
                   if "success_rate" in p else "  –  ")
        log.info("%-16s train %s  heldout %s%s", t, trained,
                 f"{100 * h['success_rate']:5.1f}%" if h else "  –  ",
                 f"  custom {100 * c['success_rate']:5.1f}%" if c else "")
    log.info("mean success %s, held-out paraphrases %s (%.0f s)", pct(metrics["success_rate"]),
             pct(metrics["heldout_paraphrase_success_rate"]), metrics["wall_time_s"])
