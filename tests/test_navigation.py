"""Contract and behaviour tests of the navigation suite (sim/navigation)."""

import sim  # noqa: F401  (configures headless GL before mujoco is imported)

import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from embodied.core.registry import get_suite, get_task, make_env
from sim.navigation.arena import BALL_R, COLORS, N_RANGES, RANGE_MAX, ROOMS, wall_clearance

TASKS = ("goto-landmark", "goto-room", "goto-between", "approach-avoid")
EXPERT_SEEDS = 20


def test_suite_lists_the_tasks():
    assert set(TASKS) <= set(get_suite("navigation").tasks)


@pytest.mark.parametrize("task", TASKS)
def test_check_env_state(task):
    env = make_env(task)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # render_mode=None warnings
        check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert obs["state"].shape == (6 + 4 * len(COLORS) + N_RANGES,) and obs["state"].dtype == np.float32
    env.close()


def test_egocentric_landmarks_and_ranges_agree_with_the_pose():
    env = make_env("goto-landmark")
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        s = obs["state"].astype(np.float64)
        x, y, c, sn = s[0], s[1], s[2], s[3]
        world = s[6:14].reshape(-1, 2)
        ego = s[14:22].reshape(-1, 2)
        # rotating the robot-frame vectors back by the yaw gives the world-frame offsets
        back = np.stack([ego[:, 0] * c - ego[:, 1] * sn, ego[:, 0] * sn + ego[:, 1] * c], axis=1)
        np.testing.assert_allclose(back, world - (x, y), atol=1e-4)
        ranges = s[22:30]
        assert np.all(ranges > 0) and np.all(ranges <= RANGE_MAX)
        # no ray ends before the nearest obstacle surface (wall face or ball)
        nearest = min(float(wall_clearance(np.array([x, y]))), float(np.linalg.norm(world - (x, y), axis=1).min()) - BALL_R)
        assert ranges.min() >= nearest - 1e-3
    # driving straight at a wall shortens the forward ray by the distance driven
    obs, _ = env.reset(seed=0)
    first = obs["state"][22]
    for _ in range(3):
        obs, *_ = env.step(np.array([0.5, 0.0], np.float32))
    assert obs["state"][22] < first or first == RANGE_MAX
    env.close()


@pytest.mark.parametrize("task", TASKS)
def test_check_env_pixels(task):
    env = make_env(task, obs_mode="pixels", image_size=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env, skip_render_check=True)
    env.close()


def test_pixel_obs_and_render():
    env = make_env("goto-room", obs_mode="pixels", image_size=48, render_mode="rgb_array", render_size=64)
    obs, _ = env.reset(seed=1)
    assert obs["image"].shape == (48, 48, 3) and obs["image"].dtype == np.uint8
    assert obs["state"].shape == (env.unwrapped.proprio_dims,)
    assert obs["image"].std() > 0  # not a blank frame
    frame = env.render()
    assert frame.shape == (64, 64, 3) and frame.dtype == np.uint8
    env.close()


def test_render_hides_the_rangefinder_rays_but_observation_images_keep_them():
    """render() (what the VLM reward and videos read) shows the scene without MuJoCo's
    rangefinder rays; observation images of the same camera (what pixel policies read)
    are drawn as before, rays included."""
    import mujoco

    env = make_env("goto-landmark", obs_mode="state+pixels", cameras=["overhead"], image_size=64,
                   render_mode="rgb_array", render_size=64)
    obs, _ = env.reset(seed=3)
    u = env.unwrapped
    r = u._renderers[64]
    r.update_scene(u.data, "overhead")  # MuJoCo's default drawing
    default = r.render().copy()
    opt = mujoco.MjvOption()
    opt.flags[mujoco.mjtVisFlag.mjVIS_RANGEFINDER] = False
    r.update_scene(u.data, "overhead", scene_option=opt)
    no_rays = r.render().copy()
    assert not np.array_equal(default, no_rays)  # the rays are visible in this view
    assert np.array_equal(obs["image"], default)  # pixel policies see what they saw before
    assert np.array_equal(env.render(), no_rays)
    obs, *_ = env.step(np.zeros(env.action_space.shape, np.float32))
    r.update_scene(u.data, "overhead")
    assert np.array_equal(obs["image"], r.render())  # a render() call leaves observation images alone
    env.close()


