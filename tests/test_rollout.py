"""Rollouts through vector environments: what the policy sees must not depend on ``vector``."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import sim  # noqa: F401  (configures headless GL before mujoco is imported)
from embodied.core.policy import Policy
from embodied.core.registry import make_env
from embodied.runtime.rollout import run_episodes


class RecordingPolicy(Policy):
    """Returns zero actions and remembers every instruction and image batch it was given."""

    n_obs_steps, horizon, n_action_steps = 1, 4, 4

    def __init__(self) -> None:
        super().__init__()
        self.instructions: list[str] = []
        self.images: list[np.ndarray] = []

    def predict_chunk(self, obs_batch, noise=None):
        self.instructions += list(obs_batch["instruction"])
        self.images.append(np.asarray(obs_batch["image"]))
        return np.zeros((len(obs_batch["instruction"]), self.horizon, 4), np.float32)


@pytest.mark.parametrize("vector", ["sync", "async"])
def test_policy_sees_the_real_instruction_and_images(vector):
    make = functools.partial(make_env, "press-button", obs_mode="pixels", image_size=32, max_episode_steps=8)
    policy = RecordingPolicy()
    results = run_episodes(make, seeds=[0, 1, 2], policy=policy, num_envs=2, vector=vector)
    assert {r.instruction for r in results} == set(policy.instructions)  # not a placeholder string
    assert all("button" in s for s in policy.instructions)
    first = make()
    obs, _ = first.reset(seed=0)
    np.testing.assert_array_equal(policy.images[0][0, 0], obs["image"])  # the env's own frame
    first.close()


def reach_batch(policy) -> dict:
    """A one-row observation batch of reach's first held-out seed, as ``policy`` reads it."""
    env = make_env("reach")
    obs, _ = env.reset(seed=100000)
    env.close()
    return {k: (np.asarray(v)[None, None].repeat(policy.n_obs_steps, 1) if k not in ("instruction", "task")
                else [v]) for k, v in obs.items() if k in ("state", "instruction", "task")}


