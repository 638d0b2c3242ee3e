"""``embodied train``: demonstrations -> a language-conditioned policy -> evaluation (see ``embodied.runtime.train``)."""

from __future__ import annotations

import logging
from typing import Any

from embodied.commands.app import hydra_command, run_dir
from embodied.runtime.eval import log_table
from embodied.runtime.train import TrainConfig, train

log = logging.getLogger("embodied.train")


@hydra_command("train", TrainConfig)
def main(cfg: TrainConfig) -> dict[str, Any]:
    out = run_dir()
    metrics = train(cfg, out)
    log_table(metrics)
    log.info("total %.0f s (data %.0f s, training %.0f s at %.0f samples/s, evaluation %.0f s); run dir %s",
             metrics["wall_time_s"], metrics["data_time_s"], metrics["train_time_s"],
             metrics["train_samples_per_s"], metrics["eval_time_s"], out)
    return metrics
