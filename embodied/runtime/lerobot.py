"""Datasets in and out as LeRobotDataset v3, through the maintained ``lerobot-dataset`` package.

    embodied data export src=data/reach-state out=exports/reach      # ours -> LeRobotDataset v3
    embodied data import src=exports/reach out=data/reach-again        # LeRobotDataset v3 -> ours
    embodied data info path=exports/reach                              # either format
    embodied train tasks=[reach] dataset=exports/reach                 # train from a LeRobot folder

The library writes and reads the layout (parquet, mp4, ``meta/``); this module only maps
features and episodes (``FEATURE_MAP``):

============================  ==========================================================
ours (``embodied.runtime.data``)  LeRobotDataset v3
============================  ==========================================================
``state`` (Ds,) float32        ``observation.state``
``image`` / ``images/<cam>``   ``observation.images.<cam>`` (video; one camera is named
                               after the dataset's ``observation_spec.cameras``)
``privileged_state``           ``observation.environment_state``
``action`` (Da,)               ``action``
``reward`` ()                  ``next.reward`` (1,)
any other ``a/b`` (e.g.        ``a.b``, scalars as (1,) (robot runs: ``policy_action``,
``reward_terms/x``)            ``intervention``, ``hold``)
episode ``success``            ``next.success`` (1,) bool: true on the last frame of a
                               successful episode (the step after which it ended)
episode end                    ``next.done`` (1,) bool: true on the last frame
episode ``instruction``        the episode's task string (our task name when it has none)
============================  ==========================================================

Per-episode values that v3's episode table has no column for (our task name, its
parameters, seed, paraphrase split, a robot run's safety counts) and the dataset's free-form
``info`` travel in ``meta/embodied.json``, which LeRobot readers ignore; ``import`` restores
them exactly. A folder without it (a user's own recording) needs ``observation.state``,
``action`` and a task string per episode; its episodes take the task string as their
instruction and ``task=`` (or the task string) as their task name.

Writes are all-or-nothing: both directions fill ``.<out>.partial-<pid>`` beside the target
and rename it at the end, so an interrupted export or import (Ctrl-C, a crash) leaves no
half-written dataset; leftovers of dead writers are removed by the next run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from embodied.core.errors import DatasetError, EmbodiedError
from embodied.core.files import fsync_dir
from embodied.runtime.data import Dataset, _pid_alive

log = logging.getLogger("embodied.lerobot")

READ_MAJOR = 3  # LeRobotDataset codebase versions this module reads: v3.x
STATE, ACTION, ENV_STATE, IMAGES = "observation.state", "action", "observation.environment_state", "observation.images."
REQUIRED = (STATE, ACTION)
SUCCESS, DONE = "next.success", "next.done"
FEATURE_MAP = {"state": STATE, "action": ACTION, "privileged_state": ENV_STATE, "reward": "next.reward"}
SIDECAR = "meta/embodied.json"
SIDECAR_VERSION = 1
VCODECS = ("libsvtav1", "h264", "hevc")  # what the library's encoder takes; libsvtav1 is LeRobot's default
DEFAULT_FPS = 20  # the simulated worlds' control rate (their render_fps); a robot run's is loop.rate_hz
_INDEX_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
_PARTIAL_RE = re.compile(r"^\.(.+)\.partial-(\d+)$")


# ---- checking a folder ---------------------------------------------------------------------
def is_lerobot(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a LeRobotDataset (of any version): ``meta/info.json``."""
    return (Path(path) / "meta" / "info.json").is_file()


