"""A learned preference reward used by the policy learners: loading it for steering and
reward eval, the states it reads there, and the errors for a missing or foreign file."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from embodied.core.reward import RewardModel, RewardOutput
from rewards.preference.model import PreferenceReward, RewardConfig, load_reward
from rewards.preference.segments import Trajectory, sample_pairs
from rewards.preference.teachers import make_simulated
from tiny import reach_checkpoint
from rewards.preference.store import TARGET

torch.set_num_threads(1)


def trained(tmp_path, ds: int = 4) -> PreferenceReward:
    rng = np.random.default_rng(0)
    w = rng.normal(size=ds)
    trajs = []
    for _ in range(8):
        s = rng.normal(size=(20, ds)).astype(np.float32)
        trajs.append(Trajectory(s, np.zeros((20, 2), np.float32), (s @ w).astype(np.float32), "go"))
    qs = sample_pairs(trajs, 40, 5, rng)
    model = PreferenceReward(RewardConfig(hidden=16, epochs=2, ensemble=2), ds, 2)
    model.train(qs, [TARGET[a] for a in make_simulated("oracle").label(qs)])
    model.save(tmp_path / "reward.pt")
    return model


def test_a_learned_reward_round_trips_through_load_reward_shifted_below_zero(tmp_path):
    model = trained(tmp_path)
    x = np.random.default_rng(1).normal(size=(7, 4)).astype(np.float32)
    raw = model(None, x, "go").reward
    for where in (tmp_path / "reward.pt", tmp_path, str(tmp_path / "reward.pt")):
        back = load_reward(path=where)
        np.testing.assert_allclose(back(None, x, "go").reward, raw - 1.0, rtol=1e-5, atol=1e-6)
        assert back.reward_range == (-2.0, 0.0) and np.all(back(None, x, "go").reward < 0)
    np.testing.assert_allclose(load_reward(tmp_path, shift="none")(None, x, "go").reward, raw, rtol=1e-5)
    # preferences are blind to the shift: the same segment ranking either way
    assert np.argsort(load_reward(tmp_path)(None, x, "go").reward).tolist() == np.argsort(raw).tolist()


def test_a_missing_empty_or_foreign_reward_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="needs path="):
        load_reward()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_reward(tmp_path / "nope.pt")
    with pytest.raises(FileNotFoundError, match="holds no reward.pt"):
        load_reward(tmp_path)
    trained(tmp_path)
    with pytest.raises(ValueError, match="shift='top' is not allowed"):
        load_reward(tmp_path, shift="top")
    (tmp_path / "reward.pt").write_bytes(b"a VLM checkpoint, say")
    with pytest.raises(ValueError, match="damaged or of another format"):
        load_reward(tmp_path)


def test_steer_loads_the_learned_reward_by_its_factory(tmp_path):
    from embodied.runtime.steer import make_reward_model

    trained(tmp_path)
    r = make_reward_model("rewards.preference.model:load_reward", {"path": str(tmp_path / "reward.pt")})
    assert isinstance(r, PreferenceReward) and r.shift == 1.0


class PrivilegedEnv(gym.Env):
    """Observation state != privileged state: the reward must read the privileged one."""

    observation_space = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (2,)), "instruction": gym.spaces.Text(8)})
    action_space = gym.spaces.Box(-1, 1, (2,))

    def privileged_state(self):
        return np.array([5.0, 6.0, 7.0], np.float32)


def test_steering_gives_a_reward_model_the_privileged_state():
    from policies.steering.env import ModelReward

    seen = []

    class Spy(RewardModel):
        inputs = frozenset({"states"})

        def score(self, frames, states, instruction):
            seen.append(states.copy())
            return RewardOutput(states.sum(1))

    r, _ = ModelReward(Spy())(gym.wrappers.TimeLimit(PrivilegedEnv(), 5), {"state": np.zeros(2), "instruction": "go"},
                              0.0, {})
    assert seen[0].tolist() == [[5.0, 6.0, 7.0]] and r == 18.0


# ------------------------------------------------------------- the steer learner
def steer_prefer_config(tmp_path, **kw):
    from embodied.runtime.prefer import PreferConfig

    base = dict(task="reach", learner="steer", checkpoint=str(reach_checkpoint(tmp_path / "base")), budget=6, rounds=2,
                episodes_per_round=2, candidates=2, heldout_episodes=1, heldout_pairs=10, eval_episodes=3,
                segment_length=10, oversample=2, steer_env_steps=40, reward=RewardConfig(hidden=16, epochs=1,
                                                                                          ensemble=2),
                labels=str(tmp_path / "labels"))
    return PreferConfig(**{**base, **kw})


def test_the_steer_learner_queries_the_checkpoints_episodes_and_steers_with_the_learned_and_true_reward(
        tmp_path, monkeypatch):
    import embodied.runtime.steer as steer_mod
    from embodied.runtime import prefer

    runs = []

    def fake_steer(cfg, out):
        r = make_reward_for(cfg)
        runs.append((cfg, out, r))
        return {"success_before": 0.5, "success_after": 0.9 if cfg.reward == "sparse" else 0.81,
                "heldout_after": 0.8, "env_steps": cfg.env_steps + 2, "curve": [{"env_steps": 0, "success": 0.5}]}

    def make_reward_for(cfg):
        return steer_mod.make_reward_model(cfg.reward, cfg.reward_kwargs) if ":" in cfg.reward else cfg.reward

    monkeypatch.setattr(steer_mod, "steer", fake_steer)
    seen = []
    real = prefer.SteerLearner.rollout

    def spy(self, episodes):
        out = real(self, episodes)
        seen.extend(t.info["policy"] for t in out)
        return out

    monkeypatch.setattr(prefer.SteerLearner, "rollout", spy)
    m = prefer.run_prefer(steer_prefer_config(tmp_path), tmp_path)
    assert seen == ["checkpoint"] * 5  # every query (and held-out) episode is the checkpoint's own
    assert {"policy_accuracy", "policy_return_spearman", "accuracy"} <= set(m["curve"][-1])
    (learned_cfg, learned_out, learned_r), (gt_cfg, gt_out, gt_r), (ctl_cfg, ctl_out, ctl_r) = runs
    assert isinstance(learned_r, PreferenceReward) and learned_r.shift == 1.0 and gt_r == "sparse"
    assert ctl_r == {"name": "constant", "value": 0.0}  # the control, under the learned reward's episode ends
    assert learned_out == tmp_path / "steer_learned" and gt_out == tmp_path / "steer_ground_truth"
    assert ctl_out == tmp_path / "steer_control"
    for key in ("checkpoint", "task", "env_steps", "seed", "final_episodes", "steer"):
        for other in (gt_cfg, ctl_cfg):  # the same seeds, settings and budget
            assert getattr(learned_cfg, key) == getattr(other, key), key
    assert learned_cfg.steer.utd == 2 and learned_cfg.final_episodes == 3
    p = m["policy"]
    assert p["success_learned"] == 0.81 and p["success_ground_truth"] == 0.9 and abs(p["ratio"] - 0.9) < 1e-9
    assert p["env_steps"] == p["env_steps_ground_truth"] == 42 and p["query_env_steps"] > 0


def test_the_steer_learner_needs_a_checkpoint_and_refuses_a_mismatched_reference(tmp_path):
    import json
    from dataclasses import replace

    from embodied.runtime.prefer import PreferConfig, SteerLearner

    with pytest.raises(ValueError, match="learner=steer needs checkpoint="):
        PreferConfig(learner="steer")
    with pytest.raises(ValueError, match="steer_ground_truth must be one of"):
        PreferConfig(learner="steer", checkpoint="x", steer_ground_truth="shaped")
    cfg = steer_prefer_config(tmp_path, steer_reference=str(tmp_path / "ref"))
    learner = SteerLearner(cfg, False)
    want = learner._steer_config("sparse", {}, 3)
    with pytest.raises(FileNotFoundError, match="holds no metrics.json"):
        learner._reference(want)
    (tmp_path / "ref").mkdir()
    steer_cfg = {**vars(want.steer), "net_arch": list(want.steer.net_arch)}
    good = {"checkpoint": cfg.checkpoint, "task": "reach", "reward": "sparse", "seed": 0, "final_episodes": 3,
            "steer": steer_cfg, "env_steps": 41}
    (tmp_path / "ref" / "metrics.json").write_text(json.dumps(good))
    assert learner._reference(want)["env_steps"] == 41
    (tmp_path / "ref" / "metrics.json").write_text(json.dumps({**good, "seed": 1}))
    with pytest.raises(ValueError, match="other settings"):
        learner._reference(want)
    # seed=1 steers with learner seed steer.seed + 1, which is what a run with seed=1 records
    want1 = SteerLearner(replace(cfg, seed=1), False)._steer_config("sparse", {}, 3)
    seeded = {**good, "seed": 1, "steer": {**steer_cfg, "seed": 1}}
    (tmp_path / "ref" / "metrics.json").write_text(json.dumps(seeded))
    assert learner._reference(want1)["env_steps"] == 41
    (tmp_path / "ref" / "metrics.json").write_text(json.dumps({**good, "seed": 1}))  # made before seed reached SAC
    with pytest.raises(ValueError, match="other settings"):
        learner._reference(want1)


def test_reward_eval_takes_a_learned_reward_by_registry_name(tmp_path):
    from rewards.registry import make_reward

    model = trained(tmp_path)
    x = np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32)
    back = make_reward({"name": "prefer", "path": str(tmp_path / "reward.pt")})
    np.testing.assert_allclose(back(None, x, "go").reward, model(None, x, "go").reward, rtol=1e-5)  # unshifted
    with pytest.raises(ValueError, match="unknown setting"):
        make_reward({"name": "prefer", "path": str(tmp_path), "checkpoint": "x"})


def test_recorded_frames_are_the_vlm_cameras_observation_images():
    from embodied.core.registry import make_env
    from rewards.preference.episodes import frame_env

    env = frame_env("reach", True, 32, "side")
    pix = make_env("reach", obs_mode="state+pixels", cameras=["side"], image_size=32)
    env.reset(seed=3)
    obs, _ = pix.reset(seed=3)
    np.testing.assert_array_equal(env.render(), obs["image"])
    with pytest.raises(ValueError, match="is not a camera of task 'reach'; its cameras"):
        frame_env("reach", True, 32, "nose")


# --------------------------------------------------------------------- PEBBLE
def test_knn_entropy_reward_is_the_log_distance_to_the_kth_neighbour():
    from rewards.preference.pebble import knn_entropy_reward

    x = np.array([[0.0], [1.0], [3.0], [7.0]], np.float32)
    np.testing.assert_allclose(knn_entropy_reward(x, 1), np.log1p([1, 1, 2, 4]), rtol=1e-6)
    np.testing.assert_allclose(knn_entropy_reward(x, 2), np.log1p([3, 2, 3, 6]), rtol=1e-6)


class StateSum(RewardModel):
    """A state reward: w · s, in [-1, 1]."""

    inputs = frozenset({"states"})
    reward_range = (-1.0, 1.0)

    def __init__(self, w):
        self.w = np.asarray(w, np.float32)

    def score(self, frames, states, instruction):
        return RewardOutput(np.tanh(states @ self.w))


def test_pebble_relabels_the_whole_replay_buffer_with_each_new_reward(tmp_path, monkeypatch):
    import tempfile

    from embodied.runtime.prefer import PreferConfig
    from rewards.preference.pebble import PebbleLearner

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where SB3 puts a logger's default folder
    (tmp_path / "tmp").mkdir()
    cfg = PreferConfig(task="press-button", learner="pebble", pebble_unsup_steps=30, pebble_learning_starts=10,
                       eval_episodes=1, seed=0)
    learner = PebbleLearner(cfg, False)
    trajs = learner.rollout(1)
    buf = learner.model.replay_buffer
    n = buf.pos
    # every step is stored but the one that opened the episode after the last one asked for
    assert n == learner.env_steps - 1 >= 30 and trajs and all(len(t.states) == 60 for t in trajs)
    assert buf.intrinsic_k == cfg.pebble_knn and np.all(buf.rewards[:n] == 0)  # pre-training: no reward stored
    nxt = buf.sample(16).next_observations.numpy()
    assert np.all(np.isfinite(nxt))
    obs = buf.observations[:n, 0]
    for seed in (1, 2):
        w = np.random.default_rng(seed).normal(size=obs.shape[1]) / 10
        assert learner.improve(StateSum(w))["relabelled"] == n
        np.testing.assert_allclose(buf.rewards[:n, 0], np.tanh(obs @ w) - 1.0, rtol=1e-5, atol=1e-6)
    assert buf.intrinsic_k == 0
    learner.rollout(1)  # new steps are rewarded by the current model as they are stored
    m = buf.pos
    np.testing.assert_allclose(buf.rewards[n:m, 0], np.tanh(buf.observations[n:m, 0] @ w) - 1.0, rtol=1e-5,
                               atol=1e-6)
    assert list((tmp_path / "tmp").glob("SB3-*")) == []  # no log asked for: no SB3-<date> folder left behind


def test_the_steer_learner_refuses_a_task_its_checkpoint_never_learned_before_asking_for_labels(tmp_path):
    from embodied.runtime.prefer import SteerLearner

    cfg = steer_prefer_config(tmp_path, task="press-button")  # the checkpoint knows reach only
    with pytest.raises(ValueError, match=r"task='press-button' is not one of the tasks .* \[reach\]"):
        SteerLearner(cfg, False)
    assert not (tmp_path / "labels").exists()
