"""Local worker processes (``workers``): the same episodes, metrics and datasets as one process, no Ray."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embodied.runtime.eval_job import EvalConfig
from embodied.runtime.distributed import PolicySource, evaluate_sharded
from embodied.runtime.evaluate import evaluate

RUN_KEYS = ("runner", "shards", "retried_shards", "wall_time_s", "workers")


def records(results):
    return {k: [(r.seed, r.instruction, r.grounded, r.success, r.length, r.ret) for r in v] for k, v in results.items()}


def without_run_info(metrics):
    return {k: v for k, v in metrics.items() if k not in RUN_KEYS}


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from embodied.core.registry import make_env
    from policies import make_policy, save_policy

    u = make_env("reach").unwrapped
    tiny = {"horizon": 4, "n_action_steps": 2, "n_obs_steps": 1, "hidden": 32, "n_layers": 1, "state_hidden": 32,
            "obs_dim": 16, "text_dim": 8, "num_inference_steps": 2, "ema": False}
    path = tmp_path_factory.mktemp("ck") / "ck"
    save_policy(make_policy("flow", tiny, u.observation_spec, u.action_spec, None, ["reach", "press-button"],
                            device="cpu"), str(path))
    return str(path)


def test_worker_processes_match_one_process(tiny_checkpoint):
    """A generative policy in two worker processes: the same episodes, metrics and video frames."""
    from policies import load_policy

    kw = dict(tasks=["reach", "press-button"], episodes=3, num_envs=2, videos=1, progress=False)
    m1, r1 = evaluate(load_policy(tiny_checkpoint, device="cpu"), **kw)
    m2, r2 = evaluate_sharded(PolicySource(tiny_checkpoint, device="cpu"), **kw, workers=2)
    assert records(r2) == records(r1)
    assert without_run_info(m2) == without_run_info(m1)
    assert m2["runner"] == "local" and m2["workers"] == 2 and m2["shards"] == 4 and m2["retried_shards"] == []
    assert r2["reach/train"][0].frames and not r2["reach/train"][1].frames
    assert all(np.array_equal(x, y) for x, y in zip(r1["reach/train"][0].frames, r2["reach/train"][0].frames))


def test_grounding_policy_matches_in_worker_processes(tmp_path):
    """Grounded held-out wordings: the same wording chosen, and the same episodes, in workers."""
    from embodied.core.registry import make_env
    from policies import load_trained, make_policy, save_policy
    from policies.common.grounding import GroundedPolicy, InstructionGrounding
    from sim.metaworld import INSTRUCTIONS

    tasks = ["reach-v3", "push-v3", "door-open-v3"]
    u = make_env(tasks[0]).unwrapped
    tiny = {"horizon": 4, "n_action_steps": 2, "n_obs_steps": 1, "hidden": 32, "n_layers": 1, "state_hidden": 32,
            "obs_dim": 16, "text_dim": 8, "num_inference_steps": 2, "ema": False, "ground_instructions": True}
    policy = make_policy("flow", tiny, u.observation_spec, u.action_spec, None, tasks, device="cpu")
    first = {t: [make_env(t).reset(seed=s)[0]["state"] for s in range(3)] for t in tasks}
    states = np.array([s for t in tasks for s in first[t]])
    grounding = InstructionGrounding.from_demonstrations(
        {t: INSTRUCTIONS[t].train for t in tasks}, states, [t for t in tasks for _ in first[t]], states, k=3)
    # one wording at a time, as a fresh worker embeds them: MiniLM's shared cache would otherwise
    # hold batch-computed vectors here, a last-bit difference from the workers'
    grounding.ensure_embeddings(lambda texts: np.concatenate([policy.sentence_vectors([t]) for t in texts]))
    save_policy(GroundedPolicy(policy, grounding), str(tmp_path / "ck"))
    kw = dict(tasks=tasks, episodes=2, splits=("heldout",), num_envs=2, progress=False,
              env_kwargs={"max_episode_steps": 5})
    m1, r1 = evaluate(load_trained(str(tmp_path / "ck"), device="cpu"), **kw)
    m2, r2 = evaluate_sharded(PolicySource(str(tmp_path / "ck"), device="cpu"), **kw, workers=2)
    assert records(r2) == records(r1)
    assert without_run_info(m2) == without_run_info(m1)
    door = r1["door-open-v3/heldout"]  # the door's scene is its own: only its wordings are candidates
    assert all(r.grounded in INSTRUCTIONS["door-open-v3"].train for r in door)
    off, _ = evaluate_sharded(PolicySource(str(tmp_path / "ck"), device="cpu", ground_instructions=False), **kw,
                              workers=2)
    assert all("grounded_episodes" not in p["heldout"] for p in off["per_task"].values())


def test_worker_error_reaches_the_driver(tmp_path):
    """An error inside a worker (a missing checkpoint) stops the run with that error."""
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        evaluate_sharded(PolicySource(str(tmp_path / "missing"), device="cpu"), ["reach"], episodes=2,
                         splits=("train",), progress=False, workers=2)


def test_collect_in_worker_processes_writes_the_same_dataset(tmp_path):
    import embodied.runtime.collect as collect_cmd
    from embodied.runtime.data import Dataset

    kw = dict(tasks=["reach", "press-button"], episodes=3, action_noise=0.1, progress=False)
    collect_cmd.collect(out=tmp_path / "one", **kw)
    m = collect_cmd.collect(out=tmp_path / "two", workers=2, **kw)
    assert m["workers"] == 2 and m["episodes"] == 6
    a, b = Dataset.open(tmp_path / "one"), Dataset.open(tmp_path / "two")
    meta = [[{k: v for k, v in e.items() if k not in ("file", "bytes")} for e in d.episodes_meta] for d in (a, b)]
    assert meta[0] == meta[1] and len(a) == len(b) == 6
    for i in range(len(a)):
        ea, eb = a[i], b[i]
        assert set(ea) == set(eb)
        assert all(np.array_equal(ea[k], eb[k]) for k in ea if isinstance(ea[k], np.ndarray))


def test_workers_config_is_checked():
    import embodied.runtime.collect as collect_cmd
    from embodied.runtime.train import TrainConfig

    for cls in (EvalConfig, collect_cmd.CollectConfig, TrainConfig):
        with pytest.raises(ValueError, match="workers"):
            cls(workers=-1)


def test_train_uses_a_worker_per_core_for_state_and_pixels(monkeypatch):
    """``workers=0`` in ``embodied train``: one process per core from 100 episodes on, whatever the
    observations (a pixel worker renders its own frames); fewer episodes stay in this process."""
    import embodied.runtime.train as train_mod

    monkeypatch.setattr(train_mod.os, "cpu_count", lambda: 3)
    for obs_mode in ("state", "pixels"):
        cfg = train_mod.TrainConfig(obs_mode=obs_mode)
        assert (train_mod._workers(cfg, 100), train_mod._workers(cfg, 99)) == (3, 1), obs_mode
        assert train_mod._workers(train_mod.TrainConfig(obs_mode=obs_mode, workers=2), 10) == 2


@pytest.mark.slow
def test_cli_eval_workers(tiny_checkpoint, tmp_path):
    """``embodied eval workers=2``: metrics.json equals the one-process evaluation's."""
    from cli_runner import run_cli

    r = run_cli(["eval", f"checkpoint={tiny_checkpoint}", "workers=2", "device=cpu", "tasks=[reach]", "episodes=2",
                 "splits=[train]", "videos=0", "progress=false", f"hydra.run.dir={tmp_path}/ev"], cwd=tmp_path,
                timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((tmp_path / "ev/metrics.json").read_text())
    assert m["runner"] == "local" and m["workers"] == 2
    from policies import load_policy

    m1, _ = evaluate(load_policy(tiny_checkpoint, device="cpu"), ["reach"], episodes=2, splits=("train",),
                     progress=False)
    assert m["per_task"] == m1["per_task"]


@pytest.mark.parametrize("busy, idle, iowait, free", [
    (0, 400, 0, 4),  # all four cores idle over the window
    (100, 300, 0, 3),  # one core's worth of time busy
    (300, 100, 0, 1),  # three
    (100, 200, 100, 3),  # iowait counts as idle
    (60, 340, 0, 4),  # 60% of a core: not busy (a core counts as busy from 70% use)
    (280, 120, 0, 1),  # 2.8 cores: three busy
])
def test_free_cores_counts_idle_cores(monkeypatch, busy, idle, iowait, free):
    """free_cores reads /proc/stat twice and counts the cores idle in between (4 here; the
    fallback without /proc/stat, half of them, gives 2, unlike every case above)."""
    import os

    import embodied.runtime.train as train_mod

    assert 1 <= train_mod.free_cores(0.05) <= (os.cpu_count() or 1)
    u0, i0, w0 = 1000, 8000, 50  # user, idle, iowait jiffies at the first reading
    readings = [f"cpu {u0} 0 500 {i0} {w0} 0 0 0 0 0\n",
                f"cpu {u0 + busy} 0 500 {i0 + idle} {w0 + iowait} 0 0 0 0 0\n"]
    opened = []

    class FakeStat:
        def __init__(self, path, *_):
            opened.append(path)
            self.line = readings[len(opened) - 1]

        def __enter__(self):
            return self

        def __exit__(self, *_):
            return False

        def readline(self):
            return self.line

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(train_mod, "open", FakeStat, raising=False)
    assert train_mod.free_cores(0.0) == free
    assert opened == ["/proc/stat", "/proc/stat"]


def test_free_cores_without_proc_stat_is_half_the_cores(monkeypatch):
    import os

    import embodied.runtime.train as train_mod

    def no_proc(*_):
        raise OSError("no /proc/stat")

    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    monkeypatch.setattr(train_mod, "open", no_proc, raising=False)
    assert train_mod.free_cores(0.0) == 3
