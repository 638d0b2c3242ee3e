"""The bridge's round-trip latency on loopback and the control loop's period jitter.

Measured by ``embodied robot bench`` (``embodied.runtime.robot``). Without a ``url`` a policy
server with a constant policy (no inference cost: what is measured is the bridge) runs in a
child process (``python -m embodied.bridge.latency STATE_DIM ACTION_DIM IMAGE_SIZE HORIZON``),
so client and server do not share an interpreter. Measured: request -> response round trips for
state observations (``state`` (To, Ds) + instruction) and for two 224x224x3 uint8 camera
images, p50/p99; then a ``ControlLoop`` at ``rate_hz`` over a robot that answers at once,
driven by the served policy: the period jitter |period - 1/rate| p50/p99/max and overruns.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any, Mapping

import numpy as np

from embodied.bridge import wire
from embodied.bridge.client import RemotePolicy
from embodied.bridge.loop import ControlLoop, LoopConfig
from embodied.core.policy import Policy
from embodied.core.robot import Robot
from embodied.core.specs import ActionSpec, ObservationSpec

CAMERAS = ("cam0", "cam1")


class ConstantPolicy(Policy):
    """Zeros (B, H, Da): the policy of the benchmark server."""

    def __init__(self, horizon: int = 8, n_action_steps: int = 4, action_dim: int = 7, n_obs_steps: int = 1):
        self.horizon, self.n_action_steps, self.n_obs_steps, self.action_dim = horizon, n_action_steps, n_obs_steps, \
            action_dim
        super().__init__()

    def predict_chunk(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None) -> np.ndarray:
        return np.zeros((len(obs_batch["instruction"]), self.horizon, self.action_dim), np.float32)

    def predict_rows(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None) -> np.ndarray:
        return self.predict_chunk(obs_batch, noise)  # no row depends on another: a batching server may merge


class InstantRobot(Robot):
    """A robot that answers at once: the loop's timing is all that is measured."""

    def __init__(self, state_dim: int, action_dim: int):
        self.observation_spec = ObservationSpec(state_dim)
        self.action_spec = ActionSpec(action_dim)
        self._on = False
        self._obs = {"state": np.zeros(state_dim, np.float32), "instruction": "hold still"}

    @property
    def is_connected(self) -> bool:
        return self._on

    def connect(self) -> None:
        self._on = True

    def get_observation(self) -> dict[str, Any]:
        return self._obs

    def send_action(self, action: np.ndarray) -> np.ndarray:
        return np.clip(np.asarray(action, np.float32), -1, 1)

    def safe_action(self) -> np.ndarray:
        return np.zeros(self.action_spec.dim, np.float32)

    def disconnect(self) -> None:
        self._on = False


def serve_constant(state_dim: int, action_dim: int, image_size: int, horizon: int) -> None:
    """Two constant-policy servers, one for state and one for two-camera observations; prints their URLs."""
    from embodied.bridge.server import PolicyServer, policy_metadata

    p = ConstantPolicy(horizon, 4, action_dim)
    state = PolicyServer(p, "127.0.0.1", 0, metadata=policy_metadata(p, state_dim=state_dim,
                                                                      action_dim=action_dim)).start()
    meta = policy_metadata(p, state_dim=state_dim, action_dim=action_dim,
                           cameras=list(CAMERAS), image_size=image_size, obs_mode="pixels")
    pixels = PolicyServer(p, "127.0.0.1", 0, metadata=meta)
    print(state.url, pixels.url, flush=True)
    pixels.serve_forever()


def _percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "mean_ms": float(a.mean()), "max_ms": float(a.max()), "n": int(len(a))}


def round_trips(policy: RemotePolicy, request: dict[str, Any], n: int, warmup: int = 20) -> dict[str, float]:
    """Round-trip times of ``n`` identical requests (after ``warmup``), plus the server's own time."""
    ms, server_ms = [], []
    for i in range(n + warmup):
        t = time.perf_counter()
        out = policy.infer(request)
        if i >= warmup:
            ms.append((time.perf_counter() - t) * 1000)
            server_ms.append(float(out["server_timing"]["infer_ms"]))
    res = _percentiles(ms)
    res["server_infer_p50_ms"] = float(np.percentile(server_ms, 50))
    res["request_bytes"] = len(wire.pack(request))
    return res


