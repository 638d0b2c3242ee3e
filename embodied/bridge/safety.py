"""The safety layer between a policy and a robot, and the e-stop.

``SafetyLayer.filter`` turns what the policy asked for into what may be sent, in order:
refuse NaN/inf and wrong shapes (the robot then holds), clip to the action bounds, stop
motion that would leave the workspace box, and limit the change from the last command
sent (``max_delta`` per step and dimension). Every clip and refusal is counted by kind
and logged (the first of each kind at WARNING, then every 100th), so an episode report
says how often the layer stepped in; a step it changed is marked as an intervention.

The workspace rule suits displacement and velocity actions: for each listed state
coordinate ``state[i]`` moved by action dimension ``j``, a component that pushes further
out of ``[low, high]`` is zeroed once the coordinate is at or beyond the limit.

``EStop`` can be triggered from any thread; ``KeyEStop`` triggers it on any key press in
a terminal (and restores the terminal on exit).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from embodied.core.errors import EmbodiedError
from embodied.core.specs import ActionSpec

log = logging.getLogger("embodied.bridge.safety")
KINDS = ("refused_nonfinite", "refused_shape", "clipped_bounds", "clipped_workspace", "clipped_delta")


class SafetyConfigError(EmbodiedError, ValueError):
    """A safety setting that cannot be used (names the field, the value and what is allowed)."""


@dataclass
class Workspace:
    """A box on state coordinates, enforced on the action dimensions that move them.

    ``state_index[k]`` is moved by ``action_index[k]`` (positive action increases it); the
    box is ``[low[k], high[k]]`` in the state's units.
    """

    state_index: list[int] = field(default_factory=list)
    action_index: list[int] = field(default_factory=list)
    low: list[float] = field(default_factory=list)
    high: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.state_index)
        if not n or any(len(x) != n for x in (self.action_index, self.low, self.high)):
            raise SafetyConfigError(f"workspace: state_index, action_index, low and high must have the same "
                                    f"non-zero length, got {self.state_index}, {self.action_index}, {self.low}, "
                                    f"{self.high}")
        if any(lo >= hi for lo, hi in zip(self.low, self.high)):
            raise SafetyConfigError(f"workspace: each low must be < high, got low={self.low}, high={self.high}")


@dataclass
class SafetyConfig:
    """Schema of the ``safety`` block of ``configs/robot.yaml``.

    Attributes:
        low, high: action bounds (per dimension, or one value); None: the robot's action spec.
        max_delta: largest change of a dimension from the last command sent, per control
            step (action units; one value or per dimension); 0 turns the limit off.
        workspace: optional state box (see ``Workspace``).
    """

    low: Any = None
    high: Any = None
    max_delta: Any = 1.0
    workspace: Workspace | None = None

    def __post_init__(self) -> None:
        if isinstance(self.workspace, dict):
            self.workspace = Workspace(**self.workspace)
        d = np.asarray(self.max_delta, np.float64)
        if d.ndim > 1 or not np.all(np.isfinite(d)) or np.any(d < 0):
            raise SafetyConfigError(f"safety.max_delta must be >= 0 (one value or one per action dimension), "
                                    f"got {self.max_delta}")


class SafetyLayer:
    """Checks and limits each action before it reaches the robot (see the module docstring)."""

    def __init__(self, config: SafetyConfig, action_spec: ActionSpec):
        self.config, self.dim = config, int(action_spec.dim)
        self.low = self._vector(action_spec.low if config.low is None else config.low, "low")
        self.high = self._vector(action_spec.high if config.high is None else config.high, "high")
        if np.any(self.low >= self.high):
            raise SafetyConfigError(f"safety.low must be < safety.high, got {self.low} and {self.high}")
        d = np.asarray(config.max_delta, np.float64)
        self.max_delta = self._vector(d, "max_delta") if np.any(d > 0) else None
        ws = config.workspace
        if ws is not None and (max(ws.action_index) >= self.dim or min(ws.action_index) < 0):
            raise SafetyConfigError(f"workspace.action_index {ws.action_index} outside 0..{self.dim - 1}")
        self.counts: Counter[str] = Counter()

    def _vector(self, value: Any, name: str) -> np.ndarray:
        v = np.asarray(value, np.float64)
        if v.ndim == 0:
            v = np.full(self.dim, float(v))
        if v.shape != (self.dim,) or not np.all(np.isfinite(v)):
            raise SafetyConfigError(f"safety.{name} must be one finite value or {self.dim} of them, got {value}")
        return v

    def _note(self, kind: str, detail: str) -> None:
        self.counts[kind] += 1
        n = self.counts[kind]
        if n == 1 or n % 100 == 0:
            log.warning("safety: %s (#%d): %s", kind, n, detail)

    def filter(self, action: Any, state: np.ndarray | None, last_sent: np.ndarray | None
               ) -> tuple[np.ndarray | None, list[str]]:
        """(action to send or None to hold, kinds of intervention) for one step.

        Args:
            action: what the policy asked for, (Da,).
            state: the observation's ``state`` (for the workspace rule), or None.
            last_sent: the last command actually sent (for ``max_delta``), or None.
        """
        try:
            a = np.array(action, dtype=np.float64)
        except (TypeError, ValueError):
            self._note("refused_shape", f"not a numeric array: {type(action).__name__}")
            return None, ["refused_shape"]
        if a.shape != (self.dim,):
            self._note("refused_shape", f"shape {a.shape}, expected ({self.dim},)")
            return None, ["refused_shape"]
        if not np.all(np.isfinite(a)):
            self._note("refused_nonfinite", f"{a}")
            return None, ["refused_nonfinite"]
        kinds = []
        b = np.clip(a, self.low, self.high)
        if np.any(b != a):
            kinds.append("clipped_bounds")
            self._note("clipped_bounds", f"{a} -> {b}")
        ws = self.config.workspace
        if ws is not None and state is not None:
            s = np.asarray(state, np.float64)
            for i, j, lo, hi in zip(ws.state_index, ws.action_index, ws.low, ws.high):
                if (s[i] >= hi and b[j] > 0) or (s[i] <= lo and b[j] < 0):
                    self._note("clipped_workspace", f"state[{i}]={s[i]:.4g} outside [{lo}, {hi}]: action[{j}] "
                                                    f"{b[j]:.4g} -> 0")
                    b[j] = 0.0
                    if "clipped_workspace" not in kinds:
                        kinds.append("clipped_workspace")
        if self.max_delta is not None and last_sent is not None:
            prev = np.asarray(last_sent, np.float64)
            c = np.clip(b, prev - self.max_delta, prev + self.max_delta)
            if np.any(c != b):
                kinds.append("clipped_delta")
                self._note("clipped_delta", f"change {np.max(np.abs(b - prev)):.4g} over max_delta: {b} -> {c}")
                b = c
        return b.astype(np.float32), kinds


class EStop:
    """An emergency stop: ``trigger()`` from any thread; the control loop holds and ends the episode."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def trigger(self, reason: str = "e-stop") -> None:
        if not self._event.is_set():
            self.reason = reason
            log.warning("E-STOP: %s", reason)
        self._event.set()

    @property
    def triggered(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        """Re-arm (a person decided it is safe to move again)."""
        self._event.clear()
        self.reason = ""


class KeyEStop:
    """Trigger ``estop`` on any key press read from ``stream`` (a terminal in cbreak mode, or a pipe).

    A daemon thread reads one character at a time; ``close()`` (or leaving the ``with``
    block) restores the terminal's settings.
    """

    def __init__(self, estop: EStop, stream: Any = None):
        self.estop = estop
        self.stream = sys.stdin if stream is None else stream
        self._saved: Sequence[Any] | None = None
        self._fd: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="key-estop", daemon=True)

    def start(self) -> "KeyEStop":
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):
            fd = None
        if fd is not None and os.isatty(fd):
            import termios
            import tty

            self._fd, self._saved = fd, termios.tcgetattr(fd)
            tty.setcbreak(fd)  # one key at a time, Ctrl-C still interrupts
        self._thread.start()
        return self

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                ch = os.read(self._fd, 1) if self._fd is not None else self.stream.read(1)
            except (OSError, ValueError):
                return
            if not ch:
                return  # end of input: no more key presses can come
            if not self._stop.is_set():
                self.estop.trigger(f"key {ch!r} pressed")

    def close(self) -> None:
        self._stop.set()
        if self._saved is not None and self._fd is not None:
            import termios

            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            self._saved = None

    def __enter__(self) -> "KeyEStop":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
