"""Latent-noise steering: the noise env, its bound, decoding, save/load, DSRL-NA's data, the command.

Unit tests run a tiny flow policy on a toy gymnasium env (no simulator); the smoke tests
save an untrained tiny policy for the ``reach`` task and run ``embodied steer`` on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from embodied.core.errors import InvalidActionError
from embodied.core.policy import stack_history
from embodied.core.reward import RewardModel, RewardOutput
from embodied.core.specs import ActionSpec, ObservationSpec
from policies import load_trained, make_policy, save_policy
from policies.steering.config import SteerConfig
from policies.steering.env import NoiseEnv, NoiseVecEnv
from policies.steering.noise import NoiseSpace, NotSteerableError, check_steerable, decode_features, features
from policies.steering.policy import STEERING_FILE, SteeredPolicy
from policies.steering.progress import Progress
from tiny import reach_checkpoint
from cli_runner import run_cli

DS, DA, TO, H, TA = 5, 3, 2, 8, 4
TINY = dict(n_obs_steps=TO, horizon=H, n_action_steps=TA, state_hidden=32, obs_dim=16, text_dim=16, warmup_steps=0,
            hidden=64, n_layers=2, time_emb_dim=16, num_inference_steps=3)
STATS = {"state": {"mean": np.zeros(DS), "std": np.ones(DS), "min": np.full(DS, -2.0), "max": np.full(DS, 2.0)},
         "action": {"mean": np.zeros(DA), "std": np.ones(DA), "min": np.full(DA, -1.0), "max": np.full(DA, 1.0)}}
INSTRUCTION = "move the dot to the goal"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class ToyEnv(gym.Env):
    """A point in [-1, 1]^3 moved by the actions; success within ``radius`` (0.15) of a goal; 12
    steps at most; episodes end on success unless ``end_on_success=False``."""

    def __init__(self, max_steps: int = 12, render_mode: str | None = None, radius: float = 0.15,
                 end_on_success: bool = True):
        self.observation_space = gym.spaces.Dict({"state": gym.spaces.Box(-np.inf, np.inf, (DS,), np.float32),
                                                  "instruction": gym.spaces.Text(64)})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (DA,), np.float32)
        self.max_steps, self.render_mode = max_steps, render_mode
        self.radius, self.end_on_success = radius, end_on_success

    def _obs(self):
        return {"state": np.concatenate([self.x, self.goal[:2]]).astype(np.float32), "instruction": INSTRUCTION}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = self.np_random.uniform(-0.5, 0.5, DA)
        self.goal = np.array([*self.np_random.uniform(-0.5, 0.5, 2), 0.0])
        self.t = 0
        return self._obs(), {"success": False}

    def step(self, action):
        self.x = np.clip(self.x + 0.2 * np.asarray(action), -1, 1)
        self.t += 1
        d = float(np.linalg.norm(self.x - self.goal))
        success = d < self.radius
        return self._obs(), 1.0 - d, success and self.end_on_success, self.t >= self.max_steps, {"success": success,
                                                                          "reward_terms": {"near": 1.0 - d}}

    def expert_action(self):
        return np.clip((self.goal - self.x) / 0.2, -1, 1).astype(np.float32)

    def render(self):
        return np.full((8, 8, 3), int(self.t), np.uint8)


def tiny(family: str = "flow", seed: int = 0):
    torch.manual_seed(seed)
    extra = {} if family == "flow" else {"hidden": 64, "n_layers": 2}
    cfg = TINY if family == "flow" else {k: v for k, v in TINY.items() if k not in ("time_emb_dim", "num_inference_steps")}
    return make_policy(family, {**cfg, **extra}, ObservationSpec(state_dim=DS), ActionSpec(dim=DA), STATS, ["toy"],
                       device="cpu")


def space(policy, **kw) -> NoiseSpace:
    return NoiseSpace.for_policy(policy, SteerConfig(**kw))


def obs_batch(b: int = 3, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"state": rng.normal(size=(b, TO, DS)).astype(np.float32), "instruction": [INSTRUCTION] * b}


class ConstActor:
    """A noise actor with a fixed output (Dw,)."""

    kind = "const"

    def __init__(self, w):
        self.w = np.asarray(w, np.float32)

    def __call__(self, feats):
        return np.tile(self.w, (len(feats), 1))


def test_noise_space_full_shared_and_rows():
    p = tiny()
    full, shared, part = space(p), space(p, noise="shared"), space(p, noise_steps=TA)
    assert (full.dim, shared.dim, part.dim) == (H * DA, DA, TA * DA)
    w = np.random.default_rng(0).uniform(-1, 1, (2, DA)).astype(np.float32)
    assert np.array_equal(shared.to_chunk(w), np.repeat(w[:, None], H, axis=1))
    wp = np.random.default_rng(1).uniform(-1, 1, (2, TA * DA)).astype(np.float32)
    chunk = part.to_chunk(wp)
    assert np.array_equal(chunk[:, :TA].reshape(2, -1), wp) and not chunk[:, TA:].any()
    with pytest.raises(ValueError, match="noise_steps=2 is not allowed.*from Ta=4 to H=8"):
        space(p, noise_steps=2)
    with pytest.raises(ValueError, match="noise=.*'full', 'shared'"):
        SteerConfig(noise="half")


def test_decode_is_deterministic_and_depends_on_the_noise():
    p = tiny()
    sp = space(p)
    env = NoiseEnv(ToyEnv(), p, sp)
    env.reset(seed=3)
    batch = env._batch()
    w = np.random.default_rng(0).uniform(-1.5, 1.5, sp.dim).astype(np.float32)
    a = p.predict_chunk(batch, sp.to_chunk(w[None]))
    b = p.predict_chunk(batch, sp.to_chunk(w[None]))
    assert np.array_equal(a, b)
    assert not np.allclose(a, p.predict_chunk(batch, sp.to_chunk(-w[None])))
    # decoding from features gives predict_chunk's chunk (DSRL-NA decodes replayed features this way)
    ob = obs_batch(3)
    noise = sp.to_chunk(np.random.default_rng(2).uniform(-1.5, 1.5, (3, sp.dim)))
    assert np.allclose(decode_features(p, features(p, ob), noise).numpy(), p.predict_chunk(ob, noise), atol=1e-6)
    # the env executes the chunk's first Ta actions of exactly that decode (same seed, same noise, twice)
    runs = []
    for _ in range(2):
        env.reset(seed=3)
        runs.append(env.step(w)[4]["executed"])
    assert np.array_equal(runs[0], runs[1]) and np.allclose(runs[0], a[0, :TA])


def test_noise_bound_is_enforced():
    p = tiny()
    sp = space(p, bound=1.0)
    env = NoiseEnv(ToyEnv(), p, sp)
    env.reset(seed=0)
    assert env.action_space.low.min() == -1.0 and env.action_space.high.max() == 1.0
    w = np.zeros(sp.dim, np.float32)
    w[5] = 1.2
    with pytest.raises(InvalidActionError, match=r"1.2 is outside the noise bound \[-1.0, 1.0\]"):
        env.step(w)
    w[5] = np.nan
    with pytest.raises(InvalidActionError, match="NaN"):
        env.step(w)
    with pytest.raises(InvalidActionError, match=r"shape \(1, 24\)"):
        env.step(np.zeros(sp.dim + 1, np.float32))
    # a steered policy clips its actor's noise to the bound before decoding
    steered = SteeredPolicy(p, ConstActor(np.full(sp.dim, 7.0)), sp)
    ob = obs_batch(2)
    assert np.array_equal(steered.noise(ob), np.ones((2, sp.dim), np.float32))
    assert np.array_equal(steered.predict_chunk(ob), p.predict_chunk(ob, sp.to_chunk(np.ones((2, sp.dim)))))


def test_env_sums_the_executed_rewards_and_stops_at_the_episode_end():
    p = tiny()
    sp = space(p)
    env = NoiseEnv(ToyEnv(max_steps=6), p, sp, reward="dense")
    obs, _ = env.reset(seed=1)
    assert obs.shape == env.observation_space.shape and obs.dtype == np.float32
    _, r, term, trunc, info = env.step(np.zeros(sp.dim, np.float32))
    assert info["env_steps"] == TA and np.isclose(r, info["reward_terms"]["near"])
    _, r, term, trunc, info = env.step(np.zeros(sp.dim, np.float32))
    assert info["env_steps"] == 2 and (term or trunc) and "episode" in info and info["episode"]["l"] == 6
    # sparse: 1 on the step that succeeds (the toy ends on success)
    env = NoiseEnv(ToyEnv(), p, sp, reward="sparse")
    env.reset(seed=1)
    total = sum(env.step(np.zeros(sp.dim, np.float32))[1] for _ in range(3))
    assert total in (0.0, 1.0)


def test_reward_model_source_reads_states_and_frames():
    class Model(RewardModel):
        inputs = frozenset({"frames", "states"})

        def score(self, frames, states, instruction):
            return RewardOutput(frames.mean(axis=(1, 2, 3)) + states[:, 0], {"frame": frames.mean(axis=(1, 2, 3))})

    p = tiny()
    sp = space(p)
    env = NoiseEnv(ToyEnv(render_mode="rgb_array", end_on_success=False), p, sp, reward=Model())
    env.reset(seed=0)
    _, r, *_, info = env.step(np.zeros(sp.dim, np.float32))
    assert np.isclose(info["reward_terms"]["frame"], 1 + 2 + 3 + 4)  # frames of steps 1..4
    replay = ToyEnv(end_on_success=False)
    replay.reset(seed=0)
    xs = [replay.step(a)[0]["state"][0] for a in info["executed"]]
    assert np.isclose(r, 10 + sum(xs), atol=1e-5)  # frame + state term, summed over the executed steps
    with pytest.raises(ValueError, match="'sparse', 'dense'"):
        NoiseEnv(ToyEnv(), p, sp, reward="shaped")


class CountingModel(RewardModel):
    """Scores a state's first entry; records the batch size of every call."""

    inputs = frozenset({"states"})

    def __init__(self):
        self.calls: list[int] = []

    def score(self, frames, states, instruction):
        self.calls.append(len(states))
        return RewardOutput(states[:, 0].astype(np.float64), {})