def loop_jitter(policy: RemotePolicy, state_dim: int, action_dim: int, rate_hz: float, steps: int) -> dict[str, Any]:
    robot = InstantRobot(state_dim, action_dim)
    with robot:
        loop = ControlLoop(robot, policy, LoopConfig(rate_hz=rate_hz, mode="realtime"))
        try:
            report = loop.run_episode(steps)
        finally:
            loop.close()
    t = report.timing(rate_hz)
    return {"rate_hz": rate_hz, "steps": report.steps, "overruns": report.events.get("overruns", 0),
            "hold_steps": report.hold_steps, **{k: v for k, v in t.items() if k.startswith(("jitter", "period"))}}


def measure(url: str = "", requests: int = 500, loop_steps: int = 250, rate_hz: float = 50.0, state_dim: int = 39,
            action_dim: int = 7, image_size: int = 224, horizon: int = 8) -> dict[str, Any]:
    """Round trips of ``requests`` state and two-camera requests, then ``loop_steps`` control-loop
    steps at ``rate_hz`` (0 steps: no loop), against ``url`` or a local constant-policy server."""
    child = None
    image_url = url
    try:
        if not url:
            child = subprocess.Popen([sys.executable, "-m", "embodied.bridge.latency", str(state_dim), str(action_dim),
                                      str(image_size), str(horizon)], stdout=subprocess.PIPE, text=True)
            assert child.stdout is not None
            url, image_url = child.stdout.readline().split()
        policy = RemotePolicy(url, timeout_s=10)
        image_policy = RemotePolicy(image_url, timeout_s=10) if image_url != url else policy
        to = policy.n_obs_steps
        state = {"state": np.zeros((to, state_dim), np.float32), "instruction": "pick up the red block"}
        s = image_size
        rng = np.random.default_rng(0)
        images = {**state, "images": {c: rng.integers(0, 256, (to, s, s, 3), dtype=np.uint8) for c in CAMERAS}}
        out: dict[str, Any] = {"url": url}
        if not policy.obs_spec.cameras:
            out["state"] = round_trips(policy, state, requests)
        spec = image_policy.obs_spec
        if spec.image_size == s and len(spec.cameras) == 2:
            out["images_2x%dx%d" % (s, s)] = round_trips(image_policy, {**images, "images": dict(
                zip(spec.cameras, images["images"].values()))}, requests)
        if loop_steps:
            out["loop"] = loop_jitter(policy, state_dim, policy.action_dim, rate_hz, loop_steps)
        policy.close()
        image_policy.close()
        return out
    finally:
        if child is not None:
            child.terminate()
            child.wait(timeout=10)


def summary_lines(res: dict[str, Any]) -> list[str]:
    """One line per round-trip kind and one for the loop, as ``embodied robot bench`` prints them."""
    lines = []
    for name in [k for k in res if k not in ("url", "loop")]:
        r = res[name]
        lines.append(f"round trip, {name:<16} p50 {r['p50_ms']:7.3f} ms  p99 {r['p99_ms']:7.3f} ms  "
                     f"(server {r['server_infer_p50_ms']:.3f} ms, {r['request_bytes']} B, n={r['n']})")
    if "loop" in res:
        lp = res["loop"]
        lines.append(f"control loop at {lp['rate_hz']:g} Hz: period p50 {lp['period_ms_p50']:.3f} ms, jitter p50 "
                     f"{lp['jitter_ms_p50']:.3f} ms, p99 {lp['jitter_ms_p99']:.3f} ms, max {lp['jitter_ms_max']:.3f} "
                     f"ms, overruns {lp['overruns']}/{lp['steps']}")
    return lines


if __name__ == "__main__":  # the child process of ``measure``: STATE_DIM ACTION_DIM IMAGE_SIZE HORIZON
    serve_constant(*(int(a) for a in sys.argv[1:5]))
