"""The Ray runner: the same episodes and metrics as the local runner, retries of killed workers, CLI.

One local Ray instance (2 CPUs) serves the module; budgets are a few episodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import embodied.runtime.collect as collect_cmd  # noqa: E402
import embodied.runtime.distributed as dist  # noqa: E402
from embodied.runtime.eval_job import EvalConfig  # noqa: E402
from embodied.runtime.distributed import PolicySource, RayOptions, evaluate_ray  # noqa: E402
from embodied.runtime.evaluate import evaluate  # noqa: E402

# The crash-once wrappers below run on Ray workers, which cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

RUN_KEYS = ("runner", "shards", "retried_shards", "wall_time_s")


@pytest.fixture(scope="module")
def ray_address():
    ctx = ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ctx.address_info["address"]
    ray.shutdown()


def records(results):
    """Everything an episode record holds but frames, per "task/split"."""
    return {k: [(r.seed, r.instruction, r.grounded, r.success, r.length, r.ret) for r in v] for k, v in results.items()}


def without_run_info(metrics):
    return {k: v for k, v in metrics.items() if k not in RUN_KEYS}


def crash_once(fn, marker):
    """``fn``, except that the first call anywhere kills its worker process (no clean exit)."""

    def shard(*args):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return fn(*args)
        os._exit(1)

    return shard


def test_expert_eval_matches_local(ray_address):
    kw = dict(tasks=["reach", "press-button"], episodes=4, num_envs=2, videos=1, progress=False)
    m_local, r_local = evaluate("expert", **kw)
    m_ray, r_ray = evaluate_ray(PolicySource(), **kw, options=RayOptions(shard_episodes=2))
    assert records(r_ray) == records(r_local)
    assert without_run_info(m_ray) == without_run_info(m_local)
    assert m_ray["runner"] == "ray" and m_ray["shards"] == 8 and m_ray["retried_shards"] == []
    for key in r_local:  # frames come back for the episodes whose videos were asked for
        for a, b in zip(r_local[key], r_ray[key]):
            assert len(a.frames) == len(b.frames)
            assert all(np.array_equal(x, y) for x, y in zip(a.frames, b.frames))
    assert r_ray["reach/train"][0].frames and not r_ray["reach/train"][1].frames


@pytest.mark.slow
def test_flow_checkpoint_eval_matches_local(ray_address, tmp_path):
    """A generative policy: episodes depend on their seed only, not on batching or sharding."""
    from embodied.core.registry import make_env
    from policies import load_policy, make_policy, save_policy

    u = make_env("reach").unwrapped
    tiny = {"horizon": 4, "n_action_steps": 2, "n_obs_steps": 1, "hidden": 32, "n_layers": 1, "state_hidden": 32,
            "obs_dim": 16, "text_dim": 8, "num_inference_steps": 2, "ema": False}
    save_policy(make_policy("flow", tiny, u.observation_spec, u.action_spec, None, ["reach"], device="cpu"),
                str(tmp_path / "ck"))
    kw = dict(tasks=["reach"], episodes=4, splits=("train",), progress=False)
    m1, r1 = evaluate(load_policy(str(tmp_path / "ck"), device="cpu"), num_envs=1, **kw)
    m3, r3 = evaluate(load_policy(str(tmp_path / "ck"), device="cpu"), num_envs=3, **kw)
    assert records(r1) == records(r3)
    m_ray, r_ray = evaluate_ray(PolicySource(str(tmp_path / "ck"), device="cpu"), num_envs=3, **kw,
                                options=RayOptions(shard_episodes=1))
    assert records(r_ray) == records(r1)
    assert without_run_info(m_ray) == without_run_info(m1)


@pytest.mark.parametrize("who", ["ray", "driver"])
def test_killed_worker_is_retried(ray_address, tmp_path, monkeypatch, who):
    """A worker killed mid-run: Ray retries its shard (or, once Ray gives up, the driver does)."""
    kw = dict(tasks=["reach"], episodes=4, num_envs=2, progress=False)
    m_local, r_local = evaluate("expert", **kw)
    monkeypatch.setattr(dist, "eval_shard", crash_once(dist.eval_shard, str(tmp_path / "crashed")))
    opts = RayOptions(shard_episodes=2) if who == "ray" else RayOptions(shard_episodes=2, task_retries=0, resubmits=1)
    m_ray, r_ray = evaluate_ray(PolicySource(), **kw, options=opts)
    assert (tmp_path / "crashed").exists()
    assert records(r_ray) == records(r_local)
    assert without_run_info(m_ray) == without_run_info(m_local)
    [retry] = m_ray["retried_shards"]
    assert retry["attempts"] == 2 and retry["resubmitted"] == (who == "driver")
    assert retry["task"] == "reach" and retry["seeds"] in ([100_000, 100_001], [100_002, 100_003])


def test_driver_gives_up_after_its_resubmits(ray_address, tmp_path, monkeypatch):
    def always_crash(*args):
        os._exit(1)

    monkeypatch.setattr(dist, "eval_shard", always_crash)
    with pytest.raises(RuntimeError, match="lost its worker 1 times"):
        evaluate_ray(PolicySource(), ["reach"], episodes=1, progress=False,
                     options=RayOptions(task_retries=0, resubmits=0))


@pytest.mark.slow
def test_collect_matches_local_despite_a_killed_worker(ray_address, tmp_path, monkeypatch):
    from embodied.runtime.data import Dataset

    kw = dict(tasks=["reach", "press-button"], episodes=3, action_noise=0.1, progress=False)
    collect_cmd.collect(out=tmp_path / "local", **kw)
    monkeypatch.setattr(collect_cmd, "expert_shard", crash_once(collect_cmd.expert_shard, str(tmp_path / "crashed")))
    m = collect_cmd.collect(out=tmp_path / "ray", runner="ray", ray_options=RayOptions(shard_episodes=2), **kw)
    assert m["runner"] == "ray" and len(m["retried_shards"]) == 1 and m["retried_shards"][0]["attempts"] == 2
    a, b = Dataset.open(tmp_path / "local"), Dataset.open(tmp_path / "ray")
    assert len(a) == len(b) == 6
    assert [{k: v for k, v in e.items() if k not in ("file", "bytes")} for e in a.episodes_meta] == \
        [{k: v for k, v in e.items() if k not in ("file", "bytes")} for e in b.episodes_meta]
    for i in range(len(a)):
        ea, eb = a[i], b[i]
        assert set(ea) == set(eb)
        for k in ea:
            if isinstance(ea[k], np.ndarray):
                assert np.array_equal(ea[k], eb[k]), k
    # resuming with the Ray runner adds fresh seeds, as the local runner does
    kw["episodes"] = 4
    collect_cmd.collect(out=tmp_path / "local", **kw)
    collect_cmd.collect(out=tmp_path / "ray", runner="ray", **kw)
    seeds = [[e["seed"] for e in Dataset.open(tmp_path / d).episodes_meta] for d in ("local", "ray")]
    assert seeds[0] == seeds[1] and len(seeds[0]) == 8


def test_cli_eval_runner_ray(ray_address, tmp_path):
    """``embodied eval runner=ray`` joining the running instance (``ray_address``): metrics.json says so."""
    cmd = [sys.executable, "-m", "embodied.cli", "eval", "runner=ray", f"ray_address={ray_address}", "policy=expert",
           "tasks=[reach]", "episodes=2", "splits=[train]", "videos=0", "progress=false",
           f"hydra.run.dir={tmp_path}/eval"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((tmp_path / "eval/metrics.json").read_text())
    assert m["runner"] == "ray" and m["retried_shards"] == [] and m["per_task"]["reach"]["episodes"] == 2
    m_local, _ = evaluate("expert", ["reach"], episodes=2, splits=("train",), progress=False)
    assert m["per_task"] == m_local["per_task"]


@pytest.mark.parametrize("field, value, needle", [
    ("runner", "spark", "runner"),
    ("ray_num_cpus", -1, "ray_num_cpus"),
    ("ray_retries", -2, "ray_retries"),
])
def test_bad_runner_config_names_the_field(field, value, needle):
    with pytest.raises(ValueError, match=needle):
        EvalConfig(**{field: value})
    with pytest.raises(ValueError, match=needle):
        collect_cmd.CollectConfig(**{field: value})



@pytest.mark.slow
def test_cli_collect_runner_ray_local_instance(tmp_path):
    """``embodied collect runner=ray`` starting (and stopping) a Ray instance of its own."""
    cmd = [sys.executable, "-m", "embodied.cli", "collect", "runner=ray", "ray_num_cpus=1", "tasks=[reach]",
           "episodes=2", f"out={tmp_path}/ds", "progress=false", f"hydra.run.dir={tmp_path}/collect"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((tmp_path / "collect/metrics.json").read_text())
    assert m["runner"] == "ray" and m["retried_shards"] == [] and m["episodes"] == 2
