"""``embodied data ACTION``: look after datasets, and move them in and out as LeRobotDataset v3.

    embodied data validate|repair path=DATASET      # read every episode; repair moves the bad ones to quarantine/
    embodied data info path=DATASET                 # ours or a LeRobotDataset v3: episodes, frames, features, tasks
    embodied data export src=OURS out=LEROBOT_DIR [fps=20] [vcodec=libsvtav1]
    embodied data import src=LEROBOT_DIR out=OURS [task=NAME]

``validate|repair``: repair moves the bad episodes into ``DATASET/quarantine/`` and rewrites the
index from the whole ones. ``export|import`` write all or nothing (``embodied.runtime.lerobot``):
an interrupted one leaves no folder behind.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from embodied.commands.app import hydra_command, run_dir
from embodied.runtime.evaluate import write_json

log = logging.getLogger("embodied.data")

ACTIONS = ("validate", "repair", "info", "export", "import")
VCODECS = ("libsvtav1", "h264", "hevc")  # embodied.runtime.lerobot.VCODECS (checked there too)


@dataclass
class DataConfig:
    """Schema of ``configs/data.yaml``."""

    action: str = "validate"  # validate | repair | info | export | import
    path: str = ""  # validate, repair, info: the dataset folder
    src: str = ""  # export: our dataset; import: a LeRobotDataset v3 folder
    out: str = ""  # export, import: the folder to write (absent or empty)
    task: str = ""  # import: our task name for every episode of a folder without meta/embodied.json
    fps: int = 20  # export: frames per second (our worlds step at 20 Hz; a robot run at loop.rate_hz)
    vcodec: str = "libsvtav1"  # export: video codec of the cameras (libsvtav1 | h264 | hevc)
    progress: bool = True

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS} (`embodied data validate|repair|info path=...`, "
                             f"`embodied data export|import src=... out=...`), got {self.action!r}")
        if not 1 <= self.fps <= 1000:
            raise ValueError(f"fps must be in [1, 1000] frames per second, got {self.fps}")
        if self.vcodec not in VCODECS:
            raise ValueError(f"vcodec must be one of {VCODECS}, got {self.vcodec!r}")
        moving = self.action in ("export", "import")
        # a setting the action does not read is refused, not ignored (as collect refuses cameras with obs_mode=state)
        unused = [n for n in ("src", "out", "task") if getattr(self, n) and (not moving or n == "task" and
                                                                             self.action != "import")]
        unused += ["path"] if moving and self.path else []
        default = {f.name: f.default for f in fields(self)}
        unused += [n for n in ("fps", "vcodec") if self.action != "export" and getattr(self, n) != default[n]]
        if unused:
            raise ValueError(f"{', '.join(f'{n}={getattr(self, n)!r}' for n in unused)}: not read by "
                             f"`embodied data {self.action}` (path= is for validate|repair|info, src= out= for "
                             "export|import, task= for import, fps= vcodec= for export)")
        if moving:
            for name in ("src", "out"):
                if not getattr(self, name):
                    raise ValueError(f"give {name}=DIR: `embodied data {self.action} src=DIR out=DIR`")
            if not Path(self.src).is_dir():
                raise FileNotFoundError(f"src {self.src!r} is not a folder: give the dataset's folder, src=DIR")
            return
        if not self.path:
            raise ValueError("give the dataset: path=DIR (e.g. data/manipulation-state)")
        if not Path(self.path).is_dir():
            raise FileNotFoundError(f"path {self.path!r} is not a folder: give the dataset's folder, path=DIR "
                                    "(e.g. data/manipulation-state)")


@hydra_command("data", DataConfig)
def main(cfg: DataConfig) -> dict[str, Any]:
    if cfg.action in ("export", "import", "info"):
        return _lerobot(cfg)
    from embodied.runtime.data import check_dataset

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


def _lerobot(cfg: DataConfig) -> dict[str, Any]:
    from embodied.runtime import lerobot

    if cfg.action == "info":
        report = lerobot.dataset_info(cfg.path)
        for k, v in report.items():
            print(f"{k}: {v}")
    elif cfg.action == "export":
        report = lerobot.export_lerobot(cfg.src, cfg.out, fps=cfg.fps, vcodec=cfg.vcodec, progress=cfg.progress)
        log.info("exported %d episode(s), %d frames to %s (LeRobotDataset v3)", report["episodes"], report["frames"],
                 report["out"])
    else:
        report = lerobot.import_lerobot(cfg.src, cfg.out, task=cfg.task, progress=cfg.progress)
        log.info("imported %d episode(s), %d frames into %s", report["episodes"], report["frames"], report["out"])
    write_json(run_dir() / "metrics.json", report)
    return report
