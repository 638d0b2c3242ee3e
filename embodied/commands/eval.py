"""``embodied eval``: success per task with 95% CIs on training and held-out paraphrases.

    embodied eval policy=expert suite=manipulation episodes=50
    embodied eval checkpoint=outputs/train/.../checkpoint suite=manipulation episodes=50
    embodied eval checkpoint=... tasks=[pick] '+instructions.pick=["lift the red cube please"]'
    embodied eval checkpoint=... instructions_file=my_wording.yaml   # task -> [templates]

Writes ``metrics.json``, ``report.md``, ``success.png`` and videos (one success and one
failure per task) to ``hydra.run.dir``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodied.app import hydra_command, run_dir
from embodied.distributed import PolicySource, evaluate_ray, ray_options
from embodied.evaluate import evaluate, save_videos, write_json, write_report
from embodied.registry import resolve_tasks

log = logging.getLogger("embodied.eval")
VECTOR = ("auto", "sync", "async")


@dataclass
class EvalConfig:
    """Schema of ``configs/eval.yaml``."""

    suite: str = "manipulation"
    tasks: list[str] = field(default_factory=list)  # overrides suite when given
    # policy=expert (config group configs/policy/); a checkpoint=PATH replaces it.
    policy: dict[str, Any] = field(default_factory=lambda: {"name": "expert"})
    checkpoint: str = ""
    episodes: int = 20  # per task and instruction split
    splits: list[str] = field(default_factory=lambda: ["train", "heldout"])
    instructions: dict[str, list[str]] = field(default_factory=dict)  # task -> your own templates
    instructions_file: str = ""  # YAML/JSON file mapping task -> list of templates
    swap_instructions: bool = False  # also evaluate each task with another task's instructions
    seed: int = 100_000  # evaluation seeds are disjoint from collection seeds
    num_envs: int = 8
    vector: str = "auto"  # auto: async (worker processes) for pixels, sync for state
    videos: int = 2  # episodes per task whose frames are kept (one success + one failure saved)
    num_inference_steps: int = 0  # 0: the checkpoint's setting
    device: str = "auto"
    progress: bool = True
    runner: str = "local"  # local | ray: episodes sharded over Ray workers (embodied/distributed.py)
    ray_address: str = ""  # runner=ray: "" starts Ray here; "auto" or HOST:PORT joins a running cluster
    ray_num_cpus: int = 0  # runner=ray, local instance: CPUs (0: all)
    ray_shard_episodes: int = 0  # runner=ray: episodes per shard (0: about two shards per worker)
    ray_retries: int = 2  # runner=ray: retries of a shard whose worker died

    def __post_init__(self) -> None:
        name = self.policy.get("name")
        if not self.checkpoint and name != "expert":
            raise ValueError(f"policy={name!r} cannot be evaluated without weights: give checkpoint=PATH "
                             "(the output of `embodied train`), or use policy=expert")
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")
        if self.vector not in VECTOR:
            raise ValueError(f"vector must be one of {VECTOR}, got {self.vector!r}")
        if self.num_inference_steps < 0:
            raise ValueError(f"num_inference_steps must be >= 0, got {self.num_inference_steps}")
        ray_options(self)


def load_instructions(path: str) -> dict[str, list[str]]:
    """Read a YAML/JSON file mapping task -> instruction template(s)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"instructions_file {path!r} does not exist")
    data = json.loads(p.read_text()) if p.suffix == ".json" else yaml.safe_load(p.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"instructions_file {path!r} must map task names to lists of instructions")
    out = {}
    for task, v in data.items():
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list) or not v or not all(isinstance(s, str) and s.strip() for s in v):
            raise ValueError(f"instructions_file {path!r}: task {task!r} needs a non-empty list of strings")
        out[str(task)] = v
    return out


def swapped_instructions(tasks: list[str]) -> dict[str, list[str]]:
    """For each task, the training instructions of another task of the same scene.

    The partner is the next task (cyclically) whose templates only use fields the task
    also has, so the words are well formed but ask for something else. Success on the
    instructed task should then drop to chance if the policy reads the instruction.
    """
    import string

    from embodied.registry import get_task

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


