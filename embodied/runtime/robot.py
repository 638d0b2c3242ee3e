"""The jobs of ``embodied robot``: ``run`` (a policy drives a robot through the bridge) and
``bench`` (the bridge's round-trip latency and loop jitter).

``run_robot`` connects to the robot (``configs/robot/<name>.yaml``) and to the policy (``url=``,
a policy server; or ``checkpoint=``, loaded here), checks both before enabling motion,
then runs ``episodes`` episodes with ``embodied.bridge.loop.ControlLoop`` (fixed rate,
chunk queue with asynchronous prefetch and blending, the safety layer on). Any key
pressed in the terminal is an e-stop; Ctrl-C holds the robot and exits cleanly.

Recorded here, in the runtime (``embodied.runtime.data``, the project's dataset format; the
robot-side modules do not import the runtime): ``dataset/`` with per step
``state`` (and images), ``action`` (sent), ``policy_action`` (asked for; zeros while
holding), ``intervention`` (the safety layer changed or replaced the action), ``hold``
and ``reward``. Also ``metrics.json`` (success, safety counts, timing per episode),
``steps.jsonl`` (per-step timing and interventions) and, with ``record_chunks=true``,
``chunks.npz`` (each chunk request: observation history, noise, chunk).

``bench_bridge`` runs ``embodied.bridge.latency`` against a local constant-policy server (or
``url=``), prints one line per measurement and writes ``metrics.json``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embodied.bridge.loop import LoopConfig

log = logging.getLogger("embodied.robot")


@dataclass
class RobotRunConfig:
    """Schema of ``configs/robot.yaml``."""

    # robot=sim | remote | rosbridge (config group configs/robot/): driver name + its arguments
    robot: dict[str, Any] = field(default_factory=dict)
    url: str = ""  # the policy server, ws://HOST:PORT (ours or openpi's)
    checkpoint: str = ""  # or: load this checkpoint here and run it in-process (no server)
    api_key: str = ""
    device: str = "auto"  # checkpoint=...: torch device
    episodes: int = 1
    max_steps: int = 0  # per episode; 0: until the robot says done (simulated robots); hardware needs one
    seed: int = 100_000  # simulated robots: seed of the first episode (embodied eval's first seed)
    instruction: str = ""  # replaces the robot's instruction ("" keeps it; hardware needs one)
    record: bool = True  # write the episodes to dataset/
    record_chunks: bool = False  # write chunks.npz (for checking actions against a local policy)
    key_estop: bool = True  # any key pressed in the terminal triggers the e-stop
    connect_timeout_s: float = 30.0
    loop: LoopConfig = field(default_factory=LoopConfig)

    def __post_init__(self) -> None:
        if bool(self.url) == bool(self.checkpoint):
            raise ValueError("give the policy as url=ws://HOST:PORT (a policy server) or checkpoint=PATH, "
                             f"exactly one; got url={self.url!r}, checkpoint={self.checkpoint!r}")
        if "kind" not in self.robot:
            raise ValueError(f"robot needs a kind (sim, remote, rosbridge): pick robot=sim|remote|rosbridge, "
                             f"got {self.robot}")
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if self.max_steps < 0:
            raise ValueError(f"max_steps must be >= 0 (0: until the robot is done), got {self.max_steps}")
        if self.robot["kind"] == "rosbridge" and not self.max_steps:
            raise ValueError("a rosbridge robot never says it is done: give max_steps=N")


def _policy(cfg: RobotRunConfig) -> Any:
    if cfg.url:
        from embodied.bridge.client import RemotePolicy

        return RemotePolicy(cfg.url, api_key=cfg.api_key or None, timeout_s=cfg.loop.request_timeout_s,
                            connect_timeout_s=cfg.connect_timeout_s)
    from embodied.runtime.checkpoints import load_for_eval
    from embodied.runtime.evaluate import RowwisePolicy

    return RowwisePolicy(load_for_eval(cfg.checkpoint, cfg.device))


def _robot(cfg: RobotRunConfig, policy: Any) -> Any:
    from embodied.bridge.drivers import make_robot

    kw = {k: v for k, v in cfg.robot.items() if k != "kind" and v is not None}
    if cfg.robot["kind"] == "sim":
        inner = policy.unwrapped
        obs_mode = kw.pop("obs_mode", None) or getattr(getattr(inner, "config", None), "obs_mode", "state")
        spec = getattr(inner, "obs_spec", None)
        kw["obs_mode"] = obs_mode
        if obs_mode != "state" and spec is not None:
            kw.setdefault("image_size", spec.image_size)
            if spec.cameras:
                kw.setdefault("cameras", list(spec.cameras))
        elif obs_mode == "state":
            kw.pop("image_size", None)
    return make_robot(cfg.robot["kind"], **kw)


def _check_policy_answers(policy: Any, robot: Any, cfg: RobotRunConfig, task: str | None) -> None:
    """Before any motion: the policy answers this robot's observation with a valid chunk (and is warm)."""
    from embodied.core.policy import check_chunk, stack_history

    obs = dict(robot.get_observation())
    if cfg.instruction:
        obs["instruction"] = cfg.instruction
    if task:
        obs["task"] = task
    batch = stack_history([obs] * max(1, policy.n_obs_steps))
    t = time.monotonic()
    kw = {"timeout_s": cfg.connect_timeout_s} if cfg.url else {}
    chunk = check_chunk(policy.predict_chunk(batch, **kw), 1)
    if chunk.shape[2] != robot.action_spec.dim:
        raise ValueError(f"the policy's actions have {chunk.shape[2]} dimensions, the robot takes "
                         f"{robot.action_spec.dim}")
    log.info("policy answered the robot's observation in %.0f ms: motion enabled", (time.monotonic() - t) * 1000)


