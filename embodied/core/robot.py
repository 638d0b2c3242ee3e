"""The Robot contract, and a simulated robot backed by any registered task.

A hardware driver and ``SimRobot`` satisfy the same interface, so a policy cannot tell
them apart. Lifecycle: ``connect()`` -> ``get_observation()`` / ``send_action()`` ...
-> ``disconnect()``; use it as a context manager so the robot is released on any exit.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from embodied.core.errors import EmbodiedError, InvalidActionError
from embodied.core.specs import ActionSpec, ObservationSpec


class RobotNotConnectedError(EmbodiedError, RuntimeError):
    """A command was sent to a robot that is not connected."""


class RobotCommunicationError(EmbodiedError, ConnectionError):
    """A robot that did not answer in time (a dropped or late message, a lost link)."""


class Robot(abc.ABC):
    """A robot: observations in the project's format, actions in [-1, 1]^Da."""

    observation_spec: ObservationSpec
    action_spec: ActionSpec

    @property
    @abc.abstractmethod
    def is_connected(self) -> bool: ...

    @abc.abstractmethod
    def connect(self) -> None: ...

    @abc.abstractmethod
    def get_observation(self) -> dict[str, Any]:
        """Return ``{"state": (Ds,) float32, ["image"], "instruction": str}``."""

    @abc.abstractmethod
    def send_action(self, action: np.ndarray) -> np.ndarray:
        """Command ``action`` (Da,); return the action actually sent (after clipping)."""

    @abc.abstractmethod
    def disconnect(self) -> None: ...

    def safe_action(self) -> np.ndarray:
        """The action (Da,) that puts the robot in its safe state from where it is now.

        Hold position for position control (the current position), zero velocity for
        velocity control; the bridge's safety layer sends it on a watchdog trip, an
        e-stop and on exit. A driver must define it: the bridge refuses to move a robot
        that has no safe state.
        """
        raise NotImplementedError(f"{type(self).__name__} defines no safe_action(): the bridge will not move a "
                                  "robot without a safe state")

    def __enter__(self) -> "Robot":
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.is_connected:
            self.disconnect()


class SimRobot(Robot):
    """A ``Robot`` backed by a registered task's gymnasium environment.

    Args:
        task: registered task name (see ``embodied.list_tasks()``).
        seed: seed of the first episode; each ``reset`` adds one.
        **env_kwargs: forwarded to ``embodied.make_env`` (obs mode, cameras, ...).
    """

    def __init__(self, task: str, seed: int = 0, **env_kwargs: Any):
        from embodied.core.registry import make_env

        self._env = make_env(task, **env_kwargs)
        self._seed = seed
        self._obs: dict[str, Any] | None = None
        self.last_info: dict[str, Any] = {}
        self.last_reward = 0.0
        self.done = False
        self._last_sent: np.ndarray | None = None
        u = self._env.unwrapped
        self.observation_spec = u.observation_spec
        self.action_spec = u.action_spec

    @property
    def is_connected(self) -> bool:
        return self._obs is not None

    @property
    def env(self):  # noqa: ANN201 - the gymnasium env, for rendering and inspection
        return self._env

    def connect(self) -> None:
        self.reset()

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        """Start the next episode (with ``seed``, else the previous seed plus one)."""
        if seed is not None:
            self._seed = int(seed)
        self._obs, self.last_info = self._env.reset(seed=self._seed)
        self._seed += 1
        self.done = False
        self.last_reward, self._last_sent = 0.0, None
        return self._obs

    def _require(self) -> None:
        if self._obs is None:
            raise RobotNotConnectedError("SimRobot is not connected: call connect() or use `with SimRobot(...)`")

    def get_observation(self) -> dict[str, Any]:
        self._require()
        assert self._obs is not None
        return self._obs

    def send_action(self, action: np.ndarray) -> np.ndarray:
        self._require()
        a = np.asarray(action, dtype=np.float32)
        if a.shape != (self.action_spec.dim,):
            raise InvalidActionError(f"action must have shape ({self.action_spec.dim},), got {a.shape}")
        if not np.all(np.isfinite(a)):
            raise InvalidActionError(f"action contains NaN/inf: {a}")
        sent = np.clip(a, self.action_spec.low, self.action_spec.high)
        self._obs, reward, term, trunc, self.last_info = self._env.step(sent)
        self.last_reward, self.done, self._last_sent = float(reward), bool(term or trunc), sent
        return sent

    def safe_action(self) -> np.ndarray:
        """Zero displacement/velocity; a ``gripper`` dimension keeps its last command (nothing is dropped)."""
        a = np.zeros(self.action_spec.dim, np.float32)
        if self._last_sent is not None:
            for i, name in enumerate(self.action_spec.names):
                if name == "gripper":
                    a[i] = self._last_sent[i]
        return a

    def disconnect(self) -> None:
        self._obs = None

    def close(self) -> None:
        """Release the simulator (the robot cannot reconnect afterwards)."""
        self.disconnect()
        self._env.close()
