"""Grounding unfamiliar instructions in the scene (policies/common/grounding.py) and its plumbing:
a wrapper policy that grounds once per episode through ``Policy.act`` and the evaluation's
``BatchActor`` (both via ``Policy.observe``), in checkpoints, in ``embodied eval`` and in the
episode records."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embodied.core.policy import Policy, PolicyWrapper
from policies import load_policy, load_trained, make_policy, save_policy
from policies.common.grounding import GROUNDING_FILE, GroundedPolicy, InstructionGrounding

VOCAB = ["reach", "goal", "push", "puck", "pick", "lift", "open", "door", "gripper", "tip", "slide", "hand", "the"]


def embed(texts):
    """Bag of words over VOCAB: a stand-in sentence encoder with known geometry."""
    out = np.zeros((len(texts), len(VOCAB)), np.float32)
    for i, t in enumerate(texts):
        for w in t.split():
            if w in VOCAB:
                out[i, VOCAB.index(w)] += 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


WORDINGS = {"reach": ["reach the goal", "move the gripper to the goal"],
            "push": ["push the puck to the goal", "slide the puck"],
            "door": ["open the door", "pull the door open"]}
# reach and push share a scene (states near 0); the door scene is far away (near 5)
SCENE = {"reach": 0.0, "push": 0.0, "door": 5.0}


def grounding(k: int = 5) -> InstructionGrounding:
    """4 demonstrations each of reach and push, 6 of the door: the 5 nearest to a scene
    name both reach and push in theirs, only the door in the door's."""
    rng = np.random.default_rng(0)
    first, tasks = [], []
    for t, centre in SCENE.items():
        for _ in range(6 if t == "door" else 4):
            first.append(centre + 0.1 * rng.normal(size=3))
            tasks.append(t)
    first = np.asarray(first, np.float32)
    return InstructionGrounding.from_demonstrations(WORDINGS, first, tasks, first, k)


def test_known_wordings_are_kept_even_in_another_tasks_scene():
    g = grounding()
    for t, ws in WORDINGS.items():
        for w in ws:
            assert g.ground(w, np.full(3, 5.0), embed) == w  # a training wording is acted on as given
            assert g.is_known(w) and g.tasks_of(w) == [t]
    assert g.tasks_of("never seen") == []


def test_unknown_wordings_snap_to_the_nearest_wording_of_a_task_of_this_scene():
    g = grounding()
    assert sorted(g.candidate_tasks(np.zeros(3))) == ["push", "reach"]
    assert g.candidate_tasks(np.full(3, 5.0)) == ["door"]
    # nearest overall is a reach wording; in the reach/push scene that is the answer
    assert g.ground("bring the hand tip to the goal", np.zeros(3), embed) == "move the gripper to the goal"
    assert g.ground("slide the puck along", np.zeros(3), embed) == "slide the puck"
    # in the door scene only the door's wordings are candidates, whatever the words say
    assert g.ground("bring the hand tip to the goal", np.full(3, 5.0), embed) in WORDINGS["door"]
    assert g.ground("open it", np.full(3, 5.0), embed) == "open the door"


def test_save_load_round_trip(tmp_path):
    g = grounding()
    g.ensure_embeddings(embed)
    g.save(tmp_path / GROUNDING_FILE)
    h = InstructionGrounding.load(tmp_path / GROUNDING_FILE)
    assert h.instructions == g.instructions and h.task_names == g.task_names and h.k == g.k
    np.testing.assert_array_equal(h.embeddings, g.embeddings)
    np.testing.assert_array_equal(h.scenes, g.scenes)

    def no_encoder(texts):  # the loaded index needs the encoder only for the new wording
        assert texts == ["push it to the goal"], texts
        return embed(texts)

    assert h.ground("push it to the goal", np.zeros(3), no_encoder) == g.ground("push it to the goal", np.zeros(3),
                                                                                 embed)