def _dataset(out: Path, robot: Any, policy: Any) -> Any:
    from embodied.runtime.data import Dataset, features_for

    feats = features_for(robot.observation_spec, robot.action_spec, pixels=bool(robot.observation_spec.cameras))
    feats.update({"policy_action": ("float32", (robot.action_spec.dim,)), "intervention": ("bool", ()),
                  "hold": ("bool", ())})
    info = {"source": "embodied robot run", "robot": type(robot).__name__,
            "obs_spec": robot.observation_spec.to_dict(), "action_spec": robot.action_spec.to_dict(),
            "policy_metadata": {k: v for k, v in getattr(policy, "metadata", {}).items()
                                if isinstance(v, (str, int, float, bool, list, type(None)))}}
    return Dataset.create(out / "dataset", feats, info, exist_ok=True)


def run_robot(cfg: RobotRunConfig, out: Path) -> dict[str, Any]:
    from embodied.bridge.loop import ControlLoop
    from embodied.bridge.safety import EStop, KeyEStop
    from embodied.runtime.data import EpisodeRecorder
    from embodied.runtime.evaluate import write_json

    policy = _policy(cfg)
    robot = _robot(cfg, policy)
    estop = EStop()
    key = KeyEStop(estop) if cfg.key_estop and sys.stdin is not None and sys.stdin.isatty() else None
    episodes, chunks, t_start = [], [], time.monotonic()
    steps_log = open(out / "steps.jsonl", "w")
    try:
        with robot:
            check = getattr(policy, "check_spec", None)
            if check is not None:
                check(robot.observation_spec, robot.action_spec)
            task = getattr(robot, "task", None) or cfg.robot.get("task") or None
            _check_policy_answers(policy, robot, cfg, task)
            dataset = _dataset(out, robot, policy) if cfg.record else None
            recorder = EpisodeRecorder(dataset) if dataset is not None else None

            def on_step(obs: Any, wanted: Any, sent: np.ndarray, info: dict[str, Any]) -> None:
                hold = wanted is None
                steps_log.write(json.dumps({"episode": len(episodes), **{k: v for k, v in info.items()}}) + "\n")
                if recorder is not None:
                    recorder.add(obs, sent, float(getattr(robot, "last_reward", 0.0)),
                                 {"policy_action": np.zeros_like(sent) if hold else wanted,
                                  "intervention": bool(info["interventions"]), "hold": hold})

            loop = ControlLoop(robot, policy, cfg.loop, estop, on_step, record_chunks=cfg.record_chunks)
            if key is not None:
                key.start()
                log.info("press any key to stop the robot (e-stop); Ctrl-C to quit")
            try:
                for k in range(cfg.episodes):
                    seed = cfg.seed + k
                    if hasattr(robot, "reset"):  # simulated robots: episode k has seed + k, as in embodied eval
                        robot.reset(seed=seed)
                    if recorder is not None:
                        recorder.start(task=task or "", instruction=cfg.instruction or None, seed=seed)
                    report = loop.run_episode(cfg.max_steps or 100_000, cfg.instruction or None, task)
                    if recorder is not None:
                        if report.steps:
                            recorder.finish(success=bool(report.success), ended_by=report.ended_by,
                                            safety=report.safety, interventions=report.interventions)
                        else:
                            recorder.discard()
                    episodes.append({"seed": seed, **report.to_dict(cfg.loop.rate_hz)})
                    chunks += [{**c, "episode": k} for c in report.chunks]
                    log.info("episode %d (seed %d): %s after %d steps, success %s, holds %d, interventions %d",
                             k, seed, report.ended_by, report.steps, report.success, report.hold_steps,
                             report.interventions)
                    if report.ended_by == "estop":
                        break
            finally:
                loop.close()
    finally:
        steps_log.close()
        if key is not None:
            key.close()
        if hasattr(policy, "close"):
            policy.close()
    if chunks:
        _save_chunks(out / "chunks.npz", chunks)
    return _metrics(cfg, out, episodes, time.monotonic() - t_start, write_json)


