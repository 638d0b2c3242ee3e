"""``embodied train``: demonstrations -> a language-conditioned policy -> evaluation (see ``embodied.runtime.train``)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from embodied.commands.app import AlreadyDone, hydra_command, run_dir
from embodied.runtime import ddp
from embodied.runtime.eval_job import log_table
from embodied.runtime.train import TrainConfig, finished, move_aside, resume_state, train

log = logging.getLogger("embodied.train")


def prepare(cfg: TrainConfig, out: Path) -> None:
    """Before anything is written to the run folder: check a torchrun launch (its environment,
    backend, device and batch split), then start over (``restart=true`` moves the old run aside:
    rank 0 does), or check that a rerun resumes the same run and has steps left to train."""
    world = ddp.check(cfg.batch_size, cfg.device, cfg.ddp_backend)
    if cfg.restart:
        if not world.main:
            return
        moved = move_aside(out)
        if moved is not None:
            print(f"embodied train: restart=true: moved the previous run to {moved}", file=sys.stderr)
        return
    step, _ = resume_state(cfg, out)
    if step and step == cfg.steps and finished(out, step):
        raise AlreadyDone(f"{out} finished at step {step} (its metrics.json): nothing to train. steps=N above {step} "
                          f"continues it, `embodied eval checkpoint={out / 'checkpoint'}` evaluates it again, "
                          "restart=true starts over")


@hydra_command("train", TrainConfig, prepare)
def main(cfg: TrainConfig) -> dict[str, Any] | None:
    out = run_dir()
    metrics = train(cfg, out)
    if metrics is None:  # a torchrun rank other than 0: rank 0 evaluates and reports
        return None
    log_table(metrics)
    speed = metrics["train_samples_per_s"]
    log.info("total %.0f s (data %.0f s, training %.0f s %s, evaluation %.0f s); run dir %s",
             metrics["wall_time_s"], metrics["data_time_s"], metrics["train_time_s"],
             f"at {speed:.0f} samples/s" if speed else "(no steps left to train)", metrics["eval_time_s"], out)
    return metrics
