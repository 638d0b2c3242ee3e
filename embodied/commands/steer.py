"""``embodied steer``: RL on a frozen flow/diffusion policy's initial noise (see ``embodied.runtime.steer``)."""

from __future__ import annotations

import logging
from typing import Any

from embodied.commands.app import hydra_command, run_dir
from embodied.runtime.evaluate import pct
from embodied.runtime.steer import SteerRunConfig, steer

log = logging.getLogger("embodied.steer")


@hydra_command("steer", SteerRunConfig)
def main(cfg: SteerRunConfig) -> dict[str, Any]:
    m = steer(cfg, run_dir())
    log.info("%s on %s (%s reward): success %s -> %s (held-out wordings %s -> %s) in %d env steps, %.0f s; "
             "steered checkpoint %s", m["method"], m["task"], m["reward_kind"], pct(m["success_before"]), pct(m["success_after"]), pct(m["heldout_before"]),
             pct(m["heldout_after"]), m["env_steps"], m["wall_time_s"], m["checkpoint_out"])
    for name, c in m["compare"].items():
        log.info("  %-13s success %s after %d env steps (%.0f s)", name, pct(c["success_after"]), c["env_steps"],
                 c["wall_time_s"])
    return m
