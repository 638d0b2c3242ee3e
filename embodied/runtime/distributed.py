"""Distributed evaluation and data collection on Ray, with results identical to the local runner.

    embodied eval runner=ray checkpoint=CKPT suite=manipulation episodes=100   # a local Ray instance
    embodied eval runner=ray ray_address=auto ...                               # join a running cluster
    embodied collect runner=ray suite=manipulation episodes=500
    embodied eval checkpoint=CKPT workers=0      # the same shards on local processes, one per core, no Ray

Work is cut into shards. A shard is (task, split, seeds, custom instructions); one Ray task
per shard builds the environment, loads the policy from its checkpoint *path* (or uses the
scripted expert), plays its seeds with ``run_episodes`` and returns the episode records
(frames only for the episodes whose videos were asked for). The driver puts the records
back in seed order and aggregates them with the local runner's own code
(``evaluate.summarize``), so ``metrics.json`` has the same numbers either way.
``embodied collect`` does the same with expert episodes: workers return the recorded
arrays and the driver appends them to the dataset in seed order per task, as they arrive,
so the dataset equals the local one episode for episode and a crash of the driver loses
no finished episode (a rerun resumes).

Identical results. An episode is fully determined by (task, split, seed, policy) only if
a policy's chunk for one episode does not depend on the other episodes in its batch. It
does with a plain batched call: flow and diffusion policies draw their initial noise from
one internal generator (``config.seed``), so an episode's noise depends on every chunk
drawn before it; and CPU matmuls are not bitwise batch-invariant. Both runners therefore
run a policy through ``evaluate.RowwisePolicy``: one batch row at a time, with noise drawn
from a generator seeded by a hash of (policy seed, the row's observation). Collection
draws its action noise from a generator seeded by the episode seed. Results are identical
on the same kind of device (compare CPU with CPU: GPU kernels round differently).

Fault tolerance. A shard whose worker dies (process killed, node lost, out of memory) is
retried by Ray (``max_retries``); when Ray gives up the driver resubmits it (a warning
says so), up to ``RayOptions.resubmits`` times. Finished shards are kept. Every shard that
needed more than one attempt is listed in ``retried_shards`` (in ``metrics.json``) with its
attempt count: each attempt checks in with a small ledger actor first, since Ray's public
API does not tell a task its attempt number. Errors raised by the code itself (a bad
checkpoint, an unknown task) are not retried: they stop the run, as they would locally.

The code must be importable on every node (``pip install -e .`` there); checkpoints and
dataset paths are read on the workers and written on the driver, so a cluster needs the
checkpoint on a shared path.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from embodied.core.policy import Policy
from embodied.runtime.evaluate import (
    SPLITS,
    RowwisePolicy,
    eval_runs,
    run_group,
    summarize,
)
from embodied.runtime.rollout import EpisodeResult

log = logging.getLogger("embodied.runtime.distributed")
RUNNERS = ("local", "ray")


@dataclass(frozen=True)
class RayOptions:
    """Where and how shards run. Command configs set these as ``ray_*`` fields.

    Attributes:
        address: ``""`` starts a local Ray instance (stopped at the end); ``"auto"``,
            ``"HOST:PORT"`` or ``"ray://HOST:PORT"`` joins a running cluster. A Ray already
            initialised in this process is used as it is.
        num_cpus: CPUs of a local instance (0: all of this machine).
        shard_episodes: episodes per shard (0: about two shards per worker).
        task_retries: Ray's ``max_retries`` of a shard whose worker died.
        resubmits: resubmissions by the driver once Ray's retries are used up.
        cpus_per_shard, gpus_per_shard: resources one shard asks Ray for.
    """

    address: str = ""
    num_cpus: int = 0
    shard_episodes: int = 0
    task_retries: int = 2
    resubmits: int = 2
    cpus_per_shard: float = 1.0
    gpus_per_shard: float = 0.0

    def __post_init__(self) -> None:
        for name, cli in (("num_cpus", "ray_num_cpus"), ("shard_episodes", "ray_shard_episodes"),
                          ("task_retries", "ray_retries"), ("resubmits", "ray_retries")):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{cli} must be an integer >= 0, got {v!r}")
        if self.cpus_per_shard <= 0 or self.gpus_per_shard < 0:
            raise ValueError(f"cpus_per_shard must be > 0 and gpus_per_shard >= 0, got "
                             f"{self.cpus_per_shard} and {self.gpus_per_shard}")
        if self.address and self.num_cpus:
            raise ValueError(f"ray_num_cpus={self.num_cpus} sizes a local instance; with ray_address="
                             f"{self.address!r} the cluster's own resources are used: leave ray_num_cpus at 0")


def ray_options(cfg: Any) -> RayOptions:
    """Check ``runner`` and the ``ray_*`` fields of a command config; return its ``RayOptions``."""
    if cfg.runner not in RUNNERS:
        raise ValueError(f"runner must be one of {RUNNERS}, got {cfg.runner!r}")
    if cfg.runner == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError("runner=ray needs the ray package, which is not installed: pip install ray")
    return RayOptions(address=cfg.ray_address, num_cpus=cfg.ray_num_cpus, shard_episodes=cfg.ray_shard_episodes,
                      task_retries=cfg.ray_retries, resubmits=cfg.ray_retries)


@contextlib.contextmanager
def ray_session(options: RayOptions) -> Iterator[int]:
    """Connect to Ray as ``options`` says; yield how many shards can run at once.

    Shuts down only an instance it started itself.
    """
    import ray

    started = not ray.is_initialized()
    if started:
        kw: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
        if options.address:
            ray.init(address=options.address, **kw)
        else:
            ray.init(num_cpus=options.num_cpus or None, include_dashboard=False, **kw)
    try:
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        yield max(1, int(cpus // options.cpus_per_shard))
    finally:
        if started:
            ray.shutdown()


# ---- shards and the driver's retry loop ------------------------------------------------

@dataclass(frozen=True)
class Shard:
    """The unit of work: consecutive seeds of one (task, split).

    ``first`` is the position of ``seeds[0]`` among the run's episodes (videos are kept
    for the run's first episodes); ``instructions`` are custom templates (split ``custom``).
    """

    task: str
    split: str
    seeds: tuple[int, ...]
    instructions: tuple[str, ...] | None = None
    first: int = 0

    @property
    def name(self) -> str:
        return f"{self.task}/{self.split}[{self.seeds[0]}..{self.seeds[-1]}]"


def split_seeds(seeds: Sequence[int], size: int) -> list[tuple[int, ...]]:
    """Consecutive chunks of at most ``size`` seeds."""
    seeds = list(seeds)
    return [tuple(seeds[i: i + size]) for i in range(0, len(seeds), size)]


def auto_shard_size(episodes: int, workers: int, requested: int = 0) -> int:
    """``requested`` if given, else enough episodes per shard for about two shards per worker."""
    return requested or max(1, math.ceil(episodes / (2 * workers)))


class _Ledger:
    """Counts the attempts of each shard (a Ray actor; see the module docstring)."""

    def __init__(self) -> None:
        self.attempts: Counter[str] = Counter()

    def start(self, name: str) -> int:
        self.attempts[name] += 1
        return self.attempts[name]


def _attempt(ledger: Any, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[int, Any]:
    """Body of every Ray task: check in with the ledger, then run ``fn(*args)``."""
    import ray

    try:
        attempt = int(ray.get(ledger.start.remote(name), timeout=60))
    except Exception:  # the ledger is bookkeeping only; never fail a shard because of it
        attempt = 0
    if attempt > 1:
        logging.getLogger("embodied.runtime.distributed").warning("shard %s: attempt %d", name, attempt)
    return attempt, fn(*args)


@dataclass(eq=False)
class Job:
    """One submitted shard: its function and arguments, and the Ray reference of its latest attempt."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    info: dict[str, Any] = field(default_factory=dict)
    ref: Any = None
    resubmits: int = 0