def check_lerobot(path: str | os.PathLike) -> dict[str, Any]:
    """Check that ``path`` is a LeRobotDataset v3 with a state and an action; return its ``info.json``.

    Checked before the library opens it (which would otherwise reach for the Hugging Face Hub
    to fetch what is missing): the metadata files, the codebase version and the features.

    Raises:
        DatasetError: naming the path and what is allowed.
    """
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"{root} is not a folder: give the folder of a LeRobotDataset v3 (meta/info.json, data/)")
    if not is_lerobot(root):
        what = ("it holds an embodied dataset (meta.json)" if (root / "meta.json").is_file()
                else "it has no meta/info.json")
        raise DatasetError(f"{root} is not a LeRobotDataset ({what}): expected meta/info.json, meta/tasks.parquet, "
                           "meta/episodes/ and data/ (LeRobotDataset v3)")
    try:
        info = json.loads((root / "meta" / "info.json").read_text(encoding="utf-8"))
        version, features = str(info["codebase_version"]), dict(info["features"])
    except (ValueError, KeyError, TypeError) as e:
        raise DatasetError(f"{root / 'meta/info.json'} is corrupt: {type(e).__name__}: {e}") from None
    m = re.match(r"^v?(\d+)(\.\d+)*$", version)
    if not m or int(m.group(1)) != READ_MAJOR:
        hint = (" (convert it with lerobot's convert_dataset_v21_to_v30 first)" if m and int(m.group(1)) < READ_MAJOR
                else "")
        raise DatasetError(f"{root} is a LeRobotDataset of codebase version {version!r}: this reads v{READ_MAJOR}.x "
                           f"only{hint}")
    missing = [k for k in REQUIRED if k not in features]
    if missing:
        raise DatasetError(f"{root} has no {', '.join(repr(k) for k in missing)} feature: a dataset to import needs "
                           f"{' and '.join(REQUIRED)} (and a task string per episode); it has {sorted(features)}")
    for need in ("meta/tasks.parquet", "meta/episodes", "data"):
        if not (root / need).exists():
            raise DatasetError(f"{root} is incomplete: {need} is missing (a LeRobotDataset v3 has meta/info.json, "
                               "meta/tasks.parquet, meta/episodes/ and data/)")
    return info


def _library() -> Any:
    """lerobot-dataset's dataset module. setup.sh installs the package with ``--no-deps`` (pyproject.toml
    lists what it needs), so a plain ``pip install embodied`` lacks it: say so in one line."""
    try:
        from ledataset.datasets import lerobot_dataset
    except ImportError as e:
        raise EmbodiedError(f"LeRobotDataset support needs the lerobot-dataset package ({e}): run ./setup.sh, or "
                            "pip install --no-deps lerobot-dataset==0.4.4") from e
    return lerobot_dataset


def _open(root: Path) -> Any:
    """The library's LeRobotDataset over a checked local folder (never the Hub)."""
    lib = _library()
    LeRobotDataset, LeRobotDatasetMetadata = lib.LeRobotDataset, lib.LeRobotDatasetMetadata

    meta = LeRobotDatasetMetadata(f"local/{root.name}", root=root)
    for ep in range(meta.total_episodes):
        files = [meta.get_data_file_path(ep)] + [meta.get_video_file_path(ep, k) for k in meta.video_keys]
        gone = [str(f) for f in files if not (root / f).is_file()]
        if gone:
            raise DatasetError(f"{root} is incomplete: episode {ep} needs {', '.join(gone)}, which is missing")
    return LeRobotDataset(f"local/{root.name}", root=root)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Our one progress bar only: silence the ``datasets`` library's per-episode bars and the
    library's note that it histograms bool features as uint8."""
    import warnings

    from datasets.utils import logging as ds_logging

    was = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Converting input from bool", category=RuntimeWarning)
            # datasets' encoding of the (1,)-shaped scalars the library's frames hold (an error from NumPy 2.4 on,
            # hence numpy<2.4 in pyproject.toml)
            warnings.filterwarnings("ignore", message="Conversion of an array with ndim > 0", category=DeprecationWarning)
            yield
    finally:
        if was:
            ds_logging.enable_progress_bar()


# ---- staging: all or nothing ----------------------------------------------------------------
def _check_out(out: str | os.PathLike) -> Path:
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DatasetError(f"{out} exists and is not empty: give a new out=PATH (nothing is overwritten)")
    return out


