"""Many robots against one policy server: round trips, late chunks and the server's throughput.

Measured by ``embodied robot bench clients=N`` (``embodied.runtime.robot.bench_fleet`` starts
the server and makes the robots). Two measurements against one ``url``:

- ``drive``: each robot runs its own ``ControlLoop`` (realtime mode at ``rate_hz``) over its own
  connection, in its own thread, episode after episode for ``duration_s``. Reported: every
  chunk request's round trip (p50/p99, as the robot sees it: request sent to chunk in hand),
  the control steps held because no action was there in time (a chunk late, a request failed,
  the server lost: the safety interventions caused by late chunks), all interventions by kind,
  and overruns of the loops' schedule.
- ``saturate``: each client sends requests back to back, for ``seconds``: the chunks per second
  the server delivers to N clients at once (its throughput), and the rows per forward pass it
  reports in ``server_timing``.

Robot side: numpy, the bridge and the ``Robot`` objects passed in; no torch.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from embodied.bridge.client import RemotePolicy
from embodied.bridge.loop import ControlLoop, LoopConfig
from embodied.core.robot import Robot

LATE = ("no action", "policy server connection lost")  # hold reasons of a step that had no chunk action in time


def _pct(ms: Sequence[float]) -> dict[str, float]:
    if not len(ms):
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan"), "n": 0}
    a = np.asarray(ms, np.float64)
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max()),
            "n": int(len(a))}


class _TimedRemote(RemotePolicy):
    """A ``RemotePolicy`` that keeps the server's timing of each chunk (queue + forward pass, rows in it)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.server_ms: list[float] = []
        self.rows: list[float] = []

    def predict_chunk(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None,
                      timeout_s: float | None = None) -> np.ndarray:
        chunk = super().predict_chunk(obs_batch, noise, timeout_s)
        t = self.last_timing
        self.server_ms.append(float(t.get("queue_ms", 0.0)) + float(t.get("infer_ms", 0.0)))
        self.rows.append(float(t.get("batch_rows", 1)))
        return chunk


def _rows_per_pass(rows: Sequence[float]) -> float:
    """Mean rows per forward pass from the rows of the pass each (one-row) request rode in."""
    return len(rows) / sum(1 / r for r in rows) if len(rows) else float("nan")


def _drive_one(url: str, robot: Robot, task: str | None, cfg: LoopConfig, end: float, max_episode_steps: int,
               seed: int, out: dict[str, Any]) -> None:
    """One robot's episodes until ``end``; what happened goes into ``out``."""
    late, kinds = Counter(), Counter()

    def on_step(obs: Any, wanted: Any, sent: Any, info: Mapping[str, Any]) -> None:
        hold = str(info.get("hold", ""))
        if hold.startswith(LATE):
            late[hold] += 1
        for k in info.get("interventions", ()):
            kinds[k] += 1

    requests_ms: list[float] = []
    events: Counter = Counter()
    steps = episodes = 0
    policy = _TimedRemote(url, timeout_s=cfg.request_timeout_s, connect_timeout_s=30)
    try:
        with robot:
            loop = ControlLoop(robot, policy, cfg, on_step=on_step)
            try:
                while (left := end - time.monotonic()) > 0:
                    if hasattr(robot, "reset"):
                        robot.reset(seed=seed + episodes)
                    n = max(1, min(max_episode_steps, int(left * cfg.rate_hz)))
                    report = loop.run_episode(n, task=task)
                    steps, episodes = steps + report.steps, episodes + 1
                    requests_ms += report.requests_ms
                    events.update(report.events)
            finally:
                loop.close()
    except Exception as e:  # reported, not raised: the other robots' figures still count
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        policy.close()
    out.update(steps=steps, episodes=episodes, requests_ms=requests_ms, late=dict(late), kinds=dict(kinds),
               events=dict(events), server_ms=policy.server_ms, rows=policy.rows)


@dataclass
class Run:
    """The raw record of one ``drive`` or ``saturate`` run: wall time and one dict per robot/client."""

    wall_s: float
    outs: list[dict[str, Any]] = field(default_factory=list)


