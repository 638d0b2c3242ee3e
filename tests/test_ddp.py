"""Data-parallel training under torchrun (``embodied.runtime.ddp``): real process groups, real
torchrun launches of ``embodied train``, no stand-ins for torch.distributed.

The launches compare two processes with one (same global batch, same seed) on the MLP policy
with ``policy.mask_padding=false``: its loss has no random draws, and without the padding mask
each process's slice weighs exactly its share of the global mean, so the two runs must give the
same losses and weights up to float rounding.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.runtime import ddp
from embodied.runtime.ddp import DistributedSetupError, World

ROOT = Path(__file__).resolve().parents[1]
TINY = ("tasks=[reach]", "demos=4", "eval_episodes=1", "num_envs=1", "videos=0", "threads=1", "workers=1",
        "batch_size=8", "save_every=10", "snapshot_every=0", "policy=mlp", "policy.mask_padding=false",
        "progress=false", "eval_every=10", "eval_episodes_periodic=1")
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")


def _env(**extra: str) -> dict[str, str]:
    """This checkout's code (not another installed copy), one thread, no torchrun variables."""
    env = {k: v for k, v in os.environ.items() if k not in (*ddp.ENV, "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                                           "MASTER_PORT")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
               OMP_NUM_THREADS="1", **extra)
    return env


def train(*args: str, cwd: Path, launcher: tuple[str, ...] = (), env: dict | None = None
          ) -> subprocess.CompletedProcess:
    """``embodied train ARGS``: one process (forked from the warm CLI runner), or under ``launcher``."""
    env = {**(env or _env()), "TMPDIR": str(cwd)}  # torchrun's rendezvous folders stay in the test's folder
    if not launcher:
        from cli_runner import run_cli

        return run_cli(["train", *args], cwd=cwd, env=env, timeout=600)
    return subprocess.run([*launcher, "-m", "embodied.cli", "train", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def logged_losses(text: str) -> dict[int, float]:
    """step -> loss from the ``step k/N loss x`` lines (every N/10 steps without a progress bar)."""
    return {int(s): float(v) for s, v in re.findall(r"step (\d+)/\d+ loss ([0-9.]+)", text)}


def weights(run: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(run / "checkpoint" / "model.safetensors")


def max_weight_diff(a: Path, b: Path) -> float:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    return max(float(np.abs(wa[k].astype(np.float64) - wb[k]).max()) for k in wa if wa[k].size)


# ---- the pieces, without launching ---------------------------------------------------------------

def test_no_torchrun_environment_is_one_process():
    assert ddp.world_from_env({}) is None


@pytest.mark.parametrize("env, named", [
    ({"RANK": "1"}, "RANK=1 is set but not WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "not MASTER_ADDR, MASTER_PORT"),
    ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "RANK='x' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "RANK=2 with WORLD_SIZE=2: RANK must be in 0..WORLD_SIZE-1"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "h",
      "MASTER_PORT": "1"}, "LOCAL_RANK=1 with LOCAL_WORLD_SIZE=1"),
])
def test_a_partial_or_bad_torchrun_environment_is_named(env, named):
    with pytest.raises(DistributedSetupError, match=re.escape(named)):
        ddp.world_from_env(env)


def test_torchrun_environment_is_read():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
           "MASTER_PORT": "1"}
    assert ddp.world_from_env(env) == World(rank=3, size=4, local_rank=1, local_size=2)


def test_a_global_batch_that_does_not_split_evenly_names_both_numbers_and_what_is_allowed():
    assert ddp.check_batch(128, World(size=4)) == 32
    with pytest.raises(DistributedSetupError) as e:
        ddp.check_batch(129, World(size=2))
    message = str(e.value)
    for part in ("batch_size=129", "the 2 processes", "WORLD_SIZE=2", "a multiple of 2", "batch_size=128 or 130"):
        assert part in message, message
    with pytest.raises(DistributedSetupError, match="batch_size=3"):
        ddp.check_batch(2, World(size=3))


@pytest.mark.parametrize("world, device, backend, gpus, named", [
    (World(size=2, local_size=2), "auto", "nccl", 0, "ddp_backend=nccl needs CUDA GPUs and NCCL, but this machine "
                                                     "has no CUDA GPU"),
    (World(size=2, local_size=2), "cuda", "auto", 0, "device='cuda', but this machine has no CUDA GPU"),
    (World(size=2, local_size=2), "cuda:1", "auto", 2, "would put all 2 processes of this machine on one GPU"),
    (World(rank=2, size=3, local_rank=2, local_size=3), "cuda", "auto", 2,
     "LOCAL_RANK=2, but this machine has 2 CUDA GPU(s)"),
    (World(size=2, local_size=2), "cpu", "nccl", 2, "ddp_backend=nccl reduces on GPUs, but device='cpu'"),
    (World(size=2, local_size=2), "mps", "auto", 0, "device=mps cannot train under torchrun"),
    (World(size=2, local_size=2), "cpu", "mpi", 0, "ddp_backend='mpi' is not allowed: use auto"),
])
def test_a_backend_or_device_that_cannot_work_is_refused(world, device, backend, gpus, named):
    with pytest.raises(DistributedSetupError, match=re.escape(named)):
        ddp.place(world, device, backend, gpus)


def test_nccl_in_a_torch_without_it_is_refused():
    with pytest.raises(DistributedSetupError, match="this torch build has no NCCL"):
        ddp.place(World(size=2), "cuda", "nccl", 2, nccl=False)


@pytest.mark.parametrize("world, device, backend, gpus, placed", [
    (World(size=2, local_size=2), "auto", "auto", 0, ("cpu", "gloo")),
    (World(rank=1, size=2, local_rank=1, local_size=2), "auto", "auto", 2, ("cuda:1", "nccl")),
    (World(rank=1, size=2, local_rank=1, local_size=2), "cuda", "gloo", 2, ("cuda:1", "gloo")),
    (World(size=2, local_size=1), "cuda:1", "auto", 2, ("cuda:1", "nccl")),  # one process per machine
])
def test_each_rank_takes_its_device_and_the_backend_follows_it(world, device, backend, gpus, placed):
    w = ddp.place(world, device, backend, gpus)
    assert (w.device, w.backend) == placed and w.launched


def test_an_unknown_backend_is_refused_by_the_config_too():
    from embodied.runtime.train import TrainConfig

    with pytest.raises(ValueError, match="ddp_backend must be one of"):
        TrainConfig(ddp_backend="mpi")


def test_the_slices_of_the_ranks_make_up_the_global_batch():
    batch = {"state": np.arange(12).reshape(6, 2), "instruction": list("abcdef"),
             "images": {"side": np.arange(6)}}
    parts = [ddp.shard(batch, World(rank=r, size=3)) for r in range(3)]
    assert [p["instruction"] for p in parts] == [["a", "b"], ["c", "d"], ["e", "f"]]
    np.testing.assert_array_equal(np.concatenate([p["state"] for p in parts]), batch["state"])
    np.testing.assert_array_equal(np.concatenate([p["images"]["side"] for p in parts]), batch["images"]["side"])
    assert ddp.shard(batch, World())["instruction"] == batch["instruction"]


def _average_on_rank(rank: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    world = ddp.start(4, "cpu", "gloo")
    try:
        a, b, c = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
        a.grad = torch.full((2,), float(rank + 1))  # 1 and 2: mean 1.5
        b.grad = torch.ones(2) if rank == 1 else None  # only rank 1 has one: 1 / 2
        logs = ddp.average_gradients([a, b, c], {"loss": float(rank), "aux": 4.0}, world)
        torch.save({"a": a.grad, "b": b.grad, "c": c.grad, "logs": logs}, f"{out}/{rank}.pt")
    finally:
        ddp.stop(world)


def test_gradients_and_logs_are_averaged_over_a_real_process_group(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_average_on_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        got = torch.load(tmp_path / f"{rank}.pt")
        assert got["a"].tolist() == [1.5, 1.5] and got["b"].tolist() == [0.5, 0.5] and got["c"] is None
        assert got["logs"] == {"loss": 0.5, "aux": 4.0}


# ---- torchrun launches -----------------------------------------------------------------------------

def _pair(root: Path) -> dict[str, str]:
    one = train(*TINY, "steps=20", f"dataset={root}/ds", f"hydra.run.dir={root}/one", cwd=root)
    assert one.returncode == 0, one.stderr[-3000:]
    two = train(*TINY, "steps=20", f"dataset={root}/ds", f"hydra.run.dir={root}/two", cwd=root, launcher=TORCHRUN)
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    return {"one": one.stdout + one.stderr, "two": two.stdout + two.stderr}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same 20-step run in one process and in two under torchrun (dataset collected once), built
    once per session: (folder, output of the one-process run, output of the torchrun run)."""
    from conftest import built_once

    root, out = built_once(tmp_path_factory, "ddp-pair", _pair)
    return root, out["one"], out["two"]


def test_two_processes_train_what_one_does(pair):
    root, one, two = pair
    a, b = logged_losses(one), logged_losses(two)
    assert sorted(a) == list(range(2, 21, 2)) and a.keys() == b.keys()  # rank 1 logs no step lines
    assert max(abs(a[k] - b[k]) for k in a) <= 2e-4, (a, b)
    assert max_weight_diff(root / "one", root / "two") < 1e-4
    m1, m2 = (json.loads((root / r / "metrics.json").read_text()) for r in ("one", "two"))
    assert (m1["world_size"], m1["batch_per_rank"], m1["ddp_backend"]) == (1, 8, None)
    assert (m2["world_size"], m2["batch_per_rank"], m2["ddp_backend"]) == (2, 4, "gloo")
    assert abs(m1["final_loss"] - m2["final_loss"]) < 1e-5 and m2["batch_size"] == 8
    # rank 0 evaluated at step 10 while rank 1 waited in the next all-reduce
    assert [c["step"] for c in m2["success_curve"]] == [10, 20] and m1["success_curve"] == m2["success_curve"]
    assert "torchrun: 2 processes (gloo), 4 rows of the 8-row batch each" in two


@pytest.mark.slow
def test_two_processes_streaming_train_what_two_in_memory_do(pair):
    """Each rank streams the global batch from the episode files and keeps its slice: the same run."""
    root, _, two = pair
    r = train(*TINY, "steps=20", "stream=true", f"dataset={root}/ds", f"hydra.run.dir={root}/two-stream", cwd=root,
              launcher=TORCHRUN)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert logged_losses(r.stdout + r.stderr) == logged_losses(two)
    assert max_weight_diff(root / "two", root / "two-stream") == 0
    assert json.loads((root / "two-stream/metrics.json").read_text())["streamed"] is True


def test_rank_0_alone_writes_the_run_folder(pair):
    root, _, two = pair
    run = root / "two"
    assert not (run / ".hydra" / "previous").exists()  # no rank took the other's .hydra/ for an earlier run
    log = (run / "train.log").read_text()
    assert log.count("mlp policy, ") == 1 and log.count("step 20/20 loss") == 1, log
    assert len(list((run / "tb").iterdir())) == 1
    assert two.count("mean success") == 1  # one evaluation


def test_torchrun_refuses_a_batch_that_does_not_split_and_writes_nothing(tmp_path):
    r = train(*TINY, "steps=2", "batch_size=7", f"dataset={tmp_path}/ds", f"hydra.run.dir={tmp_path}/run",
              cwd=tmp_path, launcher=TORCHRUN)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.startswith("embodied train: error: ")]
    # each rank refuses; torchrun stops the other rank once the first exits, so on a loaded machine one
    # rank may be stopped before it prints
    assert 1 <= len(lines) <= 2 and "batch_size=7" in lines[0] and "the 2 processes" in lines[0], r.stderr[-3000:]
    assert "batch_size=6 or 8" in lines[0] and "exitcode  : 2" in r.stderr  # a user error, not a crash
    assert not (tmp_path / "run").exists() and not (tmp_path / "ds").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: NCCL can work here")
def test_torchrun_refuses_nccl_without_gpus(tmp_path):
    r = train(*TINY, "steps=2", "ddp_backend=nccl", f"dataset={tmp_path}/ds", f"hydra.run.dir={tmp_path}/run",
              cwd=tmp_path, launcher=TORCHRUN)
    assert r.returncode != 0 and "ddp_backend=nccl needs CUDA GPUs and NCCL, but this machine has no CUDA GPU" \
        in r.stderr, r.stderr[-3000:]
    assert not (tmp_path / "run").exists()


def test_a_stray_rank_variable_without_torchrun_is_named(tmp_path):
    r = train(*TINY, "steps=2", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path, env=_env(RANK="1"))
    assert r.returncode == 2 and "RANK=1 is set but not WORLD_SIZE" in r.stderr and "torchrun" in r.stderr, \
        r.stderr[-3000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_checkpoint_resumes_across_world_sizes(pair, tmp_path):
    """Two processes' checkpoint continues in one, one process's continues in two: the same weights."""
    import shutil

    root, _, _ = pair
    for run in ("one", "two"):
        shutil.copytree(root / run, tmp_path / run)
    common = (*TINY, "steps=30", f"dataset={root}/ds")
    r = train(*common, f"hydra.run.dir={tmp_path}/two", cwd=tmp_path)  # written by two, resumed by one
    assert r.returncode == 0 and "at step 20" in r.stdout + r.stderr, r.stderr[-3000:]
    r = train(*common, f"hydra.run.dir={tmp_path}/one", cwd=tmp_path, launcher=TORCHRUN)  # and the other way
    assert r.returncode == 0 and "at step 20" in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    m1, m2 = (json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("two", "one"))
    assert (m1["steps"], m1["resumed_from_step"], m1["world_size"]) == (30, 20, 1)
    assert (m2["steps"], m2["resumed_from_step"], m2["world_size"]) == (30, 20, 2)
    assert max_weight_diff(tmp_path / "one", tmp_path / "two") < 1e-4
    # rank 0 alone kept the first invocation's .hydra/ files (two ranks would keep two copies, or collide)
    assert sorted(p.name for p in (tmp_path / "one/.hydra/previous").iterdir()) == ["1"]
    # a finished run rerun under torchrun says so on every rank and trains nothing
    r = train(*common, f"hydra.run.dir={tmp_path}/one", cwd=tmp_path, launcher=TORCHRUN)
    assert r.returncode == 0 and r.stderr.count("finished at step 30") == 2, r.stderr[-3000:]
