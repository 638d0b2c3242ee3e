"""``embodied bench``: simulation, rendering, expert and policy figures (see ``embodied.runtime.sim_bench``)."""

from __future__ import annotations

from typing import Any

from embodied.commands.app import hydra_command, run_dir
from embodied.runtime.sim_bench import BenchConfig, bench


@hydra_command("bench", BenchConfig)
def main(cfg: BenchConfig) -> dict[str, Any]:
    return bench(cfg, run_dir())