def _magenta(frame):
    """Mask of the trail colour (255, 0, 255) in a frame."""
    f = frame.astype(int)
    return (f[..., 0] > 200) & (f[..., 1] < 60) & (f[..., 2] > 200)


# half the floor width the overhead camera sees (it looks straight down from 6.6 m, fovy 45)
_OVERHEAD_HALF = 6.6 * np.tan(np.radians(22.5))


def _overhead_pixels(xy, size):
    """(row, col) of floor points (N, 2) in an overhead frame of side ``size`` (x to the
    right, y up)."""
    xy = np.asarray(xy, dtype=np.float64)
    return np.stack([(0.5 - xy[:, 1] / (2 * _OVERHEAD_HALF)) * size,
                     (0.5 + xy[:, 0] / (2 * _OVERHEAD_HALF)) * size], axis=1)


def test_render_draws_the_path_so_far_and_a_reset_clears_it():
    """With trail=True, render() shows where the robot has driven since reset (magenta discs on
    the floor, a colour the scene has nowhere else; the default draws none); the newest point
    lies under the robot, so a fresh episode shows none, and a reset starts a new trail."""
    from sim.navigation.arena import ROBOT_R
    from sim.navigation.world import TRAIL_RADIUS

    size = 64
    env = make_env("goto-landmark", render_mode="rgb_array", render_size=size, trail=True)
    plain = make_env("goto-landmark", render_mode="rgb_array", render_size=size)  # the default: no trail
    u = env.unwrapped
    obs, _ = env.reset(seed=0)
    plain.reset(seed=0)
    first = env.render()
    assert not _magenta(first).any()  # only the start point, under the robot
    assert np.array_equal(first, plain.render())
    path = [obs["state"][:2].copy()]
    for _ in range(25):
        a = u.expert_action()
        obs, *_ = env.step(a)
        plain.step(a)
        path.append(obs["state"][:2].copy())
    path = np.array(path)
    assert np.linalg.norm(path[-1] - path[0]) > 1.0  # the robot has moved well clear of its start
    frame, off = env.render(), plain.render()
    assert not _magenta(off).any()  # no trail: nothing in the scene has the trail's colour
    changed = np.any(frame != off, axis=-1)
    assert changed.any() and np.array_equal(changed, _magenta(frame))  # the trail is all that differs
    px = 2 * _OVERHEAD_HALF / size  # metres per pixel
    centres = np.argwhere(changed) + 0.5
    # dense points along the driven path (straight between consecutive steps)
    t = np.linspace(0, 1, 5)[:, None, None]
    dense = (path[:-1] * (1 - t) + path[1:] * t).reshape(-1, 2)
    dense_px = _overhead_pixels(dense, size)
    gap = np.linalg.norm(centres[:, None] - dense_px[None], axis=-1).min(1)
    assert gap.max() <= TRAIL_RADIUS / px + 1.5  # every trail pixel lies on the path
    visible = _overhead_pixels(path[np.linalg.norm(path - path[-1], axis=1) > ROBOT_R + 2 * px], size)
    cover = np.linalg.norm(visible[:, None] - centres[None], axis=-1).min(1)
    assert len(visible) >= 10 and cover.max() <= 1.5  # ... and the path is drawn all along
    env.reset(seed=1)
    assert not _magenta(env.render()).any()  # a reset clears the trail
    env.reset(seed=0)
    assert np.array_equal(env.render(), first)
    env.close()
    plain.close()


