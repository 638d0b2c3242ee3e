"""``embodied eval``: success per task with 95% confidence intervals, report and videos.

The job is ``embodied.runtime.eval_job``."""

from __future__ import annotations

import logging
from typing import Any

from embodied.commands.app import hydra_command, run_dir
from embodied.runtime.eval_job import EvalConfig, log_table, run_eval

log = logging.getLogger("embodied.eval")


@hydra_command("eval", EvalConfig)
def main(cfg: EvalConfig) -> dict[str, Any]:
    metrics = run_eval(cfg, run_dir())
    log_table(metrics)
    log.info("wrote %s", run_dir() / "report.md")
    return metrics
