"""The robot bridge over real loopback sockets: wire format, server, client, control loop, safety, faults.

Everything here is robot-side code with a numpy policy (no torch); the checkpoint-based
checks through the commands are in test_bridge_cli.py, the ROS 2 adapter in test_bridge_ros.py.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from embodied.bridge import wire
from embodied.bridge.client import RemotePolicy, ServerError, ServerUnavailable
from embodied.bridge.drivers.sim import Faults, NetworkRobot, RobotServer
from embodied.bridge.loop import ChunkSchedule, ControlLoop, LoopConfig, LoopConfigError
from embodied.bridge.safety import EStop, KeyEStop, SafetyConfig, SafetyConfigError, SafetyLayer, Workspace
from embodied.bridge.server import PolicyServer, policy_metadata
from embodied.core.policy import Policy, PolicyWrapper
from embodied.core.robot import Robot
from embodied.core.specs import ActionSpec, ObservationSpec

ROOT = Path(__file__).resolve().parents[1]
DS, DA, H, TA, TO = 5, 3, 6, 3, 2


class LinearPolicy(Policy):
    """A deterministic numpy policy: chunk = f(last state, instruction length) + noise."""

    n_obs_steps, horizon, n_action_steps = TO, H, TA
    generative = True

    def __init__(self, amplitude: float = 0.3):
        super().__init__()
        self.amplitude = amplitude
        self.calls = 0

    @property
    def noise_shape(self):
        return (H, DA)

    def predict_chunk(self, obs_batch, noise=None):
        self.calls += 1
        s = np.asarray(obs_batch["state"], np.float32)
        base = np.tanh(s[:, -1, :DA] + s[:, 0, DA - 1:DA] + 0.01 * len(obs_batch["instruction"][0]))
        chunk = base[:, None, :] + 0.05 * np.arange(H, dtype=np.float32)[None, :, None]
        if noise is not None:
            chunk = chunk + 0.1 * np.asarray(noise, np.float32)
        return (self.amplitude * chunk).astype(np.float32)


def _meta(policy):
    return policy_metadata(policy, state_dim=DS, action_dim=DA)


class ToyRobot(Robot):
    """A point robot: state = position (Ds), action = velocity of the first Da coordinates.

    Records every command with its time, so tests can check what reached the robot.
    """

    def __init__(self, bounds: float = 1.0):
        self.observation_spec = ObservationSpec(DS)
        self.action_spec = ActionSpec(DA, -bounds, bounds)
        self.pos = np.zeros(DS, np.float32)
        self.sent: list[tuple[float, np.ndarray]] = []
        self._on = False
        self.done = False

    @property
    def is_connected(self):
        return self._on

    def connect(self):
        self._on = True

    def disconnect(self):
        self._on = False

    def get_observation(self):
        return {"state": self.pos.copy(), "instruction": "go"}

    def send_action(self, action):
        a = np.asarray(action, np.float32)
        self.sent.append((time.monotonic(), a.copy()))
        self.pos[:DA] += 0.01 * a
        return a

    def safe_action(self):
        return np.zeros(DA, np.float32)


@pytest.fixture
def server():
    with PolicyServer(LinearPolicy(), metadata=_meta(LinearPolicy())) as srv:
        yield srv


def _obs(b=None, seed=0):
    rng = np.random.default_rng(seed)
    if b is None:
        return {"state": rng.standard_normal((TO, DS)).astype(np.float32), "instruction": "pick"}
    return {"state": rng.standard_normal((b, TO, DS)).astype(np.float32), "instruction": ["pick"] * b}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ robot side imports
def test_robot_side_runs_where_torch_mujoco_and_policies_cannot_be_imported(tmp_path):
    """The wire, client, loop, safety, drivers and bench import and run with torch/mujoco/policies blocked."""
    code = textwrap.dedent("""
        import sys, importlib.abc
        BLOCKED = ("torch", "mujoco", "policies", "sim", "rewards", "triton", "embodied.runtime")
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name in BLOCKED or name.startswith(tuple(b + "." for b in BLOCKED)):
                    raise ImportError(f"{name} is blocked on the robot computer")
        sys.meta_path.insert(0, Block())
        try:
            import torch
        except ImportError:
            pass
        else:
            raise SystemExit("torch imported despite the block")
        import numpy as np
        import embodied.bridge.wire, embodied.bridge.client, embodied.bridge.loop, embodied.bridge.safety
        import embodied.bridge.server, embodied.bridge.latency, embodied.bridge.drivers
        import embodied.bridge.batching, embodied.bridge.fleet
        import embodied.bridge.drivers.sim, embodied.bridge.drivers.rosbridge
        from embodied.bridge.latency import ConstantPolicy, InstantRobot
        from embodied.bridge.server import PolicyServer, policy_metadata
        from embodied.bridge.client import RemotePolicy
        from embodied.bridge.loop import ControlLoop, LoopConfig
        p = ConstantPolicy(4, 2, 3)
        with PolicyServer(p, metadata=policy_metadata(p, state_dim=5, action_dim=3)) as srv:
            remote = RemotePolicy(srv.url)
            robot = InstantRobot(5, 3)
            with robot:
                rep = ControlLoop(robot, remote, LoopConfig(rate_hz=0, mode="lockstep")).run_episode(10)
            assert rep.steps == 10 and rep.hold_steps == 0, rep.to_dict()
        bad = [m for m in sys.modules if m.split(".")[0] in ("torch", "mujoco", "policies", "sim", "rewards")]
        assert not bad, bad
        print("ROBOT-SIDE-OK")
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and "ROBOT-SIDE-OK" in r.stdout, r.stderr[-3000:]