def test_wordings_shared_by_two_tasks_are_allowed():
    shared = {"a": ["lift the handle", "pull it up"], "b": ["lift the handle", "raise it"]}
    s = np.zeros((2, 3), np.float32)
    g = InstructionGrounding.from_demonstrations(shared, s, ["a", "b"], s, 2)
    assert sorted(g.tasks_of("lift the handle")) == ["a", "b"]


def test_bad_inputs_are_named(tmp_path):
    g = grounding()
    with pytest.raises(ValueError, match="state has 4 values"):
        g.ground("anything", np.zeros(4), embed)
    with pytest.raises(ValueError, match="k=0"):
        InstructionGrounding(["a"], ["x"], [0], np.zeros((1, 2)), [0], np.zeros(2), np.ones(2), k=0)
    with pytest.raises(ValueError, match="one task index per instruction"):
        InstructionGrounding(["a"], ["x", "y"], [0], np.zeros((1, 2)), [0], np.zeros(2), np.ones(2))
    with pytest.raises(ValueError, match="index the 1 task names"):
        InstructionGrounding(["a"], ["x"], [3], np.zeros((1, 2)), [0], np.zeros(2), np.ones(2))
    with pytest.raises(ValueError, match="std positive"):
        InstructionGrounding(["a"], ["x"], [0], np.zeros((1, 2)), [0], np.zeros(2), np.zeros(2))
    (tmp_path / "bad.npz").write_text("not a zip")
    with pytest.raises(ValueError, match="not a grounding file"):
        InstructionGrounding.load(tmp_path / "bad.npz")


class Seen(Policy):
    """Records the instructions predict_chunk was asked about."""

    n_obs_steps, horizon, n_action_steps = 1, 2, 2

    def __init__(self):
        super().__init__()
        self.seen = []

    def predict_chunk(self, obs_batch, noise=None):
        self.seen.extend(obs_batch["instruction"])
        return np.zeros((len(obs_batch["instruction"]), self.horizon, 4), np.float32)


class Recorder(GroundedPolicy):
    """The grounding wrapper around ``Seen``, grounding every wording to ``to`` and recording each call."""

    def __init__(self, to: str = "reach the goal"):
        PolicyWrapper.__init__(self, Seen())  # no index: ``ground`` below stands in for it
        self.to, self.grounded = to, []

    @property
    def seen(self):
        return self.policy.seen

    def ground(self, instruction, obs):
        self.grounded.append(instruction)
        return self.to


def test_act_grounds_once_per_episode_and_per_new_instruction():
    p = Recorder()
    for _ in range(4):
        p.act({"state": np.zeros(3), "instruction": "bring the tip to the goal"})
    assert p.grounded == ["bring the tip to the goal"] and p.seen == ["reach the goal"] * 2
    p.act({"state": np.zeros(3), "instruction": "now something else"})  # a new command mid-episode
    assert p.grounded[-1] == "now something else"
    p.reset()
    p.act({"state": np.zeros(3), "instruction": "now something else"})
    assert len(p.grounded) == 3  # reset forgets the grounding with the queue


def test_episode_records_say_what_the_policy_acted_on(tmp_path):
    from embodied.runtime.evaluate import evaluate, write_report

    from sim.metaworld import INSTRUCTIONS

    # a wording grounded to another shows up in the records, and the summary says how often
    # it was one of the task's own training wordings
    own = Recorder(to=INSTRUCTIONS["reach-v3"].train[0])
    m, res = evaluate(own, ["reach-v3"], 2, ("heldout",), num_envs=2, progress=False, env_kwargs={"max_episode_steps": 3})
    assert [r.grounded for r in res["reach-v3/heldout"]] == [own.to] * 2
    assert all(r.instruction in INSTRUCTIONS["reach-v3"].heldout for r in res["reach-v3/heldout"])
    h = m["per_task"]["reach-v3"]["heldout"]
    assert h["grounded_episodes"] == 2 and h["grounded_to_own_task"] == 1.0
    other = Recorder(to=INSTRUCTIONS["push-v3"].train[0])
    m, _ = evaluate(other, ["reach-v3"], 2, ("heldout",), num_envs=1, progress=False, env_kwargs={"max_episode_steps": 3})
    assert m["per_task"]["reach-v3"]["heldout"]["grounded_to_own_task"] == 0.0
    text = write_report(tmp_path, m).read_text()
    assert "in 2 episodes the policy acted on one of its training wordings" in text
    assert "0.0% of them on a wording of the episode's own task (less on reach-v3 0%)" in text


