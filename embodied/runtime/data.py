"""On-disk episode datasets: append-only, one compressed file per episode, crash-safe.

Layout of a dataset directory::

    meta.json                 format version, features spec, free-form ``info``
    index.jsonl               one JSON line per episode (cache; rebuilt from the files)
    stats.json                running per-feature statistics (cache; recomputed if stale)
    episodes/ep_000000.npz    step arrays (T, *shape) + ``__meta__`` (JSON, 0-d str)

A *feature* is a per-step array: ``state`` float32 (Ds,), ``action`` float32 (Da,),
``reward`` float32 (), ``reward_terms/<name>`` float32 (), ``image`` uint8 (H, W, 3),
``images/<cam>`` uint8 (H, W, 3). Per-episode values (task, instruction,
instruction_split, success, seed, length, ...) live in ``__meta__`` and in the index.

Every file is written to a temporary name, fsynced and renamed into place, and the
episode file is written before the index and the stats. So a crash or Ctrl-C at any
point loses no completed episode: on ``open`` the episode files are the truth, the
index and the stats are rebuilt from them when they disagree, and leftover temporary
files of dead writers are removed. One writer per dataset at a time.
"""

from __future__ import annotations

import io
import json
import os
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from embodied.core.errors import DatasetError
from embodied.core.files import atomic_write, fsync_dir
from embodied.core.specs import ActionSpec, ObservationSpec

FORMAT_VERSION = 1
Features = Mapping[str, tuple[str, tuple[int, ...]]]
_EP_RE = re.compile(r"^ep_(\d{6,})\.npz$")
_TMP_RE = re.compile(r"\.tmp-(\d+)$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$")
_META_KEY = "__meta__"
ON_CORRUPT = ("raise", "skip", "quarantine")
QUARANTINE = "quarantine"


