"""Contract tests parameterised over every registered task of our own suites."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli
from gymnasium.utils.env_checker import check_env

import embodied
from embodied.core.env import EmbodiedEnv
from embodied.core.errors import InvalidActionError, UnknownNameError
from embodied.core.registry import get_task

SUITES = ("manipulation", "navigation")
TASKS = [t for s in SUITES for t in embodied.list_tasks(s)]


def test_suites_registered():
    assert set(SUITES) <= set(embodied.list_suites())
    assert len(embodied.list_tasks("manipulation")) >= 8
    assert len(embodied.list_tasks("navigation")) >= 4


@pytest.mark.parametrize("task", TASKS)
def test_check_env_state_and_pixels(task):
    for mode in ("state", "pixels"):
        env = embodied.make_env(task, obs_mode=mode, image_size=32)
        check_env(env, skip_render_check=True)
        env.close()


# Meta-World is a hard dependency: a plugin that fails to import fails collection here,
# instead of leaving an empty parameter list that silently drops these tests.
METAWORLD_TASKS = embodied.list_tasks("metaworld-mt50")


def test_metaworld_suite_registered():
    assert len(METAWORLD_TASKS) == 50 and "metaworld-mt10" in embodied.list_suites()


@pytest.mark.parametrize("task", METAWORLD_TASKS)
def test_check_env_metaworld(task):
    env = embodied.make_env(task)
    check_env(env, skip_render_check=True)
    env.close()


@pytest.mark.parametrize("task", TASKS + METAWORLD_TASKS)
def test_env_protocol(task):
    """What embodied.core.env documents: the members, the info keys, the physics step."""
    import mujoco

    env = embodied.make_env(task)
    u = env.unwrapped
    _, info = env.reset(seed=0)
    assert isinstance(u, EmbodiedEnv)
    assert set(info) == {"success", "reward_terms", "params"} and isinstance(info["params"], dict)
    assert isinstance(u.model, mujoco.MjModel) and isinstance(u.data, mujoco.MjData)
    assert isinstance(u.n_substeps, int) and u.n_substeps >= 1
    assert (u.native_env is not None) == (task in METAWORLD_TASKS)
    t0 = u.data.time
    _, _, _, _, info = env.step(np.zeros(env.action_space.shape, np.float32))
    assert set(info) == {"success", "reward_terms"}
    assert u.data.time == pytest.approx(t0 + u.n_substeps * u.model.opt.timestep)
    env.close()


@pytest.mark.parametrize("task", TASKS)
def test_observation_reward_contract(task):
    env = embodied.make_env(task)
    u = env.unwrapped
    obs, info = env.reset(seed=3)
    assert obs["state"].dtype == np.float32 and obs["state"].shape == (u.observation_spec.state_dim,)
    assert isinstance(obs["instruction"], str) and obs["instruction"]
    assert "{" not in obs["instruction"], "template fields must be filled"
    rng = np.random.default_rng(0)
    for _ in range(30):
        obs, r, term, trunc, info = env.step(rng.uniform(-1, 1, env.action_space.shape).astype(np.float32))
        assert np.isfinite(obs["state"]).all()
        assert 0.0 <= r <= 1.0 + 1e-6
        assert info["reward_terms"] and all(0.0 <= v <= 1.0 for v in info["reward_terms"].values())
        assert isinstance(info["success"], bool)
        if term or trunc:
            break


@pytest.mark.parametrize("task", TASKS)
def test_determinism_under_seed(task):
    def rollout():
        env = embodied.make_env(task)
        obs, _ = env.reset(seed=11)
        states, rng = [obs["state"]], np.random.default_rng(1)
        for _ in range(15):
            obs, *_ = env.step(rng.uniform(-1, 1, env.action_space.shape).astype(np.float32))
            states.append(obs["state"])
        return obs["instruction"], np.stack(states)

    (i1, s1), (i2, s2) = rollout(), rollout()
    assert i1 == i2
    np.testing.assert_array_equal(s1, s2)


@pytest.mark.parametrize("task", TASKS)
def test_expert_success(task):
    env = embodied.make_env(task)
    wins = 0
    for seed in range(20):
        env.reset(seed=seed)
        for _ in range(env.unwrapped.max_episode_steps):
            _, _, term, trunc, info = env.step(env.unwrapped.expert_action())
            if term or trunc:
                break
        wins += info["success"]
    assert wins >= 19, f"{task}: expert succeeded {wins}/20"


@pytest.mark.parametrize("task", TASKS)
def test_paraphrase_split(task):
    spec = get_task(task)
    assert len(spec.train_instructions) >= 5 and len(spec.heldout_instructions) >= 3
    assert not set(spec.train_instructions) & set(spec.heldout_instructions)
    env = embodied.make_env(task, instruction_split="heldout")
    seen = {env.reset(seed=s)[0]["instruction"] for s in range(10)}
    env_train = embodied.make_env(task)
    train_seen = {env_train.reset(seed=s)[0]["instruction"] for s in range(10)}
    assert not seen & train_seen


def test_pixel_observations_multi_camera():
    env = embodied.make_env("pick", obs_mode="pixels", cameras=["front", "top"], image_size=48)
    obs, _ = env.reset(seed=0)
    assert obs["image"].shape == (48, 48, 3) and obs["image"].dtype == np.uint8
    assert set(obs["images"]) == {"front", "top"}
    assert obs["state"].shape == (env.unwrapped.proprio_dims,)
    assert obs["image"].std() > 5, "rendered image is blank"


# ----------------------------------------------------------------- bad input
def test_unknown_task_lists_valid_names():
    with pytest.raises(UnknownNameError) as e:
        embodied.make_env("pick-up")
    assert "pick" in str(e.value) and "Did you mean" in str(e.value)
    with pytest.raises(UnknownNameError, match="Valid suites"):
        embodied.get_suite("manipulaton")


@pytest.mark.parametrize("bad", [np.zeros(3), np.zeros((1, 4)), np.zeros(5)])
def test_wrong_action_shape(bad):
    env = embodied.make_env("reach")
    env.reset(seed=0)
    with pytest.raises(InvalidActionError, match="shape"):
        env.step(bad.astype(np.float32))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_action_refused_and_state_unchanged(value):
    env = embodied.make_env("reach")
    obs, _ = env.reset(seed=0)
    with pytest.raises(InvalidActionError, match="NaN or inf"):
        env.step(np.array([0, value, 0, 0], np.float32))
    np.testing.assert_array_equal(env.unwrapped._state(), obs["state"])


def test_out_of_range_action_is_clipped():
    a, b = embodied.make_env("reach"), embodied.make_env("reach")
    a.reset(seed=0), b.reset(seed=0)
    oa = a.step(np.array([5, -5, 3, 9], np.float32))[0]
    ob = b.step(np.array([1, -1, 1, 1], np.float32))[0]
    np.testing.assert_allclose(oa["state"], ob["state"])


def test_instruction_for_wrong_suite():
    # A template whose fields the task lacks is a clear error naming the field ...
    env = embodied.make_env("pick", instructions=["go to the {room}"])
    with pytest.raises(ValueError, match="room"):
        env.reset(seed=0)
    # ... while free text is accepted as the user's own wording (the policy decides).
    env = embodied.make_env("pick", instructions=["go to the kitchen"])
    assert env.reset(seed=0)[0]["instruction"] == "go to the kitchen"


def test_bad_env_arguments():
    with pytest.raises(ValueError, match="obs_mode"):
        embodied.make_env("pick", obs_mode="depth")
    with pytest.raises(ValueError, match="camera"):
        embodied.make_env("pick", obs_mode="pixels", cameras=["wrist"])
    with pytest.raises(ValueError, match="instruction split"):
        embodied.make_env("pick", instruction_split="test")


# ----------------------------------------------------------------- Robot
def test_sim_robot_contract():
    from embodied.core.robot import RobotNotConnectedError

    robot = embodied.SimRobot("press-button", seed=4)
    with pytest.raises(RobotNotConnectedError):
        robot.get_observation()
    with robot:
        obs = robot.get_observation()
        assert obs["state"].shape == (robot.observation_spec.state_dim,)
        sent = robot.send_action(np.array([2.0, 0, -0.5, 0], np.float32))
        np.testing.assert_array_equal(sent, [1.0, 0, -0.5, 0])
        with pytest.raises(InvalidActionError):
            robot.send_action(np.array([np.nan, 0, 0, 0]))
        for _ in range(60):
            robot.send_action(robot.env.unwrapped.expert_action())
            if robot.done:
                break
        assert robot.last_info["success"]
    assert not robot.is_connected


# ----------------------------------------------------------------- bench
@pytest.mark.parametrize("suite, substeps", [("manipulation", 10), ("navigation", 5)])
def test_bench_smoke(tmp_path, suite, substeps):
    """``embodied bench`` on our own worlds: figures beside their baselines, no native one."""
    r = run_cli(["bench", f"suite={suite}", "sim_steps=10", "render_frames=2", "render_sizes=[32,48]",
                 "sections=[sim,render,experts]", "expert_episodes=1", f"hydra.run.dir={tmp_path}"], cwd=Path.cwd(),
                timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    tasks = embodied.list_tasks(suite)
    assert list(m["sim"]["per_task"]) == tasks == list(m["experts"]["per_task"])
    for task, p in m["sim"]["per_task"].items():
        assert p["substeps"] == substeps and p["replay_max_abs_qpos_diff"] == 0.0, task
        assert p["env_vs_raw"] == pytest.approx(p["env_steps_per_s"] / p["raw_steps_per_s"])
        assert "native_steps_per_s" not in p
    assert "mean_env_vs_native" not in m["sim"] and m["sim"]["mean_env_vs_raw"] > 0
    assert set(m["render"]) == {f"{s}px_{k}" for s in (32, 48) for k in ("fps", "default_fps", "vs_default")}
    for task, p in m["experts"]["per_task"].items():
        assert p["steps"] == get_task(task).max_episode_steps and 0.0 <= p["success_rate"] <= 1.0
        assert "native_same_layouts_success_rate" not in p


def test_bench_bad_config(tmp_path):
    r = run_cli(["bench", "sections=[sim,speed]", f"hydra.run.dir={tmp_path}"], cwd=Path.cwd(), timeout=300)
    assert r.returncode == 2 and "sections" in r.stderr and "'speed'" in r.stderr and "experts" in r.stderr


HINDSIGHT_TASKS = [t for s in SUITES if embodied.get_suite(s).hindsight for t in embodied.list_tasks(s)]


@pytest.mark.parametrize("task", HINDSIGHT_TASKS)
def test_hindsight_labels_replay_the_env_on_its_own_goal(task):
    """A suite's hindsight labeller, fed an episode's recorded states, gives the env's success on
    every step for the episode's own goal, and its dense reward wherever the env's reward terms do
    not depend on what the states leave out (a contact: navigation's ``safety`` term), and labels
    each goal of the suite's tasks once."""
    from embodied.core.registry import hindsight_labeller

    suite = get_task(task).suite
    tasks = embodied.list_tasks(suite)
    labeller = hindsight_labeller(suite)
    env = embodied.make_env(task)
    u = env.unwrapped
    rng = np.random.default_rng(0)
    for seed in (5, 6):
        env.reset(seed=seed)
        states, success, reward, exact = [], [], [], []
        for t in range(u.max_episode_steps):
            a = u.expert_action()
            if t % 4 == 3:
                a = rng.uniform(-1, 1, a.shape).astype(np.float32)
            _, r, term, trunc, info = env.step(a)
            states.append(u.privileged_state())
            success.append(info["success"])
            reward.append(r)
            exact.append(info["reward_terms"].get("safety", 1.0) == 1.0)
            if term or trunc:
                break
        goals = labeller(np.array(states), tasks)
        assert {g[0] for g in goals} == set(tasks)
        assert len({(g[0], tuple(sorted(g[1].items()))) for g in goals}) == len(goals)
        own = [g for g in goals if g[0] == task and g[1] == {k: v for k, v in u.params.items() if isinstance(v, str)}]
        assert len(own) == 1, (task, u.params)
        _, _, ok, r_hind = own[0]
        exact = np.array(exact)
        assert np.array_equal(ok, success) and exact.mean() > 0.5
        assert np.allclose(r_hind[exact], np.array(reward)[exact], atol=1e-4)