def drive(url: str, robots: Sequence[Robot], rate_hz: float, duration_s: float, tasks: Sequence[str | None] = (),
          max_episode_steps: int = 100_000, seed: int = 100_000, loop: LoopConfig | None = None) -> Run:
    """``len(robots)`` control loops at ``rate_hz`` against ``url`` for ``duration_s`` (see the module
    docstring); ``drive_summary`` turns one or more runs into figures.

    Robot ``k`` runs task ``tasks[k]`` (None: none given) from seed ``seed + 1000 k`` on.
    """
    cfg = loop or LoopConfig(rate_hz=rate_hz, mode="realtime")
    outs: list[dict[str, Any]] = [{} for _ in robots]
    end = time.monotonic() + duration_s
    threads = [threading.Thread(target=_drive_one, name=f"robot-{k}", daemon=True,
                                args=(url, r, tasks[k] if k < len(tasks) else None, cfg, end, max_episode_steps,
                                      seed + 1000 * k, outs[k]))
               for k, r in enumerate(robots)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration_s + 60)
    return Run(time.monotonic() - t0, outs)


def drive_summary(runs: Sequence[Run], rate_hz: float) -> dict[str, Any]:
    """Round trips (client and server side), late-chunk interventions and the rest, pooled over ``runs``."""
    outs = [o for r in runs for o in r.outs]
    wall = sum(r.wall_s for r in runs)
    late, kinds, events = Counter(), Counter(), Counter()
    for o in outs:
        late.update(o.get("late", {}))
        kinds.update(o.get("kinds", {}))
        events.update(o.get("events", {}))
    chunks = sum(len(o.get("requests_ms", ())) for o in outs)
    return {"robots": len(runs[0].outs) if runs else 0, "rate_hz": rate_hz, "wall_s": wall,
            "steps": sum(o.get("steps", 0) for o in outs), "episodes": sum(o.get("episodes", 0) for o in outs),
            "chunks": chunks, "chunks_per_s": chunks / wall if wall else 0.0,
            "round_trip": _pct([ms for o in outs for ms in o.get("requests_ms", ())]),
            "server": _pct([ms for o in outs for ms in o.get("server_ms", ())]),
            "rows_per_pass": _rows_per_pass([r for o in outs for r in o.get("rows", ())]),
            "late_chunk_interventions": int(sum(late.values())), "late_reasons": dict(late),
            "interventions": dict(kinds), "request_failures": int(events.get("request_failures", 0)),
            "overruns": int(events.get("overruns", 0)), "errors": [o["error"] for o in outs if "error" in o]}


def saturate(url: str, batches: Sequence[Mapping[str, Any]], seconds: float) -> Run:
    """One client per batch in ``batches`` (B=1 observation batches), each sending it back to back for
    ``seconds``; ``saturate_summary`` gives chunks/s, round trips and rows per forward pass."""
    outs: list[dict[str, Any]] = [{"ms": [], "rows": []} for _ in batches]
    policies = [RemotePolicy(url, timeout_s=30) for _ in batches]
    for p, b in zip(policies, batches):
        p.predict_chunk(b)  # connected and warm before the clock starts
    start = threading.Barrier(len(batches) + 1)
    end = time.monotonic() + 3600.0

    def client(k: int) -> None:
        p, b, o = policies[k], batches[k], outs[k]
        start.wait()
        while time.monotonic() < end:
            t = time.perf_counter()
            p.predict_chunk(b)
            o["ms"].append((time.perf_counter() - t) * 1000)
            o["rows"].append(float(p.last_timing.get("batch_rows", 1)))

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(len(batches))]
    for t in threads:
        t.start()
    end = time.monotonic() + seconds
    t0 = time.monotonic()
    start.wait()
    for t in threads:
        t.join(seconds + 60)
    wall = time.monotonic() - t0
    for p in policies:
        p.close()
    return Run(wall, outs)


def saturate_summary(runs: Sequence[Run]) -> dict[str, Any]:
    outs = [o for r in runs for o in r.outs]
    wall = sum(r.wall_s for r in runs)
    chunks = sum(len(o["ms"]) for o in outs)
    return {"clients": len(runs[0].outs) if runs else 0, "seconds": wall, "chunks": chunks,
            "chunks_per_s": chunks / wall if wall else 0.0, "round_trip": _pct([ms for o in outs for ms in o["ms"]]),
            "rows_per_pass": _rows_per_pass([r for o in outs for r in o["rows"]])}