def tiny_policy(**overrides):
    from embodied.core.specs import ActionSpec, ObservationSpec

    stats = {"state": {"mean": np.zeros(3), "std": np.ones(3), "min": -np.ones(3), "max": np.ones(3)},
             "action": {"mean": np.zeros(2), "std": np.ones(2), "min": -np.ones(2), "max": np.ones(2)}}
    cfg = dict(n_obs_steps=2, horizon=4, n_action_steps=2, state_hidden=16, obs_dim=8, text_dim=8, hidden=16,
               n_layers=1, time_emb_dim=8, num_inference_steps=2, **overrides)
    torch.manual_seed(0)
    return make_policy("flow", cfg, ObservationSpec(state_dim=3), ActionSpec(dim=2), stats, ["reach", "push", "door"],
                       device="cpu")


def test_grounded_policy_grounds_unknown_wordings_and_checkpoints_keep_the_index(tmp_path):
    policy = tiny_policy(ground_instructions=True)
    obs = {"state": np.zeros((2, 3), np.float32), "instruction": "fetch the puck"}
    grounded = GroundedPolicy(policy, grounding())
    got = grounded.ground("move the puck with the gripper", obs)
    assert got in WORDINGS["reach"] + WORDINGS["push"]  # a wording of the scene's tasks (MiniLM's choice)
    assert grounded.ground("open the door", obs) == "open the door"  # known: as given
    assert grounded.unwrapped is policy and grounded.n_action_steps == policy.n_action_steps
    save_policy(grounded, str(tmp_path / "ck"))
    assert (tmp_path / "ck" / GROUNDING_FILE).is_file()
    loaded = load_trained(str(tmp_path / "ck"), device="cpu")
    assert isinstance(loaded, GroundedPolicy) and loaded.unwrapped.config.ground_instructions
    assert loaded.ground("move the puck with the gripper", obs) == got
    assert not isinstance(load_trained(str(tmp_path / "ck"), device="cpu", ground_instructions=False), GroundedPolicy)
    assert not isinstance(load_policy(str(tmp_path / "ck"), device="cpu"), GroundedPolicy)  # the network alone
    save_policy(tiny_policy(), str(tmp_path / "ck"))  # over the old checkpoint: its index must not stay behind
    assert not (tmp_path / "ck" / GROUNDING_FILE).exists()
    assert not isinstance(load_trained(str(tmp_path / "ck"), device="cpu"), GroundedPolicy)


def test_grounded_and_plain_policy_act_alike_on_known_wordings():
    grounded = GroundedPolicy(tiny_policy(ground_instructions=True), grounding())
    plain = tiny_policy(ground_instructions=True)  # the same weights and noise stream
    obs = {"state": np.zeros(3, np.float32), "instruction": "push the puck to the goal"}
    a = [grounded.act(obs) for _ in range(3)]
    b = [plain.act(obs) for _ in range(3)]
    np.testing.assert_array_equal(np.stack(a), np.stack(b))


def test_onehot_policies_cannot_ground():
    with pytest.raises(ValueError, match="ground_instructions=True is not allowed with text_encoder='onehot'"):
        tiny_policy(text_encoder="onehot", ground_instructions=True)


def test_eval_refuses_to_turn_on_grounding_without_an_index(tmp_path):
    from embodied.runtime.checkpoints import load_for_eval

    save_policy(tiny_policy(), str(tmp_path / "ck"))
    with pytest.raises(ValueError, match="has no grounding.npz"):
        load_for_eval(str(tmp_path / "ck"), "cpu", ground_instructions=True)
    assert not load_for_eval(str(tmp_path / "ck"), "cpu", ground_instructions=False).config.ground_instructions