def load_for_eval(checkpoint: str, device: str = "auto", num_inference_steps: int = 0) -> Any:
    from policies import load_policy

    policy = load_policy(checkpoint, device=device)
    if num_inference_steps:
        policy.num_inference_steps = num_inference_steps
    return policy


def policy_env_kwargs(policy: Any, tasks: list[str]) -> dict[str, Any]:
    """Env arguments that give ``policy`` the observations it was trained on; checks specs."""
    from embodied.commands.collect import env_kwargs
    from embodied.registry import make_env

    spec = policy.obs_spec
    kw = env_kwargs(policy.config.obs_mode, spec.image_size, list(spec.cameras))
    for t in tasks:
        env = make_env(t, **kw)
        policy.check_spec(env.unwrapped.observation_spec, env.unwrapped.action_spec)
        env.close()
    return kw


def run_eval(cfg: EvalConfig, out: Path, policy: Any = None) -> dict[str, Any]:
    tasks = resolve_tasks(cfg.suite, cfg.tasks)
    instructions = dict(cfg.instructions)
    if cfg.instructions_file:
        instructions.update(load_instructions(cfg.instructions_file))
    if cfg.swap_instructions:
        if instructions:
            raise ValueError("swap_instructions=true replaces custom instructions: give one or the other")
        instructions = swapped_instructions(tasks)
    env_kwargs: dict[str, Any] = {}
    if policy is None and cfg.checkpoint:
        policy = load_for_eval(cfg.checkpoint, cfg.device, cfg.num_inference_steps)
    if policy is None:
        policy = "expert"
    else:
        env_kwargs = policy_env_kwargs(policy, tasks)
    vector = cfg.vector if cfg.vector != "auto" else ("async" if env_kwargs.get("obs_mode", "state") != "state"
                                                      else "sync")
    if cfg.runner == "ray":
        if not cfg.checkpoint and policy != "expert":
            raise ValueError("runner=ray loads the policy on each worker from checkpoint=PATH; this policy has none")
        metrics, results = evaluate_ray(PolicySource(cfg.checkpoint, cfg.device, cfg.num_inference_steps), tasks,
                                        cfg.episodes, cfg.splits, cfg.seed, cfg.num_envs, vector, env_kwargs,
                                        instructions, cfg.videos, cfg.progress, ray_options(cfg))
    else:
        metrics, results = evaluate(policy, tasks, cfg.episodes, cfg.splits, cfg.seed, cfg.num_envs, vector,
                                    env_kwargs, instructions, cfg.videos, cfg.progress)
    videos = save_videos(out, results) if cfg.videos else {}
    metrics["videos"] = videos
    metrics["policy"] = cfg.checkpoint or cfg.policy["name"]
    write_json(out / "metrics.json", metrics)
    write_report(out, metrics, f"Evaluation of {metrics['policy']}", videos)
    return metrics


def log_table(metrics: dict[str, Any]) -> None:
    for t, p in metrics["per_task"].items():
        h = p.get("heldout", {})
        c = p.get("custom", {})
        log.info("%-16s train %5.1f%% [%4.1f, %5.1f]  heldout %s%s", t, 100 * p.get("success_rate", 0),
                 100 * p.get("ci_low", 0), 100 * p.get("ci_high", 0),
                 f"{100 * h['success_rate']:5.1f}%" if h else "  –  ",
                 f"  custom {100 * c['success_rate']:5.1f}%" if c else "")
    log.info("mean success %.3f, held-out paraphrases %s (%.0f s)", metrics["success_rate"] or 0,
             metrics["heldout_paraphrase_success_rate"], metrics["wall_time_s"])


@hydra_command("eval", EvalConfig)
def main(cfg: EvalConfig) -> dict[str, Any]:
    metrics = run_eval(cfg, run_dir())
    log_table(metrics)
    log.info("wrote %s", run_dir() / "report.md")
    return metrics
