"""Data-parallel training under torchrun: several processes, one global batch, one set of weights.

    torchrun --nproc_per_node=2 -m embodied.cli train threads=1 ...              # two processes on one machine
    torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=HOST:29400 -m embodied.cli train ...

torchrun starts one copy of ``embodied train`` per process and tells each its place through
the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``); ``start`` reads it and joins the process group through torchrun's own
``env://`` rendezvous (multi-node runs use torchrun's rendezvous options, nothing of ours).
Backend: gloo on CPUs, NCCL on GPUs (``ddp_backend=auto``), each process on ``cuda:LOCAL_RANK``.

The step, on every rank (how it stays the one-process step):

1. every rank samples the same *global* batch (the sampler has the same seed everywhere) and
   keeps its slice, rows ``[rank * b, (rank + 1) * b)`` with ``b = batch_size / WORLD_SIZE``
   (``shard``): together the ranks see exactly the batch one process would;
2. forward and backward on the slice; the loss's own random draws (flow times, diffusion
   noise, word dropout) come from a per-rank torch seed (``seed_rank``), rank 0 keeping the
   one-process stream;
3. ``average_gradients``: one all-reduce of a flat buffer averages the gradients (and the loss
   logs) over the ranks. With equal slices the mean of the slices' mean losses is the global
   batch's mean loss, so this is its gradient (the same rule as ``DistributedDataParallel``; a
   loss that leaves padded actions out weighs the slices equally rather than by their unpadded
   counts);
4. clipping, the optimiser, scheduler and EMA steps run on every rank on the same gradients, so
   the weights stay identical (rank 0's are broadcast once at the start, ``broadcast_state``).

``DistributedDataParallel`` is not used: the policy's loss calls its sub-networks
(``model["obs"]``, ``model["head"]``) rather than one ``forward``, which DDP needs to see.

Rank 0 alone logs, evaluates and writes (TensorBoard, checkpoints, snapshots, ``metrics.json``,
Hydra's files in the run folder) and collects the demonstrations when the dataset lacks them;
the others wait for it (``barrier``), and at the end wait for its evaluation so that every
rank leaves the process group at the same point.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

log = logging.getLogger("embodied.train")

BACKENDS = ("auto", "gloo", "nccl")
ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")  # torchrun sets these (and LOCAL_WORLD_SIZE, MASTER_ADDR/PORT)
# how long a rank waits for the others in one collective: rank 0 collecting the demonstrations
# or evaluating while the others wait at a barrier or in the next step's all-reduce
TIMEOUT = datetime.timedelta(hours=6)


class DistributedSetupError(ValueError):
    """A torchrun launch that cannot train: its environment, backend, device or batch size."""


@dataclass(frozen=True)
class World:
    """This process's place among the training processes; ``World()`` is one process alone.

    ``device`` is the torch device this rank trains on (``cuda:LOCAL_RANK`` for ``device=auto``
    or ``cuda`` on GPUs) and ``backend`` the process group's, or None without torchrun.
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    device: str = "auto"
    backend: str | None = None

    @property
    def main(self) -> bool:
        """Whether this is rank 0, the one that logs, evaluates and writes."""
        return self.rank == 0

    @property
    def launched(self) -> bool:
        """Whether torchrun started this process (a process group is open)."""
        return self.backend is not None


def _env_int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise DistributedSetupError(f"{name}={env[name]!r} is not an integer; torchrun sets it") from None


def world_from_env(env: Mapping[str, str] | None = None) -> World | None:
    """The ``World`` that torchrun's environment describes; None when none of it is set.

    Raises:
        DistributedSetupError: part of torchrun's environment is set and part is missing or
            out of range (each named), e.g. ``RANK`` exported by hand without the rest.
    """
    env = os.environ if env is None else env
    present = [k for k in ENV if k in env]
    if not present:
        return None
    needed = [*ENV, "MASTER_ADDR", "MASTER_PORT"]
    missing = [k for k in needed if k not in env]
    if missing:
        raise DistributedSetupError(
            f"{', '.join(f'{k}={env[k]}' for k in present)} is set but not {', '.join(missing)}: torchrun sets all "
            f"of {', '.join(needed)}. Start with `torchrun --nproc_per_node=N -m embodied.cli train ...`, or unset "
            f"{', '.join(present)} to train in one process")
    rank, size, local_rank = (_env_int(env, k) for k in ENV)
    local_size = _env_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else size
    if size < 1 or not 0 <= rank < size:
        raise DistributedSetupError(f"RANK={rank} with WORLD_SIZE={size}: RANK must be in 0..WORLD_SIZE-1")
    if local_size < 1 or not 0 <= local_rank < local_size:
        raise DistributedSetupError(f"LOCAL_RANK={local_rank} with LOCAL_WORLD_SIZE={local_size}: LOCAL_RANK must "
                                    "be in 0..LOCAL_WORLD_SIZE-1")
    return World(rank=rank, size=size, local_rank=local_rank, local_size=local_size)


