"""Crash-safe file writes. ``atomic_write``, for everything that keeps what a user recorded
(datasets, preference labels): write to a temporary name in the same folder, fsync, rename into
place, fsync the folder; a crash at any moment leaves the old file or the new one, never half
of one. ``write_json``, for results (metrics, rollout banks' records): the same rename, no fsync."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any, Callable


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make renames in folder ``path`` durable (a no-op where folders cannot be fsynced)."""
    if os.name == "posix":
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object]) -> None:
    """Write ``path`` by ``write(f)`` into ``<path>.tmp-<pid>``, fsync, then rename it into place.

    The temporary name carries the writer's pid, so a reader can tell a dead writer's
    leftover from a live one's file in progress. A Ctrl-C that lands inside ``write`` comes
    out as ``KeyboardInterrupt`` even where the writer's own clean-up fails because of it
    (``zipfile``, under ``np.savez``, raises "Can't close the ZIP file ..." on the way out).
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if not isinstance(e, KeyboardInterrupt) and _caused_by_interrupt(e):
            raise KeyboardInterrupt from e
        raise
    fsync_dir(path.parent)


def _caused_by_interrupt(error: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in the chain of exceptions ``error`` was raised during."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write JSON atomically (a crash never leaves a half-written file)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=float))
    os.replace(tmp, path)
