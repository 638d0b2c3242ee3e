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
``url=``), prints one line per measurement and writes ``metrics.json``. With ``clients=N`` it
runs ``bench_fleet`` instead: N simulated robots against one server (``embodied.bridge.fleet``),
once with ``max_batch=1`` (one request at a time) and once batched, in the same run.
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
    """Schema of ``configs/robot_bench.yaml`` (see ``embodied.bridge.latency`` and ``embodied.bridge.fleet``)."""

    url: str = ""  # bench this policy server (ws://HOST:PORT) instead of a local one
    requests: int = 500  # round trips timed per observation kind
    loop_steps: int = 250  # control-loop steps; 0: no loop
    rate_hz: float = 50.0  # the control loop's rate
    state_dim: int = 39
    action_dim: int = 7
    image_size: int = 224  # side of the two camera images (pixels)
    horizon: int = 8  # actions per chunk of the constant policy
    out: str = ""  # also write the results to this JSON file (metrics.json is always written)
    # clients >= 1: N simulated robots against one server (embodied.bridge.fleet) instead of the above
    clients: int = 0
    checkpoint: str = ""  # clients: serve this checkpoint (its tasks' simulated robots); "": a constant policy
    device: str = "auto"  # clients + checkpoint: the server's torch device
    duration_s: float = 20.0  # clients: seconds of driving per server setting
    saturate_s: float = 5.0  # clients: seconds of back-to-back requests per setting (chunks/s); 0: skip
    max_batch: int = 8  # clients: the batched server's setting (compared with max_batch=1)
    max_wait_ms: float = 2.0  # clients: the batched server's wait budget
    rounds: int = 2  # clients: turns that alternate the settings (duration_s and saturate_s are split over them)

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if (self.loop_steps or self.clients) and not 0 < self.rate_hz <= 2000:
            raise ValueError(f"rate_hz must be in (0, 2000] for the control loop (loop_steps=0 skips it), "
                             f"got {self.rate_hz}")
        small = {k: v for k, v in (("state_dim", self.state_dim), ("action_dim", self.action_dim),
                                   ("image_size", self.image_size), ("horizon", self.horizon)) if v < 1}
        if small:
            raise ValueError(f"{', '.join(f'{k}={v}' for k, v in small.items())}: must be >= 1")
        if self.clients < 0 or self.clients > 256:
            raise ValueError(f"clients must be in 0..256 (0: the one-client latency bench), got {self.clients}")
        if self.clients and not 0 < self.duration_s <= 3600:
            raise ValueError(f"duration_s must be in (0, 3600] with clients, got {self.duration_s}")
        if not 1 <= self.rounds <= 100:
            raise ValueError(f"rounds must be in 1..100, got {self.rounds}")
        if not 0 <= self.saturate_s <= 3600:
            raise ValueError(f"saturate_s must be in [0, 3600] (0: no throughput run), got {self.saturate_s}")
        if self.checkpoint and not self.clients:
            raise ValueError("checkpoint= is served for clients=N (N simulated robots); the one-client bench "
                             "measures the bridge with a constant policy or url=")
        if self.checkpoint and self.url:
            raise ValueError(f"give checkpoint= (served here) or url= (a running server), not both; got "
                             f"checkpoint={self.checkpoint!r}, url={self.url!r}")
        from embodied.bridge.batching import check_batching

        check_batching(self.max_batch, self.max_wait_ms)


def bench_bridge(cfg: RobotBenchConfig, out: Path) -> dict[str, Any]:
    """Round-trip latency and loop jitter (``embodied.bridge.latency.measure``), or with ``clients``
    the fleet (``bench_fleet``); printed and written to ``out/metrics.json`` (and ``cfg.out`` when given)."""
    from embodied.bridge.latency import measure, summary_lines
    from embodied.runtime.evaluate import write_json

    if cfg.clients:
        res, lines = bench_fleet(cfg)
    else:
        res = measure(cfg.url, cfg.requests, cfg.loop_steps, cfg.rate_hz, cfg.state_dim, cfg.action_dim,
                      cfg.image_size, cfg.horizon)
        lines = summary_lines(res)
    for line in lines:
        print(line, flush=True)
    write_json(out / "metrics.json", res)
    if cfg.out:
        write_json(cfg.out, res)
    return res


def _fleet_robots(meta: dict[str, Any], n: int) -> tuple[list[Any], list[str | None]]:
    """N robots for the served policy: simulated robots of its tasks (in turn), or instant robots
    (a constant policy: the bridge alone)."""
    from embodied.bridge.latency import InstantRobot

    tasks = list(meta.get("tasks") or [])
    if not tasks:
        return [InstantRobot(meta["state_dim"], meta["action_dim"]) for _ in range(n)], [None] * n
    from embodied.core.robot import SimRobot

    kw: dict[str, Any] = {"obs_mode": meta.get("obs_mode", "state")}
    if kw["obs_mode"] != "state":
        kw.update(image_size=meta["image_size"], cameras=list(meta["cameras"]))
    names = [tasks[k % len(tasks)] for k in range(n)]
    return [SimRobot(t, **kw) for t in names], names


def _start_servers(cfg: RobotBenchConfig, settings: list[tuple[int, float]]) -> tuple[Any, list[str], dict]:
    """The server process (``embodied.runtime.serve.serve_settings``): (process, URLs, metadata)."""
    import subprocess

    cmd = [sys.executable, "-m", "embodied.runtime.serve", cfg.checkpoint, cfg.device, str(cfg.state_dim),
           str(cfg.action_dim), str(cfg.horizon), *(f"{b}:{w}" for b, w in settings)]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        child.wait(timeout=30)
        raise RuntimeError(f"the bench's policy server exited with status {child.returncode} before listening "
                           "(its error is above)")
    info = json.loads(line)
    return child, info["urls"], info["metadata"]