def _save_chunks(path: Path, chunks: list[dict[str, Any]]) -> None:
    """Each chunk request as arrays: episode, t0, state (N, To, Ds), noise (N, H, Da; NaN: none), chunk."""
    arrays: dict[str, Any] = {
        "episode": np.array([c["episode"] for c in chunks]), "t0": np.array([c["t0"] for c in chunks]),
        "state": np.concatenate([c["batch"]["state"] for c in chunks]),
        "chunk": np.stack([c["chunk"] for c in chunks]),
        "instruction": np.array([c["batch"]["instruction"][0] for c in chunks]),
        "noise": np.stack([np.full_like(c["chunk"], np.nan) if c["noise"] is None else c["noise"][0]
                           for c in chunks])}
    if "task" in chunks[0]["batch"]:
        arrays["task"] = np.array([c["batch"]["task"][0] for c in chunks])
    if "image" in chunks[0]["batch"]:
        arrays["image"] = np.concatenate([c["batch"]["image"] for c in chunks])
    np.savez_compressed(path, **arrays)


def _metrics(cfg: RobotRunConfig, out: Path, episodes: list[dict[str, Any]], wall: float, write_json: Any
             ) -> dict[str, Any]:
    done = [e for e in episodes if e["success"] is not None]
    safety: dict[str, int] = {}
    for e in episodes:
        for k, v in e["safety"].items():
            safety[k] = safety.get(k, 0) + v
    metrics = {"episodes": episodes, "success_rate": (sum(e["success"] for e in done) / len(done)) if done else None,
               "successes": [e["success"] for e in episodes], "safety": safety,
               "interventions": sum(e["interventions"] for e in episodes),
               "hold_steps": sum(e["hold_steps"] for e in episodes), "robot": cfg.robot,
               "policy": cfg.url or cfg.checkpoint, "mode": cfg.loop.mode, "rate_hz": cfg.loop.rate_hz,
               "seed": cfg.seed, "wall_time_s": wall}
    write_json(out / "metrics.json", metrics)
    return metrics


@dataclass
class RobotBenchConfig:
    """Schema of ``configs/robot_bench.yaml`` (see ``embodied.bridge.latency``)."""

    url: str = ""  # bench this policy server (ws://HOST:PORT) instead of a local constant-policy one
    requests: int = 500  # round trips timed per observation kind
    loop_steps: int = 250  # control-loop steps; 0: no loop
    rate_hz: float = 50.0  # the control loop's rate
    state_dim: int = 39
    action_dim: int = 7
    image_size: int = 224  # side of the two camera images (pixels)
    horizon: int = 8  # actions per chunk of the constant policy
    out: str = ""  # also write the results to this JSON file (metrics.json is always written)

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if self.loop_steps and not 0 < self.rate_hz <= 2000:
            raise ValueError(f"rate_hz must be in (0, 2000] for the control loop (loop_steps=0 skips it), "
                             f"got {self.rate_hz}")
        small = {k: v for k, v in (("state_dim", self.state_dim), ("action_dim", self.action_dim),
                                   ("image_size", self.image_size), ("horizon", self.horizon)) if v < 1}
        if small:
            raise ValueError(f"{', '.join(f'{k}={v}' for k, v in small.items())}: must be >= 1")


def bench_bridge(cfg: RobotBenchConfig, out: Path) -> dict[str, Any]:
    """Round-trip latency and loop jitter (``embodied.bridge.latency.measure``), printed and written
    to ``out/metrics.json`` (and ``cfg.out`` when given)."""
    from embodied.bridge.latency import measure, summary_lines
    from embodied.runtime.evaluate import write_json

    res = measure(cfg.url, cfg.requests, cfg.loop_steps, cfg.rate_hz, cfg.state_dim, cfg.action_dim, cfg.image_size,
                  cfg.horizon)
    for line in summary_lines(res):
        print(line)
    write_json(out / "metrics.json", res)
    if cfg.out:
        write_json(cfg.out, res)
    return res
