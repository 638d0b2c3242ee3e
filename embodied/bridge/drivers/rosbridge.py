"""``RosbridgeRobot``: a ROS 2 robot reached through rosbridge's JSON websocket protocol.

ROS users run ``rosbridge_server`` next to their robot's driver nodes; this driver is a
rosbridge client (the same protocol as roslibpy and roslibjs), so the robot computer
needs no ROS installation of its own: it subscribes to the robot's joint states and
publishes commands. rosbridge v2 operations used: ``subscribe`` / ``unsubscribe``,
``advertise`` / ``unadvertise`` and ``publish`` (``{"op": "publish", "topic", "msg"}``).

Observation: ``state`` = the ``state_fields`` (default ``position``) of the latest
``sensor_msgs/msg/JointState`` on ``state_topic``, concatenated, in ``joint_names``
order when given (metres / radians, as published). Action (Da,) in [-1, 1] is published
on ``command_topic`` as ``std_msgs/msg/Float64MultiArray`` ``data = offset + scale * a``
(one scale/offset per joint: the controller's units). Safe state: ``control="position"``
holds the last measured position, ``control="velocity"`` commands zero.

A joint state older than ``stale_s`` is a link error (``RobotCommunicationError``), so the
control loop holds rather than act on old measurements. Images are not read (state only).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Sequence

import numpy as np
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.protocol import State
from websockets.sync.client import ClientConnection

from embodied.bridge import wire
from embodied.core.robot import Robot, RobotCommunicationError, RobotNotConnectedError
from embodied.core.specs import ActionSpec, ObservationSpec

CONTROLS = ("position", "velocity")


class RosbridgeRobot(Robot):
    """A ROS 2 robot behind ``rosbridge_server`` at ``url`` (``ws://HOST:9090``).

    Args:
        url: the rosbridge websocket.
        joint_names: joints, in the order of the action and state vectors (required: the
            action dimension is their number).
        state_topic, state_type: the joint-state topic.
        state_fields: JointState fields concatenated into ``state`` (``position``, ``velocity``, ``effort``).
        command_topic, command_type: where commands are published.
        control: ``position`` or ``velocity`` (what the command means; sets the safe state).
        scale, offset: command = offset + scale * action, per joint (or one value).
        instruction: the observation's instruction (a robot has none of its own).
        timeout_s: how long to wait for the first joint state on connect.
        stale_s: an observation older than this is refused.
    """

    def __init__(self, url: str, joint_names: Sequence[str], state_topic: str = "/joint_states",
                 state_type: str = "sensor_msgs/msg/JointState", state_fields: Sequence[str] = ("position",),
                 command_topic: str = "/embodied/command", command_type: str = "std_msgs/msg/Float64MultiArray",
                 control: str = "position", scale: Any = 1.0, offset: Any = 0.0, instruction: str = "",
                 timeout_s: float = 5.0, stale_s: float = 0.5):
        if not url.startswith(("ws://", "wss://")):
            raise ValueError(f"url must start with ws:// or wss://, got {url!r}")
        if not joint_names:
            raise ValueError("joint_names must list the robot's joints (the action dimension is their number)")
        if control not in CONTROLS:
            raise ValueError(f"control must be one of {CONTROLS}, got {control!r}")
        bad = [f for f in state_fields if f not in ("position", "velocity", "effort")]
        if bad or not state_fields:
            raise ValueError(f"state_fields must be a non-empty list of position/velocity/effort, "
                             f"got {list(state_fields)}")
        n = len(joint_names)
        self.scale, self.offset = self._vector(scale, n, "scale"), self._vector(offset, n, "offset")
        if np.any(self.scale == 0):
            raise ValueError(f"scale must be non-zero for every joint, got {self.scale}")
        self.url, self.joint_names = url, [str(j) for j in joint_names]
        self.state_topic, self.state_type, self.state_fields = state_topic, state_type, list(state_fields)
        self.command_topic, self.command_type, self.control = command_topic, command_type, control
        self.instruction, self.timeout_s, self.stale_s = instruction, float(timeout_s), float(stale_s)
        self.observation_spec = ObservationSpec(n * len(self.state_fields))
        self.action_spec = ActionSpec(n, -1.0, 1.0, tuple(self.joint_names))
        self._conn: ClientConnection | None = None
        self._latest: tuple[float, dict[str, Any]] | None = None
        self._got = threading.Condition()
        self._reader: threading.Thread | None = None
        self._ids = 0
        self.received = 0

    @staticmethod
    def _vector(v: Any, n: int, name: str) -> np.ndarray:
        a = np.asarray(v, np.float64)
        a = np.full(n, float(a)) if a.ndim == 0 else a
        if a.shape != (n,) or not np.all(np.isfinite(a)):
            raise ValueError(f"{name} must be one finite value or one per joint ({n}), got {v}")
        return a

    # ------------------------------------------------------------------ link
    @property
    def is_connected(self) -> bool:
        return self._conn is not None and self._conn.state is State.OPEN

    def _op(self, op: str, **fields: Any) -> None:
        if self._conn is None:
            raise RobotNotConnectedError("RosbridgeRobot is not connected: call connect() or use `with robot:`")
        self._ids += 1
        try:
            self._conn.send(json.dumps({"op": op, "id": f"embodied:{op}:{self._ids}", **fields}))
        except (ConnectionClosed, OSError) as e:
            raise RobotCommunicationError(f"rosbridge at {self.url}: link lost ({type(e).__name__})") from None

    def _read(self) -> None:
        conn = self._conn
        while conn is not None:
            try:
                text = conn.recv()
            except (ConnectionClosed, OSError):
                return
            try:
                msg = json.loads(text)
            except (TypeError, ValueError):
                continue  # not JSON (e.g. a binary frame we did not ask for)
            if isinstance(msg, dict) and msg.get("op") == "publish" and msg.get("topic") == self.state_topic:
                with self._got:
                    self._latest = (time.monotonic(), msg.get("msg") or {})
                    self.received += 1
                    self._got.notify_all()

    def connect(self) -> None:
        try:
            self._conn = wire.ws_connect(self.url, compression=None, max_size=2**24, proxy=None,
                                         open_timeout=self.timeout_s, ping_interval=None, close_timeout=1)
        except (OSError, TimeoutError, WebSocketException) as e:
            raise RobotCommunicationError(f"no rosbridge at {self.url}: {type(e).__name__}: {e}") from None
        self._reader = threading.Thread(target=self._read, name="rosbridge-reader", daemon=True)
        self._reader.start()
        self._op("subscribe", topic=self.state_topic, type=self.state_type, queue_length=1)
        self._op("advertise", topic=self.command_topic, type=self.command_type)
        with self._got:
            if not self._got.wait_for(lambda: self._latest is not None, timeout=self.timeout_s):
                self.disconnect()
                raise RobotCommunicationError(f"no {self.state_type} on {self.state_topic} within {self.timeout_s} s "
                                              f"(is the robot's driver running behind {self.url}?)")

    def disconnect(self) -> None:
        if self._conn is not None:
            for op, topic in (("unsubscribe", self.state_topic), ("unadvertise", self.command_topic)):
                try:
                    self._op(op, topic=topic)
                except RobotCommunicationError:
                    break
            self._conn.close()
            self._conn = None

    # ------------------------------------------------------------------ robot
    def _joint_state(self) -> dict[str, Any]:
        if self._conn is None:
            raise RobotNotConnectedError("RosbridgeRobot is not connected: call connect() or use `with robot:`")
        with self._got:
            latest = self._latest
        assert latest is not None
        age = time.monotonic() - latest[0]
        if age > self.stale_s:
            raise RobotCommunicationError(f"latest {self.state_topic} is {age * 1000:.0f} ms old "
                                          f"(stale_s={self.stale_s})")
        return latest[1]

    def _field(self, msg: dict[str, Any], name: str) -> np.ndarray:
        values = list(msg.get(name) or [])
        names = list(msg.get("name") or [])
        if names:
            missing = [j for j in self.joint_names if j not in names]
            if missing:
                raise RobotCommunicationError(f"{self.state_topic} lacks joints {missing}; it has {names}")
            try:
                return np.array([values[names.index(j)] for j in self.joint_names], np.float64)
            except IndexError:
                raise RobotCommunicationError(f"{self.state_topic}: field {name!r} has {len(values)} values for "
                                              f"{len(names)} joints") from None
        if len(values) != len(self.joint_names):
            raise RobotCommunicationError(f"{self.state_topic}: {name!r} has {len(values)} values, expected "
                                          f"{len(self.joint_names)} (and no joint names)")
        return np.asarray(values, np.float64)

    def get_observation(self) -> dict[str, Any]:
        msg = self._joint_state()
        state = np.concatenate([self._field(msg, f) for f in self.state_fields]).astype(np.float32)
        return {"state": state, "instruction": self.instruction}

    def send_action(self, action: np.ndarray) -> np.ndarray:
        a = np.asarray(action, np.float64)
        if a.shape != (self.action_spec.dim,) or not np.all(np.isfinite(a)):
            raise RobotCommunicationError(f"refusing to publish action {a} (shape {a.shape}, expected "
                                          f"({self.action_spec.dim},), finite)")
        sent = np.clip(a, -1.0, 1.0)
        command = self.offset + self.scale * sent
        self._op("publish", topic=self.command_topic,
                 msg={"layout": {"dim": [], "data_offset": 0}, "data": [float(x) for x in command]})
        return sent.astype(np.float32)

    def safe_action(self) -> np.ndarray:
        if self.control == "velocity":
            return np.zeros(self.action_spec.dim, np.float32)
        position = self._field(self._joint_state(), "position")
        return np.clip((position - self.offset) / self.scale, -1.0, 1.0).astype(np.float32)