@pytest.mark.parametrize("reward", ["constant", "model"])
def test_a_learned_reward_run_never_receives_a_success_terminated_episode(reward):
    """Every step succeeds (radius 10). The oracle's episodes end after one chunk; a learned or
    constant reward refuses an env that ends on success, and on one that does not, each
    episode runs to the time limit and no info the learner sees says success."""
    p = tiny()
    sp = space(p)
    source = "constant" if reward == "constant" else CountingModel()
    with pytest.raises(ValueError, match="end_on_success=False"):
        NoiseVecEnv([lambda: ToyEnv(radius=10.0)] * 2, p, sp, reward=source)
    oracle = NoiseVecEnv([lambda: ToyEnv(radius=10.0)] * 2, p, sp, reward="sparse")
    oracle.reset()
    oracle.step_async(np.zeros((2, sp.dim), np.float32))
    _, r, dones, infos = oracle.step_wait()
    assert dones.all() and all(i["env_steps"] == 1 and i["is_success"] for i in infos)  # the oracle's ends

    vec = NoiseVecEnv([lambda: ToyEnv(radius=10.0, end_on_success=False)] * 2, p, sp, reward=source)
    vec.reset()
    lengths, seen = [], []
    for _ in range(9):
        vec.step_async(np.zeros((2, sp.dim), np.float32))
        _, rewards, dones, infos = vec.step_wait()
        seen += infos
        lengths += [i["episode"]["l"] for i, d in zip(infos, dones) if d]
        if reward == "constant":
            assert (rewards == 0.0).all()
    assert lengths and set(lengths) == {12}  # the time limit, never the success
    assert not any("success" in i or "is_success" in i for i in seen)
    assert all(i["TimeLimit.truncated"] for i in seen if "episode" in i)


