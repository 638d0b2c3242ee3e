"""Run folders are owned: ``embodied-run.json`` names the command whose results a folder holds.

The first command to write into a ``hydra.run.dir`` leaves ``embodied-run.json`` there naming
itself; any other command pointed at that folder is refused before anything is written (Hydra's
``.hydra/`` included), with the way out (``hydra.run.dir=RUN/<command>``, or any new folder). A
folder from before the marker existed belongs to the command named in its ``.hydra/hydra.yaml``,
or to ``train`` when it holds ``checkpoint/``; a folder holding other files than Hydra's is
refused. The same command may run again in its own folder (``train`` resumes there); the
``.hydra/`` files of the earlier invocation are then kept in ``.hydra/previous/<k>/``
(``keep_hydra_files``). ``embodied.commands.app.RunDirGuard`` applies these rules before Hydra
writes anything.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

OWNER_FILE = "embodied-run.json"  # in a run folder: the command whose results it holds
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what Hydra writes to .hydra/ at each start


class RunDirError(Exception):
    """A run folder that this command may not write into (it holds another command's results)."""


def _read_owner(run: Path) -> str:
    path = run / OWNER_FILE
    try:
        owner = json.loads(path.read_text()).get("command")
    except (OSError, ValueError, AttributeError) as e:
        raise RunDirError(f"{path} is unreadable or not a JSON object naming a command ({e}); the folder's "
                          "owner is unknown, so nothing is written there: give a new hydra.run.dir=PATH") from None
    if not isinstance(owner, str) or not owner:
        raise RunDirError(f"{path} names no command; give a new hydra.run.dir=PATH")
    return owner


def _hydra_config_name(run: Path) -> str | None:
    """``hydra.job.config_name`` in ``run/.hydra/hydra.yaml`` (the command that wrote it), if any."""
    path = run / ".hydra" / "hydra.yaml"
    if not path.is_file():
        return None
    try:
        from omegaconf import OmegaConf

        name = OmegaConf.select(OmegaConf.load(path), "hydra.job.config_name")
    except Exception:  # an unreadable leftover only loses the hint
        return None
    return name if isinstance(name, str) else None


def run_owner(run: Path) -> str | None:
    """The command whose results ``run`` holds, or None for a folder with nothing in it but
    Hydra's files and logs (or no folder at all).

    Raises:
        RunDirError: ``run`` is a file, its marker is unreadable, or it holds files that no
            command of ours wrote (refused: they might be someone's results).
    """
    if not run.exists():
        return None
    if not run.is_dir():
        raise RunDirError(f"hydra.run.dir={str(run)!r} is a file, not a folder: give a folder")
    if (run / OWNER_FILE).exists():
        return _read_owner(run)
    held = sorted(p.name for p in run.iterdir() if p.name != ".hydra" and p.suffix != ".log")
    if not held:
        return None
    if (run / "checkpoint").is_dir():  # a training run from before the marker
        return "train"
    name = _hydra_config_name(run)
    if name:
        return name
    shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
    raise RunDirError(f"hydra.run.dir={str(run)!r} already holds files that no embodied command wrote "
                      f"({shown}); give an empty or new folder, e.g. hydra.run.dir={run}/run")


def check_owner(run: Path, name: str) -> str | None:
    """``run_owner(run)``, refused (``RunDirError``) when it is another command than ``name``."""
    owner = run_owner(run)
    if owner is not None and owner != name:
        raise RunDirError(f"hydra.run.dir={str(run)!r} holds the results of `embodied {owner}` (see its "
                          f"{OWNER_FILE if (run / OWNER_FILE).exists() else 'files'}); `embodied {name}` does "
                          f"not write over them: give it its own folder, e.g. hydra.run.dir={run}/{name}")
    return owner


def claim_run_dir(run: Path, name: str) -> None:
    """Refuse ``run`` if another command owns it; else mark it as ``name``'s (creating it)."""
    check_owner(run, name)
    run.mkdir(parents=True, exist_ok=True)
    if not (run / OWNER_FILE).exists():
        tmp = run / f".{OWNER_FILE}.tmp"
        tmp.write_text(json.dumps({"command": name}) + "\n")
        os.replace(tmp, run / OWNER_FILE)


def keep_hydra_files(run: Path) -> None:
    """Copy the ``.hydra/`` files of an earlier invocation to ``.hydra/previous/<k>/`` before Hydra
    writes this one's over them."""
    src = run / ".hydra"
    files = [src / f for f in HYDRA_FILES if (src / f).is_file()]
    if not files:
        return
    k = 1
    while (src / "previous" / str(k)).exists():
        k += 1
    dest = src / "previous" / str(k)
    dest.mkdir(parents=True)
    for f in files:
        shutil.copy2(f, dest / f.name)
