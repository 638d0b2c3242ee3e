"""The control loop: a policy drives a ``Robot`` at a fixed rate, through the safety layer.

Each control step: read the observation, take the step's action from the chunk
schedule, pass it through ``SafetyLayer.filter`` and send it; then sleep until the next
tick (an absolute schedule: a late step is counted as an overrun, and the schedule
restarts from it instead of rushing to catch up).

Two modes:

- ``realtime``: the next chunk is requested asynchronously (a worker thread) when
  ``prefetch_steps`` actions of the current chunk are left, with the observation history
  of that step. When it arrives its actions for steps already past are dropped and the
  first ``blend_steps`` are cross-faded with the old chunk's. While a request is late,
  the current chunk's actions run on past ``n_action_steps`` up to its horizon H.
- ``lockstep``: the chunk is requested when the queue is empty and the loop waits for it,
  exactly as ``Policy.act`` does; given the same robot and noise it reproduces ``Policy.act``
  step for step (what ``embodied robot run`` compares with ``embodied eval``).

Fail closed: when there is no valid action for a step (no chunk yet, a chunk used up, a
refused action, a lost policy server, an e-stop), the robot is put in its safe state
(``Robot.safe_action``, taken once when the hold begins and repeated every step). A
watchdog thread does the same if the loop itself stops commanding the robot for
``watchdog_periods`` control periods. On leaving ``run_episode`` in any way (the end, an
exception, Ctrl-C) the robot is left in its safe state.
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from embodied.bridge.client import RemotePolicy
from embodied.bridge.safety import EStop, SafetyConfig, SafetyLayer
from embodied.core.errors import EmbodiedError
from embodied.core.policy import Policy, check_chunk, stack_history
from embodied.core.robot import Robot, RobotCommunicationError

log = logging.getLogger("embodied.bridge.loop")
MODES = ("realtime", "lockstep")


class LoopConfigError(EmbodiedError, ValueError):
    """A control-loop setting that cannot be used."""


@dataclass
class LoopConfig:
    """Schema of the loop settings of ``configs/robot.yaml``.

    Attributes:
        rate_hz: control rate; 0 runs steps back to back (lockstep in simulation only: no watchdog).
        mode: ``realtime`` or ``lockstep`` (see the module docstring).
        prefetch_steps: realtime: request the next chunk when this many actions are left.
        blend_steps: realtime: steps over which a new chunk is cross-faded in.
        request_timeout_s: how long one chunk request may take before it counts as failed.
        watchdog_periods: the watchdog holds the robot after this many periods without a command.
        noise_seed: None: the server chooses the noise; an int: the loop draws each request's
            noise from a generator with this seed and sends it (reproducible runs).
    """

    rate_hz: float = 50.0
    mode: str = "realtime"
    prefetch_steps: int = 2
    blend_steps: int = 2
    request_timeout_s: float = 2.0
    watchdog_periods: float = 1.5
    noise_seed: int | None = None
    safety: SafetyConfig = field(default_factory=SafetyConfig)

    def __post_init__(self) -> None:
        if isinstance(self.safety, dict):
            self.safety = SafetyConfig(**self.safety)
        if self.mode not in MODES:
            raise LoopConfigError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.rate_hz < 0 or self.rate_hz > 2000:
            raise LoopConfigError(f"rate_hz must be in [0, 2000] (0: steps back to back), got {self.rate_hz}")
        if self.rate_hz == 0 and self.mode == "realtime":
            raise LoopConfigError("rate_hz=0 (steps back to back) needs mode=lockstep: in realtime mode the "
                                  "asynchronous chunk requests would never arrive in time")
        if self.prefetch_steps < 0 or self.blend_steps < 0:
            raise LoopConfigError(f"prefetch_steps and blend_steps must be >= 0, got {self.prefetch_steps}, "
                                  f"{self.blend_steps}")
        if self.request_timeout_s <= 0:
            raise LoopConfigError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.watchdog_periods < 1:
            raise LoopConfigError(f"watchdog_periods must be >= 1, got {self.watchdog_periods}")


def _sleep_until(deadline: float, delay: float) -> None:
    """Sleep, then spin the last half millisecond (a plain sleep overshoots by the OS's timer slack)."""
    if delay > 0.0015:
        time.sleep(delay - 0.0005)
    while time.monotonic() < deadline:
        pass


class ChunkSchedule:
    """Which action to run at each step, from the chunks received so far.

    A chunk planned from the observation of step ``t0`` holds the actions of steps
    ``t0 .. t0 + H - 1``. The newest chunk rules; for ``blend`` steps after it takes over
    its actions are mixed with the previous chunk's for the same steps (weights moving
    linearly towards the new one).
    """

    def __init__(self, horizon: int, n_action_steps: int, blend: int = 0):
        self.horizon, self.n_action_steps, self.blend = int(horizon), int(n_action_steps), int(blend)
        self.cur: tuple[np.ndarray, int] | None = None
        self.prev: tuple[np.ndarray, int, int] | None = None  # chunk, t0, step it was replaced at

    def clear(self) -> None:
        self.cur = self.prev = None

    def accept(self, chunk: np.ndarray, t0: int, now: int) -> bool:
        """Take ``chunk`` (H, Da) planned at step ``t0`` from step ``now`` on; False if all of it is past."""
        if now - t0 >= self.horizon:
            return False
        if self.cur is not None and self.blend:
            self.prev = (self.cur[0], self.cur[1], now)
        self.cur = (np.asarray(chunk, np.float32), int(t0))
        return True

    def left(self, t: int) -> int:
        """Actions of the current chunk's first ``n_action_steps`` not yet run at step ``t`` (0 with none)."""
        return 0 if self.cur is None else max(0, self.n_action_steps - (t - self.cur[1]))

    def action(self, t: int) -> np.ndarray | None:
        """The action of step ``t``, or None when no chunk covers it."""
        if self.cur is None:
            return None
        chunk, t0 = self.cur
        i = t - t0
        if not 0 <= i < len(chunk):
            return None
        a = chunk[i]
        if self.prev is not None:
            old, t0_old, switched = self.prev
            k, j = t - switched, t - t0_old
            if 0 <= k < self.blend and 0 <= j < len(old):
                w = (k + 1) / (self.blend + 1)
                a = (1 - w) * old[j] + w * a
            elif k >= self.blend:
                self.prev = None
        return np.asarray(a, np.float32)


@dataclass
class EpisodeReport:
    """What happened in one episode (JSON-ready through ``to_dict``)."""

    steps: int = 0
    success: bool | None = None
    ended_by: str = ""  # done | max_steps | estop | error
    safety: dict[str, int] = field(default_factory=dict)
    events: Counter = field(default_factory=Counter)  # holds, chunks, stale chunks, failures...
    periods_ms: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    requests_ms: list[float] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)  # with record_chunks: batch, noise, chunk
    hold_steps: int = 0
    interventions: int = 0

    def timing(self, rate_hz: float) -> dict[str, Any]:
        """Period mean/p50/p99/max, jitter (|period - nominal|) p50/p99/max, overruns, request round trips."""
        out: dict[str, Any] = {}
        if self.periods_ms:
            p = np.asarray(self.periods_ms)
            out.update(period_ms_mean=float(p.mean()), period_ms_p50=float(np.percentile(p, 50)),
                       period_ms_p99=float(np.percentile(p, 99)), period_ms_max=float(p.max()))
            if rate_hz > 0:
                j = np.abs(p - 1000.0 / rate_hz)
                out.update(jitter_ms_p50=float(np.percentile(j, 50)), jitter_ms_p99=float(np.percentile(j, 99)),
                           jitter_ms_max=float(j.max()), jitter_ms_std=float(p.std()))
        if self.step_ms:
            out["step_ms_p99"] = float(np.percentile(self.step_ms, 99))
        if self.requests_ms:
            r = np.asarray(self.requests_ms)
            out.update(request_ms_p50=float(np.percentile(r, 50)), request_ms_p99=float(np.percentile(r, 99)))
        return out

    def to_dict(self, rate_hz: float = 0.0) -> dict[str, Any]:
        return {"steps": self.steps, "success": self.success, "ended_by": self.ended_by,
                "safety": dict(self.safety), "events": dict(self.events), "hold_steps": self.hold_steps,
                "interventions": self.interventions, "timing": self.timing(rate_hz)}