def rank_from_env() -> int:
    """This process's torchrun rank, 0 without torchrun or with a malformed environment
    (``world_from_env`` names what is wrong with it when training starts)."""
    try:
        world = world_from_env()
    except DistributedSetupError:
        return 0
    return world.rank if world is not None else 0


def check_batch(batch_size: int, world: World) -> int:
    """The per-rank batch, ``batch_size / WORLD_SIZE``; refused unless it divides evenly."""
    if batch_size % world.size:
        lo = batch_size // world.size * world.size
        allowed = f"e.g. batch_size={lo} or {lo + world.size}" if lo else f"e.g. batch_size={world.size}"
        raise DistributedSetupError(
            f"batch_size={batch_size} (the global batch) does not split evenly over the {world.size} processes of "
            f"this torchrun (WORLD_SIZE={world.size}): give a multiple of {world.size}, {allowed}, or another "
            "--nproc_per_node")
    return batch_size // world.size


def place(world: World, device: str, backend: str, gpus: int, nccl: bool = True) -> World:
    """``world`` with the device this rank trains on and the backend, after checking they fit.

    Args:
        device: ``TrainConfig.device`` (auto, cpu, cuda, cuda:N, mps).
        backend: ``TrainConfig.ddp_backend`` (auto, gloo or nccl).
        gpus: CUDA GPUs on this machine (``torch.cuda.device_count()``).
        nccl: whether this torch build has NCCL.

    Raises:
        DistributedSetupError: an unknown backend; NCCL without GPUs (or without NCCL in torch,
            or with device=cpu); device=cuda:N shared by several processes of one machine;
            more processes on this machine than GPUs; device=mps.
    """
    if backend not in BACKENDS:
        raise DistributedSetupError(f"ddp_backend={backend!r} is not allowed: use auto (nccl on GPUs, else gloo), "
                                    "gloo or nccl")
    if backend == "nccl" and (not gpus or not nccl):
        why = "this machine has no CUDA GPU" if not gpus else "this torch build has no NCCL"
        raise DistributedSetupError(f"ddp_backend=nccl needs CUDA GPUs and NCCL, but {why}: use ddp_backend=gloo "
                                    "(or auto, which picks gloo on CPUs)")
    kind, _, index = device.partition(":")
    if device == "auto":
        kind = "cuda" if gpus else "cpu"
    if kind == "mps":
        raise DistributedSetupError("device=mps cannot train under torchrun (no collective backend for it): use "
                                    "device=cpu, or train in one process")
    if kind == "cuda":
        if not gpus:
            raise DistributedSetupError(f"device={device!r}, but this machine has no CUDA GPU: use device=cpu "
                                        "(or auto)")
        if index and world.local_size > 1:
            raise DistributedSetupError(
                f"device={device!r} would put all {world.local_size} processes of this machine on one GPU: give "
                "device=cuda (or auto); each process then trains on cuda:LOCAL_RANK")
        if not index and world.local_rank >= gpus:
            raise DistributedSetupError(
                f"LOCAL_RANK={world.local_rank}, but this machine has {gpus} CUDA GPU(s): with device={device} each "
                f"process takes its own GPU, so --nproc_per_node may be at most {gpus}")
        device = device if index else f"cuda:{world.local_rank}"
    elif backend == "nccl":
        raise DistributedSetupError(f"ddp_backend=nccl reduces on GPUs, but device={device!r}: give device=cuda "
                                    "(or auto), or ddp_backend=gloo for CPU training")
    else:
        device = "cpu"
    chosen = backend if backend != "auto" else ("nccl" if kind == "cuda" and nccl else "gloo")
    return World(world.rank, world.size, world.local_rank, world.local_size, device, chosen)


