"""The simulated robot over the network: ``RobotServer`` (robot side) and ``NetworkRobot`` (client).

``RobotServer`` puts any ``Robot`` (a ``SimRobot`` for a registered task, by default)
behind a websocket; ``NetworkRobot`` is a ``Robot`` that talks to it, so the control loop
drives a robot in another process exactly as it would drive hardware. ``Faults`` makes the
link worse on purpose: every reply is delayed by ``latency_ms`` plus uniform jitter of
up to ``jitter_ms``, and each request is dropped (never applied, never answered) with
probability ``drop``; a dropped or late reply surfaces as ``RobotCommunicationError``
after the client's ``timeout_s``. Requests carry an id, so a late reply is never taken
for a newer one.

Messages use the wire format of ``embodied.bridge.wire``: requests
``{"id", "op": "hello" | "reset" | "observe" | "act" | "disconnect", "action", "seed"}``,
replies ``{"id", "obs", "sent", "done", "reward", "success", "safe_action", "error"}``.

Run a simulated robot as its own process::

    python -m embodied.bridge.drivers.sim --task reach --port 8766 --latency-ms 5 --jitter-ms 2 --drop 0.01
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.protocol import State
from websockets.sync.client import ClientConnection
from websockets.sync.server import ServerConnection, serve

from embodied.bridge import wire
from embodied.core.robot import Robot, RobotCommunicationError, RobotNotConnectedError, SimRobot
from embodied.core.specs import ActionSpec, ObservationSpec

log = logging.getLogger("embodied.bridge.drivers.sim")


def make_sim_robot(task: str, seed: int = 0, **env_kwargs: Any) -> SimRobot:
    """A ``SimRobot`` of ``task`` (the ``sim`` driver)."""
    return SimRobot(task, seed=seed, **env_kwargs)


@dataclass
class Faults:
    """Link faults injected by ``RobotServer`` (see the module docstring)."""

    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    drop: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.latency_ms < 0 or self.jitter_ms < 0 or not 0 <= self.drop < 1:
            raise ValueError(f"faults need latency_ms >= 0, jitter_ms >= 0 and 0 <= drop < 1, got "
                             f"{self.latency_ms}, {self.jitter_ms}, {self.drop}")


class RobotServer:
    """Serve ``robot`` on ``ws://host:port`` (one client at a time; port 0: the OS picks one)."""

    def __init__(self, robot: Robot, host: str = "127.0.0.1", port: int = 0, faults: Faults | None = None,
                 task: str = ""):
        self.robot, self.faults, self.task = robot, faults or Faults(), task
        self._rng = np.random.default_rng(self.faults.seed)
        self._lock = threading.Lock()
        self._server = serve(self._handle, host, port, compression=None, max_size=64 * 2**20, ping_interval=None)
        self._thread: threading.Thread | None = None
        self.stats = {"requests": 0, "dropped": 0}

    @property
    def url(self) -> str:
        host, port = self._server.socket.getsockname()[:2]
        return f"ws://{host}:{port}"

    def start(self) -> "RobotServer":
        self._thread = threading.Thread(target=self._server.serve_forever, name="robot-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        for conn in list(getattr(self._server, "connections", ())):
            conn.close()

    def __enter__(self) -> "RobotServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handle(self, conn: ServerConnection) -> None:
        while True:
            try:
                data = conn.recv()
            except ConnectionClosed:
                return
            f = self.faults
            with self._lock:
                self.stats["requests"] += 1
                drop = f.drop > 0 and self._rng.random() < f.drop
                delay = (f.latency_ms + (self._rng.uniform(-f.jitter_ms, f.jitter_ms) if f.jitter_ms else 0.0)) / 1000
            if drop:
                self.stats["dropped"] += 1
                continue
            try:
                reply = self._reply(wire.unpack(data))
            except Exception as e:  # a bad request or a robot error: answered, the link stays up
                reply = {"error": f"{type(e).__name__}: {e}"}
            if delay > 0:
                time.sleep(delay)
            try:
                conn.send(wire.pack(reply))
            except ConnectionClosed:
                return

    def _reply(self, msg: Any) -> dict[str, Any]:
        if not isinstance(msg, Mapping):
            raise wire.WireError(f"a robot request must be a map, got {type(msg).__name__}")
        op, rid = msg.get("op"), msg.get("id")
        r = self.robot
        with self._lock:
            out: dict[str, Any] = {"id": rid}
            if op == "hello":
                if not r.is_connected:
                    r.connect()
                out.update(obs_spec=r.observation_spec.to_dict(), action_spec=r.action_spec.to_dict(), task=self.task)
            elif op == "reset":
                if not r.is_connected:
                    r.connect()
                if not hasattr(r, "reset"):
                    raise wire.WireError(f"{type(r).__name__} has no reset(): it cannot start episodes")
                seed = msg.get("seed")
                r.reset(seed=None if seed is None else int(seed))
            elif op == "observe":
                pass
            elif op == "act":
                out["sent"] = np.asarray(r.send_action(np.asarray(msg.get("action"), np.float32)), np.float32)
            elif op == "disconnect":
                if r.is_connected:
                    r.disconnect()
                return out
            else:
                raise wire.WireError(f"unknown op {op!r}; ops: hello, reset, observe, act, disconnect")
            obs = dict(r.get_observation())
            out.update(obs=obs, done=bool(getattr(r, "done", False)), reward=float(getattr(r, "last_reward", 0.0)),
                       safe_action=np.asarray(r.safe_action(), np.float32))
            info = getattr(r, "last_info", {})
            if isinstance(info, Mapping) and "success" in info:
                out["success"] = bool(info["success"])
            return out


class _NoReply(RobotCommunicationError):
    """No reply within the timeout (the request may have been dropped)."""


class NetworkRobot(Robot):
    """A ``Robot`` served by a ``RobotServer`` at ``url``.

    Args:
        url: ``ws://HOST:PORT`` of the robot server.
        timeout_s: how long one request may take; then ``RobotCommunicationError``.
        seed: the first episode's seed (the server's simulator is reset to it on connect).
        connect_timeout_s: how long the handshake of ``connect()`` may take in all. The server
            brings its robot up on the first request, which can take far longer than one control
            step, and a dropped handshake request is simply sent again (``hello``, ``reset`` to a
            seed and ``observe`` change nothing when repeated), so only a server that stays silent
            this long fails the connect.
    """

    def __init__(self, url: str, timeout_s: float = 0.5, seed: int | None = None, connect_timeout_s: float = 10.0):
        if not url.startswith(("ws://", "wss://")):
            raise ValueError(f"url must start with ws:// or wss://, got {url!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s must be > 0, got {connect_timeout_s}")
        self.url, self.timeout_s, self._seed = url, float(timeout_s), seed
        self.connect_timeout_s = float(connect_timeout_s)
        self._conn: ClientConnection | None = None
        self._id = 0
        self._lock = threading.Lock()
        self._obs: dict[str, Any] | None = None
        self._safe: np.ndarray | None = None
        self.done, self.last_reward, self.task = False, 0.0, ""
        self.last_info: dict[str, Any] = {}

    @property
    def is_connected(self) -> bool:
        return self._conn is not None and self._conn.state is State.OPEN

    def _call(self, op: str, timeout_s: float | None = None, **kw: Any) -> dict[str, Any]:
        if self._conn is None:
            raise RobotNotConnectedError("NetworkRobot is not connected: call connect() or use `with robot:`")
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            self._id += 1
            rid = self._id
            deadline = time.monotonic() + timeout_s
            try:
                self._conn.send(wire.pack({"id": rid, "op": op, **kw}))
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    reply = wire.unpack(self._conn.recv(timeout=left))
                    if isinstance(reply, Mapping) and reply.get("id") == rid:
                        break  # replies to older (timed-out) requests are skipped
            except TimeoutError:
                raise _NoReply(f"robot at {self.url}: no reply to {op!r} within {timeout_s * 1000:.0f} ms") from None
            except (ConnectionClosed, OSError, WebSocketException) as e:
                raise RobotCommunicationError(f"robot at {self.url}: link lost ({type(e).__name__})") from None
        if reply.get("error"):
            raise RobotCommunicationError(f"robot at {self.url} refused {op!r}: {reply['error']}")
        if "obs" in reply:
            self._obs = reply["obs"]
            self._safe = reply.get("safe_action")
            self.done, self.last_reward = bool(reply.get("done")), float(reply.get("reward", 0.0))
            if "success" in reply:
                self.last_info = {"success": bool(reply["success"])}
        return reply

    def connect(self) -> None:
        try:
            self._conn = wire.ws_connect(self.url, compression=None, max_size=None, proxy=None, open_timeout=5,
                                 ping_interval=None, close_timeout=1)
        except (OSError, TimeoutError, WebSocketException) as e:
            raise RobotCommunicationError(f"no robot server at {self.url}: {type(e).__name__}: {e}") from None
        deadline = time.monotonic() + self.connect_timeout_s
        try:
            hello = self._handshake("hello", deadline)
            self.observation_spec = ObservationSpec.from_dict(hello["obs_spec"])
            self.action_spec = ActionSpec.from_dict(hello["action_spec"])
            self.task = str(hello.get("task", ""))
            if self._seed is not None:
                self._handshake("reset", deadline, seed=self._seed)
                self.last_info = {"success": False} if "success" in self.last_info else {}
            else:
                self._handshake("observe", deadline)  # the episode the server's robot is in
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    def _handshake(self, op: str, deadline: float, **kw: Any) -> dict[str, Any]:
        """``op``, sent again after each ``timeout_s`` without a reply, until ``deadline``."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RobotCommunicationError(f"robot at {self.url}: no reply to {op!r} within connect_timeout_s="
                                              f"{self.connect_timeout_s:g} s")
            try:
                return self._call(op, timeout_s=min(self.timeout_s, left), **kw)
            except _NoReply:
                pass

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        """Start a new episode on the server's simulator (``seed``: its seed)."""
        self._call("reset", seed=seed)
        self.last_info = {"success": False} if "success" in self.last_info else {}
        assert self._obs is not None
        return self._obs

    def get_observation(self) -> dict[str, Any]:
        return self._call("observe")["obs"]

    def send_action(self, action: np.ndarray) -> np.ndarray:
        a = np.asarray(action, np.float32)
        return np.asarray(self._call("act", action=a)["sent"], np.float32)

    def safe_action(self) -> np.ndarray:
        if self._safe is None:
            raise RobotCommunicationError(f"robot at {self.url} has not reported its safe action yet")
        return np.asarray(self._safe, np.float32)

    def disconnect(self) -> None:
        if self._conn is not None:
            try:
                self._call("disconnect")
            except RobotCommunicationError:
                pass
            self._conn.close()
            self._conn = None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m embodied.bridge.drivers.sim",
                                description="Serve a simulated robot (a registered task) over the network.")
    p.add_argument("--task", required=True, help="registered task name, e.g. reach")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8766)
    p.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    p.add_argument("--obs-mode", default="state", help="state | pixels | state+pixels")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--drop", type=float, default=0.0, help="probability that a request is dropped")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    kw: dict[str, Any] = {"obs_mode": a.obs_mode}
    if a.obs_mode != "state":
        kw["image_size"] = a.image_size
    robot = make_sim_robot(a.task, a.seed, **kw)
    server = RobotServer(robot, a.host, a.port, Faults(a.latency_ms, a.jitter_ms, a.drop), task=a.task)
    print(f"robot {a.task} serving on {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