# ------------------------------------------------------------------ wire format
def test_wire_round_trip_matches_openpi_layout():
    obj = {"a": np.arange(6, dtype=np.int16).reshape(2, 3), "f": np.array([np.nan, 1.5], np.float32),
           "s": np.array(["ab", "c"]), "b": np.array([True, False]), "n": np.float64(2.5), "i": np.int64(-3),
           "nested": [{"x": np.zeros((0, 4), np.uint8)}], "text": "hi", "raw": b"\x00\x01"}
    back = wire.unpack(wire.pack(obj))
    for k in ("a", "s", "b"):
        assert back[k].dtype == obj[k].dtype and np.array_equal(back[k], obj[k])
    assert np.array_equal(back["f"], obj["f"], equal_nan=True) and back["f"].dtype == np.float32
    # np.float64 is a Python float, which msgpack writes natively (so does openpi's packer); others keep their type
    assert back["n"] == 2.5 and back["i"] == -3 and type(back["i"]) is np.int64
    assert back["nested"][0]["x"].shape == (0, 4) and back["text"] == "hi" and back["raw"] == b"\x00\x01"
    # openpi's packer puts bin (bytes) keys in the array maps: {b"__ndarray__": True, b"data", b"dtype", b"shape"}
    raw = msgpack.unpackb(wire.pack({"x": np.ones(3, np.float32)}), raw=False, strict_map_key=False)["x"]
    assert raw == {b"__ndarray__": True, b"data": np.ones(3, np.float32).tobytes(), b"dtype": "<f4", b"shape": [3]}
    # and str keys are read too
    str_keys = msgpack.packb({"x": {"__ndarray__": True, "data": np.arange(4, dtype="<i4").tobytes(),
                                    "dtype": "<i4", "shape": [2, 2]}})
    assert np.array_equal(wire.unpack(str_keys)["x"], np.arange(4).reshape(2, 2))


@pytest.mark.parametrize("dtype", ["|O", "|V8", "<c8", "<M8[s]", "[('a', '<f4')]"])
def test_wire_refuses_object_void_complex_datetime_dtypes(dtype):
    msg = msgpack.packb({"x": {b"__ndarray__": True, b"data": b"\x00" * 8, b"dtype": dtype, b"shape": [1]}})
    with pytest.raises(wire.WireError, match="refused|not a numpy dtype|bytes of data"):
        wire.unpack(msg)
    with pytest.raises((wire.WireError, TypeError, ValueError)):
        wire.pack({"x": np.zeros(1, np.complex64)})
    with pytest.raises(wire.WireError, match="refused"):
        wire.pack({"x": np.array([object()], dtype=object)})


def test_wire_refuses_inconsistent_arrays_and_extensions():
    bad = [{b"__ndarray__": True, b"data": b"\x00" * 7, b"dtype": "<f4", b"shape": [2]},  # byte count
           {b"__ndarray__": True, b"data": b"\x00" * 8, b"dtype": "<f4", b"shape": [-2]},  # negative shape
           {b"__ndarray__": True, b"data": "text", b"dtype": "<f4", b"shape": [1]},  # data not bytes
           {b"__ndarray__": True, b"data": b"", b"dtype": 7, b"shape": [0]}]  # dtype not str
    for d in bad:
        with pytest.raises(wire.WireError):
            wire.unpack(msgpack.packb({"x": d}))
    with pytest.raises(wire.WireError, match="extension"):
        wire.unpack(msgpack.packb(msgpack.ExtType(5, b"xx")))
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.unpack(b"\x00" * 2000, max_bytes=1000)
    with pytest.raises(wire.WireError, match="not a valid msgpack"):
        wire.unpack(b"\xc1\xc1")