def features_for(obs_spec: ObservationSpec, action_spec: ActionSpec,
                 reward_terms: Sequence[str] = (), pixels: bool = True,
                 privileged_dim: int = 0) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The features spec for a task: state, action, reward, its terms and (optionally) cameras.

    One camera is stored as ``image``, several as ``images/<cam>`` (as in observations).
    ``privileged_dim > 0`` adds ``privileged_state`` (the full state vector, recorded beside
    the pixels of a pixel dataset as a training-only target).
    """
    f: dict[str, tuple[str, tuple[int, ...]]] = {
        "state": ("float32", (obs_spec.state_dim,)), "action": ("float32", (action_spec.dim,)),
        "reward": ("float32", ())}
    f.update({f"reward_terms/{t}": ("float32", ()) for t in reward_terms})
    if pixels and obs_spec.image_size:
        hw3 = (obs_spec.image_size, obs_spec.image_size, 3)
        cams = obs_spec.cameras
        f.update({"image": ("uint8", hw3)} if len(cams) <= 1 else {f"images/{c}": ("uint8", hw3) for c in cams})
    if privileged_dim > 0:
        f["privileged_state"] = ("float32", (int(privileged_dim),))
    return f


def _norm_features(features: Features) -> dict[str, dict[str, Any]]:
    out = {}
    for name, spec in features.items():
        if not isinstance(name, str) or not _NAME_RE.match(name) or name.startswith("__"):
            raise DatasetError(f"feature name {name!r} is not allowed: use letters, digits and _./-")
        try:
            dtype, shape = spec
            dt = np.dtype(dtype)
            shape = [int(s) for s in shape]
        except (TypeError, ValueError) as e:
            raise DatasetError(f"feature {name!r}: expected (dtype, shape), got {spec!r} ({e})") from None
        if dt.kind not in "biuf" or any(s < 0 for s in shape):
            raise DatasetError(f"feature {name!r}: dtype must be bool/int/float and shape non-negative, "
                               f"got {dt.name} {tuple(shape)}")
        out[name] = {"dtype": dt.name, "shape": shape}
    return out


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=_json_default, allow_nan=False)


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) is not a probe on Windows: keep the file
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


class _Stats:
    """Running count/mean/M2/min/max per feature, merged with Chan et al.'s formula."""

    def __init__(self, features: dict[str, dict[str, Any]]):
        self.features = features
        self.episodes: set[int] = set()
        self.acc: dict[str, dict[str, Any]] = {k: {"count": 0} for k in features}

    @staticmethod
    def is_float(spec: dict[str, Any]) -> bool:
        return np.dtype(spec["dtype"]).kind == "f"

    def add(self, ep_id: int, arrays: Mapping[str, np.ndarray], length: int) -> None:
        for name, a in self.acc.items():
            if not self.is_float(self.features[name]):
                a["count"] += length
                continue
            x = np.asarray(arrays[name], np.float64)
            mb = x.mean(0)
            b = {"count": length, "mean": mb, "m2": ((x - mb) ** 2).sum(0), "min": x.min(0), "max": x.max(0)}
            if a["count"] == 0:
                a.update(b)
                continue
            n = a["count"] + length
            delta = mb - a["mean"]
            a["mean"] = a["mean"] + delta * length / n
            a["m2"] = a["m2"] + b["m2"] + delta ** 2 * a["count"] * length / n
            a["min"], a["max"], a["count"] = np.minimum(a["min"], b["min"]), np.maximum(a["max"], b["max"]), n
        self.episodes.add(ep_id)

    def to_json(self) -> dict[str, Any]:
        feats = {k: {f: np.asarray(v).tolist() if f != "count" else v for f, v in a.items()} for k, a in self.acc.items()}
        ranges: list[list[int]] = []  # episode ids as [start, stop) runs: stays small
        for i in sorted(self.episodes):
            if ranges and ranges[-1][1] == i:
                ranges[-1][1] += 1
            else:
                ranges.append([i, i + 1])
        return {"version": FORMAT_VERSION, "episodes": ranges, "features": feats}

    @classmethod
    def from_json(cls, features: dict[str, dict[str, Any]], d: dict[str, Any]) -> "_Stats":
        s = cls(features)
        if set(d["features"]) != set(features):
            raise ValueError("features differ")
        s.episodes = {i for a, b in d["episodes"] for i in range(int(a), int(b))}
        s.acc = {k: {f: (int(v) if f == "count" else np.asarray(v, np.float64)) for f, v in a.items()}
                 for k, a in d["features"].items()}
        return s

    def public(self) -> dict[str, dict[str, Any]]:
        out = {}
        for k, a in self.acc.items():
            out[k] = {"count": a["count"]}
            if "mean" in a:
                out[k].update(mean=a["mean"].tolist(), std=np.sqrt(a["m2"] / a["count"]).tolist(),
                              min=a["min"].tolist(), max=a["max"].tolist())
        return out


