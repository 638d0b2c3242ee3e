"""``embodied data validate|repair path=DATASET``: read every episode of a dataset; repair moves
the bad ones into ``DATASET/quarantine/`` and rewrites the index from the whole ones."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied.commands.app import hydra_command, run_dir
from embodied.runtime.data import check_dataset
from embodied.runtime.evaluate import write_json

log = logging.getLogger("embodied.data")

ACTIONS = ("validate", "repair")


@dataclass
class DataConfig:
    """Schema of ``configs/data.yaml``."""

    action: str = "validate"  # validate (report, exit 1 if any episode is corrupt) or repair
    path: str = ""  # the dataset directory

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS} (`embodied data validate|repair path=...`), "
                             f"got {self.action!r}")
        if not self.path:
            raise ValueError("give the dataset: path=DIR (e.g. data/manipulation-state)")
        if not Path(self.path).is_dir():
            raise FileNotFoundError(f"path {self.path!r} is not a folder: give the dataset's folder, path=DIR "
                                    "(e.g. data/manipulation-state)")


@hydra_command("data", DataConfig)
def main(cfg: DataConfig) -> dict[str, Any]:
    report = check_dataset(cfg.path, repair=cfg.action == "repair")
    write_json(run_dir() / "metrics.json", report)
    for line in report["corrupt"]:
        log.warning("corrupt: %s", line)
    if report["quarantined"]:
        log.info("moved %d file(s) to %s/quarantine/: %s", len(report["quarantined"]), report["dataset"],
                 ", ".join(report["quarantined"]))
    log.info("%s: %d whole episode(s), %d corrupt", report["dataset"], report["episodes"], len(report["corrupt"]))
    if cfg.action == "validate" and report["corrupt"]:
        log.info("run `embodied data repair path=%s` to move them aside and keep the rest", cfg.path)
        sys.exit(1)
    return report