@contextlib.contextmanager
def staged_folder(out: str | os.PathLike) -> Iterator[Path]:
    """Yield an absent temporary folder beside ``out``; rename it to ``out`` when the block ends well.

    Any exception (Ctrl-C included) removes the temporary folder and propagates. ``out`` must
    be absent or an empty folder: nothing is overwritten.
    """
    out = _check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for p in out.parent.iterdir():  # leftovers of writers that died (kill -9, power loss)
        if (m := _PARTIAL_RE.match(p.name)) and m.group(1) == out.name and not _pid_alive(int(m.group(2))):
            shutil.rmtree(p, ignore_errors=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
        if out.is_dir():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---- export: ours -> LeRobotDataset v3 -----------------------------------------------------
def _cameras(ds: Dataset) -> list[str]:
    spec = ds.info.get("observation_spec") or ds.info.get("obs_spec") or {}
    return [str(c) for c in spec.get("cameras") or []]


def lerobot_names(ds: Dataset) -> dict[str, str]:
    """Our feature name -> its LeRobot feature name, for every feature of ``ds``."""
    names = {}
    for k in ds.features:
        if k == "image":
            names[k] = IMAGES + (_cameras(ds)[:1] or ["image"])[0]
        elif k.startswith("images/"):
            names[k] = IMAGES + k[len("images/"):]
        else:
            names[k] = FEATURE_MAP.get(k, k.replace("/", "."))
    if len(set(names.values())) != len(names) or {SUCCESS, DONE} & set(names.values()):
        raise DatasetError(f"features {sorted(ds.features)} of {ds.root} do not map to distinct LeRobot names: "
                           f"{names}")
    return names


def _is_image(spec: Mapping[str, Any]) -> bool:
    return spec["dtype"] == "uint8" and len(spec["shape"]) == 3 and spec["shape"][-1] == 3


def lerobot_features(ds: Dataset, names: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The ``features`` argument of ``LeRobotDataset.create`` for ``ds`` (cameras as video)."""
    out: dict[str, dict[str, Any]] = {}
    for k, spec in ds.features.items():
        if _is_image(spec):
            out[names[k]] = {"dtype": "video", "shape": tuple(spec["shape"]), "names": ["height", "width", "channels"]}
        else:
            out[names[k]] = {"dtype": spec["dtype"], "shape": tuple(spec["shape"]) or (1,), "names": None}
    out[SUCCESS] = {"dtype": "bool", "shape": (1,), "names": None}
    out[DONE] = {"dtype": "bool", "shape": (1,), "names": None}
    return out


_INDEX_META = ("episode", "file", "bytes")  # our index's bookkeeping, not the episode's own values


def export_lerobot(src: str | os.PathLike, out: str | os.PathLike, fps: int = DEFAULT_FPS, vcodec: str = "libsvtav1",
                   robot_type: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Write the dataset ``src`` (ours) to ``out`` as a LeRobotDataset v3; return a summary.

    Every step becomes a frame (``FEATURE_MAP``); each camera is one video per episode,
    encoded with ``vcodec`` (lossy: frames come back within the codec's error); the state,
    action and every other array are stored exactly.
    """
    from tqdm.auto import tqdm

    LeRobotDataset = _library().LeRobotDataset
    if vcodec not in VCODECS:
        raise ValueError(f"vcodec must be one of {VCODECS}, got {vcodec!r}")
    if not 1 <= fps <= 1000:
        raise ValueError(f"fps must be in [1, 1000] frames per second, got {fps}")
    if is_lerobot(src):
        raise DatasetError(f"{src} is a LeRobotDataset already: export takes an embodied dataset (meta.json, "
                           "episodes/); `embodied data import` reads this one")
    ds = Dataset.open(src)
    _check_out(out)
    names = lerobot_names(ds)
    features = lerobot_features(ds, names)
    episodes, skipped = [], 0
    out = Path(out)
    bar = tqdm(total=sum(ds.lengths), desc="export", unit="frame", disable=not progress)
    try:
        with _quiet(), staged_folder(out) as tmp, contextlib.ExitStack() as stack:
            lr = LeRobotDataset.create(f"local/{out.name}", fps=fps, features=features, root=tmp,
                                       robot_type=robot_type, use_videos=True, vcodec=vcodec)
            stack.callback(_close, lr)  # before the partial folder goes: its writers would write into it later
            for i in range(len(ds)):
                ep = ds[i]
                n = int(ep["length"])
                if n == 0:  # LeRobot has no empty episodes
                    skipped += 1
                    continue
                task = str(ep.get("instruction") or ep.get("task") or "unspecified")
                success = bool(ep.get("success", False))
                for t in range(n):
                    frame = {names[k]: _frame_value(ep[k][t]) for k in ds.features}
                    frame[SUCCESS] = np.array([success and t == n - 1])
                    frame[DONE] = np.array([t == n - 1])
                    frame["task"] = task
                    lr.add_frame(frame)
                    bar.update(1)
                lr.save_episode(parallel_encoding=False)  # one process: Ctrl-C stops it cleanly
                episodes.append({k: v for k, v in ds.episodes_meta[i].items() if k not in _INDEX_META})
            lr.finalize()
            stack.pop_all()
            side = {"format": "embodied", "version": SIDECAR_VERSION, "info": ds.info, "features": ds.features,
                    "names": names, "episodes": episodes}
            (tmp / SIDECAR).write_text(json.dumps(side, indent=1), encoding="utf-8")
    finally:
        bar.close()
    return {"src": str(Path(src).resolve()), "out": str(out.resolve()), "episodes": len(episodes),
            "frames": sum(int(e["length"]) for e in episodes), "skipped_empty": skipped, "fps": fps, "vcodec": vcodec,
            "features": {names[k]: k for k in ds.features}}


def _close(lr: Any) -> None:
    """Close an unfinished writer's files (its buffered episode metadata would otherwise be written on
    garbage collection, into a folder that is gone)."""
    with contextlib.suppress(Exception):
        lr.finalize()


def _frame_value(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return x.reshape(1) if x.ndim == 0 else x


# ---- import: LeRobotDataset v3 -> ours -----------------------------------------------------
def _sidecar(root: Path, n_episodes: int) -> dict[str, Any] | None:
    path = root / SIDECAR
    if not path.is_file():
        return None
    try:
        side = json.loads(path.read_text(encoding="utf-8"))
        ok = side.get("format") == "embodied" and int(side["version"]) <= SIDECAR_VERSION
        ok = ok and len(side["episodes"]) == n_episodes
    except (ValueError, KeyError, TypeError) as e:
        log.warning("%s is unreadable (%s): importing without it", path, e)
        return None
    if not ok:
        log.warning("%s does not describe this dataset (other version or episode count): importing without it", path)
        return None
    return side


def _our_names(features: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """LeRobot feature name -> ours, for a folder without ``meta/embodied.json``."""
    cams = [k for k, f in features.items() if f["dtype"] in ("video", "image")]
    back = {v: k for k, v in FEATURE_MAP.items()}
    out = {}
    for k, f in features.items():
        if k in _INDEX_COLUMNS or k in (SUCCESS, DONE) or f["dtype"] == "string":
            continue
        if k in cams:
            out[k] = "image" if len(cams) == 1 else "images/" + (k[len(IMAGES):] if k.startswith(IMAGES) else k)
        else:
            out[k] = back.get(k, k)
    return out


def _foreign_info(root: Path, info: dict[str, Any], names: Mapping[str, str]) -> tuple[dict[str, Any], dict]:
    feats = info["features"]
    cams = [k for k in names if feats[k]["dtype"] in ("video", "image")]
    spec: dict[str, tuple[str, tuple[int, ...]]] = {}
    for k, ours in names.items():
        f = feats[k]
        shape = tuple(int(s) for s in f["shape"])
        if k in cams:
            hwc = shape if shape[-1] == 3 else (shape[1], shape[2], shape[0])  # info.json says (h, w, c) or (c, h, w)
            spec[ours] = ("uint8", hwc)
        else:
            spec[ours] = (f["dtype"], () if ours == "reward" and shape == (1,) else shape)
    sizes = {spec[names[k]][1][0] for k in cams}
    obs = {"state_dim": int(spec["state"][1][0]),
           "cameras": [k[len(IMAGES):] if k.startswith(IMAGES) else k for k in cams],
           "image_size": sizes.pop() if len(sizes) == 1 else 0}
    return {"source": "LeRobotDataset", "lerobot": {"path": str(root.resolve()), "fps": info.get("fps"),
                                                    "robot_type": info.get("robot_type"),
                                                    "codebase_version": info.get("codebase_version")},
            "observation_spec": obs}, spec


def import_lerobot(src: str | os.PathLike, out: str | os.PathLike, task: str = "",
                   progress: bool = True) -> dict[str, Any]:
    """Write the LeRobotDataset v3 ``src`` to ``out`` in our format; return a summary.

    Args:
        task: our task name for every episode of a folder that has no ``meta/embodied.json``
            (else each episode's task string is also its task name).
    """
    from tqdm.auto import tqdm

    root = Path(src)
    info = check_lerobot(root)
    _check_out(out)
    with _quiet():
        lr = _open(root)
    meta = lr.meta
    side = _sidecar(root, meta.total_episodes)
    if side is not None:
        names = {v: k for k, v in side["names"].items() if v in info["features"]}
        spec = {k: (f["dtype"], tuple(f["shape"])) for k, f in side["features"].items() if k in names.values()}
        ds_info = side["info"]
    else:
        names = _our_names(info["features"])
        ds_info, spec = _foreign_info(root, info, names)
    videos = [k for k in names if info["features"][k]["dtype"] in ("video", "image")]
    columns = lr.hf_dataset.with_format("arrow")  # datasets' numpy format needs torchvision's removed VideoReader
    bar = tqdm(total=meta.total_frames, desc="import", unit="frame", disable=not progress)
    n_frames = 0
    try:
        with _quiet(), staged_folder(out) as tmp:
            ds = Dataset.create(tmp, spec, ds_info)
            for e in range(meta.total_episodes):
                row = meta.episodes[e]
                a, b = int(row["dataset_from_index"]), int(row["dataset_to_index"])
                cols = columns[a:b]
                arrays = {ours: _column(cols, k).reshape(b - a, *spec[ours][1]).astype(spec[ours][0], copy=False)
                          for k, ours in names.items() if k not in videos}
                frames: dict[str, list[np.ndarray]] = {k: [] for k in videos}
                for j in range(a, b):
                    item = lr[j] if videos else None
                    for k in videos:
                        frames[k].append(_to_uint8_hwc(item[k]))  # type: ignore[index]
                    bar.update(1)
                arrays.update({names[k]: np.stack(v) for k, v in frames.items()})
                words = str(row["tasks"][0])
                if side is not None:
                    ep_meta = dict(side["episodes"][e])
                    ep_meta.pop("length", None)
                else:
                    ep_meta = {"task": task or words, "instruction": words, "lerobot_episode": e}
                    if SUCCESS in info["features"]:
                        ep_meta["success"] = bool(_column(cols, SUCCESS).any())
                ds.append(arrays, **ep_meta)
                n_frames += b - a
    finally:
        bar.close()
    return {"src": str(root.resolve()), "out": str(Path(out).resolve()), "episodes": meta.total_episodes,
            "frames": n_frames, "with_embodied_meta": side is not None, "features": dict(names)}


def _column(table: Any, name: str) -> np.ndarray:
    """Column ``name`` of a pyarrow table as one flat numpy array (list values concatenated)."""
    col = table.column(name).combine_chunks()
    while hasattr(col, "flatten") and hasattr(col.type, "value_type"):  # (fixed size) lists of values
        col = col.flatten()
    return col.to_numpy(zero_copy_only=False)


def _to_uint8_hwc(x: Any) -> np.ndarray:
    """A frame as the library returns it, float (3, H, W) in [0, 1], as uint8 (H, W, 3)."""
    a = np.asarray(x, np.float32)
    return np.clip(np.rint(a.transpose(1, 2, 0) * 255.0), 0, 255).astype(np.uint8)


def training_copy(src: str | os.PathLike, dest: str | os.PathLike, tasks: list[str]) -> Path:
    """Our-format copy of the LeRobotDataset ``src`` at ``dest`` for ``embodied train``, imported once.

    A folder without ``meta/embodied.json`` trained for one task has all its episodes labelled
    with that task; otherwise each episode keeps its task (its task string when it has no other).
    """
    dest = Path(dest)
    if not (dest / "meta.json").is_file():
        label = tasks[0] if len(tasks) == 1 and not (Path(src) / SIDECAR).is_file() else ""
        log.info("importing the LeRobotDataset %s into %s%s", src, dest, f" (task {label})" if label else "")
        import_lerobot(src, dest, task=label, progress=False)
    return dest


# ---- info ------------------------------------------------------------------------------------
def dataset_info(path: str | os.PathLike) -> dict[str, Any]:
    """A summary of the dataset at ``path``, ours or a LeRobotDataset v3."""
    from collections import Counter

    root = Path(path)
    if is_lerobot(root):
        info = check_lerobot(root)
        with _quiet():
            meta = _open(root).meta
        return {"dataset": str(root.resolve()), "format": "LeRobotDataset", "codebase_version": info["codebase_version"],
                "episodes": meta.total_episodes, "frames": meta.total_frames, "fps": meta.fps,
                "robot_type": meta.robot_type, "cameras": list(meta.camera_keys),
                "features": {k: f"{f['dtype']} {tuple(f['shape'])}" for k, f in meta.features.items()
                             if k not in _INDEX_COLUMNS},
                "tasks": len(meta.tasks), "task_examples": [str(t) for t in list(meta.tasks.index)[:5]],
                "embodied_meta": (root / SIDECAR).is_file()}
    if not (root / "meta.json").is_file():
        raise DatasetError(f"{root} is not a dataset: expected an embodied dataset (meta.json, episodes/) or a "
                           "LeRobotDataset v3 (meta/info.json)")
    ds = Dataset.open(root, on_corrupt="skip")
    return {"dataset": str(root.resolve()), "format": "embodied", "episodes": len(ds), "frames": sum(ds.lengths),
            "features": {k: f"{f['dtype']} {tuple(f['shape'])}" for k, f in ds.features.items()},
            "tasks": dict(Counter(str(m.get("task")) for m in ds.episodes_meta)),
            "success_rate": float(np.mean([bool(m.get("success")) for m in ds.episodes_meta])) if len(ds) else None}
