"""Contract and behaviour tests of the Meta-World v3 adapter (sim/metaworld)."""

import sim  # noqa: F401  (configures headless GL before mujoco is imported)

import json
import re
import subprocess
from pathlib import Path
import sys
import warnings

import metaworld  # noqa: F401  (a hard dependency: missing, this module fails loudly, never skips)
import mujoco
import numpy as np
import pytest
from cli_runner import run_cli
from gymnasium.utils.env_checker import check_env

from embodied.core.errors import InvalidActionError
from embodied.core.registry import get_suite, get_task, list_tasks, make_env
from sim.base import INSTRUCTION_CHARSET
from sim.metaworld import INSTRUCTIONS  # task -> Paraphrases, from instructions.yaml
from sim.metaworld.tasks import ALL_TASKS, MT10, MT50


def test_static_lists_match_the_package():
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS, MT10_V3, MT50_V3
    from metaworld.policies import ENV_POLICY_MAP

    assert list(ALL_TASKS) == list(ALL_V3_ENVIRONMENTS)
    assert list(MT10) == list(MT10_V3)
    assert list(MT50) == list(MT50_V3)
    assert set(ENV_POLICY_MAP) == set(ALL_TASKS)


def test_registry_has_tasks_and_suites():
    assert len(ALL_TASKS) == 50
    assert set(ALL_TASKS) <= set(list_tasks())
    assert get_suite("metaworld-mt10").tasks == MT10
    assert get_suite("metaworld-mt50").tasks == MT50
    for t in ALL_TASKS:
        spec = get_task(t)
        assert spec.suite == "metaworld" and spec.max_episode_steps == 200


def test_registration_does_not_import_metaworld():
    code = ("import sys, sim.metaworld; from embodied.core.registry import get_suite;"
            "get_suite('metaworld-mt50'); assert 'metaworld' not in sys.modules, 'imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


# Words that only held-out wordings used when the split was made (before training wordings
# were added). No training wording of any task may use one: the held-out split measures
# words the policy has never been trained on, and added training wordings must not leak them.
HELDOUT_ONLY_WORDS = frozenset("""
along arm aside avoid bang bear below between brew brewer brush cabinet catch cavity come control crank
depress dip direction disengage dish downward drops effector end engage espresso extend extract facing fall
fingers fish flask flip flush football force frame free give glide goalposts goes guide handled haul hinged
hoist home horizontally inside latch laterally lay leaves let location mallet mark marked mount neighbouring
nudge obstacle opening picked pin pivot placing point poke post rack release relocate rim rod round running
sash seal second secure shelve shift shoot sink sits slot small socket spot steer store straight strike
switch thread transport unmount upright wide wield without work yank""".split())


def test_training_wordings_never_use_heldout_only_words():
    leaks = {(task, s): sorted(set(re.findall(r"[a-z]+", s.lower())) & HELDOUT_ONLY_WORDS)
             for task, words in INSTRUCTIONS.items() for s in words.train}
    leaks = {k: v for k, v in leaks.items() if v}
    assert not leaks, f"training wordings use held-out-only words: {leaks}"
    heldout_words = {w for words in INSTRUCTIONS.values() for s in words.heldout
                     for w in re.findall(r"[a-z]+", s.lower())}
    assert HELDOUT_ONLY_WORDS <= heldout_words  # the list names words of the held-out split


@pytest.mark.parametrize("task", ALL_TASKS)
def test_instruction_split(task):
    train, heldout = INSTRUCTIONS[task].train, INSTRUCTIONS[task].heldout
    assert len(set(train)) >= 5 and len(set(heldout)) >= 3
    assert not set(train) & set(heldout)
    assert all(set(s) <= set(INSTRUCTION_CHARSET) and len(s) <= 256 for s in train + heldout)
    spec = get_task(task)
    assert spec.train_instructions == train and spec.heldout_instructions == heldout


@pytest.mark.parametrize("task", ALL_TASKS)
def test_contract_every_task(task):
    env = make_env(task)
    u = env.unwrapped
    obs, info = env.reset(seed=3)
    assert obs["state"].dtype == np.float32 and obs["state"].shape == (39,) and np.isfinite(obs["state"]).all()
    assert obs["instruction"] in INSTRUCTIONS[task].train and not info["success"]
    assert u.observation_spec.state_dim == 39 and u.action_spec.dim == 4 and u.max_episode_steps == 200
    for _ in range(5):
        a = u.expert_action()
        assert a.shape == (4,) and a.dtype == np.float32 and np.all(np.abs(a) <= 1.0)
        obs, reward, term, trunc, info = env.step(a)
        assert 0.0 <= reward <= 1.0 and np.isfinite(obs["state"]).all()
        assert isinstance(info["success"], bool) and term == info["success"]
    env.close()


def test_heldout_env_uses_heldout_wording():
    env = make_env("door-open-v3", instruction_split="heldout")
    seen = {env.reset(seed=s)[0]["instruction"] for s in range(10)}
    assert seen <= set(INSTRUCTIONS["door-open-v3"].heldout) and len(seen) > 1


@pytest.mark.parametrize("task", ["reach-v3", "pick-place-v3"])
def test_check_env_state(task):
    env = make_env(task)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert obs["state"].shape == (39,) and obs["state"].dtype == np.float32
    assert isinstance(obs["instruction"], str) and not info["success"]
    env.close()


def test_check_env_pixels_and_render():
    env = make_env("drawer-open-v3", obs_mode="pixels", image_size=32, render_mode="rgb_array", render_size=48)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env)
    obs, _ = env.reset(seed=1)
    assert obs["image"].shape == (32, 32, 3) and obs["image"].dtype == np.uint8 and obs["image"].std() > 0
    assert obs["state"].shape == (4,)
    frame = env.render()
    assert frame.shape == (48, 48, 3) and frame.dtype == np.uint8
    env.close()


