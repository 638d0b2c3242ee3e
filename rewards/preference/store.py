"""The label store: every query and every label, append-only, crash-safe, reusable across runs.

Layout of a store directory (``labels=PATH``)::

    meta.json              format, task (or tasks), state/action dims, segment length (checked on reuse)
    queries/q_000000.npz   the two segments of query 0 (``left/states``, ``right/frames``, ...
                           plus ``__meta__``: instructions and provenance as JSON)
    labels.jsonl           one line per answer: {"query": 0, "label": "right", "teacher": "oracle",
                           "time": <unix seconds>}; label is left | right | equal | skip

A query file is written to a temporary name, fsynced and renamed before anyone is asked
about it; a label is one ``write`` of one line to the file opened for appending, fsynced
before the call returns (so a page or loop that got an answer acknowledged can crash at
any point without losing it). On open every line is checked; a malformed or truncated
line is never skipped silently: the store refuses to open, listing each bad line by
number, unless asked to quarantine them (``on_malformed="quarantine"``), which moves them
verbatim to ``labels.rejected.jsonl`` and keeps the rest. One writer at a time: the first
write takes an exclusive lock on ``PATH/lock`` (released by ``close``, or by the kernel when
the process dies), and a second writer is refused with the first one's pid; threads of the
writing process share its store.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from embodied.core.errors import EmbodiedError
from embodied.core.files import atomic_write, fsync_dir
from rewards.preference.segments import Query, Segment

log = logging.getLogger("embodied.prefer")

FORMAT = 1
LABELS = ("left", "right", "equal", "skip")
TARGET = {"left": 0.0, "right": 1.0, "equal": 0.5}  # P[right ≻ left]; a skip trains nothing
ON_MALFORMED = ("raise", "quarantine")
MATCHED = ("task", "tasks", "state_dim", "action_dim", "segment_length")
_Q_RE = re.compile(r"^q_(\d{6,})\.npz$")
_TMP_RE = re.compile(r"\.tmp-(\d+)$")


class LabelFileError(EmbodiedError, ValueError):
    """A label file with malformed or truncated lines; ``problems`` lists (line number, reason)."""

    def __init__(self, path: Path, problems: Sequence[tuple[int, str]]):
        self.path, self.problems = path, list(problems)
        rows = "\n".join(f"  line {n}: {why}" for n, why in self.problems)
        super().__init__(f"{path}: {len(self.problems)} bad line(s), nothing was skipped:\n{rows}\n"
                         "Fix or delete those lines, or reopen with labels_on_malformed=quarantine to move "
                         "them to labels.rejected.jsonl and keep every good label.")


class LabelStoreError(EmbodiedError, ValueError):
    """A store that is missing, of another task or shape, or asked for something it does not hold."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _atomic_write(path: Path, data: bytes | None = None, arrays: Mapping[str, np.ndarray] | None = None) -> None:
    """``data`` (bytes) or ``arrays`` (a compressed .npz) written crash-safely to ``path``."""
    atomic_write(path, (lambda f: np.savez_compressed(f, **arrays)) if arrays is not None
                 else (lambda f: f.write(data or b"")))


def _excerpt(line: str) -> str:
    return repr(line if len(line) <= 60 else line[:57] + "...")