def _lost_worker_errors() -> tuple[type[BaseException], ...]:
    from ray import exceptions as e

    return (e.WorkerCrashedError, e.NodeDiedError, e.ObjectLostError, e.OutOfMemoryError, e.RaySystemError)


class ShardRunner:
    """Runs shard functions as Ray tasks; resubmits shards whose worker died; records retries.

    Call inside ``ray_session``. ``retried`` lists every shard that took more than one
    attempt: ``{"shard", **info, "attempts", "resubmitted"}``.
    """

    def __init__(self, options: RayOptions):
        import ray

        self.options = options
        self._remote = ray.remote(_attempt).options(num_cpus=options.cpus_per_shard, num_gpus=options.gpus_per_shard,
                                                    max_retries=options.task_retries)
        self._ledger = ray.remote(_Ledger).options(num_cpus=0).remote()
        self._lost = _lost_worker_errors()
        self.retried: list[dict[str, Any]] = []

    def submit(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], info: Mapping[str, Any] | None = None
               ) -> Job:
        job = Job(name, fn, tuple(args), dict(info or {}))
        job.ref = self._remote.remote(self._ledger, name, fn, job.args)
        return job

    def _resubmit(self, job: Job, err: BaseException) -> None:
        if job.resubmits >= self.options.resubmits:
            raise RuntimeError(f"shard {job.name} lost its worker {job.resubmits + 1} times, giving up "
                               f"(ray_retries={self.options.resubmits}): {err}") from err
        job.resubmits += 1
        log.warning("shard %s lost its worker (%s); resubmitting it (%d of %d)", job.name, type(err).__name__,
                    job.resubmits, self.options.resubmits)
        job.ref = self._remote.remote(self._ledger, job.name, job.fn, job.args)

    def _done(self, job: Job, attempt: int) -> None:
        attempts = max(attempt, 1 + job.resubmits)
        if attempts > 1:
            if not job.resubmits:
                log.warning("shard %s finished on attempt %d (Ray retried it after its worker died)", job.name, attempts)
            self.retried.append({"shard": job.name, **job.info, "attempts": attempts, "resubmitted": job.resubmits})

    def get(self, job: Job) -> Any:
        """The result of ``job`` (blocks), resubmitting it while its worker dies."""
        import ray

        while True:
            try:
                attempt, value = ray.get(job.ref)
            except self._lost as err:
                self._resubmit(job, err)
                continue
            self._done(job, attempt)
            return value

    def as_completed(self, jobs: Sequence[Job]) -> Iterator[tuple[Job, Any]]:
        """(job, result) pairs as jobs finish, resubmitting those whose worker died."""
        import ray

        pending = {job.ref: job for job in jobs}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(ready[0])
            try:
                attempt, value = ray.get(job.ref)
            except self._lost as err:
                self._resubmit(job, err)
                pending[job.ref] = job
                continue
            self._done(job, attempt)
            yield job, value

    def cancel(self, jobs: Sequence[Job]) -> None:
        """Cancel jobs whose results are no longer wanted (best effort)."""
        import ray

        for job in jobs:
            with contextlib.suppress(Exception):
                ray.cancel(job.ref)

    def close(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.kill(self._ledger)


def _pool_worker_init() -> None:
    import sim  # noqa: F401  (chooses the headless GL backend before MuJoCo and torch load)


class PoolRunner:
    """``ShardRunner``'s interface over local worker processes (``concurrent.futures``, forkserver).

    For one machine without Ray: ``workers`` processes each load the policy once and play
    shards. No retries: a worker that dies stops the run (``retried`` stays empty).
    """

    def __init__(self, workers: int):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # forkserver: each worker is forked from a clean server process that imported sim, torch and the
        # policies once (for every pool this process makes) and made no GL context and no torch thread;
        # a child forked from this process would inherit its threads in whatever state they are. Where
        # there is no forkserver, spawn: a fresh interpreter per worker.
        if "forkserver" in multiprocessing.get_all_start_methods():
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["sim", "torch", "policies", "embodied.runtime.distributed"])
        else:
            ctx = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_pool_worker_init)
        self.retried: list[dict[str, Any]] = []

    def submit(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], info: Mapping[str, Any] | None = None
               ) -> Job:
        job = Job(name, fn, tuple(args), dict(info or {}))
        job.ref = self._pool.submit(fn, *job.args)
        return job

    def get(self, job: Job) -> Any:
        """The result of ``job`` (blocks); a worker's exception is raised here."""
        return job.ref.result()

    def as_completed(self, jobs: Sequence[Job]) -> Iterator[tuple[Job, Any]]:
        from concurrent.futures import as_completed

        pending = {job.ref: job for job in jobs}
        for fut in as_completed(pending):
            yield pending[fut], fut.result()

    def cancel(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            job.ref.cancel()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def shard_runner(options: RayOptions, workers: int = 0) -> Iterator[tuple[ShardRunner | PoolRunner, int]]:
    """(runner, how many shards run at once): Ray where ``options`` says (``workers`` = 0),
    else ``workers`` local processes (started as shards arrive, so never more than shards)."""
    with (contextlib.nullcontext(workers) if workers > 0 else ray_session(options)) as n:
        runner: ShardRunner | PoolRunner = PoolRunner(workers) if workers > 0 else ShardRunner(options)
        try:
            yield runner, n
        finally:
            runner.close()


# ---- evaluation ----------------------------------------------------------------------------

@dataclass(frozen=True)
class PolicySource:
    """What a worker loads: a checkpoint directory (``""``: the scripted expert)."""

    checkpoint: str = ""
    device: str = "auto"
    num_inference_steps: int = 0
    ground_instructions: bool | None = None  # None: the checkpoint's setting
    noise_scale: float | None = None  # factor on the initial noise (RowwisePolicy); None: the checkpoint's

    def load(self) -> Policy | str:
        """``"expert"``, or the checkpoint's policy wrapped in ``RowwisePolicy``.

        Workers keep the last few loaded policies; a checkpoint rewritten since is reloaded.
        """
        if not self.checkpoint:
            return "expert"
        path = Path(self.checkpoint)
        stamp = tuple(sorted((f.name, f.stat().st_mtime_ns) for f in path.iterdir())) if path.is_dir() else ()
        return _load_cached(self, stamp)


@functools.lru_cache(maxsize=2)
def _load_cached(source: PolicySource, stamp: tuple[Any, ...]) -> RowwisePolicy:
    from embodied.runtime.checkpoints import load_for_eval

    return RowwisePolicy(load_for_eval(source.checkpoint, source.device, source.num_inference_steps,
                                       source.ground_instructions), noise_scale=source.noise_scale)


def eval_shard(source: PolicySource, shard: Shard, env_kwargs: Mapping[str, Any], num_envs: int, vector: str,
               videos: int) -> list[EpisodeResult]:
    """Play one shard on a worker (see ``evaluate.run_group``)."""
    import sim  # noqa: F401  (chooses the headless GL backend before MuJoCo and torch load)

    return run_group(source.load(), shard.task, shard.split, shard.instructions, shard.seeds, env_kwargs, num_envs,
                     vector, videos, shard.first)


def evaluate_ray(source: PolicySource, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], dict[str, list[EpisodeResult]]]:
    """``evaluate.evaluate`` with its episodes sharded over Ray workers (``evaluate_sharded``)."""
    return evaluate_sharded(source, *args, **kwargs)


