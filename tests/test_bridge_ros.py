"""The ROS 2 adapter (``RosbridgeRobot``) against roslibpy, the ROS ecosystem's own rosbridge client.

The robot is a roslibpy node in another process: it publishes ``sensor_msgs/msg/JointState``
and follows the ``std_msgs/msg/Float64MultiArray`` commands it receives, both through
roslibpy's own encoding and topic handling. ROS 2's ``rosbridge_server`` cannot be
installed here (it needs a ROS 2 installation), so the two clients meet at a minimal
rosbridge v2 relay written below from the protocol (subscribe, unsubscribe, advertise,
unadvertise, publish); roslibpy talking through it is what pins the relay to the protocol.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import serve

from embodied.bridge.drivers import make_robot
from embodied.bridge.loop import ControlLoop, LoopConfig
from embodied.core.policy import Policy
from embodied.core.robot import RobotCommunicationError

ROOT = Path(__file__).resolve().parents[1]
TARGET = np.array([0.5, -0.4, 0.2], np.float32)


class Relay:
    """A rosbridge v2 pub/sub relay: ``publish`` on a topic reaches every client subscribed to it."""

    def __init__(self):
        self.subs: dict[str, set] = defaultdict(set)
        self.ops: list[dict] = []
        self._lock = threading.Lock()
        self.server = serve(self._handle, "127.0.0.1", 0, compression=None)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.socket.getsockname()[1]

    def _handle(self, conn):
        try:
            for text in conn:
                msg = json.loads(text)
                with self._lock:
                    self.ops.append(msg)
                    op, topic = msg.get("op"), msg.get("topic")
                    if op == "subscribe":
                        self.subs[topic].add(conn)
                    elif op == "unsubscribe":
                        self.subs[topic].discard(conn)
                    targets = list(self.subs[topic]) if op == "publish" else []
                for c in targets:
                    try:
                        c.send(json.dumps({"op": "publish", "topic": topic, "msg": msg["msg"]}))
                    except ConnectionClosed:
                        pass
        except ConnectionClosed:
            pass
        finally:
            with self._lock:
                for s in self.subs.values():
                    s.discard(conn)

    def stop(self):
        self.server.shutdown()


NODE = textwrap.dedent("""
    import json, sys, time
    import roslibpy
    ros = roslibpy.Ros(host="127.0.0.1", port={port})
    ros.run(timeout=20)
    command_order = ["wrist", "elbow", "shoulder"]  # what a Float64MultiArray command's entries mean
    published_order = ["shoulder", "wrist", "elbow"]  # the JointState lists them otherwise: map by name
    pos = dict.fromkeys(command_order, 0.0)
    states = roslibpy.Topic(ros, "/joint_states", "sensor_msgs/msg/JointState")
    commands = roslibpy.Topic(ros, "/embodied/command", "std_msgs/msg/Float64MultiArray")

    def on_command(msg):
        print(json.dumps(msg["data"]), flush=True)
        for name, target in zip(command_order, msg["data"]):
            pos[name] += 0.5 * (target - pos[name])

    commands.subscribe(on_command)
    end = time.time() + {seconds}
    while time.time() < end and ros.is_connected:
        states.publish(roslibpy.Message({{"name": published_order, "position": [pos[n] for n in published_order],
                                          "velocity": [0.0] * 3, "effort": []}}))
        time.sleep(0.01)
    ros.terminate()
""")


class Reach(Policy):
    """Chunks towards a fixed joint target (normalised units)."""

    n_obs_steps, horizon, n_action_steps = 1, 4, 2

    def predict_chunk(self, obs_batch, noise=None):
        return np.tile(TARGET, (len(obs_batch["instruction"]), self.horizon, 1)).astype(np.float32)


@pytest.fixture
def relay():
    r = Relay()
    yield r
    r.stop()


def test_rosbridge_robot_drives_a_roslibpy_node(relay):
    node = subprocess.Popen([sys.executable, "-c", NODE.format(port=relay.port, seconds=20)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        robot = make_robot("rosbridge", url=f"ws://127.0.0.1:{relay.port}", joint_names=["wrist", "elbow", "shoulder"],
                           scale=2.0, offset=0.1, instruction="reach", timeout_s=20,
                           # the node shares a loaded CI machine with other test workers and can go a second
                           # without publishing; refusing stale states is the next test's subject, not this one's
                           stale_s=5.0)
        with robot:
            first = robot.get_observation()
            assert first["state"].shape == (3,) and first["instruction"] == "reach"
            loop = ControlLoop(robot, Reach(), LoopConfig(rate_hz=20, safety={"max_delta": 0.2}))
            report = loop.run_episode(30)
            loop.close()
            final = robot.get_observation()["state"]
            hold = robot.safe_action()
    finally:
        node.terminate()
        out, err = node.communicate(timeout=30)
    # a tick whose observation the link missed (a loaded machine) is held, not stepped: every tick is accounted for
    missed = report.events["robot_comm_errors"]
    assert report.steps + missed == 30 and missed <= 2 and report.hold_steps == 0, (report.to_dict(20), err[-2000:])
    received = [json.loads(line) for line in out.splitlines() if line.startswith("[")]
    assert len(received) >= 25, err[-2000:]
    # the node (roslibpy) got our commands: offset + scale * action, the first one rate-limited from the
    # safe state (hold the measured position: (0 - 0.1) / 2), the last one the safe state on exit
    assert np.allclose(received[0], 0.1 + 2.0 * np.clip(TARGET, -0.05 - 0.2, -0.05 + 0.2), atol=1e-6)
    assert np.allclose(received[-2], 0.1 + 2.0 * TARGET, atol=1e-6)
    # and we read its joint states by name: each joint reached its command
    assert np.allclose(final, 0.1 + 2.0 * TARGET, atol=0.02)
    assert np.allclose(hold, (final - 0.1) / 2.0, atol=1e-6)
    assert np.allclose(received[-1], 0.1 + 2.0 * hold, atol=0.02)
    # the robot's goodbyes reach the relay's thread after disconnect() returns: give a loaded machine a moment
    deadline = time.monotonic() + 10
    while not {"unsubscribe", "unadvertise"} <= {o["op"] for o in relay.ops} and time.monotonic() < deadline:
        time.sleep(0.05)
    ops = {o["op"] for o in relay.ops}
    assert {"subscribe", "advertise", "publish", "unsubscribe", "unadvertise"} <= ops


def test_rosbridge_robot_reports_a_missing_driver_and_stale_states(relay):
    robot = make_robot("rosbridge", url=f"ws://127.0.0.1:{relay.port}", joint_names=["a"], timeout_s=0.5)
    with pytest.raises(RobotCommunicationError, match="no sensor_msgs/msg/JointState on /joint_states"):
        robot.connect()
    with pytest.raises(ValueError, match="joint_names"):
        make_robot("rosbridge", url="ws://127.0.0.1:1", joint_names=[])
    with pytest.raises(ValueError, match="does not take"):
        make_robot("rosbridge", url="ws://127.0.0.1:1", joint_names=["a"], task="reach")
