"""Request batching for ``PolicyServer``: concurrent clients' requests in one forward pass.

openpi's server, and ours until now, answers one request at a time: eight robots wait in line
for eight forward passes. Here each connection's thread reads and checks its own client's
request (so a client that sends half a message, or a bad one, only ever holds its own
thread), hands it to the ``Batcher`` as a ``Job`` and waits. The batcher's one thread takes
the oldest job, waits up to ``max_wait_ms`` from that job's arrival for others (not at all
once every connected client has a job waiting), up to ``max_batch`` rows, and runs them as
one ``policy.predict_rows`` call. The batcher never touches a socket: each connection sends
its own reply, so a client that stops reading holds up no one (the lesson of the websockets
library's ``broadcast``: never let one peer's writes block the loop that serves the others).

Why ``predict_rows``: a row's chunk must not depend on who else was in the batch. On a CPU,
``TorchPolicy.predict_rows`` gives each row bitwise what ``predict_chunk`` gives it alone
(``RowwisePolicy``, what ``embodied serve`` serves, too); a policy without it is not merged:
its jobs run one ``predict_chunk`` each, since a plain batched call may mix rows.

If a merged pass fails (a chunk with NaN, a policy error), its jobs are run again one by
one, so only the request that causes the error gets it; the others get their chunks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from embodied.core.errors import EmbodiedError
from embodied.core.policy import Policy, check_chunk

log = logging.getLogger("embodied.bridge.batching")
MAX_BATCH_LIMIT = 1024
MAX_WAIT_MS_LIMIT = 1000.0


class BatchingConfigError(EmbodiedError, ValueError):
    """A batching setting that cannot be used (names the setting, the value and what is allowed)."""


class ClientGone(EmbodiedError, ConnectionError):
    """The job's client disconnected before its chunk was computed: the job was dropped."""


class ServerStopping(EmbodiedError, RuntimeError):
    """The server stopped before the job's chunk was computed."""


def check_batching(max_batch: Any, max_wait_ms: Any) -> tuple[int, float]:
    """``(max_batch, max_wait_ms)`` as (int, float); ``BatchingConfigError`` naming what is wrong."""
    if isinstance(max_batch, bool) or not isinstance(max_batch, (int, np.integer)) \
            or not 1 <= max_batch <= MAX_BATCH_LIMIT:
        raise BatchingConfigError(f"max_batch must be an int in 1..{MAX_BATCH_LIMIT} (1: one request per forward "
                                  f"pass, as openpi's server), got {max_batch!r}")
    if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, (int, float, np.number)) \
            or not 0 <= float(max_wait_ms) <= MAX_WAIT_MS_LIMIT:
        raise BatchingConfigError(f"max_wait_ms must be a number in [0, {MAX_WAIT_MS_LIMIT:g}] (how long the first "
                                  f"request of a batch waits for others), got {max_wait_ms!r}")
    return int(max_batch), float(max_wait_ms)


@dataclass
class Job:
    """One client's request on its way through the batcher.

    ``batch``: the request shaped for ``predict_chunk`` (``rows`` rows); ``noise``: (rows, H, Da)
    or None; ``alive``: False once the client is gone (its job is then dropped unrun).
    The batcher sets ``chunk`` (rows, H, Da) float32 or ``error``, and ``timing``.
    """

    batch: dict[str, Any]
    noise: np.ndarray | None
    rows: int
    alive: Callable[[], bool] = lambda: True
    arrived: float = field(default_factory=time.monotonic)
    chunk: np.ndarray | None = None
    error: BaseException | None = None
    timing: dict[str, float] = field(default_factory=dict)
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the job is finished (chunk or error), after waiting up to ``timeout`` seconds."""
        return self._done.wait(timeout)

    def finish(self, chunk: np.ndarray | None = None, error: BaseException | None = None) -> None:
        self.chunk, self.error = chunk, error
        self._done.set()


def merge_batches(batches: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Observation batches with the same keys, concatenated along the rows (B1 + B2 + ...)."""
    out: dict[str, Any] = {}
    for key, first in batches[0].items():
        values = [b[key] for b in batches]
        if isinstance(first, Mapping):
            out[key] = {c: np.concatenate([v[c] for v in values]) for c in first}
        elif isinstance(first, list):
            out[key] = [x for v in values for x in v]
        else:
            out[key] = np.concatenate(values)
    return out


def _signature(job: Job) -> tuple:
    """Jobs with the same signature can share a pass: the same keys (and cameras), noise given or not."""
    b = job.batch
    cams = tuple(sorted(b["images"])) if isinstance(b.get("images"), Mapping) else ()
    return (job.noise is None, tuple(sorted(b)), cams)


