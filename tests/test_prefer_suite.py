"""Preferences across a suite (issue 34, item 4): ``embodied prefer`` with several tasks learns one
reward for all of them, with the instruction in its input, from pairs that never mix two tasks, and
the steer learner hands it to suite-wide steering beside the ground truth and the constant control."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rewards.preference.model import PreferenceReward, RewardConfig
from rewards.preference.segments import Trajectory, sample_pairs
from rewards.preference.store import TARGET, LabelStore
from rewards.preference.teachers import make_simulated
from cli_runner import run_cli
from tiny import reach_checkpoint

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the tasks of a run
def test_prefer_takes_one_task_a_list_or_a_suite_and_names_the_forms_when_given_two():
    from hydra.errors import MissingConfigException

    from embodied.commands.app import compose
    from embodied.runtime.prefer import PreferConfig

    cfg = compose("prefer", PreferConfig, ["suite=manipulation"])
    assert (cfg.suite, cfg.task, cfg.tasks) == ("manipulation", "", [])
    assert cfg.task_names == ["reach", "push", "pick", "place-in-bin", "stack", "open-drawer", "close-drawer",
                              "press-button"] and cfg.task_label == "manipulation"
    cfg = compose("prefer", PreferConfig, ["tasks=[reach,push]"])
    assert (cfg.task, cfg.task_names, cfg.task_label) == ("", ["reach", "push"], "reach,push")
    assert compose("prefer", PreferConfig, []).task_names == ["press-button"]  # the default, as before
    assert compose("prefer", PreferConfig, ["task=reach"]).task_names == ["reach"]
    forms = r"give one of task=NAME, tasks=\[A,B,...\] or suite=NAME .* got task and tasks"
    with pytest.raises(ValueError, match=forms):
        PreferConfig(task="reach", tasks=["push"])
    with pytest.raises(ValueError, match="got tasks and suite"):
        PreferConfig(tasks=["push"], suite="manipulation")
    with pytest.raises(ValueError, match="names a task twice"):
        PreferConfig(tasks=["push", "push"])
    with pytest.raises(ValueError, match="learner=pebble trains SAC in one task"):
        PreferConfig(suite="manipulation", learner="pebble")
    with pytest.raises(MissingConfigException, match="navigation"):
        compose("prefer", PreferConfig, ["suite=nope"])


def test_the_command_line_sets_any_field_of_the_noise_policy_and_refuses_a_misspelt_one():
    from hydra.errors import ConfigCompositionException

    from embodied.commands.app import compose
    from embodied.commands.prefer import PreferCommandConfig
    from embodied.runtime.prefer import PreferConfig, SteerLearner
    from policies.steering.config import SteerConfig

    over = ["learner=steer", "checkpoint=x", "suite=manipulation"]
    cfg = compose("prefer", PreferCommandConfig, [*over, "steer.bound=0.5", "steer.zero_init=true"])
    assert cfg.steer == SteerConfig(utd=2, bound=0.5, zero_init=True)  # utd=2 stays the command's default
    run = SteerLearner._steer_config(SimpleNamespace(cfg=cfg, tasks=["reach", "push"]), "sparse", {}, 3)
    assert run.steer == cfg.steer and run.tasks == ["reach", "push"]
    with pytest.raises(ConfigCompositionException, match="Could not override 'steer.bnd'") as e:
        compose("prefer", PreferCommandConfig, [*over, "steer.bnd=0.5"])
    assert "Key 'bnd' not in 'SteerConfig'" in str(e.value.__cause__)
    with pytest.raises(ValueError, match="bound=-1.0 is not allowed"):
        compose("prefer", PreferCommandConfig, [*over, "steer.bound=-1"])
    # the library's PreferConfig still takes the fields as a dict
    plain = SimpleNamespace(cfg=PreferConfig(learner="steer", checkpoint="x", steer={"utd": 4, "bound": 0.5}),
                            tasks=["reach"])
    assert SteerLearner._steer_config(plain, "sparse", {}, 3).steer == SteerConfig(utd=4, bound=0.5)


# ---------------------------------------------------------------- pairs within one task
def two_task_trajectories(rng: np.random.Generator, ds: int = 4, n: int = 10, steps: int = 20) -> list[Trajectory]:
    """Trajectories of two tasks, several wordings each; task a's reward is s·w, task b's is −s·w."""
    w = np.linspace(-1.0, 1.0, ds).astype(np.float32)
    wordings = {"a": ["hover over the red block", "reach the red block"],
                "b": ["sweep the green block onto the zone", "push the green block to the zone"]}
    out = []
    for task, sign in (("a", 1.0), ("b", -1.0)):
        for k in range(n):
            s = rng.normal(size=(steps, ds)).astype(np.float32)
            out.append(Trajectory(s, np.zeros((steps, 2), np.float32), (sign * s @ w).astype(np.float32),
                                  wordings[task][k % 2], info={"task": task}))
    return out


def test_pairs_by_task_never_mix_two_tasks_and_do_mix_a_tasks_wordings():
    rng = np.random.default_rng(0)
    trajs = two_task_trajectories(rng)
    pairs = sample_pairs(trajs, 300, 5, rng, by="task")
    assert all(q.left.info["task"] == q.right.info["task"] for q in pairs)
    assert {q.left.info["task"] for q in pairs} == {"a", "b"}
    assert any(q.left.instruction != q.right.instruction for q in pairs)  # paraphrases of one task pair up
    by_words = sample_pairs(trajs, 100, 5, rng)  # one task's runs: the same instruction, as before
    assert all(q.left.instruction == q.right.instruction for q in by_words)
    with pytest.raises(ValueError, match=r"info\['task'\]"):
        sample_pairs([Trajectory(t.states, t.actions, t.rewards, t.instruction) for t in trajs], 4, 5, rng, by="task")


# ---------------------------------------------------------------- the instruction in the reward's input
def test_one_reward_learns_opposite_preferences_per_task_from_the_instruction(tmp_path):
    rng = np.random.default_rng(0)
    pairs = sample_pairs(two_task_trajectories(rng), 400, 5, rng, by="task")
    model = PreferenceReward(RewardConfig(text="minilm", hidden=32, epochs=25, ensemble=1), 4, 2, seed=0)
    fit = model.train(pairs, [TARGET[a] for a in make_simulated("oracle").label(pairs)])
    assert fit["train_accuracy"] > 0.85
    states = rng.normal(size=(200, 4)).astype(np.float32)
    truth = states @ np.linspace(-1.0, 1.0, 4)
    ra = model(None, states, "reach the red block").reward
    rb = model(None, states, "push the green block to the zone").reward
    # the same states, another task's instruction: the opposite ranking
    assert np.corrcoef(ra, truth)[0, 1] > 0.6 and np.corrcoef(rb, truth)[0, 1] < -0.6
    # a wording never labelled lands beside its task's (the sentence embedding, not the words)
    assert np.corrcoef(model(None, states, "move the gripper above the red block").reward, truth)[0, 1] > 0.6
    # one batch may hold several tasks' rows (suite-wide steering scores every env's step at once)
    both = model(None, np.concatenate([states[:3], states[:3]]), ["reach the red block"] * 3
                 + ["push the green block to the zone"] * 3).reward
    np.testing.assert_allclose(both, np.concatenate([ra[:3], rb[:3]]), rtol=1e-5, atol=1e-6)
    model.save(tmp_path / "reward.pt")
    back = PreferenceReward.load(tmp_path / "reward.pt")  # the text centring travels with the weights
    assert back.cfg.text == "minilm"
    np.testing.assert_allclose(back(None, states, "reach the red block").reward, ra, rtol=1e-5, atol=1e-6)
    # the default (auto, outside the loop; the loop picks hash for one task) reads hashed words, as before
    assert PreferenceReward(RewardConfig(), 4).text_dim == 32
    with pytest.raises(ValueError, match="reward text must be one of"):
        RewardConfig(text="bert")


# ---------------------------------------------------------------- the loop across tasks
def tiny_cfg(tmp_path: Path, **kw):
    from embodied.runtime.prefer import PreferConfig

    base = dict(tasks=["reach", "push"], teacher="mistake", eps=0.1, budget=12, rounds=2, episodes_per_round=2,
                candidates=2, heldout_episodes=2, heldout_pairs=20, eval_episodes=2, segment_length=10, oversample=2,
                reward=RewardConfig(hidden=16, epochs=2, ensemble=2), labels=str(tmp_path / "labels"))
    return PreferConfig(**{**base, **kw})


def test_the_loop_across_two_tasks_asks_within_one_task_and_records_the_tasks(tmp_path):
    from embodied.runtime.prefer import run_prefer

    m = run_prefer(tiny_cfg(tmp_path), tmp_path)
    assert m["tasks"] == ["reach", "push"] and m["task"] == "reach,push" and m["reward_text"] == "minilm"
    store = LabelStore(tmp_path / "labels")
    assert store.meta["tasks"] == ["reach", "push"] and "task" not in store.meta
    qs, _ = store.training_set()
    seen = {(q.left.info["task"], q.right.info["task"]) for q in qs}
    assert seen == {("reach", "reach"), ("push", "push")}  # both tasks asked, never one against the other
    assert set(m["final"]["per_task"]) == {"reach", "push"}
    assert PreferenceReward.load(tmp_path / "reward.pt").cfg.text == "minilm"
    store.close()
    with pytest.raises(ValueError, match="made for another setting: tasks"):  # a store of other tasks is refused
        run_prefer(tiny_cfg(tmp_path, tasks=["reach", "pick"]), tmp_path / "other")


def test_the_steer_learner_spreads_its_episodes_over_the_tasks_and_steers_suite_wide(tmp_path, monkeypatch):
    """The three steering runs get the same tasks, seeds and budget; the learned-reward and control
    runs are built on envs that never end on success (the same check_episode_ends as any run)."""
    import embodied.runtime.steer as steer_mod
    from embodied.runtime import prefer
    from policies.steering.env import ModelReward

    runs = []

    def fake_steer(cfg, out):
        s = steer_mod.Steering(cfg, out)  # the real run's reward and training envs, without training
        env = s.make_train_env()
        runs.append({"cfg": cfg, "out": out, "end_on_success": env.unwrapped.end_on_success, "source": s.reward,
                     "episode_end": s.episode_end})
        env.close()
        s.tb.close()
        kind = "oracle" if cfg.reward == "sparse" else "control" if isinstance(cfg.reward, dict) else "learned"
        after = {"oracle": 0.9, "learned": 0.85, "control": 0.6}[kind]
        per = {t: {"success": after, "heldout": after} for t in cfg.tasks}
        return {"success_before": 0.5, "heldout_before": 0.5, "success_after": after, "heldout_after": after,
                "per_task_before": {t: {"success": 0.5, "heldout": 0.5} for t in cfg.tasks}, "per_task_after": per,
                "env_steps": cfg.env_steps, "curve": [], "episode_end": s.episode_end, "reward_kind": kind}

    monkeypatch.setattr(steer_mod, "steer", fake_steer)
    ckpt = reach_checkpoint(tmp_path / "base", "flow", tasks=("reach", "push"))
    cfg = tiny_cfg(tmp_path, learner="steer", checkpoint=str(ckpt), steer_env_steps=40, budget=6, heldout_episodes=2)
    learner = prefer.SteerLearner(cfg, False)
    played = learner.rollout(4)
    assert [t.info["task"] for t in played] == ["reach", "push", "reach", "push"]
    assert all(e.unwrapped.instruction_split == "train" for e in learner.envs.values())  # training wordings only
    m = prefer.run_prefer(cfg, tmp_path)
    learned, truth, control = runs
    for r in runs:
        assert r["cfg"].tasks == ["reach", "push"] and not r["cfg"].task
        for key in ("checkpoint", "env_steps", "seed", "final_episodes", "steer"):
            assert getattr(r["cfg"], key) == getattr(learned["cfg"], key), key
    assert isinstance(learned["source"], ModelReward) and isinstance(learned["source"].model, PreferenceReward)
    assert learned["source"].model.cfg.text == "minilm"
    assert learned["end_on_success"] is False and control["end_on_success"] is False and truth["end_on_success"]
    assert learned["episode_end"] == control["episode_end"] == "time limit"
    p = m["policy"]
    assert p["reward_kind_learned"] == "learned" and p["episode_end_learned"] == "time limit"
    assert set(p["per_task_learned"]) == set(p["per_task_ground_truth"]) == set(p["per_task_control"]) == {
        "reach", "push"}
    assert p["gain_ratio"] == pytest.approx(0.35 / 0.4) and p["gain_over_control"] == pytest.approx(0.25)


# ---------------------------------------------------------------- the command, end to end
def test_embodied_prefer_steer_across_two_tasks_writes_the_reward_and_every_steering_run(tmp_path):
    ckpt = reach_checkpoint(tmp_path / "base", "flow", tasks=("reach", "push"))
    run = tmp_path / "run"
    r = run_cli(
        ["prefer", "learner=steer", "tasks=[reach,push]", f"checkpoint={ckpt}",
         "teacher=mistake", "eps=0.1", "budget=8", "rounds=2", "episodes_per_round=2", "candidates=2",
         "heldout_episodes=2", "heldout_pairs=20", "eval_episodes=1", "segment_length=10", "oversample=2",
         "steer_env_steps=16", "steer_eval_every=0", "steer_eval_episodes=1", "reward.hidden=16", "reward.epochs=2",
         "reward.ensemble=2", "steer.batch_size=8", "steer.learning_starts=4", "steer.net_arch=[16,16]",
         "steer.utd=1", f"hydra.run.dir={run}"],
        cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((run / "metrics.json").read_text())
    assert m["tasks"] == ["reach", "push"] and m["labels"]["answered"] == 8 and m["teacher"] == "mistake"
    assert (run / "reward.pt").is_file() and PreferenceReward.load(run / "reward.pt").cfg.text == "minilm"
    p = m["policy"]
    for name in ("learned", "ground_truth", "control"):
        s = json.loads((run / f"steer_{name}" / "metrics.json").read_text())
        assert s["tasks"] == ["reach", "push"] and set(s["per_task_after"]) == {"reach", "push"}
        assert p[f"per_task_{name}"] == s["per_task_after"]
        assert (run / f"steer_{name}" / "checkpoint" / "steering.json").is_file()
    learned = json.loads((run / "steer_learned" / "metrics.json").read_text())
    # the learned-reward run never saw the simulator's success: episodes ended at the time limit only
    assert learned["reward_kind"] == "learned" and learned["episode_end"] == "time limit"
    assert learned["reward"] == "rewards.preference.model:load_reward"
    truth = json.loads((run / "steer_ground_truth" / "metrics.json").read_text())
    assert truth["reward_kind"] == "oracle" and truth["env_steps"] == learned["env_steps"]
    assert truth["eval_seed"] == learned["eval_seed"] and truth["seed"] == learned["seed"]
