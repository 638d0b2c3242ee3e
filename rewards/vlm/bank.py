"""Rollout banks: episodes of a suite's tasks with the frames a reward reads and their ground truth.

A rollout bank is a set of episodes of a suite's tasks played by scripted experts, noisy
experts, partial experts (the expert for part of its episode, then standing still or acting
at random) and random actions, from a range of seeds and one instruction split. Every step
keeps the frame the reward reads (one camera's observation image, or ``env.render()``, at
the reward's frame side), the privileged state and the ground truth: success and the task's
dense reward. Banks feed both fitting (training seeds, training wordings;
``rewards.vlm.fit_reward``) and evaluation (held-out seeds, held-out wordings;
``rewards.vlm.evaluate``); any ``RewardModel`` can be evaluated on one.

A bank's frames are the bulk of it (a 64 px frame is 12 KB; navigation's default fitting bank
holds 361,720 of them). ``collect_bank`` can write them to a ``.npy`` file as it plays
(``frames_file``) and hand back a ``DiskFrames`` that reads the rows a batch asks for, so that
a fit's memory does not grow with its bank.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from embodied.core.files import write_json
from embodied.core.registry import get_task, make_env
from rewards.wrappers import frame_env_kwargs, read_frame

log = logging.getLogger("embodied.reward")
BEHAVIOURS = ("expert", "noisy", "partial", "random")
BANK_ARRAYS = ("frames", "states", "episode", "step", "success", "gt_reward", "post")


@dataclass
class BankConfig:
    """Which episodes a rollout bank holds (the ``bank`` part of fit and eval configs)."""

    seeds: int = 30  # seeds per task; every behaviour plays each seed once
    seed: int = 0  # first seed: task i of T plays seeds seed + i, seed + i + T, ... (see seed_range)
    split: str = "train"  # instruction split of the episodes: train | heldout
    behaviours: list[str] = field(default_factory=lambda: list(BEHAVIOURS))
    noise: float = 0.4  # std of the Gaussian added to the noisy expert's actions
    hold_steps: int = 5  # steps kept after the first success (the goal still holds, or not)
    frame_stride: int = 1  # keep every k-th frame (and always the last); 1 keeps all
    random_extra_steps: int = 10  # random episodes last the seed's expert length plus this
    partial_tail: int = 20  # steps a partial episode goes on after the expert stops

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise ValueError(f"bank.seeds must be >= 1, got {self.seeds}")
        if self.split not in ("train", "heldout"):
            raise ValueError(f"bank.split must be 'train' or 'heldout', got {self.split!r}")
        bad = [b for b in self.behaviours if b not in BEHAVIOURS]
        if bad or not self.behaviours:
            raise ValueError(f"bank.behaviours must be a non-empty subset of {list(BEHAVIOURS)}, got {self.behaviours}")
        if self.noise < 0 or self.hold_steps < 0 or self.frame_stride < 1:
            raise ValueError(f"bank.noise and bank.hold_steps must be >= 0 and bank.frame_stride >= 1, got "
                             f"{self.noise}, {self.hold_steps}, {self.frame_stride}")


def seed_range(cfg: BankConfig, n_tasks: int) -> tuple[int, int]:
    """[lo, hi) of the seeds a bank of ``n_tasks`` tasks plays. Each task plays its own seeds
    (interleaved), so that every episode of the bank starts from a different scene: the
    suites' tasks share one scene distribution, and the same seed would repeat a scene."""
    return cfg.seed, cfg.seed + cfg.seeds * n_tasks


_NPY_MAGIC = b"\x93NUMPY\x01\x00"
_NPY_HEADER = 128  # bytes before the data: magic, version, header length and the padded header dict


def _npy_header(shape: tuple[int, ...]) -> bytes:
    """A version 1.0 ``.npy`` header of a C-order uint8 array of ``shape``, always ``_NPY_HEADER`` bytes
    long, so that a file's header can be rewritten in place once its row count is known."""
    text = "{'descr': '|u1', 'fortran_order': False, 'shape': %r, }" % (tuple(int(d) for d in shape),)
    body = text.ljust(_NPY_HEADER - len(_NPY_MAGIC) - 2 - 1) + "\n"
    return _NPY_MAGIC + len(body).to_bytes(2, "little") + body.encode("latin1")