class LabelStore:
    """Queries and labels of one task, or of several (each query within one), in a directory (see
    the module docstring).

    Args:
        path: the store directory.
        meta: what this run needs (``task``, or ``tasks`` for several, ``state_dim``, ``action_dim``,
            ``segment_length``); creates the store when absent, and must match a store that
            exists. None opens an existing store as it is (``embodied label``).
        on_malformed: ``raise`` (default) or ``quarantine`` (see the module docstring).
    """

    def __init__(self, path: str | os.PathLike, meta: Mapping[str, Any] | None = None, on_malformed: str = "raise"):
        if on_malformed not in ON_MALFORMED:
            raise ValueError(f"labels_on_malformed must be one of {ON_MALFORMED}, got {on_malformed!r}")
        self.root = Path(path)
        self.labels_path = self.root / "labels.jsonl"
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        self._queries: dict[int, Query] = {}
        if not (self.root / "meta.json").is_file():
            if meta is None:
                raise LabelStoreError(f"no label store at {self.root} (meta.json missing); create one with "
                                      "`embodied prefer labels=PATH` or `embodied label labels=PATH task=NAME`")
            (self.root / "queries").mkdir(parents=True, exist_ok=True)
            self._claim()
            self.meta = {"format": FORMAT, **{k: meta[k] for k in MATCHED if k in meta}}
            _atomic_write(self.root / "meta.json", json.dumps(self.meta, indent=2).encode())
        else:
            self.meta = self._read_meta(meta)
        self._clean_tmp()
        self.query_ids = sorted(int(m.group(1)) for p in (self.root / "queries").iterdir()
                                if (m := _Q_RE.match(p.name)))
        self.records: list[dict[str, Any]] = []
        self.by_query: dict[int, dict[str, Any]] = {}
        self._read_labels(on_malformed)

    # ------------------------------------------------------------------ open
    def _claim(self) -> None:
        """Become the store's one writer (an exclusive ``flock`` on PATH/lock), or say who is."""
        if self._lock_fd is not None:
            return
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise LabelStoreError(f"another writer (pid {other}) holds the label store {self.root}: one writer at "
                                  "a time (stop it, or answer through its label page)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def close(self) -> None:
        """Give up the writer's lock (reading goes on working)."""
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock

    def __del__(self) -> None:
        self.close()

    def _read_meta(self, want: Mapping[str, Any] | None) -> dict[str, Any]:
        p = self.root / "meta.json"
        try:
            meta = json.loads(p.read_text())
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                found = meta.get("format") if isinstance(meta, dict) else meta
                raise ValueError(f"format {found!r}, expected {FORMAT}")
        except (OSError, ValueError) as e:
            raise LabelStoreError(f"{p} is unreadable: {e}") from None
        diffs = [f"{k}: store has {meta.get(k)!r}, this run has {want[k]!r}"
                 for k in MATCHED if want is not None and k in want and meta.get(k) != want[k]]
        if diffs:
            raise LabelStoreError(f"label store {self.root} was made for another setting: " + "; ".join(diffs)
                                  + ". Use a new labels=PATH, or the settings it was made with.")
        return meta

    def _clean_tmp(self) -> None:
        for d in (self.root, self.root / "queries"):
            for p in d.iterdir():
                m = _TMP_RE.search(p.name)
                if m and not _pid_alive(int(m.group(1))):
                    p.unlink(missing_ok=True)  # a dead writer's unfinished file: never acknowledged

    def _check_line(self, raw: str, known: set[int], seen: dict[int, int]) -> tuple[dict[str, Any] | None, str]:
        try:
            rec = json.loads(raw)
        except ValueError as e:
            return None, f"not JSON ({e.msg}): {_excerpt(raw)}"
        if not isinstance(rec, dict):
            return None, f"not a JSON object: {_excerpt(raw)}"
        q = rec.get("query")
        if not isinstance(q, int) or isinstance(q, bool) or q < 0:
            return None, f"'query' must be a non-negative integer, got {q!r}"
        if rec.get("label") not in LABELS:
            return None, f"'label' must be one of {LABELS}, got {rec.get('label')!r}"
        if not isinstance(rec.get("teacher"), str):
            return None, f"'teacher' must be a string, got {rec.get('teacher')!r}"
        if q not in known:
            return None, f"query {q} has no file queries/q_{q:06d}.npz"
        if q in seen:
            return None, f"query {q} was already labelled on line {seen[q]}"
        return rec, ""

    def _read_labels(self, on_malformed: str) -> None:
        if not self.labels_path.exists():
            return
        data = self.labels_path.read_bytes()
        lines = data.split(b"\n")
        truncated = not data.endswith(b"\n") and data != b""
        if not truncated:
            lines = lines[:-1]
        known, seen = set(self.query_ids), {}
        good, bad = [], []
        for n, b in enumerate(lines, 1):
            try:
                raw = b.decode("utf-8")
            except UnicodeDecodeError:
                bad.append((n, b, "not UTF-8 text"))
                continue
            if truncated and n == len(lines):
                bad.append((n, b, f"truncated (the file ends mid-line, a write was interrupted): {_excerpt(raw)}"))
                continue
            if not raw.strip():
                bad.append((n, b, "empty line"))
                continue
            rec, why = self._check_line(raw, known, seen)
            if rec is None:
                bad.append((n, b, why))
            else:
                seen[rec["query"]] = n
                good.append((b, rec))
        if bad and on_malformed == "raise":
            raise LabelFileError(self.labels_path, [(n, why) for n, _, why in bad])
        if bad:
            self._quarantine(bad, [b for b, _ in good])
        self.records = [rec for _, rec in good]
        self.by_query = {rec["query"]: rec for rec in self.records}

    def _quarantine(self, bad: list[tuple[int, bytes, str]], good: list[bytes]) -> None:
        self._claim()
        rejected = self.root / "labels.rejected.jsonl"
        with open(rejected, "ab") as f:
            for n, b, why in bad:
                entry = {"line": n, "reason": why, "text": b.decode("utf-8", "replace"), "time": time.time()}
                f.write((json.dumps(entry) + "\n").encode())
                log.warning("%s line %d moved to %s: %s", self.labels_path, n, rejected.name, why)
            f.flush()
            os.fsync(f.fileno())
        _atomic_write(self.labels_path, b"".join(b + b"\n" for b in good))

    # --------------------------------------------------------------- queries
    def add_query(self, query: Query) -> int:
        """Write a query's file (atomically) and return its id; sets ``query.id``."""
        arrays: dict[str, np.ndarray] = {}
        meta: dict[str, Any] = {}
        for side in ("left", "right"):
            seg: Segment = getattr(query, side)
            if self.meta.get("segment_length") not in (None, len(seg)):
                raise LabelStoreError(f"{side} segment has {len(seg)} steps, the store holds "
                                      f"{self.meta['segment_length']}-step segments")
            for name in ("states", "actions", "rewards", "frames"):
                if getattr(seg, name) is not None:
                    arrays[f"{side}/{name}"] = np.asarray(getattr(seg, name))
            meta[side] = {"instruction": seg.instruction, "info": seg.info}
        arrays["__meta__"] = np.array(json.dumps(meta, default=str))
        with self._lock:
            self._claim()
            qid = self.query_ids[-1] + 1 if self.query_ids else 0
            _atomic_write(self.root / "queries" / f"q_{qid:06d}.npz", arrays=arrays)
            self.query_ids.append(qid)
        query.id = qid
        return qid

    def query(self, qid: int, frames: bool = False) -> Query:
        """Load query ``qid`` (frames only when asked: they are the bulk of the file)."""
        if qid not in self.query_ids:
            raise LabelStoreError(f"query {qid} is not in {self.root} (it holds {len(self.query_ids)} queries)")
        if not frames and qid in self._queries:
            return self._queries[qid]
        path = self.root / "queries" / f"q_{qid:06d}.npz"
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["__meta__"]))
                segs = {side: Segment(z[f"{side}/states"], z[f"{side}/actions"], z[f"{side}/rewards"],
                                      meta[side]["instruction"],
                                      z[f"{side}/frames"] if frames and f"{side}/frames" in z.files else None,
                                      meta[side]["info"]) for side in ("left", "right")}
        except (OSError, ValueError, KeyError) as e:
            raise LabelStoreError(f"query file {path} is damaged: {e}") from None
        q = Query(segs["left"], segs["right"], qid)
        if not frames:
            self._queries[qid] = q
        return q

    def has_frames(self, qid: int) -> bool:
        with np.load(self.root / "queries" / f"q_{qid:06d}.npz", allow_pickle=False) as z:
            return "left/frames" in z.files and "right/frames" in z.files

    # ---------------------------------------------------------------- labels
    def add_label(self, qid: int, label: str, teacher: str) -> dict[str, Any]:
        """Append one label, fsynced before returning. Repeating the same answer is a no-op
        (a page retrying after a lost acknowledgement); a different answer raises."""
        if label not in LABELS:
            raise ValueError(f"label must be one of {LABELS}, got {label!r}")
        with self._lock:
            self._claim()
            if qid not in self.query_ids:
                raise LabelStoreError(f"query {qid} is not in {self.root}")
            old = self.by_query.get(qid)
            if old is not None:
                if old["label"] == label:
                    return old
                raise LabelStoreError(f"query {qid} is already labelled {old['label']!r} by {old['teacher']}; "
                                      "labels are append-only")
            rec = {"query": int(qid), "label": label, "teacher": str(teacher), "time": round(time.time(), 3)}
            new = not self.labels_path.exists()
            fd = os.open(self.labels_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(rec) + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            if new:
                fsync_dir(self.root)
            self.records.append(rec)
            self.by_query[qid] = rec
        return rec

    def pending(self) -> list[int]:
        """Ids of the queries nobody has answered yet, oldest first."""
        return [q for q in self.query_ids if q not in self.by_query]

    def training_set(self, frames: bool = False) -> tuple[list[Query], list[float]]:
        """Every answered, non-skipped query (with its frames if asked) and its target P[right ≻ left]."""
        qs = [r["query"] for r in self.records if r["label"] != "skip"]
        return [self.query(q, frames) for q in qs], [TARGET[self.by_query[q]["label"]] for q in qs]

    def counts(self) -> dict[str, int]:
        c = {k: 0 for k in LABELS}
        for r in self.records:
            c[r["label"]] += 1
        return {**c, "answered": len(self.records), "queries": len(self.query_ids)}