def test_corner_cameras_are_upright():
    """Meta-World's corner cameras are rolled upside down; we rotate their frames back. In an
    upright frame the dark background is at the top and the table fills the bottom."""
    env = make_env("reach-v3", obs_mode="state+pixels", cameras=["corner", "corner2"], image_size=64)
    obs, _ = env.reset(seed=0)
    assert obs["state"].shape == (39,) and obs["image"].shape == (64, 64, 3)
    for cam, img in obs["images"].items():
        assert img[:16].mean() + 30 < img[-16:].mean(), cam
    env.close()


def _magenta(img: np.ndarray) -> np.ndarray:
    img = img.astype(int)
    return (img[..., 0] > 120) & (img[..., 2] > 120) & (img[..., 1] < 0.6 * np.minimum(img[..., 0], img[..., 2]))


@pytest.mark.parametrize("task", ["reach-v3", "pick-place-v3", "button-press-topdown-v3", "window-open-v3"])
def test_render_draws_the_goal_marker_but_observation_images_keep_metaworlds_drawing(task):
    """render() (what the VLM reward and videos read) draws the goal site as a translucent
    magenta sphere of GOAL_MARKER_RADIUS around the goal; observation images of the same
    camera (what pixel policies read) are Meta-World's drawing (a 2 cm sphere), and neither the
    model nor the simulation changes. A task without a goal site, or whose goal is an object's
    state rather than a point in free space (window-open-v3), renders as before."""
    from sim.metaworld.world import GOAL_MARKER_RADIUS

    env = make_env(task, obs_mode="state+pixels", cameras=["corner"], image_size=64,
                   render_mode="rgb_array", render_size=64)
    obs, _ = env.reset(seed=3)
    u = env.unwrapped
    site_size, site_rgba = u.model.site_size.copy(), u.model.site_rgba.copy()
    r = u._renderers[64]

    def default() -> np.ndarray:  # Meta-World's drawing of the corner camera, turned upright
        r.update_scene(u.data, "corner")
        return np.ascontiguousarray(r.render()[::-1, ::-1])

    assert np.array_equal(obs["image"], default())  # pixel policies see what they saw before
    frame = env.render()
    np.testing.assert_array_equal(u.model.site_size, site_size)  # the model is untouched
    np.testing.assert_array_equal(u.model.site_rgba, site_rgba)
    from sim.metaworld.world import GOAL_MARKED_TASKS

    has_site = mujoco.mj_name2id(u.model, mujoco.mjtObj.mjOBJ_SITE, "goal") >= 0
    assert has_site == (task != "button-press-topdown-v3")
    if not task.startswith(GOAL_MARKED_TASKS):  # no goal site, or a goal that is an object's state
        assert np.array_equal(frame, default())
    else:
        assert not _magenta(obs["image"]).any()
        ys, xs = np.nonzero(_magenta(frame))
        assert len(ys) >= 6  # a 2 cm sphere is about one pixel here; the marker is several
        # The marker is drawn at the goal: project the goal through the corner camera.
        cam = u.data.camera("corner")
        rel = cam.xmat.reshape(3, 3).T @ (np.asarray(u.params["goal"]) - cam.xpos)  # camera frame, -z forward
        f = 32 / np.tan(np.deg2rad(u.model.camera("corner").fovy[0]) / 2)
        col, row = 32 + f * rel[0] / -rel[2], 32 - f * rel[1] / -rel[2]  # MuJoCo's (unrotated) image
        col, row = 63 - col, 63 - row  # the frame is turned 180 degrees
        assert abs(xs.mean() - col) < 3 and abs(ys.mean() - row) < 3, (xs.mean(), ys.mean(), col, row)
        radius_px = f * GOAL_MARKER_RADIUS / -rel[2]
        assert len(ys) <= np.pi * (radius_px + 1.5) ** 2
    obs, *_ = env.step(np.zeros(4, np.float32))
    assert np.array_equal(obs["image"], default())  # a render() call leaves observation images alone
    env.close()