class Dataset:
    """An episode dataset in a directory (see the module docstring for the layout).

    Attributes:
        root: the directory.
        features: name -> {"dtype": str, "shape": [int, ...]} (per step).
        info: free-form dict given at creation (suite, obs_mode, specs, ...).
    """

    def __init__(self, root: Path, meta: dict[str, Any], entries: list[dict[str, Any]], next_id: int,
                 index_dirty: bool):
        self.root, self.features, self.info = root, meta["features"], meta.get("info", {})
        self._entries, self._next_id, self._index_dirty = entries, next_id, index_dirty
        self._stats: _Stats | None = None

    # ---- creating and opening -------------------------------------------------
    @classmethod
    def create(cls, root: str | os.PathLike, features: Features, info: Mapping[str, Any] | None = None,
               exist_ok: bool = False, on_corrupt: str = "raise") -> "Dataset":
        """Create an empty dataset; with ``exist_ok`` reopen one with the same features to append
        (``on_corrupt`` as in ``open``)."""
        root, feats = Path(root), _norm_features(features)
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            if not exist_ok:
                raise DatasetError(f"{root} exists and is not empty; pass exist_ok=True to append to it")
            ds = cls.open(root, on_corrupt=on_corrupt)
            diffs = [f"{k!r}: on disk {_fmt(ds.features.get(k))}, given {_fmt(feats.get(k))}"
                     for k in sorted(set(ds.features) | set(feats)) if ds.features.get(k) != feats.get(k)]
            if diffs:
                raise DatasetError(f"dataset {root} has different features: " + "; ".join(diffs))
            return ds
        root.mkdir(parents=True, exist_ok=True)
        meta = {"format_version": FORMAT_VERSION, "features": feats, "info": dict(info or {})}
        try:
            text = json.dumps(meta, default=_json_default, indent=1, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise DatasetError(f"dataset info must be JSON serialisable: {e}") from None
        atomic_write(root / "meta.json", lambda f: f.write(text.encode()))
        (root / "episodes").mkdir(exist_ok=True)
        return cls(root, meta, [], 0, False)

    @classmethod
    def open(cls, root: str | os.PathLike, *, validate: bool = False, on_corrupt: str = "raise") -> "Dataset":
        """Open a dataset, check it and repair its caches.

        Always: meta.json is read and checked, every episode file is listed and its size
        compared with the index (a truncated file is reported), the index is rebuilt from
        the files if it disagrees, and temporary files of dead writers are removed.
        ``validate=True`` also reads every episode and checks keys, dtypes, shapes and lengths.

        Args:
            on_corrupt: "raise" (DatasetError naming each bad file and what is wrong),
                "skip" (warn, and leave those episodes out), or "quarantine" (warn, move each
                bad file into ``quarantine/`` and drop it from the index; nothing is deleted).
                An index line whose file is gone is dropped by "skip" and "quarantine".
        """
        if on_corrupt not in ON_CORRUPT:
            raise DatasetError(f"on_corrupt must be one of {ON_CORRUPT}, got {on_corrupt!r}")
        root = Path(root)
        meta = _read_meta(root)
        files, ep_dir = {}, root / "episodes"
        for p in [*root.iterdir(), *(ep_dir.iterdir() if ep_dir.is_dir() else ())]:
            if p.parent == ep_dir and (m := _EP_RE.match(p.name)):
                files[int(m.group(1))] = p
            elif (t := _TMP_RE.search(p.name)) and not _pid_alive(int(t.group(1))):
                p.unlink(missing_ok=True)  # left by a writer that crashed
        indexed, dirty = _read_index(root / "index.jsonl")
        entries, bad, bad_paths = [], [], []
        for ep_id in sorted(set(files) | set(indexed)):
            path, entry = files.get(ep_id), indexed.get(ep_id)
            try:
                if path is None:
                    dirty = True
                    raise DatasetError("listed in index.jsonl but the file is missing")
                size = path.stat().st_size
                if entry is None or entry.get("bytes") != size:
                    if entry is not None:
                        raise DatasetError(f"file has {size} bytes, index.jsonl recorded {entry.get('bytes')} "
                                           "(truncated or overwritten)")
                    entry, dirty = _entry(ep_id, path, _load_npz(path, meta["features"], keys=())[1]), True
                if validate:
                    _load_npz(path, meta["features"], keys=None)
                entries.append(entry)
            except DatasetError as e:
                bad.append(f"{path.name if path else f'ep_{ep_id:06d}.npz'}: {e}")
                if path is not None:
                    bad_paths.append(path)
        if bad:
            msg = f"{len(bad)} corrupt episode(s) in {root}:\n  " + "\n  ".join(bad)
            if on_corrupt == "raise":
                raise DatasetError(msg + f"\n(`embodied data repair path={root}` moves them to quarantine/ and "
                                   "keeps the rest; or pass on_corrupt=skip to leave them out of this run)")
            if on_corrupt == "quarantine":  # the index is rewritten without them below
                _quarantine(root, bad_paths)
                msg, dirty = msg + f"\n(moved to {root / QUARANTINE})", True
            else:  # skip: the files and the index stay as they are, so the next open reports them again
                msg += "\n(skipped)"
            warnings.warn(msg, stacklevel=2)
        ds = cls(root, meta, entries, max(set(files) | set(indexed), default=-1) + 1, dirty)
        if dirty:
            try:
                ds._rewrite_index()
            except OSError:
                pass  # read-only: the in-memory index is right
        return ds

    # ---- writing ----------------------------------------------------------------
    def append(self, episode: Mapping[str, np.ndarray], **meta: Any) -> int:
        """Validate and append one episode; returns its position (``ds[pos]``).

        Args:
            episode: feature name -> (T, *shape) array, for every feature of the spec.
                Values are cast to the feature dtype when that is lossless in kind
                (float64 -> float32 is fine, float -> uint8 is not); NaN/inf is refused.
            **meta: JSON-serialisable per-episode values, e.g. task, instruction,
                instruction_split, success, seed.
        """
        arrays, length = self._check_episode(episode)
        bad = {"episode", "file", "bytes", "length"} & set(meta) or set(self.features) & set(meta)
        if bad:
            raise DatasetError(f"episode meta keys {sorted(bad)} are reserved (feature or index names)")
        try:
            meta_json = _dumps({**meta, "length": length})
        except (TypeError, ValueError) as e:
            raise DatasetError(f"episode meta must be JSON serialisable and finite: {e}") from None
        stats = self._ensure_stats()
        ep_id = self._next_id
        path = self.root / "episodes" / f"ep_{ep_id:06d}.npz"
        path.parent.mkdir(exist_ok=True)
        if path.exists():
            raise DatasetError(f"{path} already exists: is another process writing to this dataset?")
        payload = {**arrays, _META_KEY: np.array(meta_json)}
        try:
            atomic_write(path, lambda f: np.savez_compressed(f, **payload))
        finally:
            if path.exists():  # safe from here on, even if interrupted after the rename
                self._next_id = ep_id + 1
                self._entries.append(_entry(ep_id, path, json.loads(meta_json)))
                stats.add(ep_id, arrays, length)
                self._commit_caches()
        return len(self._entries) - 1

    def _commit_caches(self) -> None:
        """Add the newest entry to index.jsonl and rewrite stats.json (both are caches)."""
        try:
            if self._index_dirty:
                self._rewrite_index()
            else:
                self._index_dirty = True  # until the line is fully on disk
                with open(self.root / "index.jsonl", "a", encoding="utf-8") as f:
                    f.write(_dumps(self._entries[-1]) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                self._index_dirty = False
        finally:
            self._write_stats()

    def _check_episode(self, episode: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        missing, extra = set(self.features) - set(episode), set(episode) - set(self.features)
        if missing or extra:
            raise DatasetError(f"episode features do not match the dataset: missing {sorted(missing)}, "
                               f"unexpected {sorted(extra)}")
        out, lengths = {}, {}
        for name, spec in self.features.items():
            x, dt, shape = np.asarray(episode[name]), np.dtype(spec["dtype"]), tuple(spec["shape"])
            if x.shape[1:] != shape or x.ndim != len(shape) + 1:
                raise DatasetError(f"feature {name!r}: expected shape (T{''.join(f', {s}' for s in shape)}), "
                                   f"got {x.shape}")
            if not np.can_cast(x.dtype, dt, "same_kind"):
                raise DatasetError(f"feature {name!r}: expected dtype {dt.name}, got {x.dtype.name}")
            y = x.astype(dt)
            if dt.kind == "f" and not np.all(np.isfinite(y)):
                raise DatasetError(f"feature {name!r}: contains NaN or inf (or values too large for {dt.name})")
            if dt.kind in "biu" and not np.array_equal(y, x):
                raise DatasetError(f"feature {name!r}: values out of range for {dt.name}")
            out[name], lengths[name] = y, len(x)
        if len(set(lengths.values())) > 1:
            raise DatasetError(f"features have different lengths T: {lengths}")
        length = next(iter(lengths.values()), 0)
        if length == 0:
            raise DatasetError("episode has no steps (T = 0)")
        return out, length

    def _rewrite_index(self) -> None:
        text = "".join(_dumps(e) + "\n" for e in self._entries)
        atomic_write(self.root / "index.jsonl", lambda f: f.write(text.encode()))
        self._index_dirty = False

    # ---- statistics -------------------------------------------------------------
    def _ensure_stats(self) -> _Stats:
        if self._stats is not None:
            return self._stats
        ids = {e["episode"] for e in self._entries}
        try:
            s = _Stats.from_json(self.features, json.loads((self.root / "stats.json").read_text()))
            fresh = s.episodes <= ids  # a crash may have left out the newest episodes
        except (OSError, ValueError, KeyError, TypeError):
            fresh = False
        if not fresh:
            s = _Stats(self.features)
        todo = [i for i, e in enumerate(self._entries) if e["episode"] not in s.episodes]
        floats = [k for k, v in self.features.items() if _Stats.is_float(v)]
        for i in todo:
            e = self._entries[i]
            s.add(e["episode"], self._load(i, keys=floats)[0], e["length"])
        self._stats = s
        if todo or not fresh:
            self._write_stats()
        return s

    def _write_stats(self) -> None:
        if self._stats is not None:
            text = _dumps(self._stats.to_json())
            try:
                atomic_write(self.root / "stats.json", lambda f: f.write(text.encode()))
            except OSError:
                pass  # read-only dataset: recomputed on the next open

    @property
    def stats(self) -> dict[str, dict[str, Any]]:
        """Per feature over all steps: count; and for float features mean/std/min/max
        (lists shaped like the feature; std is the population std, ddof=0)."""
        return self._ensure_stats().public()

    # ---- reading ----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    @property
    def episodes_meta(self) -> list[dict[str, Any]]:
        """One dict per episode: episode id, file, bytes, length and the meta given to append."""
        return [dict(e) for e in self._entries]

    @property
    def lengths(self) -> list[int]:
        return [int(e["length"]) for e in self._entries]

    def _load(self, i: int, keys: Iterable[str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        e = self._entries[i]
        return _load_npz(self.root / "episodes" / e["file"], self.features, keys)

    def __getitem__(self, i: int) -> dict[str, Any]:
        """Episode ``i``: every feature as a (T, *shape) array, plus its meta values."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"episode {i} out of range for a dataset of {len(self)}")
        arrays, meta = self._load(i % len(self))
        return {**meta, **arrays}

    def iter_episodes(self, tasks: Iterable[str] | None = None) -> Iterator[dict[str, Any]]:
        """Yield episodes in order (as ``ds[i]``), only those of ``tasks`` if given."""
        keep = None if tasks is None else set(tasks)
        for i, e in enumerate(self._entries):
            if keep is None or e.get("task") in keep:
                yield self[i]

    def check_features(self, features: Iterable[str]) -> None:
        """Raise DatasetError naming the ``features`` this dataset does not record."""
        unknown = [f for f in features if f not in self.features]
        if unknown:
            raise DatasetError(f"unknown features {unknown}; the dataset {self.root} has {sorted(self.features)}")

    def select(self, tasks: Iterable[str] | None = None) -> list[int]:
        """Positions (``ds[i]``) of the episodes of ``tasks`` (all if None), in order.

        Raises:
            DatasetError: a task of ``tasks`` has no episode here (each named, with the tasks it holds).
        """
        keep = None if tasks is None else set(tasks)
        if keep is not None:
            have = {e.get("task") for e in self._entries}
            missing = sorted(keep - have)
            if missing:
                raise DatasetError(f"tasks {missing} have no episodes in {self.root}; it holds "
                                   f"{sorted(str(t) for t in have)}")
        return [i for i, e in enumerate(self._entries) if keep is None or e.get("task") in keep]

    def read(self, i: int, features: Sequence[str]) -> dict[str, np.ndarray]:
        """Only ``features`` of episode ``i``, each (T, *shape) and read-only: the other arrays and the
        meta of its file stay unread (T is the index's), for a reader that reads episodes batch by batch."""
        self.check_features(features)
        e = self._entries[i]
        return _read_members(self.root / "episodes" / e["file"], self.features, features, int(e["length"]))

    def load_arrays(self, features: Sequence[str] = ("state", "action"),
                    tasks: Iterable[str] | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Concatenate episodes for training (all of them in memory; ``embodied.runtime.stream``
        reads windows from disk instead).

        Returns:
            arrays: feature -> (N, *shape), N the total number of steps.
            episode_ends: (E,) int64, exclusive end of each episode in the N axis.
        """
        self.check_features(features)
        sel = self.select(tasks)
        ends = np.cumsum([self._entries[i]["length"] for i in sel], dtype=np.int64)
        n = int(ends[-1]) if len(ends) else 0
        out = {f: np.empty((n, *self.features[f]["shape"]), self.features[f]["dtype"]) for f in features}
        start = 0
        for i, end in zip(sel, ends):
            arrays = self._load(i, keys=features)[0]
            for f in features:
                out[f][start:end] = arrays[f]
            start = int(end)
        return out, ends

    def __repr__(self) -> str:
        return f"Dataset({str(self.root)!r}, episodes={len(self)}, features={sorted(self.features)})"


def _quarantine(root: Path, paths: Sequence[Path]) -> None:
    """Move ``paths`` into ``root/quarantine/`` (never overwriting an earlier one)."""
    dest = root / QUARANTINE
    dest.mkdir(exist_ok=True)
    for p in paths:
        target, n = dest / p.name, 1
        while target.exists():
            target, n = dest / f"{p.stem}.{n}{p.suffix}", n + 1
        os.replace(p, target)
    fsync_dir(dest)
    fsync_dir(root / "episodes")


def check_dataset(root: str | os.PathLike, repair: bool = False) -> dict[str, Any]:
    """Read every episode of a dataset; with ``repair``, quarantine the bad ones and rewrite the index.

    Returns ``{"dataset", "episodes" (whole ones), "corrupt": [messages], "quarantined": [file names]}``.
    Nothing is deleted: a bad file moves to ``quarantine/``, where it can be inspected.
    """
    root = Path(root)
    before = {p.name for p in (root / QUARANTINE).iterdir()} if (root / QUARANTINE).is_dir() else set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = Dataset.open(root, validate=True, on_corrupt="quarantine" if repair else "skip")
    corrupt = [line.strip() for w in caught if "corrupt episode" in str(w.message)
               for line in str(w.message).splitlines()[1:] if line.startswith("  ")]
    after = {p.name for p in (root / QUARANTINE).iterdir()} if (root / QUARANTINE).is_dir() else set()
    return {"dataset": str(root.resolve()), "episodes": len(ds), "corrupt": corrupt,
            "quarantined": sorted(after - before)}


def _fmt(spec: dict[str, Any] | None) -> str:
    return "missing" if spec is None else f"{spec['dtype']} {tuple(spec['shape'])}"


def _read_meta(root: Path) -> dict[str, Any]:
    path = root / "meta.json"
    if not path.is_file():
        raise DatasetError(f"{root} is not a dataset: {path} is missing")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        version, feats = int(meta["format_version"]), meta["features"]
        meta["features"] = _norm_features({k: (v["dtype"], v["shape"]) for k, v in feats.items()})
    except (ValueError, KeyError, TypeError, AttributeError, DatasetError) as e:
        raise DatasetError(f"{path} is corrupt: {type(e).__name__}: {e}") from None
    if version > FORMAT_VERSION:
        raise DatasetError(f"{path}: format version {version} is newer than this code ({FORMAT_VERSION})")
    return meta


def _read_index(path: Path) -> tuple[dict[int, dict[str, Any]], bool]:
    """Index entries by episode id, and whether the index needs rewriting."""
    entries, dirty = {}, False
    if not path.exists():
        return entries, True
    strings: dict[str, str] = {}  # one object per distinct string: keys, tasks and wordings repeat on every line

    def share(x: Any) -> Any:
        if isinstance(x, str):
            return strings.setdefault(x, x)
        if isinstance(x, dict):
            return {strings.setdefault(k, k): share(v) for k, v in x.items()}
        return [share(v) for v in x] if isinstance(x, list) else x

    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            e = share(json.loads(line))
            entries[int(e["episode"])] = e
        except (ValueError, KeyError, TypeError):
            dirty = True  # e.g. a half-written last line: rebuilt from the files
    return entries, dirty


def _entry(ep_id: int, path: Path, meta: dict[str, Any]) -> dict[str, Any]:
    return {"episode": ep_id, "file": path.name, "bytes": path.stat().st_size, **meta}


_NPY_HEADERS: dict[bytes, tuple[tuple[int, ...], bool, np.dtype]] = {}  # .npy header -> (shape, fortran, dtype)


def _read_members(path: Path, features: dict[str, dict[str, Any]], keys: Sequence[str],
                  length: int) -> dict[str, np.ndarray]:
    """``keys`` of one episode file as read-only (length, *shape) views of the decompressed members.

    What ``_load_npz`` checks, checked against the index's ``length``, with each distinct .npy header
    parsed once: ``np.load`` spends most of an episode's read parsing headers and the meta.
    """
    out = {}
    try:
        with zipfile.ZipFile(path) as z:
            for k in keys:
                raw = z.read(k + ".npy")
                size = 2 if raw[6:7] == b"\x01" else 4  # header length field: 2 bytes in format 1.0, else 4
                start = 8 + size + int.from_bytes(raw[8:8 + size], "little")
                head = raw[:start]
                if head not in _NPY_HEADERS:
                    f = io.BytesIO(head)
                    read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                                   (2, 0): np.lib.format.read_array_header_2_0}[np.lib.format.read_magic(f)]
                    _NPY_HEADERS[head] = read_header(f)
                shape, fortran, dtype = _NPY_HEADERS[head]
                spec = features[k]
                if dtype != np.dtype(spec["dtype"]) or fortran or shape != (length, *spec["shape"]):
                    raise DatasetError(f"feature {k!r} is {dtype.name} {shape}, expected {spec['dtype']} "
                                       f"(T={length},)+{tuple(spec['shape'])}")
                out[k] = np.frombuffer(raw, dtype, int(np.prod(shape, dtype=np.int64)), start).reshape(shape)
    except DatasetError as e:
        raise DatasetError(f"{path}: {e}") from None
    except Exception as e:  # zipfile, zlib and numpy format errors all mean a bad file
        raise DatasetError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    return out


def _load_npz(path: Path, features: dict[str, dict[str, Any]],
              keys: Iterable[str] | None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read ``keys`` (None: all, checked against the spec) and the meta of one episode file."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z[_META_KEY]))
            names = set(z.files) - {_META_KEY}
            if keys is None and names != set(features):
                raise DatasetError(f"features {sorted(names)} do not match the spec {sorted(features)}")
            arrays = {k: z[k] for k in (features if keys is None else keys)}
    except DatasetError as e:
        raise DatasetError(f"{path}: {e}") from None
    except Exception as e:  # zipfile, zlib, numpy format and JSON errors all mean a bad file
        raise DatasetError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    for k, x in arrays.items():
        spec = features[k]
        if x.dtype != np.dtype(spec["dtype"]) or x.shape[1:] != tuple(spec["shape"]) or len(x) != meta.get("length"):
            raise DatasetError(f"{path}: feature {k!r} is {x.dtype.name} {x.shape}, expected "
                               f"{spec['dtype']} (T={meta.get('length')},)+{tuple(spec['shape'])}")
    return arrays, meta


class EpisodeRecorder:
    """Collect one episode step by step, then append it to a dataset.

    ``start(...)``; ``add(obs, action, reward, info)`` per env step; ``finish()`` to
    append or ``discard()`` to drop. Only features of the dataset's spec are recorded:
    ``state``/``image`` from ``obs``, ``images/<cam>`` from ``obs["images"]``,
    ``reward_terms/<name>`` from ``info["reward_terms"]``, other names from ``obs`` or ``info``.
    """

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        self._steps: dict[str, list[np.ndarray]] | None = None
        self._meta: dict[str, Any] = {}
        self._last_info: Mapping[str, Any] = {}

    @property
    def recording(self) -> bool:
        return self._steps is not None

    def start(self, *, task: str = "", instruction: str | None = None, seed: int | None = None,
              **meta: Any) -> None:
        """Begin an episode; ``instruction`` defaults to the first observation's."""
        if self.recording:
            raise DatasetError("an episode is already being recorded: call finish() or discard() first")
        self._steps = {k: [] for k in self.dataset.features}
        self._meta = {"task": task, "instruction": instruction, "seed": seed, **meta}
        self._last_info = {}

    def add(self, obs: Mapping[str, Any], action: np.ndarray, reward: float,
            info: Mapping[str, Any] | None = None) -> None:
        """Record one step: the observation the action was taken in, the action (Da,),
        and the reward and info that followed it."""
        if self._steps is None:
            raise DatasetError("call start() before add()")
        info = info or {}
        if self._meta["instruction"] is None and "instruction" in obs:
            self._meta["instruction"] = str(obs["instruction"])
        for name, buf in self._steps.items():
            if name == "action":
                v = action
            elif name == "reward":
                v = reward
            elif name.startswith("images/") and name[7:] in obs.get("images", {}):
                v = obs["images"][name[7:]]
            elif name.startswith("reward_terms/") and name[13:] in info.get("reward_terms", {}):
                v = info["reward_terms"][name[13:]]
            elif name in obs:
                v = obs[name]
            elif name in info:
                v = info[name]
            else:
                raise DatasetError(f"feature {name!r} of the dataset is not in this step's obs/info")
            buf.append(np.array(v))  # a copy: environments may reuse their buffers
        self._last_info = info

    def finish(self, success: bool | None = None, **meta: Any) -> int:
        """Append the episode (``success`` defaults to the last info's); returns its position."""
        if self._steps is None:
            raise DatasetError("call start() before finish()")
        if success is None:
            success = bool(self._last_info.get("success", False))
        steps, extra = self._steps, {**self._meta, "success": bool(success), **meta}
        if extra["instruction"] is None:
            extra["instruction"] = ""
        episode = {k: np.stack(v) if v else np.zeros((0, *self.dataset.features[k]["shape"]))
                   for k, v in steps.items()}
        pos = self.dataset.append(episode, **extra)
        self.discard()
        return pos

    def discard(self) -> None:
        """Drop the episode being recorded, if any."""
        self._steps, self._meta, self._last_info = None, {}, {}


def make_windows(episode_ends: np.ndarray, horizon: int = 1, max_action_pad: int | None = None) -> np.ndarray:
    """Training samples as (episode, step) pairs, (N, 2) int64; ``step`` is the current step.

    Every step of every episode is a sample, except that with ``max_action_pad`` those
    whose action chunk would need more than that many padded actions at the episode end
    are left out (Diffusion Policy uses ``n_action_steps - 1``).
    """
    ends = np.asarray(episode_ends, np.int64)
    lengths = np.diff(np.concatenate([[0], ends]))
    if horizon < 1 or np.any(lengths < 0):
        raise ValueError(f"horizon must be >= 1 and episode_ends increasing, got {horizon}, {ends}")
    rows = []
    for e, T in enumerate(lengths):
        last = T if max_action_pad is None else min(T, T - horizon + 1 + max_action_pad)
        steps = np.arange(max(last, 0), dtype=np.int64)
        rows.append(np.stack([np.full_like(steps, e), steps], 1))
    return np.concatenate(rows) if rows else np.zeros((0, 2), np.int64)


def sample_windows(arrays: Mapping[str, np.ndarray], episode_ends: np.ndarray, idx: np.ndarray,
                   n_obs_steps: int, horizon: int, action_key: str = "action") -> dict[str, np.ndarray]:
    """Cut observation histories and action chunks around the (episode, step) pairs ``idx``.

    Returns ``action`` (B, H, Da): the actions of steps t .. t+H-1 (the chunk the policy
    executes from now on, as ``Policy.act`` does), the last action repeated past the
    episode end; ``action_is_pad`` (B, H) bool marks those; every other feature of
    ``arrays`` as (B, To, ...): steps t-To+1 .. t, the first frame repeated before the
    episode start (the padding convention of Diffusion Policy, Chi et al. 2023).
    """
    ends = np.asarray(episode_ends, np.int64)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    idx = np.asarray(idx, np.int64).reshape(-1, 2)
    ep, t = idx[:, 0], idx[:, 1]
    if n_obs_steps < 1 or horizon < 1:
        raise ValueError(f"n_obs_steps and horizon must be >= 1, got {n_obs_steps}, {horizon}")
    if np.any((ep < 0) | (ep >= len(ends))):
        raise ValueError(f"idx holds episodes outside 0..{len(ends) - 1}")
    if np.any((t < 0) | (t >= (ends - starts)[ep])):
        raise ValueError("idx holds steps outside their episode")
    s0, last = starts[ep][:, None], (ends[ep] - starts[ep] - 1)[:, None]
    obs_i = s0 + np.maximum(t[:, None] + np.arange(1 - n_obs_steps, 1), 0)
    act_t = t[:, None] + np.arange(horizon)
    out = {k: v[obs_i] for k, v in arrays.items() if k != action_key}
    out[action_key] = arrays[action_key][s0 + np.minimum(act_t, last)]
    out["action_is_pad"] = act_t > last
    return out