# ------------------------------------------------------------------ server and client
def test_metadata_on_connect_healthz_and_api_key():
    policy = LinearPolicy()
    with PolicyServer(policy, metadata=_meta(policy), api_key="s3cret") as srv:
        http = srv.url.replace("ws://", "http://")
        assert urllib.request.urlopen(http + "/healthz", timeout=5).read() == b"OK\n"
        with pytest.raises(InvalidStatus) as e:
            connect(srv.url, proxy=None)
        assert e.value.response.status_code == 401
        with pytest.raises(ServerError, match="401"):
            RemotePolicy(srv.url, connect_timeout_s=2)
        with connect(srv.url, proxy=None, additional_headers={"Authorization": "Api-Key s3cret"}) as ws:
            meta = wire.unpack(ws.recv(timeout=5))
        assert meta["horizon"] == H and meta["n_obs_steps"] == TO and meta["action_dim"] == DA
        assert meta["noise_shape"] == [H, DA] and meta["server"] == "embodied"
        remote = RemotePolicy(srv.url, api_key="s3cret")
        assert (remote.n_obs_steps, remote.horizon, remote.n_action_steps) == (TO, H, TA)


def test_identical_actions_locally_and_through_the_server(server):
    """Same observation and noise -> bitwise the same chunk, batched or not; no noise -> the server's own."""
    local, remote = LinearPolicy(), RemotePolicy(server.url)
    obs = _obs(4)
    noise = np.random.default_rng(1).standard_normal((4, H, DA)).astype(np.float32)
    assert np.array_equal(remote.predict_chunk(obs, noise), local.predict_chunk(obs, noise))
    assert np.array_equal(remote.predict_chunk(obs), local.predict_chunk(obs))
    assert remote.last_timing["infer_ms"] >= 0
    # Policy.act through the server == Policy.act locally, step by step
    local.reset(), remote.reset()
    rng = np.random.default_rng(2)
    for _ in range(10):
        o = {"state": rng.standard_normal(DS).astype(np.float32), "instruction": "pick"}
        assert np.array_equal(remote.act(o), local.act(o))


def test_openpi_style_client_single_step_requests(server):
    """An openpi client sends one step with 'prompt' and gets (H, Da) 'actions' and server_timing."""
    local = LinearPolicy()
    with connect(server.url, proxy=None, compression=None, max_size=None) as ws:
        meta = wire.unpack(ws.recv(timeout=5))
        states = [np.full(DS, float(i), np.float32) for i in range(3)]
        for i, s in enumerate(states):
            ws.send(wire.pack({"state": s, "prompt": "pick"}))
            out = wire.unpack(ws.recv(timeout=5))
            hist = [states[max(0, j)] for j in range(i - TO + 1, i + 1)]  # the server pads with the first step
            want = local.predict_chunk({"state": np.stack(hist)[None], "instruction": ["pick"]})[0]
            assert out["actions"].shape == (meta["horizon"], DA) and np.array_equal(out["actions"], want)
            assert "infer_ms" in out["server_timing"] and (i == 0 or "prev_total_ms" in out["server_timing"])
        ws.send(wire.pack({"__ctrl__": "episode_start"}))
        assert wire.unpack(ws.recv(timeout=5)) == {"__ack__": "episode_start"}
    # a client written for another policy's keys, renamed by the server's key_map
    policy = LinearPolicy()
    with PolicyServer(policy, metadata=_meta(policy), key_map={"observation/state": "state"}) as srv, \
            connect(srv.url, proxy=None) as ws:
        ws.recv(timeout=5)
        ws.send(wire.pack({"observation/state": np.ones((TO, DS), np.float32), "prompt": "pick"}))
        out = wire.unpack(ws.recv(timeout=5))
        assert np.array_equal(out["actions"], local.predict_chunk({"state": np.ones((1, TO, DS), np.float32),
                                                                   "instruction": ["pick"]})[0])


def _error_frame(url, payload):
    """Send ``payload``; return the text frame the server answers with (then it must close)."""
    with connect(url, proxy=None, max_size=None) as ws:
        ws.recv(timeout=5)
        ws.send(payload)
        reply = ws.recv(timeout=5)
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=5)
    assert isinstance(reply, str), f"expected an error text frame, got {type(reply)}"
    return reply


