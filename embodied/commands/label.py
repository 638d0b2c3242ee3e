"""``embodied label labels=DIR``: serve the labelling page for a person (see ``rewards.preference.server``)."""

from __future__ import annotations

from typing import Any

from embodied.commands.app import hydra_command, run_dir
from embodied.runtime.evaluate import write_json
from embodied.runtime.prefer import LabelConfig, serve_labels


@hydra_command("label", LabelConfig)
def main(cfg: LabelConfig) -> dict[str, Any]:
    metrics = serve_labels(cfg)
    write_json(run_dir() / "metrics.json", metrics)
    return metrics