class DiskFrames:
    """Read-only uint8 frames (N, S, S, 3) in a ``.npy`` file, read row by row on demand.

    Indexing with an int, a slice, or an integer or boolean array returns an in-memory array, as
    indexing the loaded array would; only the rows asked for are read (``os.preadv``, so the file's
    pages stay in the OS cache and out of this process's memory). ``np.asarray`` reads them all.
    """

    ndim = 4
    dtype = np.dtype(np.uint8)

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            self._offset = f.tell()
        if dtype != np.uint8 or fortran or len(shape) != 4 or shape[-1] != 3:
            raise ValueError(f"{self.path} must hold C-order uint8 frames (N, S, S, 3), got {dtype} {shape}"
                             f"{' in Fortran order' if fortran else ''}")
        self.shape = tuple(int(d) for d in shape)
        self._row = int(np.prod(self.shape[1:]))
        need = self._offset + self.shape[0] * self._row
        if self.path.stat().st_size < need:
            raise ValueError(f"{self.path} is truncated: {self.path.stat().st_size} bytes, its header needs {need}")
        self._fd = os.open(self.path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        n = self.shape[0]
        if isinstance(key, (int, np.integer)):
            if not -n <= key < n:
                raise IndexError(f"frame {key} is out of range for {n} frames")
            return self._read(np.array([int(key) % n]))[0]
        if isinstance(key, slice):
            return self._read(np.arange(*key.indices(n)))
        idx = np.asarray(key)
        if idx.dtype == bool:
            if idx.shape != (n,):
                raise IndexError(f"a boolean mask of frames must have shape ({n},), got {idx.shape}")
            idx = np.flatnonzero(idx)
        if not np.issubdtype(idx.dtype, np.integer):
            raise IndexError(f"frames are indexed by ints, slices or int/bool arrays, got {idx.dtype}")
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"frame indices must lie in [-{n}, {n}), got [{idx.min()}, {idx.max()}]")
        return self._read(idx.ravel() % n).reshape(idx.shape + self.shape[1:])

    def _read(self, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` (flat, non-negative) in their order; each run of consecutive rows is one read."""
        rows, inverse = np.unique(idx, return_inverse=True)
        out = np.empty((len(rows),) + self.shape[1:], np.uint8)
        flat = out.reshape(len(rows), self._row)
        starts = np.flatnonzero(np.diff(rows, prepend=-2) != 1)
        for a, b in zip(starts, list(starts[1:]) + [len(rows)]):
            want = (b - a) * self._row
            got = os.preadv(self._fd, [memoryview(flat[a:b]).cast("B")], self._offset + int(rows[a]) * self._row)
            if got != want:
                raise OSError(f"short read from {self.path}: {got} of {want} bytes at frame {rows[a]}")
        return out if np.array_equal(rows, idx) else out[inverse]  # (no copy when idx is already sorted, unique)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self[:]
        return a if dtype is None else a.astype(dtype)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"DiskFrames({str(self.path)!r}, shape={self.shape})"


class FrameWriter:
    """Appends uint8 frames (n, S, S, 3) to a ``.npy`` file; ``close`` writes the final row count into
    its header and returns the file as ``DiskFrames``."""

    def __init__(self, path: str | Path, size: int):
        self.path, self.size, self.rows = Path(path), int(size), 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "wb")
        self._f.write(_npy_header((0, self.size, self.size, 3)))

    def append(self, frames: np.ndarray) -> None:
        if frames.dtype != np.uint8 or frames.shape[1:] != (self.size, self.size, 3):
            raise ValueError(f"frames must be uint8 (n, {self.size}, {self.size}, 3), got {frames.dtype} {frames.shape}")
        self._f.write(np.ascontiguousarray(frames).tobytes())
        self.rows += len(frames)

    def close(self) -> DiskFrames:
        self._f.seek(0)
        self._f.write(_npy_header((self.rows, self.size, self.size, 3)))
        self._f.close()
        return DiskFrames(self.path)

    def abort(self) -> None:
        """Close and delete a partly written file (an interrupted collection)."""
        self._f.close()
        self.path.unlink(missing_ok=True)


@dataclass
class RolloutBank:
    """Frames and ground truth of many episodes; rows are kept frames (N,), one per step.

    Arrays: ``frames`` uint8 (N, S, S, 3); ``states`` float32 (N, Ds) privileged state;
    ``episode`` int (N,) index into ``episodes``; ``step`` int (N,) steps taken (1 = the frame
    after the first action); ``success`` bool (N,); ``gt_reward`` float32 (N,) the task's dense
    reward of the step; ``post`` bool (N,) after the episode's first success (hold steps).
    ``episodes``: one dict per episode (task, seed, behaviour, instruction, params, split,
    success, length, gt_return over all its steps).
    """

    frames: np.ndarray | DiskFrames
    states: np.ndarray
    episode: np.ndarray
    step: np.ndarray
    success: np.ndarray
    gt_reward: np.ndarray
    post: np.ndarray
    episodes: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    def rows(self, task: str) -> np.ndarray:
        ids = np.array([i for i, e in enumerate(self.episodes) if e["task"] == task], int)
        return np.flatnonzero(np.isin(self.episode, ids))

    def save(self, folder: str | Path) -> Path:
        """Write ``frames.npy``, ``bank.npz`` (the other arrays) and ``bank.json`` to ``folder``; frames
        already on disk are copied file to file (not at all when they were written there)."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        target = out / "frames.npy"
        if isinstance(self.frames, DiskFrames):
            if self.frames.path.resolve() != target.resolve():
                shutil.copyfile(self.frames.path, target)
        else:
            np.save(target, self.frames)
        np.savez(out / "bank.npz", **{k: getattr(self, k) for k in BANK_ARRAYS if k != "frames"})
        write_json(out / "bank.json", {"episodes": self.episodes, "meta": self.meta})
        return out

    @classmethod
    def load(cls, folder: str | Path, stream: bool = False) -> "RolloutBank":
        """A saved bank; ``stream``: read its frames from ``frames.npy`` on demand (``DiskFrames``)
        instead of loading them (banks saved with the frames inside ``bank.npz`` always load them)."""
        root = Path(folder)
        if not (root / "bank.npz").is_file() or not (root / "bank.json").is_file():
            raise FileNotFoundError(f"rollout bank {str(folder)!r} must be a folder with bank.npz and bank.json "
                                    "(written with save_bank=PATH)")
        arrays = dict(np.load(root / "bank.npz"))
        if "frames" not in arrays:
            if not (root / "frames.npy").is_file():
                raise FileNotFoundError(f"rollout bank {str(folder)!r} has no frames.npy")
            arrays["frames"] = DiskFrames(root / "frames.npy") if stream else np.load(root / "frames.npy")
        info = json.loads((root / "bank.json").read_text())
        return cls(**{k: arrays[k] for k in BANK_ARRAYS}, episodes=info["episodes"], meta=info["meta"])


def _policy_action(u: Any, behaviour: str, t: int, switch: int, tail: str, rng: np.random.Generator,
                   noise: float, shape: tuple[int, ...]) -> np.ndarray:
    if behaviour == "random" or (behaviour == "partial" and t >= switch and tail == "random"):
        return rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    if behaviour == "partial" and t >= switch:
        return np.zeros(shape, np.float32)
    a = u.expert_action()  # the expert keeps its memory current only when asked every step
    if behaviour == "noisy":
        a = np.clip(a + rng.normal(0.0, noise, shape), -1.0, 1.0).astype(np.float32)
    return a


def play_bank_episode(env: Any, seed: int, behaviour: str, expert_len: int, cfg: BankConfig,
                      rng: np.random.Generator, record: bool = True, camera: str | None = None) -> dict[str, Any]:
    """One episode of ``behaviour`` from ``seed``; frames rendered when ``record``."""
    obs, info = env.reset(seed=seed)
    u = env.unwrapped
    shape = env.action_space.shape
    cap = int(u.max_episode_steps)
    switch, tail = cap + 1, "stop"
    if behaviour == "random":
        cap = min(cap, expert_len + cfg.random_extra_steps)
    elif behaviour == "partial":
        switch = max(1, int(rng.uniform(0.2, 0.9) * expert_len))
        tail = "random" if rng.random() < 0.5 else "stop"
        cap = min(cap, switch + cfg.partial_tail)
    rows: dict[str, list[Any]] = {k: [] for k in ("frames", "states", "step", "success", "gt_reward", "post")}
    first, t, ret = None, 0, 0.0
    while True:
        a = _policy_action(u, behaviour, t, switch, tail, rng, cfg.noise, shape)
        obs, r, term, trunc, info = env.step(a)
        t += 1
        ret += float(r) if first is None else 0.0
        ok = bool(info["success"])
        if first is None and ok:
            first = t
            end = cfg.hold_steps == 0
        elif first is not None:
            end = t - first >= cfg.hold_steps
        else:
            end = bool(trunc or term) or t >= cap
        if record and (t % cfg.frame_stride == 0 or end or t == first):
            rows["frames"].append(read_frame(env, obs, camera))
            rows["states"].append(u.privileged_state())
            rows["step"].append(t)
            rows["success"].append(ok)
            rows["gt_reward"].append(float(r))
            rows["post"].append(first is not None and t > first)
        if end:
            break
    return {"rows": rows, "instruction": obs["instruction"], "params": dict(u.params), "success": first is not None,
            "length": first if first is not None else t, "gt_return": ret, "switch": switch if behaviour == "partial"
            else None}


def collect_bank(tasks: Sequence[str], cfg: BankConfig, image_size: int, progress: bool = True,
                 camera: str | None = None, supersample: int = 1,
                 frames_file: str | Path | None = None) -> RolloutBank:
    """Play ``cfg.seeds`` seeds of every task with every behaviour; see ``RolloutBank``.
    Frames are ``camera``'s observation images, or ``env.render()`` when it is None, drawn with
    ``make_env``'s ``supersample``. With ``frames_file`` they are written to that ``.npy`` file as
    each episode ends and the bank reads them from it (``DiskFrames``); an interrupted
    collection deletes the partial file."""
    writer = FrameWriter(frames_file, image_size) if frames_file is not None else None
    try:
        return _collect(tasks, cfg, image_size, progress, camera, supersample, writer)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise


def _collect(tasks: Sequence[str], cfg: BankConfig, image_size: int, progress: bool, camera: str | None,
             supersample: int, writer: FrameWriter | None) -> RolloutBank:
    from tqdm import tqdm

    arrays: dict[str, list[np.ndarray]] = {k: [] for k in BANK_ARRAYS}
    episodes: list[dict[str, Any]] = []
    bar = tqdm(total=len(tasks) * cfg.seeds, desc="rollout bank", disable=not progress, unit="seed")
    t0 = time.perf_counter()
    for i, task in enumerate(tasks):
        env = make_env(task, instruction_split=cfg.split, **frame_env_kwargs(camera, image_size, supersample))
        try:
            for k in range(cfg.seeds):
                seed = cfg.seed + k * len(tasks) + i
                rng = np.random.default_rng([seed, 7])
                expert = play_bank_episode(env, seed, "expert", 0, cfg, rng, "expert" in cfg.behaviours, camera)
                for b in cfg.behaviours:
                    ep = expert if b == "expert" else play_bank_episode(env, seed, b, expert["length"], cfg, rng,
                                                                        True, camera)
                    rows = ep.pop("rows")
                    n = len(rows["step"])
                    frames = np.asarray(rows["frames"], np.uint8).reshape(n, image_size, image_size, 3)
                    if writer is not None:
                        writer.append(frames)
                    else:
                        arrays["frames"].append(frames)
                    arrays["states"].append(np.asarray(rows["states"], np.float32).reshape(n, -1))
                    arrays["episode"].append(np.full(n, len(episodes), np.int64))
                    for key, dt in (("step", np.int64), ("success", bool), ("gt_reward", np.float32), ("post", bool)):
                        arrays[key].append(np.asarray(rows[key], dt))
                    episodes.append({"task": task, "seed": seed, "behaviour": b, "split": cfg.split,
                                     "frames": n, **ep})
                bar.update(1)
        finally:
            env.close()
    bar.close()
    cat = {k: np.concatenate(v) for k, v in arrays.items() if k != "frames" or writer is None}
    cat["frames"] = writer.close() if writer is not None else cat["frames"]
    meta = {"tasks": list(tasks), "suites": sorted({get_task(t).suite for t in tasks}), "image_size": image_size,
            "camera": camera, "supersample": supersample, "bank": asdict(cfg), "wall_time_s": time.perf_counter() - t0}
    log.info("rollout bank: %d episodes, %d frames (%.0f s)", len(episodes), len(cat["step"]), meta["wall_time_s"])
    return RolloutBank(**cat, episodes=episodes, meta=meta)


def bank_for(tasks: Sequence[str], cfg: BankConfig, image_size: int, camera: str | None, path: str, save: str,
             progress: bool, supersample: int = 1, stream: bool = False,
             scratch: str | Path | None = None) -> RolloutBank:
    """A saved bank (``path``) after checking it matches ``cfg``, else a freshly played one.
    ``stream``: keep the frames on disk (``DiskFrames``): a saved bank's where they lie, a played
    one's written to ``save``'s ``frames.npy`` when saving, else to ``scratch/frames.npy``."""
    if stream and not path and not save and scratch is None:
        raise ValueError("stream=True plays the bank's frames into a file: give save or scratch (a folder)")
    if path:
        bank = RolloutBank.load(path, stream=stream)
        want = {"tasks": list(tasks), "image_size": image_size, "camera": camera, "supersample": supersample,
                "bank": asdict(cfg)}
        have = {k: bank.meta.get(k, 1 if k == "supersample" else None) for k in want}  # (older banks: none)
        if have != want:
            diff = {k: (have[k], want[k]) for k in want if have[k] != want[k]}
            raise ValueError(f"rollout bank {path!r} was played with other settings (have, want): {diff}")
        return bank
    frames_file = Path(save or scratch) / "frames.npy" if stream else None
    bank = collect_bank(tasks, cfg, image_size, progress, camera, supersample, frames_file)
    if save:
        bank.save(save)
        log.info("saved the rollout bank to %s", save)
    return bank


def suite_of(tasks: Sequence[str]) -> str:
    suites = sorted({get_task(t).suite for t in tasks})
    if len(suites) != 1:
        raise ValueError(f"a reward is fitted and evaluated on one suite at a time; tasks {list(tasks)} span {suites}")
    return suites[0]