def test_malformed_oversized_and_wrong_dtype_messages_get_an_error_frame_others_still_served():
    policy = LinearPolicy()
    with PolicyServer(policy, metadata=_meta(policy), max_message_bytes=64 * 1024) as srv:
        bystander = RemotePolicy(srv.url)
        before = bystander.predict_chunk(_obs(1))
        good = _obs()
        cases = {
            "not a valid msgpack": b"\xc1\xff\x00garbage",
            "over the limit": wire.pack({**good, "pad": b"\x00" * (70 * 1024)}),
            "must be a float array": wire.pack({**good, "state": good["state"].astype(np.int64)}),
            "refused": msgpack.packb({"state": {b"__ndarray__": True, b"data": b"\x00" * 80, b"dtype": "<c16",
                                                b"shape": [TO, DS // 2]}, "instruction": "x"}),
            "must be \\(5,\\)": wire.pack({**good, "state": np.zeros((TO, DS + 1), np.float32)}),
            "NaN or inf": wire.pack({**good, "state": np.full((TO, DS), np.nan, np.float32)}),
            "no 'instruction'": wire.pack({"state": good["state"]}),
            "'noise' must have shape": wire.pack({**good, "noise": np.zeros((H + 1, DA), np.float32)}),
            "text frame": "hello",
        }
        for expect, payload in cases.items():
            text = _error_frame(srv.url, payload)
            assert "Traceback" in text and __import__("re").search(expect, text), (expect, text[-500:])
            assert np.array_equal(bystander.predict_chunk(_obs(1)), before)  # the other client is still served
        assert srv.stats["errors"] == len(cases)


def test_fuzzed_requests_never_crash_the_server():
    """1,000 fuzzed messages (random bytes, mutated valid requests, odd structures): each answered or refused."""
    policy = LinearPolicy()
    rng = np.random.default_rng(0)
    valid = wire.pack(_obs())
    with PolicyServer(policy, metadata=_meta(policy), max_message_bytes=256 * 1024) as srv:
        bystander = RemotePolicy(srv.url)
        answered = refused = 0
        ws = None
        for i in range(1000):
            kind = i % 4
            if kind == 0:
                msg = rng.bytes(int(rng.integers(0, 300)))
            elif kind == 1:
                b = bytearray(valid)
                for j in rng.integers(0, len(b), int(rng.integers(1, 8))):
                    b[j] = int(rng.integers(0, 256))
                msg = bytes(b)
            elif kind == 2:
                msg = bytes(valid[: int(rng.integers(0, len(valid)))])
            else:
                leaf = [None, True, 1.5, -7, "x" * 5, b"\x00", [], {}, np.zeros(3, np.float32), np.int8(3)]
                msg = wire.pack({"state": leaf[int(rng.integers(len(leaf)))],
                                 "instruction": leaf[int(rng.integers(len(leaf)))],
                                 "noise": leaf[int(rng.integers(len(leaf)))]})
            if ws is None:
                ws = wire.ws_connect(srv.url, proxy=None, max_size=None)
                ws.recv(timeout=5)
            ws.send(msg)
            reply = ws.recv(timeout=5)
            if isinstance(reply, str):
                refused += 1
                ws.close()
                ws = None
            else:
                out = wire.unpack(reply)
                assert np.all(np.isfinite(out["actions"]))
                answered += 1
        if ws is not None:
            ws.close()
        assert answered + refused == 1000 and refused > 900
        assert bystander.predict_chunk(_obs(1)).shape == (1, H, DA)
        assert urllib.request.urlopen(srv.url.replace("ws://", "http://") + "/healthz", timeout=5).status == 200


SERVER_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    from test_bridge import LinearPolicy, _meta
    from embodied.bridge.server import PolicyServer
    p = LinearPolicy()
    srv = PolicyServer(p, port={port}, metadata=_meta(p))
    print(srv.url, flush=True)
    srv.serve_forever()
""")


def _server_process(port):
    code = SERVER_SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests"), port=port)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    assert url.startswith("ws://"), url
    return proc, url


def test_client_reconnects_after_a_server_restart():
    port = _free_port()
    proc, url = _server_process(port)
    try:
        remote = RemotePolicy(url, timeout_s=20)
        first = remote.predict_chunk(_obs(2))
        proc.kill()
        proc.wait(timeout=10)
        with pytest.raises(ServerUnavailable):
            remote.predict_chunk(_obs(2), timeout_s=0.5)
        proc, _ = _server_process(port)
        assert np.array_equal(remote.predict_chunk(_obs(2)), first)
        assert remote.reconnects >= 1 and remote.connected
    finally:
        proc.kill()
        proc.wait(timeout=10)


def episode_with_server_killed(rate: float, steps: int, kill_after_s: float = 0.6):
    """An episode of ``steps`` at ``rate`` against a server process SIGKILLed ``kill_after_s`` in:
    (loop, robot, report, the kill's monotonic time or None). Also run by
    docs/results/scripts/bridge_kill_to_safe.py."""
    proc, url = _server_process(_free_port())
    robot = ToyRobot()
    loop = ControlLoop(robot, RemotePolicy(url, timeout_s=0.5), LoopConfig(rate_hz=rate, request_timeout_s=0.3))
    killed: list[float] = []

    def kill_later():
        time.sleep(kill_after_s)
        killed.append(time.monotonic())
        proc.kill()

    threading.Thread(target=kill_later, daemon=True).start()
    try:
        with robot:
            report = loop.run_episode(steps)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        loop.close()
    return loop, robot, report, (killed[0] if killed else None)


@pytest.mark.timed
def test_server_killed_mid_episode_robot_in_safe_state_within_two_periods():
    rate = 20.0
    loop, robot, report, t_kill = episode_with_server_killed(rate, 40)
    assert t_kill is not None and report.steps >= 30
    holds = [t for t, why in loop.hold_log if t > t_kill and why.startswith(("policy server", "no action"))]
    assert holds, list(loop.hold_log)
    first_safe = min(t for t, a in robot.sent if t >= holds[0] - 1e-3)
    assert first_safe - t_kill <= 2 / rate, f"safe state {1000 * (first_safe - t_kill):.0f} ms after the kill"
    after = [a for t, a in robot.sent if t >= first_safe]
    assert all(np.array_equal(a, robot.safe_action()) for a in after)  # held until the end, never resumed
    assert report.events["hold:policy server connection lost"] >= 1


class SlowOnce(PolicyWrapper):
    """The wrapped policy, with one chosen call delayed (a latency spike)."""

    def __init__(self, policy, call: int, delay_s: float):
        super().__init__(policy)
        self.call, self.delay_s, self.calls = call, delay_s, 0

    def predict_chunk(self, obs_batch, noise=None):
        self.calls += 1
        if self.calls == self.call:
            time.sleep(self.delay_s)
        return self.policy.predict_chunk(obs_batch, noise)


@pytest.mark.timed
def test_latency_spike_longer_than_the_chunk_safe_hold_then_recovery():
    rate = 50.0
    # far longer than a whole chunk of actions, so the chunk runs out even when a loaded machine stalls
    # the loop for a few periods (the schedule counts steps, not seconds); under the request timeout
    slow = SlowOnce(LinearPolicy(), call=3, delay_s=H / rate + 0.8)
    with PolicyServer(slow, metadata=_meta(LinearPolicy())) as srv:
        robot = ToyRobot()
        loop = ControlLoop(robot, RemotePolicy(srv.url), LoopConfig(rate_hz=rate, request_timeout_s=2.0))
        with robot:
            report = loop.run_episode(110)
        loop.close()
    assert report.hold_steps >= 5, report.to_dict()
    assert report.events["hold:no action"] >= 1
    hold_start = [t for t, why in loop.hold_log if why.startswith("no action")][0]
    during = [a for t, a in robot.sent if hold_start <= t <= hold_start + 0.25]
    assert during and all(np.array_equal(a, np.zeros(DA)) for a in during)
    # recovery: after the spike, chunks arrive again and the robot moves under the policy
    assert report.events["chunks_used"] >= 6
    moving = [a for t, a in robot.sent if t > hold_start + slow.delay_s and np.any(a != 0)]
    assert len(moving) >= 10
    assert report.ended_by == "max_steps"


# ------------------------------------------------------------------ the loop and the safety layer
def test_fuzzed_responses_never_reach_the_robot_unsafe():
    """A server that answers 1,000 requests with fuzzed chunks: every command the robot got is safe."""
    rng = np.random.default_rng(3)

    class Evil(Policy):
        n_obs_steps, horizon, n_action_steps = 1, 4, 1

        def predict_chunk(self, obs_batch, noise=None):
            c = rng.uniform(-5, 5, (1, 4, DA)).astype(np.float32)
            k = rng.integers(6)
            if k == 0:
                c[0, 0, rng.integers(DA)] = np.nan
            elif k == 1:
                c[0, :, 0] = np.inf
            elif k == 2:
                return c[:, :, :DA - 1]  # wrong shape
            elif k == 3:
                return np.full((1, 4, DA), 1e30, np.float32)
            return c

    evil = Evil()
    with PolicyServer(evil, metadata=policy_metadata(evil, state_dim=DS, action_dim=DA)) as srv:
        robot = ToyRobot(bounds=0.8)
        cfg = LoopConfig(rate_hz=0, mode="lockstep", safety=SafetyConfig(max_delta=0.25))
        steps = []
        loop = ControlLoop(robot, RemotePolicy(srv.url), cfg,
                           on_step=lambda obs, wanted, sent, info: steps.append((sent, wanted is None)))
        with robot:
            report = loop.run_episode(1000)
        loop.close()
    assert report.events["chunks_requested"] == 1000 and len(steps) == 1000
    sent = np.array([a for _, a in robot.sent])
    assert np.all(np.isfinite(sent)) and np.all(np.abs(sent) <= 0.8 + 1e-6)
    # every policy action moved at most max_delta from the command before it; the safe state is commanded at once
    for (prev, _), (a, hold) in zip(steps, steps[1:]):
        assert np.array_equal(a, robot.safe_action()) if hold else np.all(np.abs(a - prev) <= 0.25 + 1e-6)
    assert report.events["request_failures"] > 100 and report.safety["clipped_bounds"] > 100
    assert report.safety.get("clipped_delta", 0) > 0 and report.hold_steps > 0


def test_safety_layer_bounds_workspace_delta_and_refusals():
    spec = ActionSpec(3, -1.0, 1.0)
    ws = Workspace(state_index=[0, 1], action_index=[0, 1], low=[-0.5, -0.5], high=[0.5, 0.5])
    layer = SafetyLayer(SafetyConfig(max_delta=0.5, workspace=ws, high=[1.0, 1.0, 0.5]), spec)
    a, kinds = layer.filter([2.0, 0.1, 0.9], np.zeros(3), None)
    assert np.allclose(a, [1.0, 0.1, 0.5]) and kinds == ["clipped_bounds"]
    a, kinds = layer.filter([-0.3, 0.3, 0.0], np.array([0.6, -0.6, 0.0]), None)  # outside on both, moving back in
    assert np.allclose(a, [-0.3, 0.3, 0]) and not kinds
    a, kinds = layer.filter([0.3, -0.3, 0.0], np.array([0.6, 0.6, 0.0]), None)
    assert np.allclose(a, [0.0, -0.3, 0]) and kinds == ["clipped_workspace"]
    a, kinds = layer.filter([1.0, -1.0, 0.0], np.zeros(3), np.zeros(3))
    assert np.allclose(a, [0.5, -0.5, 0]) and kinds == ["clipped_delta"]
    assert layer.filter([np.nan, 0, 0], np.zeros(3), None) == (None, ["refused_nonfinite"])
    assert layer.filter([0.0, 0.0], np.zeros(3), None) == (None, ["refused_shape"])
    assert dict(layer.counts) == {"clipped_bounds": 1, "clipped_workspace": 1, "clipped_delta": 1,
                                  "refused_nonfinite": 1, "refused_shape": 1}
    with pytest.raises(SafetyConfigError, match="max_delta"):
        SafetyConfig(max_delta=-1)
    with pytest.raises(SafetyConfigError, match="same non-zero length"):
        Workspace([0], [0, 1], [0], [1])
    with pytest.raises(SafetyConfigError, match="low must be < safety.high"):
        SafetyLayer(SafetyConfig(low=0.5, high=0.5), spec)
    with pytest.raises(LoopConfigError, match="mode"):
        LoopConfig(mode="fast")


def test_chunk_schedule_drops_stale_actions_and_blends():
    s = ChunkSchedule(horizon=4, n_action_steps=2, blend=1)
    old, new = np.zeros((4, 1)), np.ones((4, 1))
    assert s.action(0) is None and s.left(0) == 0
    assert s.accept(old, 0, 0) and s.left(1) == 1
    assert s.accept(new + np.arange(4)[:, None], 1, 3)  # planned at step 1, arrives at step 3
    assert np.allclose(s.action(3), 0.5 * old[3] + 0.5 * (1 + 2))  # blended with the old chunk's step 3
    assert np.allclose(s.action(4), 1 + 3) and s.action(5) is None  # then the new chunk, up to its horizon
    assert not s.accept(new, 0, 4)  # entirely in the past


def test_lockstep_loop_reproduces_policy_act():
    local, looped = LinearPolicy(), LinearPolicy()
    robot = ToyRobot()
    seen = []
    loop = ControlLoop(robot, looped, LoopConfig(rate_hz=0, mode="lockstep", safety=SafetyConfig(max_delta=0)),
                       on_step=lambda obs, wanted, sent, info: seen.append((obs["state"].copy(), sent)))
    with robot:
        report = loop.run_episode(20)
    loop.close()
    assert report.steps == 20 and report.hold_steps == 0 and looped.calls == 20 // TA + (20 % TA > 0)
    local.reset()
    for state, sent in seen:
        assert np.array_equal(local.act({"state": state, "instruction": "go"}), sent)


def test_estop_from_a_thread_and_from_a_key_press():
    robot = ToyRobot()
    loop = ControlLoop(robot, LinearPolicy(), LoopConfig(rate_hz=50))
    threading.Timer(0.2, loop.estop.trigger, args=("operator",)).start()
    with robot:
        report = loop.run_episode(500)
    assert report.ended_by == "estop" and report.steps < 100
    assert np.array_equal(robot.sent[-1][1], robot.safe_action())
    # a key press on a terminal-like stream (a pipe here)
    r, w = os.pipe()
    estop = EStop()
    with os.fdopen(r, "rb", buffering=0) as stream, KeyEStop(estop, stream):
        loop2 = ControlLoop(robot, LinearPolicy(), LoopConfig(rate_hz=50), estop=estop)
        threading.Timer(0.2, os.write, args=(w, b" ")).start()
        with robot:
            report = loop2.run_episode(500)
    os.close(w)
    assert report.ended_by == "estop" and "key" in estop.reason and report.steps < 100


@pytest.mark.timed
def test_watchdog_holds_the_robot_while_the_loop_waits():
    rate = 20.0
    robot = ToyRobot()
    slow = SlowOnce(LinearPolicy(), call=2, delay_s=0.6)
    loop = ControlLoop(robot, slow, LoopConfig(rate_hz=rate, mode="lockstep", request_timeout_s=2.0))
    with robot:
        report = loop.run_episode(10)
    loop.close()
    assert report.events["watchdog_trips"] >= 1
    trip = [t for t, why in loop.hold_log if why.startswith("watchdog")][0]
    gaps = np.diff([t for t, _ in robot.sent])
    assert gaps.max() <= 2 / rate + 0.05, f"the robot went {gaps.max() * 1000:.0f} ms without a command"
    assert any(abs(t - trip) < 0.05 and np.array_equal(a, robot.safe_action()) for t, a in robot.sent)


class CollectingPolicy(PolicyWrapper):
    """The wrapped policy, with a full garbage collection in each call (as the collector itself runs
    one when the objects a process allocates pass its thresholds)."""

    def predict_chunk(self, obs_batch, noise=None):
        gc.collect()
        return self.policy.predict_chunk(obs_batch, noise)


def test_a_big_heap_does_not_stall_the_loop_with_full_garbage_collections():
    """In a process with a large heap (a policy process holds torch and its model), a full garbage
    collection stops every thread for hundreds of milliseconds: the loop keeps the heap that exists
    when an episode starts out of the collector's scans for the episode."""
    rate = 20.0
    heap = [{"k": [i]} for i in range(1_500_000)]  # kept alive through the episode
    pauses: list[float] = []
    started: list[float] = []

    def timed(phase, info):
        if phase == "start":
            started.append(time.perf_counter())
        elif started and info["generation"] == 2:
            pauses.append(time.perf_counter() - started.pop())

    gc.callbacks.append(timed)
    try:
        robot = ToyRobot()
        loop = ControlLoop(robot, CollectingPolicy(LinearPolicy()), LoopConfig(rate_hz=rate, mode="lockstep"))
        with robot:
            report = loop.run_episode(20)
        loop.close()
    finally:
        gc.callbacks.remove(timed)
        del heap
    assert report.ended_by == "max_steps" and gc.get_freeze_count() == 0  # the heap is the collector's again
    # each full collection scanned only the episode's objects (the period bound itself is the watchdog test's)
    assert len(pauses) >= 2 and max(pauses) < 0.05, pauses


def test_loop_refuses_robots_without_safe_state_and_unreachable_servers(server):
    class NoSafe(ToyRobot):
        def safe_action(self):
            return Robot.safe_action(self)

    robot = NoSafe()
    with robot, pytest.raises(NotImplementedError, match="safe"):
        ControlLoop(robot, LinearPolicy(), LoopConfig(rate_hz=0, mode="lockstep")).run_episode(5)
    assert robot.sent == []
    remote = RemotePolicy(server.url)
    server.stop()
    time.sleep(0.2)
    robot = ToyRobot()
    with robot, pytest.raises(LoopConfigError, match="not reachable"):
        ControlLoop(robot, remote, LoopConfig(rate_hz=0, mode="lockstep")).run_episode(5)
    assert robot.sent == []


# ------------------------------------------------------------------ the simulated robot over the network
def test_network_sim_robot_with_latency_jitter_and_drops():
    """A simulated robot in a server, reached over a link that delays, jitters and drops requests."""
    from embodied.core.robot import SimRobot

    class Sim4(LinearPolicy):
        def predict_chunk(self, b, noise=None):
            s = np.asarray(b["state"])
            return np.tile(0.3 * np.tanh(s[:, -1:, :4]), (1, H, 1)).astype(np.float32)

    with RobotServer(SimRobot("reach"), faults=Faults(latency_ms=2, jitter_ms=1, drop=0.05, seed=1),
                     task="reach") as rs:
        robot = NetworkRobot(rs.url, timeout_s=0.08, seed=7)
        with robot:
            assert robot.task == "reach" and robot.action_spec.dim == 4
            assert np.array_equal(robot.get_observation()["state"], SimRobot("reach").reset(seed=7)["state"])
            loop = ControlLoop(robot, Sim4(), LoopConfig(rate_hz=50))
            report = loop.run_episode(80)
            loop.close()
    assert rs.stats["dropped"] >= 1 and report.events["robot_comm_errors"] >= 1
    assert report.steps >= 40 and report.ended_by in ("done", "max_steps"), report.to_dict()
    assert report.events["chunks_used"] >= 10


def test_network_robot_handshake_waits_for_a_slow_robot_and_resends_dropped_requests():
    """The server brings its robot up on the first request: that may take many control steps."""
    from embodied.core.robot import SimRobot

    class SlowToStart(SimRobot):
        def connect(self):
            time.sleep(0.4)
            super().connect()

    # every request has a 30% chance of being dropped, and each request may wait only 50 ms
    with RobotServer(SlowToStart("reach"), faults=Faults(drop=0.3, seed=3), task="reach") as rs:
        robot = NetworkRobot(rs.url, timeout_s=0.05, seed=7, connect_timeout_s=10)
        with robot:
            assert robot.task == "reach" and robot.action_spec.dim == 4
    assert rs.stats["requests"] > 3  # the handshake was sent more than once


def test_network_robot_connect_to_a_silent_server_fails_within_its_budget():
    from embodied.core.robot import RobotCommunicationError, SimRobot

    with RobotServer(SimRobot("reach"), faults=Faults(drop=0.999999, seed=0)) as rs:
        robot = NetworkRobot(rs.url, timeout_s=0.05, connect_timeout_s=0.3)
        t0 = time.monotonic()
        with pytest.raises(RobotCommunicationError, match="no reply to 'hello' within connect_timeout_s=0.3"):
            robot.connect()
        assert time.monotonic() - t0 < 2.0 and not robot.is_connected
    with pytest.raises(ValueError, match="connect_timeout_s must be > 0"):
        NetworkRobot("ws://127.0.0.1:1", connect_timeout_s=0)


CTRL_C_SCRIPT = textwrap.dedent("""
    import sys, json
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    import numpy as np
    from test_bridge import LinearPolicy, ToyRobot
    from embodied.bridge.loop import ControlLoop, LoopConfig

    class Logged(ToyRobot):
        def send_action(self, action):
            a = super().send_action(action)
            print(json.dumps([float(x) for x in a]), flush=True)
            return a

    robot = Logged()
    with robot:
        try:
            ControlLoop(robot, LinearPolicy(amplitude=3.0), LoopConfig(rate_hz=50)).run_episode(100_000)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
            sys.exit(130)
""")


def _sigint_as_by_default() -> None:
    """``preexec_fn`` of a child that is sent Ctrl-C: a background job of a non-interactive shell
    ignores SIGINT and its children inherit that, so Python would install no KeyboardInterrupt
    handler and the test would wait for an exit that never comes."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_leaves_the_robot_in_its_safe_state():
    code = CTRL_C_SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=_sigint_as_by_default)
    lines = []
    while len(lines) < 20:  # moving under the policy
        lines.append(proc.stdout.readline())
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    lines += out.splitlines()
    assert proc.returncode == 130 and lines[-1].strip() == "INTERRUPTED", err[-2000:]
    commands = [json.loads(x) for x in lines if x.startswith("[")]
    assert any(np.any(np.asarray(c) != 0) for c in commands[:20])
    assert commands[-1] == [0.0, 0.0, 0.0]  # the last command the robot got: its safe action