def evaluate_sharded(
    source: PolicySource,
    tasks: Sequence[str],
    episodes: int = 20,
    splits: Sequence[str] = SPLITS,
    seed: int = 100_000,
    num_envs: int = 4,
    vector: str = "sync",
    env_kwargs: Mapping[str, Any] | None = None,
    instructions: Mapping[str, Sequence[str]] | None = None,
    videos: int = 0,
    progress: bool = True,
    options: RayOptions = RayOptions(),
    workers: int = 0,
) -> tuple[dict[str, Any], dict[str, list[EpisodeResult]]]:
    """``evaluate.evaluate`` with its episodes sharded over workers; same arguments and results.

    ``source`` names the policy (workers load it themselves). ``workers`` = 0: Ray workers,
    where ``options`` says; ``workers`` > 0: that many local processes (``PoolRunner``),
    no Ray needed. The metrics add ``runner``, ``shards`` and ``retried_shards``.
    """
    from tqdm.auto import tqdm

    runs = eval_runs(tasks, episodes, splits, instructions)
    env_kwargs = dict(env_kwargs or {})
    if source.checkpoint:  # workers may start in another directory
        source = replace(source, checkpoint=str(Path(source.checkpoint).absolute()))
    t0 = time.time()
    kind = "local" if workers > 0 else "ray"
    with shard_runner(options, workers) as (runner, n_workers):
        size = auto_shard_size(len(runs) * episodes, n_workers, options.shard_episodes)
        shards = [Shard(task, split, chunk, None if custom is None else tuple(custom), k * size)
                  for task, split, custom in runs
                  for k, chunk in enumerate(split_seeds(range(seed, seed + episodes), size))]
        log.info("%d episodes in %d shards on %d %s workers", len(runs) * episodes, len(shards), n_workers, kind)
        jobs = [runner.submit(s.name, eval_shard, (source, s, env_kwargs, num_envs, vector, videos),
                              {"task": s.task, "split": s.split, "seeds": list(s.seeds)}) for s in shards]
        done: dict[int, list[EpisodeResult]] = {}
        bar = tqdm(total=len(runs) * episodes, desc="eval", unit="ep", disable=not progress, leave=False)
        try:
            for job, res in runner.as_completed(jobs):
                done[id(job)] = res
                bar.update(len(res))
        finally:
            bar.close()
            runner.cancel([j for j in jobs if id(j) not in done])
    results: dict[str, list[EpisodeResult]] = {f"{task}/{split}": [] for task, split, _ in runs}
    for s, job in zip(shards, jobs):
        res = done[id(job)]
        if [r.seed for r in res] != list(s.seeds):
            raise RuntimeError(f"shard {s.name} returned seeds {[r.seed for r in res]}, expected {list(s.seeds)}")
        results[f"{s.task}/{s.split}"].extend(res)
    metrics = summarize(tasks, results, episodes, seed, time.time() - t0)
    metrics.update(runner=kind, shards=len(shards), retried_shards=runner.retried)
    if workers > 0:
        metrics["workers"] = min(workers, len(shards))
    return metrics, results