def test_the_trail_leaves_observation_images_and_the_simulation_alone():
    """Pixel observations (even of the overhead camera) and states are byte-identical with and
    without the trail, rendered or not; only render() frames differ."""
    kw = dict(obs_mode="state+pixels", cameras=["overhead"], image_size=64, render_mode="rgb_array",
              render_size=64)
    env, plain = make_env("approach-avoid", **kw, trail=True), make_env("approach-avoid", **kw, trail=False)
    a_obs, _ = env.reset(seed=4)
    b_obs, _ = plain.reset(seed=4)
    drawn = False
    for t in range(40):
        assert np.array_equal(a_obs["image"], b_obs["image"]) and np.array_equal(a_obs["state"], b_obs["state"])
        frame = env.render()
        assert np.array_equal(plain.render(), np.where(_magenta(frame)[..., None], plain.render(), frame))
        drawn = drawn or _magenta(frame).any()
        assert not _magenta(a_obs["image"]).any()
        a = env.unwrapped.expert_action()
        a_obs, *_ = env.step(a)
        b_obs, *_ = plain.step(a)
    assert drawn
    env.close()
    plain.close()


def test_the_trail_fits_the_scenes_free_geoms():
    """With fewer free geom slots than trail points, an evenly thinned trail fills them
    (first and last points kept) and the scene is never overfilled."""
    import mujoco

    env = make_env("goto-room", render_mode="rgb_array", render_size=64, trail=True)
    u = env.unwrapped
    env.reset(seed=2)
    for _ in range(30):
        env.step(u.expert_action())
    n = len(u._trail)
    assert n > 10
    scene = mujoco.MjvScene(u.model, maxgeom=200)
    mujoco.mjv_updateScene(u.model, u.data, mujoco.MjvOption(), None, mujoco.MjvCamera(),
                           mujoco.mjtCatBit.mjCAT_ALL, scene)
    base = scene.ngeom
    scene_small = mujoco.MjvScene(u.model, maxgeom=base + 5)
    mujoco.mjv_updateScene(u.model, u.data, mujoco.MjvOption(), None, mujoco.MjvCamera(),
                           mujoco.mjtCatBit.mjCAT_ALL, scene_small)
    u._mark_render_scene(scene)
    assert scene.ngeom == base + n  # room for all
    u._mark_render_scene(scene_small)
    assert scene_small.ngeom == base + 5
    drawn = np.array([scene_small.geoms[k].pos[:2] for k in range(base, base + 5)])
    np.testing.assert_allclose(drawn[[0, -1]], np.array(u._trail)[[0, -1]], atol=1e-5)
    assert len(np.unique(drawn.round(4), axis=0)) == 5  # spread over the trail, no point twice
    env.close()


@pytest.mark.parametrize("task", TASKS)
def test_reset_is_deterministic(task):
    env = make_env(task)
    a, ia = env.reset(seed=7)
    b, ib = env.reset(seed=7)
    np.testing.assert_array_equal(a["state"], b["state"])
    assert a["instruction"] == b["instruction"] and ia["params"] == ib["params"]
    for _ in range(5):
        sa = env.step(np.array([0.8, 0.3], np.float32))[0]["state"]
    env.reset(seed=7)
    for _ in range(5):
        sb = env.step(np.array([0.8, 0.3], np.float32))[0]["state"]
    np.testing.assert_array_equal(sa, sb)
    c, _ = env.reset(seed=8)
    assert not np.array_equal(a["state"], c["state"])


def test_scene_is_task_independent():
    """Same seed, any task: the same state layout and the same balls; only the words differ."""
    states = {t: make_env(t).reset(seed=11)[0]["state"] for t in TASKS}
    first = states[TASKS[0]]
    for t, st in states.items():
        assert st.shape == first.shape
        np.testing.assert_array_equal(st[6:], first[6:], err_msg=t)


@pytest.mark.parametrize("task", TASKS)
def test_instruction_split(task):
    spec = get_task(task)
    assert len(spec.train_instructions) >= 5 and len(spec.heldout_instructions) >= 3
    assert not set(spec.train_instructions) & set(spec.heldout_instructions)
    env = make_env(task, instruction_split="heldout")
    held = set()
    for s in range(12):
        obs, info = env.reset(seed=s)
        held.add(obs["instruction"])
        formatted_train = {t.format(**info["params"]) for t in spec.train_instructions}
        assert obs["instruction"] not in formatted_train
        assert any(obs["instruction"] == t.format(**info["params"]) for t in spec.heldout_instructions)
    assert len(held) > 1