def test_noise_streams_replay_the_same_seeds_with_other_noise_and_report_pass_at_k(tmp_path):
    """Stream 0 is the ordinary evaluation; stream k > 0 draws other noise for the same seeds,
    reproducibly; pass@k is the share of seeds some stream solves."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny import reach_checkpoint

    from embodied.runtime.checkpoints import load_for_eval
    from embodied.runtime.evaluate import RowwisePolicy, evaluate, noise_stream_summary
    from embodied.runtime.rollout import EpisodeResult

    policy = load_for_eval(str(reach_checkpoint(tmp_path / "ckpt")), "cpu")
    batch = reach_batch(policy)
    c0, c0b = RowwisePolicy(policy).predict_chunk(batch), RowwisePolicy(policy, 0).predict_chunk(batch)
    c1, c1b = RowwisePolicy(policy, 1).predict_chunk(batch), RowwisePolicy(policy, 1).predict_chunk(batch)
    np.testing.assert_array_equal(c0, c0b)
    np.testing.assert_array_equal(c1, c1b)
    assert not np.allclose(c0, c1)

    _, r0 = evaluate(policy, ["reach"], 2, ("train",), 100000, 2, progress=False)
    _, r0b = evaluate(policy, ["reach"], 2, ("train",), 100000, 2, progress=False, noise_stream=0)
    _, r1 = evaluate(policy, ["reach"], 2, ("train",), 100000, 2, progress=False, noise_stream=1)
    assert [e.ret for e in r0["reach/train"]] == [e.ret for e in r0b["reach/train"]]
    assert [e.seed for e in r1["reach/train"]] == [100000, 100001]
    assert [e.ret for e in r1["reach/train"]] != [e.ret for e in r0["reach/train"]]

    def rec(seed, ok):
        return EpisodeResult(seed=seed, instruction="i", success=ok, length=1, ret=0.0)

    streams = [{"reach/train": [rec(1, True), rec(2, False), rec(3, False)]},
               {"reach/train": [rec(1, False), rec(2, True), rec(3, False)]}]
    s = noise_stream_summary(streams)
    assert s["k"] == 2
    assert s["per_task"]["reach/train"]["pass_at_k"] == pytest.approx(2 / 3)
    assert s["per_task"]["reach/train"]["mean"] == pytest.approx(2 / 6)
    assert s["per_task"]["reach/train"]["unsolved_seeds"] == [3]
    assert s["train"]["pass_at_k"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="other seeds"):
        noise_stream_summary([streams[0], {"reach/train": [rec(1, True), rec(2, True), rec(4, True)]}])


@pytest.mark.parametrize("kw, match", [
    ({"noise_streams": 0}, r"noise_streams must be in \[1, 1000\], got 0"),
    ({"noise_streams": 4}, "give checkpoint=PATH"),
    ({"noise_streams": 4, "checkpoint": "CKPT", "workers": 2}, "runner=local workers=1"),
])
def test_noise_streams_refuses_what_it_cannot_replay(tmp_path, kw, match):
    from embodied.runtime.eval_job import EvalConfig

    if kw.get("checkpoint") == "CKPT":
        (tmp_path / "c").mkdir()
        kw = {**kw, "checkpoint": str(tmp_path / "c")}
    with pytest.raises(ValueError, match=match):
        EvalConfig(tasks=["reach"], **kw)


def test_noise_scale_multiplies_the_drawn_noise_and_reaches_the_workers(tmp_path):
    """noise_scale=0 plays the zero noise (the flow's mode); 0.5 halves every row's drawn noise;
    a worker process gets the same scale as this process; explicit noise is used as given."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from cli_runner import run_cli
    from tiny import reach_checkpoint

    from embodied.core.policy import batch_row
    from embodied.runtime.checkpoints import load_for_eval
    from embodied.runtime.evaluate import RowwisePolicy, _row_noise

    ckpt = reach_checkpoint(tmp_path / "ckpt")
    policy = load_for_eval(str(ckpt), "cpu")
    batch = reach_batch(policy)
    zeros = np.zeros((1, *policy.noise_shape), np.float32)
    np.testing.assert_array_equal(RowwisePolicy(policy, noise_scale=0).predict_chunk(batch),
                                  RowwisePolicy(policy).predict_chunk(batch, zeros))
    rowwise = RowwisePolicy(policy)
    half = 0.5 * _row_noise(rowwise.noise_key, batch_row(batch, 0), tuple(policy.noise_shape))
    np.testing.assert_array_equal(RowwisePolicy(policy, noise_scale=0.5).predict_chunk(batch),
                                  rowwise.predict_chunk(batch, half.astype(np.float32)))
    assert not np.allclose(RowwisePolicy(policy, noise_scale=0).predict_chunk(batch), rowwise.predict_chunk(batch))
    np.testing.assert_array_equal(RowwisePolicy(policy, noise_scale=0).predict_chunk(batch, half.astype(np.float32)),
                                  rowwise.predict_chunk(batch, half.astype(np.float32)))  # explicit noise: unscaled

    rets = {}
    for scale, workers in ((0, 1), (0, 2), (1, 1)):
        run = tmp_path / f"eval_{scale}_{workers}"
        r = run_cli(["eval", f"checkpoint={ckpt}", "tasks=[reach]", "episodes=2", "videos=0", "progress=false",
                     f"noise_scale={scale}", f"workers={workers}", f"hydra.run.dir={run}"], cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        m = json.loads((run / "metrics.json").read_text())
        assert m["noise_scale"] == scale
        rets[scale, workers] = m["per_task"]["reach"]["mean_return"]
    assert rets[0, 1] == rets[0, 2]  # the workers drew the same zero noise
    assert rets[0, 1] != rets[1, 1]

    # a checkpoint trained with policy.noise_scale=0 (the same weights): eval, its workers and
    # predict_chunk play the zero noise unless told otherwise
    zero_ckpt = reach_checkpoint(tmp_path / "ckpt0", config={"noise_scale": 0.0})
    own = load_for_eval(str(zero_ckpt), "cpu")
    assert own.noise_scale == 0.0
    np.testing.assert_array_equal(own.predict_chunk(batch), own.predict_chunk(batch, zeros))
    np.testing.assert_array_equal(RowwisePolicy(own).predict_chunk(batch), RowwisePolicy(policy, noise_scale=0)
                                  .predict_chunk(batch))
    np.testing.assert_array_equal(RowwisePolicy(own, noise_scale=1).predict_chunk(batch), rowwise.predict_chunk(batch))
    run = tmp_path / "eval_own"
    r = run_cli(["eval", f"checkpoint={zero_ckpt}", "tasks=[reach]", "episodes=2", "videos=0", "progress=false",
                 "workers=2", f"hydra.run.dir={run}"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads((run / "metrics.json").read_text())
    assert m["noise_scale"] == 0.0 and m["per_task"]["reach"]["mean_return"] == rets[0, 1]


@pytest.mark.parametrize("value", [-0.5, float("nan"), float("inf"), True, "x"])
def test_a_policys_noise_scale_refuses_what_is_not_a_scale(value):
    from policies.flow.config import FlowConfig

    with pytest.raises(ValueError, match="noise_scale=.* is not allowed: must be a finite number >= 0"):
        FlowConfig(noise_scale=value)


def test_noise_scale_is_an_inference_setting_of_flow_and_diffusion_policies_only(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny import reach_checkpoint

    from embodied.runtime.checkpoints import load_for_eval
    from embodied.runtime.serve import load_served

    diffusion = load_for_eval(str(reach_checkpoint(tmp_path / "d", "diffusion", config={"noise_scale": 0.5})), "cpu")
    assert diffusion.noise_scale == 0.5
    diffusion.noise_scale = 0
    assert diffusion.config.noise_scale == 0.0
    with pytest.raises(ValueError, match="noise_scale=-1 is not allowed"):
        diffusion.noise_scale = -1
    mlp = reach_checkpoint(tmp_path / "m", "mlp")
    with pytest.raises(ValueError, match="noise_scale has no effect on a 'mlp' policy"):
        load_for_eval(str(mlp), "cpu").noise_scale = 0
    served, meta = load_served(str(reach_checkpoint(tmp_path / "f")), "cpu", noise_scale=0)
    assert served.noise_scale == 0.0 and meta["noise_scale"] == 0.0


@pytest.mark.parametrize("value", [-0.5, float("nan"), float("inf")])
def test_noise_scale_refuses_what_is_not_a_scale(tmp_path, value):
    from embodied.runtime.eval_job import EvalConfig

    with pytest.raises(ValueError, match="noise_scale=.* is not allowed: must be a finite number >= 0"):
        EvalConfig(tasks=["reach"], noise_scale=value)


def test_noise_scale_is_refused_where_no_noise_is_drawn(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from cli_runner import run_cli

    r = run_cli(["eval", "tasks=[reach]", "episodes=1", "videos=0", "noise_scale=0", f"hydra.run.dir={tmp_path}/r"],
                cwd=tmp_path)
    assert r.returncode != 0 and "noise_scale=0.0 has no effect here" in r.stderr, r.stderr[-2000:]