def test_a_learned_rewards_own_success_call_ends_its_episodes():
    from policies.steering.env import ModelReward

    p = tiny()
    sp = space(p)
    model = CountingModel()
    # state[0] is the point's x in [-1, 1]: a threshold of -2 is met on the first step
    vec = NoiseVecEnv([lambda: ToyEnv(end_on_success=False)] * 3, p, sp, reward=ModelReward(model, -2.0))
    vec.reset()
    vec.step_async(np.zeros((3, sp.dim), np.float32))
    _, _, dones, infos = vec.step_wait()
    assert dones.all() and all(i["reward_success"] and i["env_steps"] == 1 for i in infos)
    assert not any(i["TimeLimit.truncated"] for i in infos)  # terminal: no bootstrap past the call
    assert model.calls == [3]  # one batch for the three envs' step
    vec = NoiseVecEnv([lambda: ToyEnv(end_on_success=False)] * 3, p, sp, reward=ModelReward(model, None))
    model.calls.clear()
    vec.reset()
    vec.step_async(np.zeros((3, sp.dim), np.float32))
    _, _, dones, infos = vec.step_wait()
    assert not dones.any() and not any(i["reward_success"] for i in infos)
    assert model.calls == [3] * TA  # the envs step in lockstep: one scoring batch per executed step


def test_vec_env_batches_the_decode_and_resets_finished_envs():
    p = tiny()
    sp = space(p)
    vec = NoiseVecEnv([lambda: ToyEnv(max_steps=6)] * 2, p, sp, reward="dense", alias_samples=2)
    vec.seed(5)
    f = vec.reset()
    assert f.shape == (2, vec.observation_space.shape[0])
    single = NoiseEnv(ToyEnv(max_steps=6), p, sp, reward="dense")
    fs, _ = single.reset(seed=6)  # the vector env's second sub-env got seed 5 + 1
    assert np.allclose(fs, f[1], atol=1e-5)
    w = np.random.default_rng(0).uniform(-1, 1, (2, sp.dim)).astype(np.float32)
    _, r, done, infos = vec.step(w)
    _, rs, *_, info_s = single.step(w[1])
    assert np.allclose(infos[1]["chunk"], info_s["executed"], atol=1e-5) and np.isclose(r[1], rs, atol=1e-5)
    assert infos[0]["alias_noise"].shape == (2, sp.dim) and infos[0]["alias_chunk"].shape == (2, TA, DA)
    assert np.abs(infos[0]["alias_noise"]).max() <= sp.bound
    _, _, done, infos = vec.step(w)
    assert done.all() and all("terminal_observation" in i and i["TimeLimit.truncated"] for i in infos)
    assert all(r.length == 0 for r in vec.runners)  # reset at once