def test_instruction_names_the_goal():
    env = make_env("goto-landmark")
    colors = set()
    for s in range(20):
        obs, info = env.reset(seed=s)
        colors.add(info["params"]["color"])
        assert info["params"]["color"] in obs["instruction"]
    assert colors == set(COLORS)
    env = make_env("goto-room")
    rooms = {env.reset(seed=s)[1]["params"]["room"] for s in range(20)}
    assert rooms == set(ROOMS)


@pytest.mark.parametrize("task", TASKS)
def test_expert_succeeds(task):
    env = make_env(task)
    wins = 0
    for s in range(EXPERT_SEEDS):
        obs, _ = env.reset(seed=1000 + s)
        for _ in range(env.unwrapped.max_episode_steps):
            obs, reward, term, trunc, info = env.step(env.unwrapped.expert_action())
            terms = info["reward_terms"]
            assert 0.0 <= reward <= 1.0 and all(0.0 <= v <= 1.0 for v in terms.values()), terms
            if term or trunc:
                break
        wins += bool(term and info["success"])
    assert wins / EXPERT_SEEDS >= 0.95, f"{task}: expert succeeded {wins}/{EXPERT_SEEDS}"


def test_reward_weights_sum_to_one():
    for task in TASKS:
        env = make_env(task)
        env.reset(seed=0)
        _, terms, weights = env.unwrapped._evaluate()
        assert set(weights) <= set(terms) and abs(sum(weights.values()) - 1.0) < 1e-9


def test_avoid_violation_fails_the_episode():
    from sim.navigation.tasks import AVOID_RADIUS, REACH_RADIUS

    env = make_env("approach-avoid").unwrapped
    env.reset(seed=3)
    target, avoid = env.goal.point, env.scene.landmarks[env.goal.avoid]
    away = (target - avoid) / np.linalg.norm(target - avoid)
    at_target = target + 0.8 * REACH_RADIUS * away  # on the far side from the avoided ball
    env.data.qpos[:2] = at_target
    assert env._evaluate()[0]
    env.data.qpos[:2] = avoid + 0.7 * AVOID_RADIUS * away  # inside the keep-out radius
    success, terms, _ = env._evaluate()
    assert not success and terms["avoid"] == 0.0
    env.data.qpos[:2] = at_target  # back at the target, but the violation is latched
    assert not env._evaluate()[0]
    env.reset(seed=3)
    env.data.qpos[:2] = at_target  # a new episode starts clean
    assert env._evaluate()[0]


def test_gym_make_and_render():
    import gymnasium as gym

    from embodied.core.registry import gym_id

    env = gym.make(gym_id("goto-between"), render_mode="rgb_array", render_size=64)
    obs, _ = env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (64, 64, 3) and frame.dtype == np.uint8 and frame.std() > 0
    env.close()


def test_bad_action_rejected():
    from embodied.core.errors import InvalidActionError

    env = make_env("goto-room")
    env.reset(seed=0)
    with pytest.raises(InvalidActionError):
        env.step(np.zeros(3, np.float32))


def test_hindsight_labels_latch_an_approach_avoid_violation():
    from sim.navigation.tasks import AVOID_RADIUS, REACH_RADIUS, hindsight_labels

    env = make_env("approach-avoid").unwrapped
    env.reset(seed=3)
    k, a = env.goal.target, env.goal.avoid
    target, avoid = env.scene.landmarks[k], env.scene.landmarks[a]
    away = (target - avoid) / np.linalg.norm(target - avoid)
    state = env.privileged_state()
    states = np.repeat(state[None], 3, axis=0)
    states[[0, 2], :2] = target + 0.8 * REACH_RADIUS * away  # at the target, near the avoided ball, back
    states[1, :2] = avoid + 0.7 * AVOID_RADIUS * away
    fields = {"color": COLORS[k], "avoid": COLORS[a]}
    (ok, _), = [(g[2], g[3]) for g in hindsight_labels(states, ["approach-avoid"]) if g[1] == fields]
    assert ok.tolist() == [True, False, False]
    with pytest.raises(ValueError, match="navigation states"):
        hindsight_labels(states[:, :10], ["approach-avoid"])
    with pytest.raises(ValueError, match="no navigation task 'reach'"):
        hindsight_labels(states, ["reach"])