StepCallback = Callable[[Mapping[str, Any], "np.ndarray | None", np.ndarray, dict[str, Any]], None]


class ControlLoop:
    """Run ``policy`` on ``robot`` (see the module docstring).

    Args:
        robot: a connected ``Robot`` that defines ``safe_action``.
        policy: any ``Policy`` (a ``RemotePolicy`` is also watched for a lost connection).
        config: rate, mode and safety settings.
        estop: shared e-stop (a new one by default; ``loop.estop.trigger()`` from anywhere).
        on_step: called after each step with (observation, policy action or None when
            holding, action sent, info: step, intervention kinds, hold reason, timing).
    """

    def __init__(self, robot: Robot, policy: Policy, config: LoopConfig | None = None,
                 estop: EStop | None = None, on_step: StepCallback | None = None, record_chunks: bool = False):
        self.robot, self.policy = robot, policy
        self.config = config or LoopConfig()
        self.estop = estop or EStop()
        self.on_step = on_step
        self.record_chunks = record_chunks
        self.safety = SafetyLayer(self.config.safety, robot.action_spec)
        self.period = 1.0 / self.config.rate_hz if self.config.rate_hz > 0 else 0.0
        self._send_lock = threading.Lock()
        self._last_command = time.monotonic()
        self._hold_action: np.ndarray | None = None
        self._last_sent: np.ndarray | None = None
        self._watchdog_trips = 0
        self._retry_at = 0.0
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chunk-request")
        self._rng = np.random.default_rng(self.config.noise_seed) if self.config.noise_seed is not None else None
        self.hold_log: deque[tuple[float, str]] = deque(maxlen=256)  # (monotonic time, reason) of each hold start

    # ---------------------------------------------------------------- robot commands
    def _send(self, action: np.ndarray) -> np.ndarray | None:
        """Send a policy action; None (nothing sent) when the policy server's connection is lost by now."""
        with self._send_lock:
            if self._connection_lost():  # checked under the lock the watchdog's hold also takes
                return None
            self._hold_action = None
            sent = np.asarray(self.robot.send_action(action), np.float32)
            self._last_command = time.monotonic()
            self._last_sent = sent
            return sent

    def _begin_hold(self, reason: str, report: EpisodeReport | None) -> None:
        if self._hold_action is None:
            self._hold_action = np.asarray(self.robot.safe_action(), np.float32)
            self.hold_log.append((time.monotonic(), reason))
            log.warning("holding the robot: %s", reason)
            if report is not None:
                report.events[f"hold:{reason.split(':')[0]}"] += 1

    def hold_now(self, reason: str, report: EpisodeReport | None = None) -> np.ndarray:
        """Put the robot in its safe state at once (from any thread); returns what the robot was sent."""
        with self._send_lock:
            self._begin_hold(reason, report)
            assert self._hold_action is not None
            self._last_sent = np.asarray(self.robot.send_action(self._hold_action), np.float32)
            self._last_command = time.monotonic()
            return self._last_sent

    def _watchdog(self, stop: threading.Event, report: EpisodeReport) -> None:
        """Every quarter period: hold the robot when the policy server's connection is lost (without
        waiting for the loop's next tick), or when no command was sent for ``watchdog_periods``."""
        limit = self.config.watchdog_periods * self.period
        while not stop.wait(self.period / 4):
            if self._hold_action is None and self._connection_lost():
                try:
                    self.hold_now("policy server connection lost", report)
                except Exception as e:
                    log.error("watchdog could not command the robot: %s", e)
            elif time.monotonic() - self._last_command > limit:
                self._watchdog_trips += 1
                try:
                    self.hold_now(f"watchdog: no command for {limit * 1000:.0f} ms")
                except Exception as e:  # the robot itself failed: nothing more this thread can do
                    log.error("watchdog could not command the robot: %s", e)

    # ---------------------------------------------------------------- chunks
    def _noise(self) -> np.ndarray | None:
        shape = getattr(self.policy.unwrapped, "noise_shape", None)
        if self._rng is None or shape is None:
            return None
        return self._rng.standard_normal((1, *shape)).astype(np.float32)

    def _request(self, history: deque, t: int, report: EpisodeReport) -> tuple:
        batch = stack_history(list(history))
        noise = self._noise()
        report.events["chunks_requested"] += 1
        start = time.monotonic()
        timeout = self.config.request_timeout_s

        def call() -> tuple[np.ndarray, float]:
            if isinstance(self.policy, RemotePolicy):
                chunk = self.policy.predict_chunk(batch, noise, timeout_s=timeout)
            else:
                chunk = self.policy.predict_chunk(batch, noise)
            return check_chunk(chunk, 1)[0], (time.monotonic() - start) * 1000

        return self._pool.submit(call), t, batch, noise, start

    def _connection_lost(self) -> bool:
        return getattr(self.policy, "connected", True) is False

    # ---------------------------------------------------------------- the loop
    def run_episode(self, max_steps: int, instruction: str | None = None, task: str | None = None) -> EpisodeReport:
        """Run until the robot says ``done``, ``max_steps`` steps, or an e-stop; the robot ends in its safe state.

        ``instruction`` replaces the observation's (a hardware robot has none of its own);
        ``task`` is added to each observation (what ``embodied eval`` gives a policy too).
        """
        if max_steps < 1:
            raise LoopConfigError(f"max_steps must be >= 1, got {max_steps}")
        if not self.robot.is_connected:
            raise LoopConfigError("the robot is not connected: connect() it (or use `with robot:`) first")
        start = np.asarray(self.robot.safe_action(), np.float32)  # no safe state: NotImplementedError, no motion
        if self._connection_lost():
            raise LoopConfigError("the policy server is not reachable: not enabling motion")
        cfg, report = self.config, EpisodeReport()
        self.policy.reset()
        self.safety.counts.clear()
        history: deque = deque(maxlen=max(1, self.policy.n_obs_steps))
        schedule = ChunkSchedule(self.policy.horizon, self.policy.n_action_steps, cfg.blend_steps
                                 if cfg.mode == "realtime" else 0)
        pending: tuple | None = None
        # max_delta counts from the safe state: the first command moves at most max_delta from holding still
        self._hold_action, self._last_sent, self._retry_at, self._watchdog_trips = None, start, 0.0, 0
        stop_watchdog = threading.Event()
        # the objects that exist now (a policy process holds hundreds of thousands: torch, the model) leave the
        # collector's generations for the episode, so a full collection scans only what the episode allocates
        # instead of stopping every thread, the watchdog's too, for tens to hundreds of milliseconds
        gc.freeze()
        if self.period > 0:
            self._last_command = time.monotonic()
            threading.Thread(target=self._watchdog, args=(stop_watchdog, report), name="watchdog", daemon=True).start()
        next_tick = time.monotonic()
        last_tick: float | None = None
        try:
            for t in range(max_steps):
                tick = time.monotonic()
                if last_tick is not None:
                    report.periods_ms.append((tick - last_tick) * 1000)
                last_tick = tick
                obs = self._observe(history, instruction, task, report)
                if obs is None:  # the robot did not answer: held, try again next tick
                    next_tick = self._wait_tick(next_tick, report)
                    continue
                if self.estop.triggered:
                    self._step_hold(obs, f"estop: {self.estop.reason}", report, t)
                    report.ended_by = "estop"
                    break
                pending = self._chunks(pending, schedule, history, t, report)
                self._command(obs, schedule, pending, t, report, tick)
                if getattr(self.robot, "done", False):
                    report.ended_by = "done"
                    break
                next_tick = self._wait_tick(next_tick, report)
            else:
                report.ended_by = "max_steps"
            report.success = self._success()  # before the safe-state command below moves a simulator on
        except BaseException as e:
            report.ended_by = "error" if not isinstance(e, KeyboardInterrupt) else "interrupted"
            raise
        finally:
            stop_watchdog.set()
            if pending is not None:
                pending[0].cancel()
            try:
                self.hold_now("episode over")
            except Exception as e:
                log.error("could not put the robot in its safe state: %s", e)
            gc.unfreeze()
            report.safety = dict(self.safety.counts)
            report.events["watchdog_trips"] = self._watchdog_trips
        return report

    def _observe(self, history: deque, instruction: str | None, task: str | None,
                 report: EpisodeReport) -> dict[str, Any] | None:
        """The step's observation, pushed into the history (padded at the start); None after a link error."""
        try:
            obs = dict(self.robot.get_observation())
        except RobotCommunicationError as e:
            report.events["robot_comm_errors"] += 1
            self._comm_hold(f"robot link: {e}", report)
            return None
        if instruction is not None:
            obs["instruction"] = instruction
        if task is not None:
            obs["task"] = task
        if not history:
            for _ in range(history.maxlen - 1):  # type: ignore[operator]
                history.append(obs)
        history.append(obs)
        return obs

    def _chunks(self, pending: tuple | None, schedule: ChunkSchedule, history: deque, t: int,
                report: EpisodeReport) -> tuple | None:
        """Collect a chunk that arrived; ask for the next one when the current one is running out."""
        cfg = self.config
        if pending is not None:
            pending = self._collect(pending, schedule, t, report)
        low = cfg.prefetch_steps if cfg.mode == "realtime" else 0
        if pending is None and schedule.left(t) <= low and time.monotonic() >= self._retry_at:
            pending = self._request(history, t, report)
            if cfg.mode == "lockstep" or (schedule.cur is None and t == 0):  # no motion before a first chunk
                pending = self._collect(pending, schedule, t, report, wait=True)
        return pending

    def _command(self, obs: Mapping[str, Any], schedule: ChunkSchedule, pending: tuple | None, t: int,
                 report: EpisodeReport, tick: float) -> None:
        """Send the step's action through the safety layer, or hold the robot when there is none."""
        reason, wanted = "", None
        if self._connection_lost():
            reason = "policy server connection lost"
            schedule.clear()
        else:
            wanted = schedule.action(t)
            if wanted is None:
                reason = "no action: waiting for a chunk" if pending is not None else "no action: no chunk"
        if wanted is not None:
            safe, kinds = self.safety.filter(wanted, obs.get("state"), self._last_sent)
            if safe is None:
                reason = f"refused: {kinds[0]}"
            else:
                try:
                    sent = self._send(safe)
                except RobotCommunicationError as e:
                    report.events["robot_comm_errors"] += 1
                    self._comm_hold(f"robot link: {e}", report)
                    return
                if sent is None:  # the server went away since the check above
                    schedule.clear()
                    return self._hold_step(obs, "policy server connection lost", report, t)
                if kinds or not np.array_equal(sent, wanted):
                    report.interventions += 1
                self._after_step(obs, wanted, sent, {"step": t, "interventions": kinds}, report, tick)
                return
        self._hold_step(obs, reason, report, t)

    def _hold_step(self, obs: Mapping[str, Any], reason: str, report: EpisodeReport, t: int) -> None:
        try:
            self._step_hold(obs, reason, report, t)
        except RobotCommunicationError as e:
            report.events["robot_comm_errors"] += 1
            log.warning("hold command not confirmed: %s", e)

    def _wait_tick(self, next_tick: float, report: EpisodeReport) -> float:
        """Sleep until the next tick of the schedule; returns the tick after it."""
        if self.period <= 0:
            return next_tick
        next_tick += self.period
        delay = next_tick - time.monotonic()
        if delay > 0:
            _sleep_until(next_tick, delay)
            return next_tick
        report.events["overruns"] += 1
        return time.monotonic()

    def _comm_hold(self, reason: str, report: EpisodeReport) -> None:
        """Try to command the safe state after a robot link error (it may fail again)."""
        try:
            with self._send_lock:
                self._begin_hold(reason, report)
                assert self._hold_action is not None
                self.robot.send_action(self._hold_action)
                self._last_command = time.monotonic()
        except RobotCommunicationError as e:
            log.warning("hold command not confirmed: %s", e)

    def _success(self) -> bool | None:
        info = getattr(self.robot, "last_info", None)
        if isinstance(info, Mapping) and "success" in info:
            return bool(info["success"])
        return None

    def _collect(self, pending: tuple, schedule: ChunkSchedule, t: int, report: EpisodeReport,
                 wait: bool = False) -> tuple | None:
        """Take a finished request's chunk into the schedule; the request itself while it is still running."""
        fut, t0, batch, noise, start = pending
        timeout = self.config.request_timeout_s
        if not fut.done() and not wait:
            if time.monotonic() - start <= timeout:
                return pending
            fut.cancel()  # abandoned: its answer would come too late to use
            return self._failed(t, report, f"no answer within {timeout:.2f} s")
        try:
            chunk, ms = fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            return self._failed(t, report, f"no answer within {timeout:.2f} s")
        except Exception as e:  # a refused request, a dead server, a bad chunk: hold and ask again
            first = str(e).splitlines()[0] if str(e) else ""
            return self._failed(t, report, f"{type(e).__name__}: {first}")
        report.requests_ms.append(ms)
        if schedule.accept(chunk, t0, t):
            report.events["chunks_used"] += 1
            if self.record_chunks:
                report.chunks.append({"t0": t0, "batch": batch, "noise": noise, "chunk": chunk})
        else:
            report.events["chunks_stale"] += 1
        return None

    def _failed(self, t: int, report: EpisodeReport, why: str) -> None:
        report.events["request_failures"] += 1
        if self.config.mode == "realtime":  # lockstep asks again at the next step
            self._retry_at = time.monotonic() + max(2 * self.period, 0.02)
        log.warning("chunk request at step %d failed: %s", t, why)
        return None

    def _step_hold(self, obs: Mapping[str, Any], reason: str, report: EpisodeReport, t: int) -> None:
        tick = time.monotonic()
        sent = self.hold_now(reason, report)
        report.hold_steps += 1
        report.interventions += 1
        self._after_step(obs, None, sent, {"step": t, "interventions": ["hold"], "hold": reason}, report, tick)

    def _after_step(self, obs: Mapping[str, Any], wanted: np.ndarray | None, sent: np.ndarray,
                    info: dict[str, Any], report: EpisodeReport, tick: float) -> None:
        report.steps += 1
        ms = (time.monotonic() - tick) * 1000
        report.step_ms.append(ms)
        info["step_ms"] = ms
        log.debug("step %d: %.2f ms%s", info["step"], ms, f" hold ({info['hold']})" if "hold" in info else "")
        if self.on_step is not None:
            self.on_step(obs, wanted, sent, info)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