# ---- collection ----------------------------------------------------------------------------

class OrderedShards:
    """Per-group (task) streams of shard results in seed order, computed ahead on Ray (or local workers).

    ``plan(group, first_seed, n)`` queues shards for seeds ``first_seed .. first_seed+n-1``;
    ``stream(group)`` yields the items the shard function returns, shard after shard in
    seed order, queuing further shards of a fifth of the plan when it runs out (a failed
    expert episode needs another seed). At most ``lookahead`` shards are in flight, taken in plan order,
    so results wait in Ray's object store only a little ahead of the consumer.
    ``drop(group)`` cancels what a group no longer needs.

    Args:
        fn: ``fn(group, seeds, *args) -> list`` of items, one per seed, run on a worker.
        args: the remaining arguments of ``fn``.
    """

    def __init__(self, runner: ShardRunner | PoolRunner, fn: Callable[..., list[Any]], args: tuple[Any, ...],
                 size: int, lookahead: int):
        self.runner, self.fn, self.args, self.size, self.lookahead = runner, fn, tuple(args), size, lookahead
        self._next_seed: dict[str, int] = {}
        self._planned: dict[str, int] = {}
        self._queue: dict[str, deque[tuple[tuple[int, ...], Job | None]]] = {}
        self._order: deque[tuple[str, tuple[int, ...]]] = deque()  # planned, not yet submitted
        self._in_flight: dict[tuple[str, tuple[int, ...]], Job] = {}

    def plan(self, group: str, first_seed: int, n: int) -> None:
        self._next_seed[group] = first_seed
        self._planned[group] = n
        self._queue[group] = deque()
        self._add(group, n)
        self._fill()

    def _add(self, group: str, n: int) -> None:
        first = self._next_seed[group]
        for chunk in split_seeds(range(first, first + n), self.size):
            self._queue[group].append((chunk, None))
            self._order.append((group, chunk))
        self._next_seed[group] = first + n

    def _submit(self, group: str, seeds: tuple[int, ...]) -> Job:
        job = self.runner.submit(f"{group}[{seeds[0]}..{seeds[-1]}]", self.fn, (group, seeds, *self.args),
                                 {"task": group, "seeds": list(seeds)})
        self._in_flight[(group, seeds)] = job
        return job

    def _fill(self) -> None:
        while self._order and len(self._in_flight) < self.lookahead:
            group, seeds = self._order.popleft()
            self._submit(group, seeds)

    def stream(self, group: str) -> Iterator[Any]:
        while True:
            if not self._queue[group]:  # the plan ran out (failed expert episodes): a few more seeds
                self._add(group, max(1, min(self.size, math.ceil(self._planned[group] / 5))))
            seeds, _ = self._queue[group].popleft()
            job = self._in_flight.get((group, seeds))
            if job is None:  # not submitted yet: it is needed now
                self._order.remove((group, seeds))
                job = self._submit(group, seeds)
            self._fill()
            items = self.runner.get(job)
            del self._in_flight[(group, seeds)]
            self._fill()
            yield from items

    def drop(self, group: str) -> None:
        for key in [k for k in self._in_flight if k[0] == group]:
            self.runner.cancel([self._in_flight.pop(key)])
        self._order = deque(k for k in self._order if k[0] != group)
        self._queue[group] = deque()
        self._fill()

    def close(self) -> None:
        self.runner.cancel(list(self._in_flight.values()))
        self._in_flight.clear()
        self._order.clear()


@contextlib.contextmanager
def ordered_shards(fn: Callable[..., list[Any]], args: tuple[Any, ...], plan: Mapping[str, tuple[int, int]],
                   options: RayOptions, workers: int = 0) -> Iterator[OrderedShards]:
    """Start Ray (``workers`` = 0) or ``workers`` local processes, and an ``OrderedShards``
    planned with ``{group: (first_seed, n)}``; clean up after."""
    with shard_runner(options, workers) as (runner, n_workers):
        size = auto_shard_size(sum(n for _, n in plan.values()), n_workers, options.shard_episodes)
        shards = OrderedShards(runner, fn, args, size, lookahead=2 * n_workers)
        try:
            for group, (first, n) in plan.items():
                shards.plan(group, first, n)
            yield shards
        finally:
            shards.close()


__all__ = ["RUNNERS", "Job", "OrderedShards", "PolicySource", "PoolRunner", "RayOptions", "Shard", "ShardRunner",
           "auto_shard_size", "eval_shard", "evaluate_ray", "evaluate_sharded", "ordered_shards", "ray_options",
           "ray_session", "shard_runner", "split_seeds"]