def check(batch_size: int, device: str, backend: str) -> World:
    """The checks of ``start`` without joining the process group (``embodied train`` runs them
    before anything is written); ``World(device=device)`` without torchrun. The environment and the
    batch split are checked before torch is imported, so that a launch refused for them fails at once."""
    world = world_from_env()
    if world is None:
        if backend not in BACKENDS:  # refused with or without torchrun
            place(World(), device, backend, 0)
        return World(device=device)
    check_batch(batch_size, world)
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count()
    return place(world, device, backend, gpus, dist.is_available() and dist.is_nccl_available())


def start(batch_size: int, device: str, backend: str) -> World:
    """Join torchrun's process group when torchrun started this process; ``World(device=device)`` when not.

    Non-zero ranks log only warnings from here on (rank 0 alone reports).
    """
    import torch
    import torch.distributed as dist

    world = check(batch_size, device, backend)
    if not world.launched:
        return world
    if not dist.is_available():
        raise DistributedSetupError("this torch build has no torch.distributed: train in one process")
    if world.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(world.device))
    dist.init_process_group(world.backend, timeout=TIMEOUT)
    if not world.main:
        logging.getLogger("embodied").setLevel(logging.WARNING)
    log.info("torchrun: %d processes (%s), %d rows of the %d-row batch each, rank 0 on %s", world.size,
             world.backend, batch_size // world.size, batch_size, world.device)
    return world


def stop(world: World) -> None:
    """Leave the process group (nothing without torchrun)."""
    import torch.distributed as dist

    if world.launched and dist.is_initialized():
        dist.destroy_process_group()


def barrier(world: World) -> None:
    """Wait until every rank is here (nothing without torchrun)."""
    import torch.distributed as dist

    if world.launched:
        dist.barrier()


def broadcast_state(module: Any, world: World) -> None:
    """Give every rank rank 0's tensors of ``module`` (weights, EMA copy, normaliser buffers)."""
    import torch.distributed as dist

    if not world.launched:
        return
    for t in module.state_dict().values():
        dist.broadcast(t, src=0)


def seed_rank(seed: int, world: World) -> None:
    """Seed torch for the loss's random draws: rank 0 keeps the stream it has (the one-process
    run's), every other rank gets an independent one derived from (seed, rank)."""
    import torch

    if world.rank:
        torch.manual_seed(int(np.random.SeedSequence([seed, world.rank]).generate_state(1)[0]))


def shard(batch: Mapping[str, Any], world: World) -> dict[str, Any]:
    """This rank's slice of a global batch: rows ``[rank * b, (rank + 1) * b)`` of every array
    and list (nested dicts too), ``b`` = rows / WORLD_SIZE."""
    if world.size == 1:
        return dict(batch)

    def cut(v: Any) -> Any:
        if isinstance(v, Mapping):
            return {k: cut(x) for k, x in v.items()}
        b = len(v) // world.size
        return v[world.rank * b: (world.rank + 1) * b]

    return {k: cut(v) for k, v in batch.items()}


def average_gradients(params: list[Any], logs: dict[str, float], world: World) -> dict[str, float]:
    """Average the gradients of ``params`` over the ranks in place, and ``logs`` (the loss
    terms) with them, in one all-reduce; returns the averaged ``logs``.

    A parameter without a gradient on every rank keeps none (the optimiser skips it, as in one
    process); one with a gradient on some ranks gets their sum over WORLD_SIZE.
    """
    import torch
    import torch.distributed as dist

    if not world.launched:
        return logs
    keys = sorted(logs)
    ref = params[0]
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    has = torch.tensor([p.grad is not None for p in params], dtype=ref.dtype, device=ref.device)
    extra = torch.tensor([logs[k] for k in keys], dtype=ref.dtype, device=ref.device)
    flat = torch.cat([*parts, has, extra])
    dist.all_reduce(flat)
    n = sum(x.numel() for x in parts)
    grads, has, extra = flat[:n] / world.size, flat[n: n + len(params)], flat[n + len(params):] / world.size
    offset = 0
    for p, held in zip(params, has.tolist()):
        k = p.numel()
        p.grad = grads[offset: offset + k].view_as(p) if held else None
        offset += k
    return dict(zip(keys, extra.tolist()))