def bench_fleet(cfg: RobotBenchConfig) -> tuple[dict[str, Any], list[str]]:
    """``cfg.clients`` robots at ``cfg.rate_hz`` against one server, with ``max_batch=1`` and batched.

    ``embodied.bridge.fleet.drive`` (round trips, late-chunk interventions) for ``duration_s``
    per setting, then ``saturate`` (chunks/s) for ``saturate_s`` per setting; each in
    ``rounds`` turns that alternate the settings, so a load that drifts (other jobs on the
    machine) weighs on both alike. Against ``url=`` only that server is measured.
    """
    from embodied.bridge.client import RemotePolicy
    from embodied.bridge.fleet import drive, drive_summary, saturate, saturate_summary
    from embodied.core.policy import stack_history

    settings = [(1, 0.0), (cfg.max_batch, cfg.max_wait_ms)]
    child = None
    loop_log = logging.getLogger("embodied.bridge.loop")
    level = loop_log.level
    loop_log.setLevel(logging.ERROR)  # each episode's end is a hold: counted, not logged once per robot
    try:
        if cfg.url:
            probe = RemotePolicy(cfg.url, timeout_s=30)
            urls, meta = [cfg.url], dict(probe.metadata)
            probe.close()
            names = [f"server at {cfg.url}"]
        else:
            child, urls, meta = _start_servers(cfg, settings)
            names = ["max_batch=1", f"max_batch={cfg.max_batch}, max_wait_ms={cfg.max_wait_ms:g}"]
        robots, tasks = _fleet_robots(meta, cfg.clients)
        drives: dict[str, list[Any]] = {n: [] for n in names}
        for _ in range(cfg.rounds):
            for name, url in zip(names, urls):
                drives[name].append(drive(url, robots, cfg.rate_hz, cfg.duration_s / cfg.rounds, tasks))
        results = {n: drive_summary(runs, cfg.rate_hz) for n, runs in drives.items()}
        if cfg.saturate_s:
            batches = []
            for r, task in zip(robots, tasks):
                with r:
                    obs = dict(r.get_observation())
                if task:
                    obs["task"] = task
                batches.append(stack_history([obs] * max(1, int(meta["n_obs_steps"]))))
            sats: dict[str, list[Any]] = {n: [] for n in names}
            for _ in range(cfg.rounds):
                for name, url in zip(names, urls):
                    sats[name].append(saturate(url, batches, cfg.saturate_s / cfg.rounds))
            for n, runs in sats.items():
                results[n]["saturated"] = saturate_summary(runs)
    finally:
        loop_log.setLevel(level)
        if child is not None:
            child.terminate()
            child.wait(timeout=30)
    out: dict[str, Any] = {"clients": cfg.clients, "rate_hz": cfg.rate_hz, "duration_s": cfg.duration_s,
                           "saturate_s": cfg.saturate_s, "rounds": cfg.rounds,
                           "policy": cfg.checkpoint or cfg.url or "constant", "settings": results}
    if len(results) == 2:
        one, many = results.values()
        ratios = {"round_trip_p50": many["round_trip"]["p50_ms"] / one["round_trip"]["p50_ms"],
                  "round_trip_p99": many["round_trip"]["p99_ms"] / one["round_trip"]["p99_ms"]}
        if cfg.saturate_s:
            ratios["chunks_per_s"] = many["saturated"]["chunks_per_s"] / one["saturated"]["chunks_per_s"]
        out["batched_over_one_at_a_time"] = ratios
    return out, fleet_lines(out)


def fleet_lines(res: dict[str, Any]) -> list[str]:
    """What ``embodied robot bench clients=N`` prints: one line per setting, then the ratios."""
    lines = [f"{res['clients']} robots at {res['rate_hz']:g} Hz against one server ({res['policy']}), "
             f"{res['duration_s']:g} s driving and {res['saturate_s']:g} s saturated per setting, "
             f"in {res['rounds']} alternating rounds:"]
    for name, r in res["settings"].items():
        rt, line = r["round_trip"], f"  {name:<28}"
        line += (f" round trip p50 {rt['p50_ms']:6.1f} ms  p99 {rt['p99_ms']:6.1f} ms ({rt['n']} chunks;"
                 f" server p50 {r['server']['p50_ms']:.1f} p99 {r['server']['p99_ms']:.1f} ms,"
                 f" {r['rows_per_pass']:.1f} rows/pass);"
                 f" late-chunk interventions {r['late_chunk_interventions']}"
                 f" (all: {sum(r['interventions'].values())}, overruns {r['overruns']})")
        if "saturated" in r:
            s = r["saturated"]
            line += (f"; saturated {s['chunks_per_s']:6.1f} chunks/s (p50 {s['round_trip']['p50_ms']:.1f} ms,"
                     f" {s['rows_per_pass']:.1f} rows/pass)")
        if r["errors"]:
            line += f"; ERRORS: {r['errors']}"
        lines.append(line)
    if "batched_over_one_at_a_time" in res:
        q = res["batched_over_one_at_a_time"]
        line = (f"  batched / one at a time:     round trip p50 x{q['round_trip_p50']:.2f}, "
                f"p99 x{q['round_trip_p99']:.2f}")
        if "chunks_per_s" in q:
            line += f"; chunks/s x{q['chunks_per_s']:.2f}"
        lines.append(line)
    return lines