def test_alias_pairs_are_the_decodes_of_their_noise():
    from policies.steering.na import NoiseAliasing

    p = tiny()
    cfg = SteerConfig(algo="na", net_arch=(32, 32), batch_size=8, learning_starts=4, utd=1, na_alias_samples=2)
    sp = NoiseSpace.for_policy(p, cfg)
    vec = NoiseVecEnv([ToyEnv] * 2, p, sp, reward="sparse", alias_samples=2)
    na = NoiseAliasing(vec, cfg)
    progress = Progress(40, show=False)
    na.learn(progress)
    assert 40 <= progress.env_steps < 40 + 2 * TA and na.updates > 0
    n = na.replay.size
    assert na.alias.size == 3 * n  # the executed noise and two random ones per transition
    f, w, a = (na.alias.data[k][: na.alias.size] for k in ("f", "w", "a"))
    decoded = decode_features(p, torch.as_tensor(f), torch.as_tensor(sp.to_chunk(w)))[:, :TA].reshape(len(f), -1)
    assert np.allclose(decoded.numpy(), a, atol=1e-5)


def test_expert_transitions_fill_the_action_critic_replay():
    from policies.steering.na import expert_transitions

    p = tiny()
    data, steps, rate = expert_transitions(ToyEnv(), p, "sparse", episodes=3, seed=0)
    n = len(data["f"])
    assert rate == 1.0 and (n - 3) * TA < steps <= n * TA  # each episode's last chunk may stop early
    assert data["a"].shape == (n, TA, DA) and data["f"].shape == data["f2"].shape == (n, 16 + 16)
    assert data["term"].sum() == 3.0 and data["r"].sum() == 3.0  # one success per episode, where it ends
    assert np.allclose(data["f"][1:][data["term"][:-1] == 0], data["f2"][:-1][data["term"][:-1] == 0])


