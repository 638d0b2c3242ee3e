"""Training windows read from disk batch by batch: datasets larger than memory (issue 37).

The in-memory path (``Dataset.load_arrays``) holds every step of the features a policy trains
on; for pixels that is ~12 KB a step at 64 px, so a 100,000-episode pixel dataset of the
manipulation suite (~2.2 M steps) takes ~27 GB. The streaming path holds only each episode's
length. A batch's windows are drawn exactly as in memory (uniform over every valid window, by
the same random calls, so a seed gives the same batches bit for bit); then the episodes those
windows fall in are read from their files (only the features trained on: the other arrays of an
episode file stay unread), and ``sample_windows`` cuts the windows out of them. A background
thread reads the next batch while the current one trains; at most two batches of episodes are in
memory at a time, whatever the size of the dataset.

``stream``: ``"true"``, ``"false"``, or ``"auto"``: stream when the features trained on would
take more than ``memory_gb`` in memory (``arrays_bytes``).
"""

from __future__ import annotations

import resource
import sys
from typing import Any, Sequence

import numpy as np

from embodied.runtime.data import Dataset, sample_windows

STREAM_MODES = ("auto", "true", "false")
DEFAULT_MEMORY_GB = 8.0


def stream_mode(value: Any, option: str = "stream") -> str:
    """``value`` as one of ``STREAM_MODES`` (a bool, or a string in any case).

    Raises:
        ValueError: naming ``option``, the value and the modes allowed.
    """
    mode = str(value).lower() if isinstance(value, (bool, str)) else None
    if mode not in STREAM_MODES:
        raise ValueError(f"{option} must be one of {STREAM_MODES} (auto: stream when the training arrays do not fit "
                         f"in {option}_memory_gb), got {value!r}")
    return mode


def check_memory_gb(value: Any, option: str = "stream_memory_gb") -> float:
    """``value`` as a positive number of GB; ValueError naming ``option`` otherwise."""
    try:
        gb = float(value)
    except (TypeError, ValueError):
        gb = float("nan")
    if not gb > 0 or gb == float("inf"):
        raise ValueError(f"{option} must be a number of GB > 0 (the memory the training arrays may take before "
                         f"stream=auto streams them), got {value!r}")
    return gb


def arrays_bytes(ds: Dataset, features: Sequence[str], positions: Sequence[int]) -> int:
    """Bytes the ``features`` of the episodes at ``positions`` take in memory (``load_arrays``)."""
    ds.check_features(features)
    per_step = sum(np.dtype(ds.features[f]["dtype"]).itemsize * int(np.prod(ds.features[f]["shape"], dtype=np.int64))
                   for f in features)
    lengths = ds.lengths
    return per_step * sum(lengths[i] for i in positions)


def should_stream(mode: str, nbytes: int, memory_gb: float) -> bool:
    """Whether to stream: ``mode`` "true"/"false", or for "auto" whether ``nbytes`` exceed ``memory_gb``."""
    return mode == "true" or (mode == "auto" and nbytes > memory_gb * 2**30)


def peak_rss_mb() -> float:
    """The peak resident memory of this process so far, in MiB (``getrusage``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


class WindowIndex:
    """Training windows numbered 0..n-1 in (episode, step) order, as ``make_windows`` lists them
    (every step of every episode), without the (N, 2) table: only the (E,) episode ends."""

    def __init__(self, lengths: Sequence[int]):
        self.ends = np.cumsum(np.asarray(lengths, np.int64), dtype=np.int64)
        self.starts = self.ends - np.asarray(lengths, np.int64)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def __getitem__(self, r: np.ndarray) -> np.ndarray:
        """(B,) window numbers -> (B, 2) int64 (episode, step) pairs: ``make_windows(ends)[r]``."""
        r = np.asarray(r, np.int64)
        ep = np.searchsorted(self.ends, r, side="right")
        return np.stack([ep, r - self.starts[ep]], 1)


class MemoryWindows:
    """Windows cut from arrays held in memory (``Dataset.load_arrays``)."""

    streamed = False

    def __init__(self, ds: Dataset, positions: Sequence[int], features: Sequence[str], tasks: Sequence[str]):
        self.arrays, self.ends = ds.load_arrays(features=features, tasks=tasks)

    def cut(self, idx: np.ndarray, n_obs_steps: int, horizon: int) -> dict[str, np.ndarray]:
        return sample_windows(self.arrays, self.ends, idx, n_obs_steps, horizon)


class StreamedWindows:
    """Windows cut from the episode files a batch touches, read when it is drawn.

    Each distinct episode of a batch is read once (its ``features`` only); they are laid end to end
    and ``sample_windows`` cuts the windows from them, so a window holds the same values as
    ``MemoryWindows`` gives.
    """

    streamed = True

    def __init__(self, ds: Dataset, positions: Sequence[int], features: Sequence[str], tasks: Sequence[str]):
        ds.check_features(features)
        self.ds, self.positions, self.features = ds, list(positions), tuple(features)

    def cut(self, idx: np.ndarray, n_obs_steps: int, horizon: int) -> dict[str, np.ndarray]:
        idx = np.asarray(idx, np.int64).reshape(-1, 2)
        eps, local = np.unique(idx[:, 0], return_inverse=True)
        episodes = [self.ds.read(self.positions[int(e)], self.features) for e in eps]
        arrays = {f: np.concatenate([ep[f] for ep in episodes]) for f in self.features}
        ends = np.cumsum([len(ep[self.features[0]]) for ep in episodes], dtype=np.int64)
        return sample_windows(arrays, ends, np.stack([local.reshape(-1), idx[:, 1]], 1), n_obs_steps, horizon)