@pytest.mark.parametrize("task", ["pick-place-v3", "door-open-v3"])
def test_reset_is_deterministic(task):
    a_env, b_env = make_env(task), make_env(task)
    rng = np.random.default_rng(0)
    a_env.reset(seed=1)
    for _ in range(10):  # a different history must not matter
        a_env.step(rng.uniform(-1, 1, 4).astype(np.float32))
    a, ia = a_env.reset(seed=7)
    b, ib = b_env.reset(seed=7)
    np.testing.assert_array_equal(a["state"], b["state"])
    assert a["instruction"] == b["instruction"] and ia["params"] == ib["params"]
    for _ in range(10):
        sa = a_env.step(a_env.unwrapped.expert_action())[0]["state"]
        sb = b_env.step(b_env.unwrapped.expert_action())[0]["state"]
    np.testing.assert_array_equal(sa, sb)
    c, _ = b_env.reset(seed=8)
    assert not np.array_equal(a["state"][36:], c["state"][36:])  # another goal


def test_scene_compiled_once_and_each_env_owns_its_model():
    """Envs after the first copy the compiled model: the same simulation, a model of their own."""
    import mujoco
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

    from sim.metaworld import world

    task = "peg-insert-side-v3"  # moves its box in the model at reset
    world._COMPILED.clear()
    compile_xml = MujocoEnv.__dict__["_initialize_simulation"]
    first, second = make_env(task), make_env(task)
    assert MujocoEnv.__dict__["_initialize_simulation"] is compile_xml  # put back after building
    assert len(world._COMPILED) == 1
    fresh = mujoco.MjModel.from_xml_path(first.unwrapped.mw.fullpath)
    model = second.unwrapped.mw.model
    for name in ("body_pos", "body_quat", "geom_size", "geom_pos", "jnt_range", "actuator_gear", "opt.timestep"):
        obj_f, obj_m = fresh, model
        for part in name.split("."):
            obj_f, obj_m = getattr(obj_f, part), getattr(obj_m, part)
        np.testing.assert_array_equal(np.asarray(obj_m), np.asarray(obj_f), err_msg=name)
    runs = []
    for env in (first, second):
        obs, _ = env.reset(seed=3)
        states = [obs["state"]]
        for _ in range(30):
            states.append(env.step(env.unwrapped.expert_action())[0]["state"])
        runs.append(np.stack(states))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert first.unwrapped.mw.model is not second.unwrapped.mw.model
    before = np.array(second.unwrapped.mw.model.body_pos)
    first.reset(seed=4)  # moves the box in the first env's model only
    np.testing.assert_array_equal(second.unwrapped.mw.model.body_pos, before)
    assert not np.array_equal(first.unwrapped.mw.model.body_pos, before)


@pytest.mark.parametrize("task", ["reach-v3", "button-press-topdown-v3", "drawer-close-v3"])
def test_expert_succeeds(task):
    env = make_env(task)
    for seed in range(3):
        env.reset(seed=seed)
        for _ in range(env.unwrapped.max_episode_steps):
            _, reward, term, trunc, info = env.step(env.unwrapped.expert_action())
            assert 0.0 <= reward <= 1.0 and set(info["reward_terms"]) == {"metaworld"}
            assert reward == info["reward_terms"]["metaworld"]
            if term or trunc:
                break
        assert term and info["success"], f"{task} seed {seed}: expert failed"


def test_truncation_and_stepping_past_metaworld_limit():
    env = make_env("reach-v3", max_episode_steps=3)
    env.reset(seed=0)
    truncs = [env.step(np.zeros(4, np.float32))[3] for _ in range(5)]
    assert truncs == [False, False, True, True, True]
    env = make_env("reach-v3", max_episode_steps=600)
    env.reset(seed=0)
    for _ in range(510):  # Meta-World alone raises after 500 steps
        trunc = env.step(np.zeros(4, np.float32))[3]
    assert not trunc


