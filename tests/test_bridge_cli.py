"""One checkpoint through the commands: local, ``embodied serve``, ``embodied eval policy=remote``,
``embodied robot run`` (in-process simulator and a simulator process over the network)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
EVAL = ["tasks=[reach]", "episodes=3", "splits=[train]", "videos=0", "progress=false", "device=cpu"]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from embodied.core.registry import make_env
    from policies import make_policy, save_policy

    u = make_env("reach").unwrapped
    tiny = {"horizon": 4, "n_action_steps": 2, "n_obs_steps": 2, "hidden": 32, "n_layers": 1, "state_hidden": 32,
            "obs_dim": 16, "text_dim": 8, "num_inference_steps": 2, "ema": False}
    path = tmp_path_factory.mktemp("ck") / "ck"
    save_policy(make_policy("flow", tiny, u.observation_spec, u.action_spec, None, ["reach", "press-button"],
                            device="cpu"), str(path))
    return str(path)


def _cli(*args, cwd, timeout=300):
    r = run_cli(args, cwd=cwd, env=ENV, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return r


@pytest.fixture(scope="module")
def served(tiny_checkpoint, tmp_path_factory):
    """``embodied serve`` of the tiny checkpoint in its own process; yields (url, run dir)."""
    out = tmp_path_factory.mktemp("serve")
    proc = subprocess.Popen([sys.executable, "-m", "embodied.cli", "serve", f"checkpoint={tiny_checkpoint}", "port=0",
                             "device=cpu", "duration_s=600", f"hydra.run.dir={out}"], cwd=out, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "server.json").exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "embodied serve did not start"
        time.sleep(0.2)
    yield json.loads((out / "server.json").read_text())["url"], out
    proc.terminate()
    proc.wait(timeout=30)


def test_identical_actions_local_served_and_in_robot_run(tiny_checkpoint, served, tmp_path):
    """Same observations and noise: one chunk locally, from ``embodied serve`` and inside ``embodied robot run``."""
    from embodied.bridge.client import RemotePolicy
    from embodied.runtime.checkpoints import load_for_eval
    from embodied.runtime.evaluate import RowwisePolicy

    url, _ = served
    local = load_for_eval(tiny_checkpoint, "cpu")
    remote = RemotePolicy(url)
    rng = np.random.default_rng(0)
    batch = {"state": rng.standard_normal((3, 2, local.obs_spec.state_dim)).astype(np.float32),
             "instruction": ["reach the red target", "go", "touch it"], "task": ["reach"] * 3}
    noise = rng.standard_normal((3, 4, 4)).astype(np.float32)
    # the server runs the policy as embodied eval does (RowwisePolicy: each row as if alone, bitwise)
    rowwise = RowwisePolicy(local)
    assert np.array_equal(remote.predict_chunk(batch, noise), rowwise.predict_chunk(batch, noise))
    assert np.array_equal(remote.predict_chunk(batch), rowwise.predict_chunk(batch))
    one = {k: v[:1] for k, v in batch.items()}
    assert not np.array_equal(remote.predict_chunk(one, noise[:1]), remote.predict_chunk(one, noise[1:2]))

    for noise_seed in ("null", "7"):  # the server's noise, and noise drawn and sent by the loop
        run = tmp_path / f"run_{noise_seed}"
        _cli("robot", "run", "robot=sim", "robot.task=reach", f"url={url}", "episodes=1", "loop.mode=lockstep",
             "loop.rate_hz=0", f"loop.noise_seed={noise_seed}", "record_chunks=true", f"hydra.run.dir={run}",
             cwd=tmp_path)
        z = np.load(run / "chunks.npz")
        assert len(z["t0"]) >= 60 // 2
        for i in range(len(z["t0"])):
            row = {"state": z["state"][i: i + 1], "instruction": [str(z["instruction"][i])],
                   "task": [str(z["task"][i])]}
            n = None if np.isnan(z["noise"][i]).all() else z["noise"][i: i + 1]
            assert (n is None) == (noise_seed == "null")
            assert np.array_equal(rowwise.predict_chunk(row, n)[0], z["chunk"][i]), i


def test_bridge_success_matches_eval_on_the_same_seeds(tiny_checkpoint, served, tmp_path):
    url, _ = served
    _cli("eval", f"checkpoint={tiny_checkpoint}", *EVAL, f"hydra.run.dir={tmp_path}/local", cwd=tmp_path)
    _cli("eval", "policy=remote", f"url={url}", *EVAL, f"hydra.run.dir={tmp_path}/remote", cwd=tmp_path)
    _cli("robot", "run", "robot=sim", "robot.task=reach", f"url={url}", "episodes=3", "loop.mode=lockstep",
         "loop.rate_hz=0", "loop.safety.max_delta=0", f"hydra.run.dir={tmp_path}/robot", cwd=tmp_path)
    local = json.loads((tmp_path / "local/metrics.json").read_text())["per_task"]["reach"]
    remote = json.loads((tmp_path / "remote/metrics.json").read_text())["per_task"]["reach"]
    robot = json.loads((tmp_path / "robot/metrics.json").read_text())
    for key in ("success_rate", "mean_length", "mean_return"):
        assert remote[key] == local[key], key
    assert robot["success_rate"] == local["success_rate"]
    assert np.mean([e["steps"] for e in robot["episodes"]]) == local["mean_length"]
    assert robot["interventions"] == 0 and robot["hold_steps"] == 0
    from embodied.runtime.data import Dataset

    ds = Dataset.open(tmp_path / "robot/dataset")
    assert len(ds) == 3 and [m["seed"] for m in ds.episodes_meta] == [100_000, 100_001, 100_002]
    returns = [float(ds[i]["reward"].astype(np.float64).sum()) for i in range(3)]
    assert np.mean(returns) == pytest.approx(local["mean_return"], abs=1e-5)  # rewards stored as float32
    assert not any(ds[i]["intervention"].any() for i in range(3))
    assert np.array_equal(ds[0]["action"], ds[0]["policy_action"])


def test_robot_run_against_a_simulator_process(served, tmp_path):
    """``embodied robot sim-server`` (a process behind a slow link) driven by ``embodied robot run`` at 20 Hz."""
    import socket

    url, _ = served
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sim = subprocess.Popen([sys.executable, "-m", "embodied.cli", "robot", "sim-server", "--task", "reach", "--port",
                            str(port), "--latency-ms", "2", "--jitter-ms", "1"], cwd=tmp_path, env=ENV,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "serving on" in sim.stdout.readline()
        _cli("robot", "run", "robot=remote", f"robot.url=ws://127.0.0.1:{port}", f"url={url}", "episodes=1",
             "max_steps=30", "loop.rate_hz=20", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    finally:
        sim.terminate()
        sim.wait(timeout=30)
    m = json.loads((tmp_path / "run/metrics.json").read_text())
    ep = m["episodes"][0]
    # in realtime the actions applied depend on timing, so the episode may reach the goal before the step limit
    if ep["ended_by"] == "max_steps":  # a tick whose observation the robot link missed is held, not stepped
        missed = ep["events"].get("robot_comm_errors", 0)
        assert ep["steps"] + missed == 30 and missed <= 2 and ep["events"]["chunks_used"] >= 10, ep
    else:
        assert ep["ended_by"] == "done" and ep["success"] and ep["events"]["chunks_used"] >= ep["steps"] // 4, ep
    assert ep["timing"]["period_ms_p50"] == pytest.approx(50, abs=5)
    lines = (tmp_path / "run/steps.jsonl").read_text().splitlines()
    assert len(lines) == ep["steps"] and "step_ms" in json.loads(lines[0])


def test_serve_batches_stops_by_itself_and_writes_its_metrics(tiny_checkpoint, tmp_path):
    """``duration_s`` ends ``embodied serve`` cleanly (metrics.json: requests, forward passes, rows)."""
    from embodied.bridge.client import RemotePolicy

    out = tmp_path / "serve"
    proc = subprocess.Popen([sys.executable, "-m", "embodied.cli", "serve", f"checkpoint={tiny_checkpoint}", "port=0",
                             "device=cpu", "duration_s=4", "max_batch=4", "max_wait_ms=1", f"hydra.run.dir={out}"],
                            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "server.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    meta = json.loads((out / "server.json").read_text())["metadata"]
    assert meta["max_batch"] == 4
    remote = RemotePolicy(json.loads((out / "server.json").read_text())["url"])
    batch = {"state": np.zeros((2, 2, meta["state_dim"]), np.float32), "instruction": ["go", "reach"]}
    assert remote.predict_chunk(batch).shape == (2, 4, meta["action_dim"])
    remote.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    m = json.loads((out / "metrics.json").read_text())
    assert m["requests"] == 1 and m["batching"]["rows"] == 2 and m["max_batch"] == 4


def test_robot_bench_many_robots_against_one_checkpoint_server(tiny_checkpoint, tmp_path):
    """``embodied robot bench clients=N checkpoint=...``: simulated robots of the checkpoint's tasks, one
    server, max_batch=1 and batched in one run; round trips, late-chunk interventions, chunks/s, ratios."""
    r = _cli("robot", "bench", "clients=3", "rate_hz=20", "duration_s=2", "saturate_s=1", "rounds=1",
             f"checkpoint={tiny_checkpoint}", "device=cpu", "max_batch=4", f"hydra.run.dir={tmp_path}/bench",
             cwd=tmp_path)
    m = json.loads((tmp_path / "bench/metrics.json").read_text())
    assert list(m["settings"]) == ["max_batch=1", "max_batch=4, max_wait_ms=2"]
    for s in m["settings"].values():
        assert s["robots"] == 3 and s["steps"] > 0 and s["round_trip"]["n"] > 0 and not s["errors"]
        assert s["saturated"]["chunks"] > 0 and "late_chunk_interventions" in s
    assert m["settings"]["max_batch=1"]["saturated"]["rows_per_pass"] == 1
    assert set(m["batched_over_one_at_a_time"]) == {"round_trip_p50", "round_trip_p99", "chunks_per_s"}
    assert "batched / one at a time" in r.stdout and "late-chunk interventions" in r.stdout


def test_robot_bench_is_a_hydra_command(tmp_path):
    """``embodied robot bench`` takes ``hydra.run.dir=`` and writes ``metrics.json`` there (and ``out=`` too)."""
    r = _cli("robot", "bench", "requests=5", "loop_steps=5", f"out={tmp_path}/copy.json",
             f"hydra.run.dir={tmp_path}/bench", cwd=tmp_path)
    m = json.loads((tmp_path / "bench/metrics.json").read_text())
    assert m["state"]["n"] == 5 and m["images_2x224x224"]["n"] == 5 and m["loop"]["steps"] == 5
    assert json.loads((tmp_path / "copy.json").read_text()) == m
    assert "round trip, state" in r.stdout and "control loop at 50 Hz" in r.stdout
    r = run_cli(["robot", "bench", "requests=0", f"hydra.run.dir={tmp_path}/bad"], cwd=tmp_path, env=ENV,
                timeout=120)
    assert r.returncode == 2 and "requests must be >= 1" in r.stderr and not (tmp_path / "bad").exists()


def test_bad_command_arguments_name_the_problem(tmp_path):
    r = run_cli(["robot", "run", "robot=sim", f"hydra.run.dir={tmp_path}"], cwd=tmp_path, env=ENV, timeout=120)
    assert r.returncode == 2 and "url=ws://HOST:PORT" in r.stderr
    r = run_cli(["eval", "policy=remote", f"hydra.run.dir={tmp_path}"], cwd=tmp_path, env=ENV, timeout=120)
    assert r.returncode == 2 and "policy=remote and url=ws://HOST:PORT go together" in r.stderr
    r = run_cli(["robot", "fly"], cwd=tmp_path, env=ENV, timeout=120)
    assert r.returncode == 2 and "unknown sub-command 'fly'" in r.stderr


def test_serve_runtime_onnxruntime_gives_the_torch_chunks_to_1e5_and_is_refused_where_it_cannot_run(tiny_checkpoint,
                                                                                                     tmp_path):
    """``embodied serve runtime=onnxruntime``: a lone robot's chunk from ONNX Runtime, equal to the default
    (torchscript, bitwise eval's) within 1e-5; a bad name and a policy it cannot run are clear errors."""
    import torch

    from embodied.runtime.serve import ServeConfig, load_served
    from policies import make_policy, save_policy

    threads = torch.get_num_threads()
    try:
        default, meta = load_served(str(tiny_checkpoint), "cpu")
        onnx, _ = load_served(str(tiny_checkpoint), "cpu", runtime="onnxruntime")
        assert onnx.policy.unwrapped._frozen.runtime == "onnxruntime"
        rng = np.random.default_rng(0)
        for i in range(5):
            batch = {"state": rng.normal(size=(1, meta["n_obs_steps"], meta["state_dim"])).astype(np.float32),
                     "instruction": ["reach the red target", "press the button"][i % 2:][:1]}
            a, b = default.predict_chunk(batch), onnx.predict_chunk(batch)
            assert a.shape == b.shape and np.abs(a - b).max() < 1e-5
        assert type(onnx.policy.unwrapped._frozen.graphs[next(iter(onnx.policy.unwrapped._frozen.graphs))]).__name__ \
            == "_OnnxChunk"
        with pytest.raises(ValueError, match=r"runtime must be one of \('torchscript', 'onnxruntime'\), got 'tvm'"):
            ServeConfig(checkpoint=str(tiny_checkpoint), runtime="tvm")
        from embodied.core.registry import make_env

        u = make_env("reach").unwrapped  # a diffusion policy: its sampler is not a fixed loop to export
        save_policy(make_policy("diffusion", {"horizon": 4, "n_action_steps": 2, "hidden": 32, "n_layers": 1,
                                              "num_inference_steps": 2}, u.observation_spec, u.action_spec, None,
                                ["reach"], device="cpu"), tmp_path / "diffusion")
        with pytest.raises(ValueError, match="runtime=onnxruntime runs flow policies with state observations"):
            load_served(str(tmp_path / "diffusion"), "cpu", runtime="onnxruntime")
    finally:
        torch.set_num_threads(threads)