@pytest.mark.parametrize("algo", ["sac", "na"])
def test_steered_policy_round_trips_through_save_load(tmp_path, algo, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where SB3 puts a logger's default folder
    (tmp_path / "tmp").mkdir()
    p = tiny()
    cfg = SteerConfig(algo=algo, net_arch=(32, 32), batch_size=16, learning_starts=8, utd=1, noise="shared")
    sp = NoiseSpace.for_policy(p, cfg)
    vec = NoiseVecEnv([ToyEnv] * 2, p, sp, alias_samples=2 if algo == "na" else 0)
    if algo == "sac":
        from policies.steering.sb3 import ProgressCallback, SB3Actor, make_algorithm

        model = make_algorithm(cfg, vec)
        model.learn(80, callback=ProgressCallback(Progress(80, show=False)))
        actor = SB3Actor.of(model, cfg)
        assert list((tmp_path / "tmp").glob("SB3-*")) == []  # no log asked for: no SB3-<date> folder left behind
    else:
        from policies.steering.na import NoiseAliasing

        na = NoiseAliasing(vec, cfg)
        na.learn(Progress(80, show=False))
        actor = na.noise_actor()
    steered = SteeredPolicy(p, actor, sp)
    save_policy(steered, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / STEERING_FILE).is_file()
    loaded = load_trained(tmp_path / "ckpt", device="cpu")
    assert isinstance(loaded, SteeredPolicy) and loaded.space == sp
    ob = obs_batch(4, seed=7)
    assert np.array_equal(loaded.predict_chunk(ob), steered.predict_chunk(ob))
    assert not np.allclose(loaded.predict_chunk(ob), p.predict_chunk(ob, np.zeros((4, H, DA), np.float32)))
    # acting step by step: the same actions from both
    env_a, env_b = ToyEnv(), ToyEnv()
    (oa, _), (ob_, _) = env_a.reset(seed=2), env_b.reset(seed=2)
    steered.reset(), loaded.reset()
    for _ in range(8):
        xa, xb = steered.act(oa), loaded.act(ob_)
        assert np.array_equal(xa, xb)
        oa, ob_ = env_a.step(xa)[0], env_b.step(xb)[0]
    # saving the plain policy over it removes the actor
    save_policy(p, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt" / STEERING_FILE).exists()
    assert not isinstance(load_trained(tmp_path / "ckpt", device="cpu"), SteeredPolicy)


@pytest.mark.parametrize("algo", ["sac", "td3", "ppo", "na"])
def test_zero_init_starts_at_the_zero_noise_and_the_updates_move_it(algo):
    """``zero_init``: the untrained steered policy plays the base's zero-noise chunks exactly; without it
    the default-initialised output layer plays some other noise; either way the updates move the actor
    (SAC, TD3, NA)."""
    from policies.steering.na import NoiseAliasing
    from policies.steering.sb3 import ProgressCallback, SB3Actor, make_algorithm

    p = tiny()
    ob = obs_batch(4, seed=7)
    mode = p.predict_chunk(ob, np.zeros((4, H, DA), np.float32))
    for zero_init in (True, False):
        cfg = SteerConfig(algo=algo, net_arch=(32, 32), batch_size=16, learning_starts=8, utd=1, noise="shared",
                          n_steps=16, zero_init=zero_init)
        sp = NoiseSpace.for_policy(p, cfg)
        vec = NoiseVecEnv([ToyEnv] * 2, p, sp, alias_samples=2 if algo == "na" else 0)
        if algo == "na":
            na = NoiseAliasing(vec, cfg)
            actor, learn = na.noise_actor(), na.learn
        else:
            model = make_algorithm(cfg, vec)
            actor = SB3Actor.of(model, cfg)
            learn = lambda progress: model.learn(80, callback=ProgressCallback(progress))  # noqa: E731
        before = SteeredPolicy(p, actor, sp).predict_chunk(ob)
        if zero_init:
            assert np.array_equal(before, mode), algo
        elif algo != "ppo":  # SB3 initialises PPO's action layer at gain 0.01: nearly, not exactly, zero
            assert not np.allclose(before, mode, atol=1e-3), algo
        if algo == "ppo":  # its first update comes after n_steps noise steps per env, past this budget
            continue
        learn(Progress(80, show=False))
        actor = na.noise_actor() if algo == "na" else SB3Actor.of(model, cfg)
        assert not np.allclose(SteeredPolicy(p, actor, sp).predict_chunk(ob), mode, atol=1e-4), (algo, zero_init)
    with pytest.raises(ValueError, match="zero_init='yes' is not allowed"):
        SteerConfig(zero_init="yes")


def test_a_steered_policy_batches_evaluation_rows_bitwise_as_each_row_alone():
    from embodied.runtime.evaluate import RowwisePolicy

    p = tiny()
    sp = space(p)

    class FeatureActor:  # noise that depends on each row's features
        kind = "feature"

        def __call__(self, feats):
            return np.stack([np.tanh(np.resize(f, sp.dim)) for f in np.asarray(feats, np.float32)])

    steered = SteeredPolicy(p, FeatureActor(), sp)
    assert steered.batches_rows
    ob = obs_batch(5, seed=3)
    alone = np.concatenate([steered.predict_chunk({"state": ob["state"][i:i + 1], "instruction": ob["instruction"][i:i + 1]})
                            for i in range(5)])
    assert np.array_equal(steered.predict_rows(ob), alone)
    assert np.array_equal(RowwisePolicy(steered).predict_chunk(ob), alone)
    assert not np.array_equal(alone[0], alone[1])  # the rows were steered differently


def test_the_mlp_floor_cannot_be_steered():
    with pytest.raises(NotSteerableError, match="cannot be steered.*generative=False.*flow or diffusion"):
        check_steerable(tiny("mlp"))
    with pytest.raises(NotSteerableError):
        NoiseEnv(ToyEnv(), tiny("mlp"), space(tiny()))


def test_steered_policy_ignores_evaluation_noise():
    p = tiny()
    sp = space(p)
    steered = SteeredPolicy(p, ConstActor(np.full(sp.dim, 0.3)), sp)
    ob = obs_batch(2)
    given = np.random.default_rng(0).normal(size=(2, H, DA)).astype(np.float32)
    assert np.array_equal(steered.predict_chunk(ob, given), steered.predict_chunk(ob))
    hist = stack_history([{"state": np.zeros(DS, np.float32), "instruction": INSTRUCTION}] * TO)
    assert steered.predict_chunk(hist).shape == (1, H, DA)


def test_progress_stops_past_the_budget_and_evaluates_on_schedule():
    seen = []
    prog = Progress(100, evaluate=lambda s: seen.append(s) or {"success": 0.5}, eval_every=30, show=False)
    steps = 0
    while prog.update([{"env_steps": 4}, {"env_steps": 4}]):
        steps += 8
    assert prog.env_steps == 104 and seen == [32, 64, 96]
    with pytest.raises(ValueError, match="budget=0"):
        Progress(0, show=False)


# ---- the command ------------------------------------------------------------------------------
def embodied(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    r = run_cli([*args, "progress=false"], cwd=cwd, timeout=900)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def test_steer_command_smoke(tmp_path):
    ckpt = reach_checkpoint(tmp_path / "base", "flow")
    run = tmp_path / "steer"
    embodied("steer", f"checkpoint={ckpt}", "task=reach", "env_steps=48", "num_envs=2", "eval_every=24",
             "eval_episodes=1", "final_episodes=1", "videos=1", "steer.batch_size=8", "steer.learning_starts=4",
             "steer.net_arch=[16,16]", "compare=[raw_sac]", "compare_env_steps=96", f"hydra.run.dir={run}", cwd=tmp_path)
    m = json.loads((run / "metrics.json").read_text())
    for key in ("success_before", "success_after", "env_steps", "wall_time_s", "curve", "heldout_after"):
        assert key in m, key
    assert 48 <= m["env_steps"] < 48 + 2 * 4 and [p["env_steps"] for p in m["curve"]][:2] == [0, 24]
    # the baseline trains on its own, longer budget (compare_env_steps); the steered method on env_steps
    assert 96 <= m["compare"]["raw_sac"]["env_steps"] < 96 + 2 * 4
    assert m["compare"]["raw_sac"]["curve"][-1]["env_steps"] >= 96
    assert m["compare_env_steps"] == 96 and "budget 96 env steps for the compared methods" in (run / "report.md").read_text()
    assert m["target_success"] == m["success_after"]  # the comparison's target: the held-out figure
    for f in ("steer_curve.png", "report.md", "checkpoint/steering.json", "checkpoint/model.safetensors"):
        assert (run / f).is_file(), f
    assert list((run / "before" / "videos").iterdir()) and list((run / "after" / "videos").iterdir())
    assert list((run / "tb").rglob("events.out.tfevents.*"))
    # the steered checkpoint evaluates like any other
    embodied("eval", f"checkpoint={run}/checkpoint", "tasks=[reach]", "episodes=1", "videos=0",
             f"hydra.run.dir={tmp_path}/eval", cwd=tmp_path)
    assert "reach" in json.loads((tmp_path / "eval/metrics.json").read_text())["per_task"]


def test_suite_wide_control_run_and_its_checkpoint_round_trip_through_eval_play_and_serve(tmp_path):
    """One noise policy for two tasks under the constant-reward control (episodes end at the
    time limit); the steered checkpoint then evaluates, plays and serves like any other."""
    import os
    import time

    from embodied.bridge.client import RemotePolicy
    from embodied.runtime.evaluate import RowwisePolicy

    ckpt = reach_checkpoint(tmp_path / "base", "flow", tasks=("reach", "push"))
    run = tmp_path / "steer"
    embodied("steer", f"checkpoint={ckpt}", "tasks=[reach,push]", "reward=constant", "env_steps=48", "num_envs=2",
             "eval_every=0", "eval_episodes=1", "final_episodes=2", "videos=0", "steer.batch_size=8",
             "steer.learning_starts=4", "steer.net_arch=[16,16]", f"hydra.run.dir={run}", cwd=tmp_path)
    m = json.loads((run / "metrics.json").read_text())
    assert m["tasks"] == ["reach", "push"] and m["reward_kind"] == "control" and m["episode_end"] == "time limit"
    assert set(m["per_task_after"]) == {"reach", "push"} and "| push |" in (run / "report.md").read_text()
    steered = load_trained(run / "checkpoint", device="cpu")
    assert isinstance(steered, SteeredPolicy)

    embodied("eval", f"checkpoint={run}/checkpoint", "tasks=[reach,push]", "episodes=2", "videos=0",
             f"hydra.run.dir={tmp_path}/eval", cwd=tmp_path)
    ev = json.loads((tmp_path / "eval/metrics.json").read_text())
    for t in ("reach", "push"):  # the same seeds as the run's final evaluation: the same figures
        assert ev["per_task"][t]["success_rate"] == m["per_task_after"][t]["success"]
    r = run_cli(["play", f"checkpoint={run}/checkpoint", "task=push", "instruction=push the red block to the zone",
                 f"hydra.run.dir={tmp_path}/play"], cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert list((tmp_path / "play").rglob("*.mp4"))

    out = tmp_path / "serve"
    proc = subprocess.Popen([sys.executable, "-m", "embodied.cli", "serve", f"checkpoint={run}/checkpoint", "port=0",
                             "device=cpu", "duration_s=300", f"hydra.run.dir={out}"], cwd=tmp_path,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "server.json").exists():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "embodied serve did not start"
            time.sleep(0.2)
        remote = RemotePolicy(json.loads((out / "server.json").read_text())["url"])
        rng = np.random.default_rng(0)
        batch = {"state": rng.standard_normal((2, 2, steered.unwrapped.obs_spec.state_dim)).astype(np.float32),
                 "instruction": ["reach the red target", "push the blue block to the zone"]}
        assert np.array_equal(remote.predict_chunk(batch), RowwisePolicy(steered).predict_chunk(batch))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_steer_command_refuses_the_mlp_floor_and_bad_settings(tmp_path):
    ckpt = reach_checkpoint(tmp_path / "mlp", "mlp")
    r = embodied("steer", f"checkpoint={ckpt}", "task=reach", f"hydra.run.dir={tmp_path}/s", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "cannot be steered" in r.stderr and "generative=False" in r.stderr
    r = embodied("steer", f"checkpoint={ckpt}", "task=reach", "steer.bound=0", f"hydra.run.dir={tmp_path}/s",
                 cwd=tmp_path, check=False)
    assert r.returncode == 2 and "bound=0" in r.stderr
    r = embodied("steer", f"checkpoint={ckpt}", "task=reach", "compare=[raw_ppo]", f"hydra.run.dir={tmp_path}/s",
                 cwd=tmp_path, check=False)
    assert r.returncode == 2 and "raw_ppo" in r.stderr and "raw_sac" in r.stderr


def test_initial_noise_is_the_base_policys_and_the_learner_sees_the_shaped_reward():
    from policies.steering.sb3 import ShapedReward

    p = tiny()
    sp = space(p, bound=1.5)
    box = sp.box()
    box.seed(0)
    draws = np.stack([box.sample() for _ in range(2000)])
    assert np.abs(draws).max() <= 1.5
    # N(0, I) clipped: P(|w| > 1.5) = 13.4% of the values sit on the bound (uniform noise: none)
    assert abs(np.mean(np.abs(draws) == 1.5) - 0.134) < 0.01
    vec = ShapedReward(NoiseVecEnv([lambda: ToyEnv(max_steps=6)] * 2, p, sp, reward="dense"), 1.0)
    vec.seed(0)
    vec.reset()
    _, r, _, infos = vec.step(np.zeros((2, sp.dim), np.float32))
    assert np.allclose(r, [i["reward_terms"]["near"] - 1.0 for i in infos], atol=1e-5)
    # prior_coef: minus the coefficient times each env's mean squared noise (the zero noise costs nothing)
    vec = ShapedReward(NoiseVecEnv([lambda: ToyEnv(max_steps=6)] * 2, p, sp, reward="dense"), 1.0, 0.5)
    vec.seed(0)
    vec.reset()
    w = np.stack([np.zeros(sp.dim), np.full(sp.dim, 1.2)]).astype(np.float32)
    _, r, _, infos = vec.step(w)
    assert np.allclose(r, [i["reward_terms"]["near"] - 1.0 - 0.5 * m for i, m in zip(infos, (0.0, 1.44))],
                       atol=1e-5)
    with pytest.raises(ValueError, match="prior_coef=-0.1 is not allowed"):
        SteerConfig(prior_coef=-0.1)
    with pytest.raises(ValueError, match="prior_coef=0.1 is not allowed with algo=na"):
        SteerConfig(algo="na", prior_coef=0.1)


def test_compare_steps_reads_every_curve_against_the_target():
    from embodied.runtime.steer import compare_steps

    def curve(*points):
        return [{"env_steps": n, "success": v} for n, v in points]

    main = curve((0, 0.5), (2500, 0.7), (5000, 0.9), (7500, 0.8))
    others = {"slow": (curve((0, 0.1), (10000, 0.6), (20000, 0.9)), 20000),
              "never": (curve((0, 0.0), (30000, 0.85)), 30000)}
    t = compare_steps(main, others, target=0.9)
    assert t["slow"] == {"steps_to_reach": 20000, "steps_ratio": 4.0, "steps_ratio_at_least": None}
    assert t["never"] == {"steps_to_reach": None, "steps_ratio": None, "steps_ratio_at_least": 6.0}
    # a steered curve that starts at the target (or never gets there) gives no ratio at all
    assert compare_steps(main, others, target=0.5)["slow"]["steps_ratio"] is None
    assert compare_steps(main, others, target=0.95)["never"] == {"steps_to_reach": None, "steps_ratio": None,
                                                                 "steps_ratio_at_least": None}


def test_report_ratio_never_rounds_a_lower_bound_up():
    from embodied.runtime.steer import format_ratio

    assert format_ratio(None, 30000 / 10006) == "> 2.99x"  # 2.998: not "> 3.0x"
    assert format_ratio(3.0, None) == "3.00x"
    assert format_ratio(None, None) == "–"


@pytest.mark.parametrize("override, want", [([], "sparse"), (["reward=dense"], "dense")])
def test_steer_command_takes_the_task_rewards_from_the_reward_group(override, want):
    from embodied.commands.app import compose
    from embodied.runtime.steer import SteerRunConfig

    cfg = compose("steer", SteerRunConfig, ["checkpoint=c", "task=reach", *override])
    assert cfg.reward == want


def test_steer_command_takes_a_suite_by_name_and_lists_the_suites_for_an_unknown_one():
    from hydra.errors import MissingConfigException

    from embodied.commands.app import compose
    from embodied.runtime.steer import SteerRunConfig

    cfg = compose("steer", SteerRunConfig, ["checkpoint=c", "suite=manipulation"])
    assert (cfg.suite, cfg.task, cfg.tasks) == ("manipulation", "", [])
    with pytest.raises(MissingConfigException, match="navigation"):
        compose("steer", SteerRunConfig, ["checkpoint=c", "suite=nope"])


def test_steer_command_takes_a_learned_reward_by_name_and_refuses_an_unknown_one(tmp_path):
    from embodied.commands.app import compose
    from embodied.core.errors import UnknownNameError
    from embodied.runtime.steer import SteerRunConfig

    cfg = compose("steer", SteerRunConfig, ["checkpoint=c", "task=reach", "reward=prefer",
                                            f"reward.path={tmp_path / 'reward.pt'}"])
    assert cfg.reward == {"name": "prefer", "path": str(tmp_path / "reward.pt"), "shift": "none",
                          "success_threshold": None}
    with pytest.raises(UnknownNameError, match="shaped"):
        SteerRunConfig(checkpoint="c", task="reach", reward={"name": "shaped"})


@pytest.mark.parametrize("algo", ["sac", "na"])
def test_an_actor_takes_back_its_earlier_weights(algo):
    p = tiny()
    sp = space(p)
    cfg = SteerConfig(algo=algo, net_arch=(8,), batch_size=4, learning_starts=2)
    vec = NoiseVecEnv([lambda: ToyEnv()] * 2, p, sp, reward="dense",
                      alias_samples=cfg.na_alias_samples if algo == "na" else 0)
    if algo == "na":
        from policies.steering.na import NoiseAliasing

        actor = NoiseAliasing(vec, cfg).noise_actor()
    else:
        from policies.steering.sb3 import SB3Actor, make_algorithm

        actor = SB3Actor.of(make_algorithm(cfg, vec), cfg)
    feats = np.random.default_rng(0).normal(size=(5, vec.observation_space.shape[0])).astype(np.float32)
    before, saved = actor(feats), {k: v.detach().clone() for k, v in actor.tensors().items()}
    with torch.no_grad():
        for v in actor.tensors().values():
            if v.is_floating_point():
                v.add_(0.5)
    assert not np.allclose(actor(feats), before)
    actor.load_tensors(saved)
    assert np.array_equal(actor(feats), before)


def test_select_best_keeps_the_best_validation_point_and_evaluates_on_other_seeds(tmp_path):
    from embodied.runtime.steer import SteerRunConfig, steer

    ckpt = reach_checkpoint(tmp_path / "base", "flow")
    cfg = SteerRunConfig(checkpoint=str(ckpt), task="reach", env_steps=48, num_envs=2, eval_every=16,
                         eval_episodes=2, final_episodes=2, videos=0, select="best", progress=False,
                         steer=SteerConfig(batch_size=8, learning_starts=4, net_arch=(16, 16)))
    m = steer(cfg, tmp_path / "run")
    scores = [np.mean([p["success"], p["heldout"]]) for p in m["curve"]]
    kept = max(i for i, s in enumerate(scores) if s == max(scores))  # the best; a tie goes to the later
    assert m["selected_env_steps"] == m["curve"][kept]["env_steps"] and m["select"] == "best"
    assert m["selected_val_success"] == pytest.approx(scores[kept])
    assert "select=best" in (tmp_path / "run" / "report.md").read_text()
    with pytest.raises(ValueError, match="overlaps the held-out seeds"):
        SteerRunConfig(checkpoint="c", task="reach", select="best", val_seed=100_010)
    with pytest.raises(ValueError, match="eval_every"):
        SteerRunConfig(checkpoint="c", task="reach", select="best", eval_every=0)
    with pytest.raises(ValueError, match="'last' or 'best'"):
        SteerRunConfig(checkpoint="c", task="reach", select="first")


def test_curve_plot_puts_the_final_star_at_the_kept_weights_and_names_the_curve_seeds():
    from embodied.runtime.steer import curve_ylabel, kept_steps

    assert kept_steps({"env_steps": 30015, "selected_env_steps": 10009}) == 10009
    assert kept_steps({"env_steps": 30015, "selected_env_steps": 0}) == 0  # kept the initial actor
    assert kept_steps({"env_steps": 30015}) == 30015  # select=last
    m = {"curve": [{"episodes": 50}], "final_episodes": 100, "select": "best"}
    assert curve_ylabel(m) == ("success, training wordings\n(curve: 50 episodes, validation seeds;\n"
                               "star: 100, held-out seeds)")
    assert "curve: 50 episodes, held-out seeds" in curve_ylabel({**m, "select": "last"})


def test_steering_refuses_a_task_the_checkpoint_was_not_trained_on(tmp_path):
    from embodied.runtime.steer import Steering, SteerRunConfig

    ckpt = reach_checkpoint(tmp_path / "base", "flow")
    with pytest.raises(ValueError, match=r"task='push' is not one of the tasks .* \[reach\]"):
        Steering(SteerRunConfig(checkpoint=str(ckpt), task="push", progress=False), tmp_path / "run")