def test_bad_input_rejected():
    env = make_env("reach-v3")
    env.reset(seed=0)
    with pytest.raises(InvalidActionError):
        env.step(np.zeros(3, np.float32))
    with pytest.raises(InvalidActionError):
        env.step(np.array([np.nan, 0, 0, 0], np.float32))
    with pytest.raises(ValueError, match="camera"):
        make_env("reach-v3", obs_mode="pixels", cameras=["nope"])
    with pytest.raises(ValueError, match="obs_mode"):
        make_env("reach-v3", obs_mode="depth")


def test_rollout_with_expert():
    from embodied.runtime.rollout import run_episodes

    res = run_episodes(lambda: make_env("reach-v3", max_episode_steps=100), seeds=[0, 1, 2], policy="expert",
                       num_envs=2)
    assert [r.seed for r in res] == [0, 1, 2] and all(r.success for r in res)


def test_bench_metaworld_mt10_smoke(tmp_path):
    """``embodied bench`` on MT10: each figure beside its baseline, a baseline that replays the
    very same episodes, and Meta-World's own env and expert as the adapter's baselines."""
    r = run_cli(["bench", "suite=metaworld-mt10", "sim_steps=10", "render_frames=2", "render_sizes=[32]",
                 "sections=[sim,render,experts]", "expert_episodes=1", "expert_steps=20", f"hydra.run.dir={tmp_path}"],
                cwd=Path.cwd(), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["suite"] == "metaworld-mt10" and m["tasks"] == list(MT10)
    assert list(m["sim"]["per_task"]) == list(MT10)
    for task, p in m["sim"]["per_task"].items():
        assert p["substeps"] == 5, task
        assert p["replay_max_abs_qpos_diff"] == 0.0, f"{task}: the mj_step baseline simulated other episodes"
        assert p["env_vs_raw"] == pytest.approx(p["env_steps_per_s"] / p["raw_steps_per_s"])
        assert p["env_vs_native"] == pytest.approx(p["env_steps_per_s"] / p["native_steps_per_s"])
    assert {"mean_env_steps_per_s", "mean_env_vs_raw", "mean_env_vs_native"} <= set(m["sim"])
    assert set(m["render"]) == {"32px_fps", "32px_default_fps", "32px_vs_default"}
    assert m["render"]["32px_fps"] > 0 and m["render"]["32px_default_fps"] > 0
    for task, p in m["experts"]["per_task"].items():
        assert p["steps"] == 20 and p["episodes"] == 1 and 0 <= p["episodes_agree"] <= 1, task
        for k in ("success_rate", "native_same_layouts_success_rate", "native_benchmark_success_rate"):
            assert 0.0 <= p[k] <= 1.0, (task, k)


def test_bench_experts_paired_with_metaworld():
    """The adapter's expert episodes and Meta-World's own on the same layouts agree."""
    from embodied.runtime.sim_bench import bench_experts

    p = bench_experts("reach-v3", episodes=3, seed=0)
    assert p["steps"] == 200 and p["success_rate"] == 1.0
    assert p["native_same_layouts_success_rate"] == 1.0 and p["episodes_agree"] == 3
    assert p["native_benchmark_success_rate"] >= 2 / 3


def test_recorded_frames_play_at_video_speed():
    """Meta-World steps at 80 Hz and videos play at 20 fps: a recorded episode keeps its first frame,
    every fourth step and its last, so the video runs in the episode's own time."""
    from embodied.runtime.rollout import VIDEO_FPS, frame_stride, run_episodes

    assert VIDEO_FPS == 20 and frame_stride({"render_fps": 80}) == 4 and frame_stride({"render_fps": 20}) == 1
    assert frame_stride({"render_fps": 10}) == 1 and frame_stride({}) == 1
    res = run_episodes(lambda: make_env("reach-v3", max_episode_steps=30, render_mode="rgb_array", render_size=32),
                       seeds=[0, 1], policy="expert", num_envs=2, record=1)
    n = res[0].length
    assert len(res[0].frames) == 1 + n // 4 + (n % 4 != 0) and not res[1].frames
    final = make_env("reach-v3", max_episode_steps=30, render_mode="rgb_array", render_size=32)
    final.reset(seed=0)
    for _ in range(n):
        final.step(final.expert_action())
    assert np.array_equal(res[0].frames[-1], final.render())  # the last step's frame is kept