class Batcher:
    """Runs ``Job``s through ``policy`` in batches of up to ``max_batch`` rows (see the module docstring).

    Args:
        policy: any ``Policy``; batched when it has ``predict_rows``.
        max_batch: most rows in one forward pass (a request with more rows runs alone).
        max_wait_ms: how long the oldest waiting request may wait for others to join it.
    """

    def __init__(self, policy: Policy, max_batch: int = 8, max_wait_ms: float = 2.0):
        self.max_batch, self.max_wait_ms = check_batching(max_batch, max_wait_ms)
        self.policy = policy
        rows = getattr(policy, "predict_rows", None)
        self._predict_rows: Callable[..., Any] | None = rows if callable(rows) else None
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._clients = 0
        self._closed = False
        self.stats = {"passes": 0, "rows": 0, "jobs": 0, "dropped": 0, "retried_alone": 0}
        self._thread = threading.Thread(target=self._loop, name="policy-batcher", daemon=True)
        self._thread.start()

    @property
    def merges(self) -> bool:
        """Whether requests are merged into one forward pass (the policy has ``predict_rows``)."""
        return self._predict_rows is not None

    # ------------------------------------------------------------------ the connections' side
    def client_joined(self) -> None:
        with self._cond:
            self._clients += 1

    def client_left(self) -> None:
        with self._cond:
            self._clients = max(0, self._clients - 1)
            self._cond.notify()  # the clients still here may all be waiting now

    def submit(self, job: Job) -> Job:
        """Queue ``job``; ``job.wait()`` for its chunk."""
        with self._cond:
            if self._closed:
                job.finish(error=ServerStopping("the policy server is stopping"))
                return job
            self._jobs.append(job)
            self._cond.notify()
        return job

    def close(self) -> None:
        """Stop the batcher; jobs still queued get ``ServerStopping`` (again: nothing)."""
        with self._cond:
            self._closed = True
            left, self._jobs = list(self._jobs), deque()
            self._cond.notify_all()
        for job in left:
            job.finish(error=ServerStopping("the policy server is stopping"))
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    # ------------------------------------------------------------------ the batcher's thread
    def _fitting(self) -> tuple[int, int]:
        """(jobs, rows) of the longest prefix of the queue within ``max_batch`` rows (at least one job)."""
        n, rows = 0, 0
        for job in self._jobs:
            if n and rows + job.rows > self.max_batch:
                break
            n, rows = n + 1, rows + job.rows
        return n, rows

    def _take(self) -> list[Job] | None:
        """The next batch: wait for a first job, then up to ``max_wait_ms`` after its arrival for more."""
        with self._cond:
            while not self._jobs and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            deadline = self._jobs[0].arrived + self.max_wait_ms / 1000
            while True:
                n, rows = self._fitting()
                full = rows >= self.max_batch or n < len(self._jobs)
                everyone = n >= self._clients  # no connected client could add a request now
                left = deadline - time.monotonic()
                if full or everyone or left <= 0 or not self.merges:
                    return [self._jobs.popleft() for _ in range(n)]
                self._cond.wait(left)
                if self._closed:
                    return None

    def _loop(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            try:
                self._run(jobs)
            except BaseException as e:  # never leave a client waiting on a job the batcher dropped
                for job in jobs:
                    if not job.wait(0):
                        job.finish(error=e)
                log.exception("batcher pass failed")

    def _run(self, jobs: list[Job]) -> None:
        live = []
        for job in jobs:
            if job.alive():
                live.append(job)
            else:
                self.stats["dropped"] += 1
                job.finish(error=ClientGone("the client disconnected before its chunk was computed"))
        groups: dict[tuple, list[Job]] = {}
        for job in live:
            groups.setdefault(_signature(job), []).append(job)
        for group in groups.values():
            if self.merges:
                self._pass(group)
            else:
                for job in group:
                    self._pass([job])

    def _pass(self, jobs: list[Job]) -> None:
        """One forward pass over ``jobs``; if it fails, each job alone (the error goes to its cause only)."""
        t0 = time.monotonic()
        rows = sum(j.rows for j in jobs)
        try:
            chunks = self._predict(jobs, rows)
        except Exception as e:
            if len(jobs) == 1:
                jobs[0].finish(error=e)
                return
            self.stats["retried_alone"] += len(jobs)
            for job in jobs:
                self._pass([job])
            return
        infer_ms = (time.monotonic() - t0) * 1000
        self.stats["passes"] += 1
        self.stats["rows"] += rows
        self.stats["jobs"] += len(jobs)
        for job, chunk in zip(jobs, chunks):
            job.timing = {"infer_ms": infer_ms, "queue_ms": (t0 - job.arrived) * 1000, "batch_rows": rows,
                          "batch_requests": len(jobs)}
            job.finish(chunk)

    def _predict(self, jobs: list[Job], rows: int) -> list[np.ndarray]:
        if self._predict_rows is None:
            job = jobs[0]
            return [check_chunk(self.policy.predict_chunk(job.batch, job.noise), job.rows).astype(np.float32)]
        batch = jobs[0].batch if len(jobs) == 1 else merge_batches([j.batch for j in jobs])
        noise = None if jobs[0].noise is None else np.concatenate([j.noise for j in jobs])  # type: ignore[misc]
        out = check_chunk(self._predict_rows(batch, noise), rows).astype(np.float32)
        ends = np.cumsum([j.rows for j in jobs])
        return [out[e - j.rows: e] for j, e in zip(jobs, ends)]
