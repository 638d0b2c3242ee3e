"""``embodied collect``: scripted-expert demonstrations -> an on-disk dataset (see ``embodied.runtime.collect``)."""

from __future__ import annotations

import logging
import os
from typing import Any

from embodied.commands.app import hydra_command, run_dir
from embodied.core.registry import resolve_tasks
from embodied.runtime.collect import CollectConfig, collect
from embodied.runtime.distributed import ray_options
from embodied.runtime.evaluate import write_json

log = logging.getLogger("embodied.collect")


@hydra_command("collect", CollectConfig)
def main(cfg: CollectConfig) -> dict[str, Any]:
    tasks = resolve_tasks(cfg.suite, cfg.tasks)
    out = cfg.out or f"data/{cfg.suite if not cfg.tasks else '-'.join(cfg.tasks)}-{cfg.obs_mode}"
    metrics = collect(tasks, out, cfg.episodes, cfg.obs_mode, cfg.image_size, cfg.cameras, cfg.seed,
                      cfg.action_noise, cfg.only_success, cfg.max_attempts_factor, cfg.progress, cfg.suite,
                      cfg.runner, ray_options(cfg), cfg.workers or os.cpu_count() or 1, cfg.on_corrupt)
    write_json(run_dir() / "metrics.json", metrics)
    log.info("dataset %s: %d episodes (%s)", metrics["dataset"], metrics["episodes"],
             ", ".join(f"{t}: {v['total']}" for t, v in metrics["per_task"].items()))
    return metrics
