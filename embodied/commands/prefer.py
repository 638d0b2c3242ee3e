"""``embodied prefer [run|eval|plot] ...``: preference-based reward learning (see ``embodied.runtime.prefer``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from embodied.commands.app import hydra_command, run_dir
from embodied.runtime.evaluate import write_json
from embodied.runtime.prefer import ACTIONS, PreferConfig, evaluate_reward, plot_runs, run_prefer
from policies.steering.config import SteerConfig
from rewards.preference.config import STEER_DEFAULTS

log = logging.getLogger("embodied.prefer")
__all__ = ["ACTIONS", "PreferCommandConfig", "main"]


@dataclass
class PreferCommandConfig(PreferConfig):
    """``PreferConfig`` with ``steer`` typed as the noise policy's ``SteerConfig``, so that the command
    line sets any of its fields (``steer.bound=0.5``) and a misspelt one is refused by name."""

    steer: SteerConfig = field(default_factory=lambda: SteerConfig(**STEER_DEFAULTS))  # learner=steer


@hydra_command("prefer", PreferCommandConfig)
def main(cfg: PreferCommandConfig) -> dict[str, Any]:
    torch.set_num_threads(1)  # small nets: threads cost more than they give
    out = run_dir()
    if cfg.action == "plot":
        metrics = plot_runs(cfg.runs, Path(cfg.out) if cfg.out else out / "curve.png")
        log.info("figure: %s", metrics["figure"])
    elif cfg.action == "eval":
        metrics = evaluate_reward(cfg, out)
        log.info("held-out accuracy %.3f, ECE %.3f, return Spearman %.3f; success %s", metrics["accuracy"],
                 metrics["ece"], metrics["return_spearman"], metrics["policy"])
    else:
        metrics = run_prefer(cfg, out)
        log.info("labels in %s: %s; reward: %s", metrics["labels_path"], metrics["labels"], out / "reward.pt")
    write_json(out / "metrics.json", metrics)
    return metrics
