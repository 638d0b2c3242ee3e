"""Observation and action specs: the shapes and units every part agrees on.

Observation (one step), a dict:
    ``state``: float32 (Ds,), proprioception and object poses in metres / radians.
    ``image``: uint8 (H, W, 3), primary camera, only when pixels are asked for.
    ``images``: dict camera name -> uint8 (H, W, 3), only with more than one camera.
    ``instruction``: str, the natural-language task.
Batched forms add a leading B (and To for history): ``state`` (B, To, Ds).

Action: float32 (Da,), normalised to [-1, 1]; each task documents the units it maps to.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from embodied.core.errors import SpecMismatchError


@dataclass(frozen=True)
class ObservationSpec:
    """What a task observes: state size, cameras and image size."""

    state_dim: int
    cameras: tuple[str, ...] = ()
    image_size: int = 0  # square images (H = W); 0 when no camera is used

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cameras"] = list(self.cameras)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ObservationSpec":
        return cls(int(d["state_dim"]), tuple(d.get("cameras", ())), int(d.get("image_size", 0)))


@dataclass(frozen=True)
class ActionSpec:
    """Continuous actions in [low, high]^dim (the project normalises to [-1, 1])."""

    dim: int
    low: float = -1.0
    high: float = 1.0
    names: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["names"] = list(self.names)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ActionSpec":
        return cls(int(d["dim"]), float(d["low"]), float(d["high"]), tuple(d.get("names", ())))


def check_compatible(what: str, expected: ObservationSpec | ActionSpec,
                     got: ObservationSpec | ActionSpec, check_cameras: bool = True) -> None:
    """Raise SpecMismatchError naming each field that differs (cameras optional)."""
    a, b = expected.to_dict(), got.to_dict()
    if not check_cameras:
        for k in ("cameras", "image_size"):
            a.pop(k, None), b.pop(k, None)
    a.pop("names", None), b.pop("names", None)
    diffs = [f"{k}: {what} has {a[k]!r}, task has {b[k]!r}" for k in a if a[k] != b.get(k)]
    if diffs:
        raise SpecMismatchError(f"{what} does not match the task: " + "; ".join(diffs))
