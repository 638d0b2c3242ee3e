"""Preference-based reward learning: teachers' statistics, the label store's crash-safety
and error reporting, Bradley–Terry training, query selection, metrics and the ``embodied prefer`` loop."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli
import torch
from scipy import stats

from embodied.core.reward import RewardInputError, RewardModel, RewardOutput
from rewards import quality as M
from rewards.preference.model import PreferenceReward, RewardConfig, bt_loss, text_features
from rewards.preference.queries import schedule, select
from rewards.preference.segments import Query, Segment, Trajectory, sample_pairs
from rewards.preference.store import TARGET, LabelFileError, LabelStore, LabelStoreError
from rewards.preference.teachers import (PRESETS, RewardModelTeacher, SimulatedTeacher, TeacherConfig,
                                         discounted_return, make_simulated)

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)


def seg(rewards, instruction="press the red button", frames=None, ds=3) -> Segment:
    r = np.asarray(rewards, np.float32)
    return Segment(np.zeros((len(r), ds), np.float32), np.zeros((len(r), 2), np.float32), r, instruction, frames)


def pairs_with_returns(r0: np.ndarray, r1: np.ndarray, length: int = 5) -> list[Query]:
    """Queries whose segments have the given returns (spread evenly over the steps)."""
    return [Query(seg(np.full(length, a / length)), seg(np.full(length, b / length))) for a, b in zip(r0, r1)]


def binom_ok(k: int, n: int, p: float, alpha: float = 1e-3) -> bool:
    return stats.binomtest(k, n, p).pvalue > alpha


# ------------------------------------------------------------------ teachers
def test_oracle_prefers_the_higher_return_and_calls_exact_ties_equal():
    t = make_simulated("oracle")
    qs = pairs_with_returns(np.array([1.0, 2.0, 1.5]), np.array([2.0, 1.0, 1.5]))
    assert t.label(qs) == ["right", "left", "equal"]


def test_mistake_teacher_flips_at_rate_eps_within_a_binomial_interval():
    rng = np.random.default_rng(0)
    n = 4000
    r0, r1 = rng.uniform(0, 5, n), rng.uniform(0, 5, n)
    qs = pairs_with_returns(r0, r1)
    truth = make_simulated("oracle").label(qs)
    got = make_simulated("mistake", seed=1).label(qs)
    flips = sum(a != b for a, b in zip(truth, got))
    lo, hi = stats.binom.interval(0.999, n, 0.1)
    assert lo <= flips <= hi, f"{flips} mistakes in {n}, expected about {0.1 * n:.0f} ([{lo}, {hi}])"
    # the rate is eps whichever side is right, and a teacher with eps=0.2 is told apart
    right = np.array(truth) == "right"
    for side in (right, ~right):
        k = sum(a != b for a, b, s in zip(truth, got, side) if s)
        assert binom_ok(k, int(side.sum()), 0.1)
    assert not binom_ok(flips, n, 0.2)


def test_stochastic_teacher_follows_bradley_terry_with_its_beta():
    rng = np.random.default_rng(0)
    n = 6000
    d = rng.uniform(-4, 4, n)
    qs = pairs_with_returns(np.full(n, 5.0), 5.0 + d)
    got = np.array(make_simulated("stochastic", seed=2).label(qs)) == "right"
    for beta, should_fit in ((1.0, True), (3.0, False)):
        p = 1 / (1 + np.exp(-beta * d))
        bins = np.digitize(d, np.linspace(-4, 4, 9)[1:-1])
        chi2 = sum((got[bins == b].sum() - p[bins == b].sum()) ** 2 / (p[bins == b] * (1 - p[bins == b])).sum()
                   for b in range(8))
        pval = stats.chi2.sf(chi2, 8)
        assert (pval > 1e-3) == should_fit, f"beta={beta}: chi2={chi2:.1f}, p={pval:.2g}"


def test_skip_teacher_skips_exactly_when_both_returns_are_below_its_threshold():
    rng = np.random.default_rng(0)
    n, margin = 2000, 2.0
    r0, r1 = rng.uniform(0, 1, n), rng.uniform(0, 1, n)
    got = make_simulated("skip", margin=margin).label(pairs_with_returns(r0, r1))
    expect_skip = np.maximum(r0, r1) < 0.1 * margin
    assert 0 < expect_skip.sum() < n
    assert [g == "skip" for g in got] == expect_skip.tolist()
    assert all(g == ("right" if b > a else "left") for g, a, b, s in zip(got, r0, r1, expect_skip) if not s)


def test_equal_teacher_says_equal_exactly_when_returns_are_closer_than_its_threshold():
    rng = np.random.default_rng(0)
    n, margin = 2000, 3.0
    r0, r1 = rng.uniform(0, 1, n), rng.uniform(0, 1, n)
    got = make_simulated("equal", margin=margin).label(pairs_with_returns(r0, r1))
    expect = np.abs(r1 - r0) < 0.1 * margin
    assert 0 < expect.sum() < n
    assert [g == "equal" for g in got] == expect.tolist()


def test_myopic_teacher_judges_the_discounted_return():
    early, late = np.r_[np.ones(10), np.zeros(10)], np.r_[np.zeros(12), np.full(8, 1.1)]
    assert early.sum() > late.sum() and discounted_return(late, 0.9) > discounted_return(early, 0.9)
    q = Query(seg(early), seg(late))
    assert make_simulated("oracle").label([q]) == ["left"]
    assert make_simulated("myopic").label([q]) == ["right"]
    assert discounted_return(np.array([1.0, 1.0]), 0.5) == pytest.approx(1.5)  # the last step weighs 1


def test_presets_are_b_prefs():
    assert PRESETS["oracle"] == TeacherConfig()
    assert PRESETS["stochastic"].beta == 1.0 and PRESETS["mistake"].eps == 0.1
    assert PRESETS["skip"].skip == 0.1 and PRESETS["equal"].equal == 0.1 and PRESETS["myopic"].gamma == 0.9


@pytest.mark.parametrize("kw, word", [({"eps": 0.7}, "eps"), ({"gamma": 0.0}, "gamma"), ({"beta": -1.0}, "beta"),
                                      ({"skip": -0.1}, "skip")])
def test_bad_teacher_settings_name_the_field(kw, word):
    with pytest.raises(ValueError, match=word):
        TeacherConfig(**kw)


def test_thresholds_without_a_margin_are_refused():
    with pytest.raises(ValueError, match="margin"):
        SimulatedTeacher(PRESETS["skip"])
    with pytest.raises(ValueError, match="teacher must be one of"):
        make_simulated("perfect")


class Brightness(RewardModel):
    """A stand-in frame reward: the mean brightness of each frame, in [0, 1]."""

    inputs = frozenset({"frames"})
    reward_range = (0.0, 1.0)

    def score(self, frames, states, instruction):
        return RewardOutput(frames.reshape(len(frames), -1).mean(1) / 255.0)


def clip(level: int, length: int = 6) -> np.ndarray:
    return np.full((length, 8, 8, 3), level, np.uint8)


def test_reward_model_teacher_prefers_the_better_scored_clip_and_abstains_when_unsure():
    t = RewardModelTeacher(Brightness(), abstain=0.05)
    qs = [Query(seg(np.zeros(6), frames=clip(200)), seg(np.zeros(6), frames=clip(50))),
          Query(seg(np.zeros(6), frames=clip(10)), seg(np.zeros(6), frames=clip(240))),
          Query(seg(np.zeros(6), frames=clip(100)), seg(np.zeros(6), frames=clip(105)))]
    assert t.label(qs) == ["left", "right", "skip"]
    assert RewardModelTeacher(Brightness()).label(qs[2:]) == ["right"]


def test_reward_model_teacher_refuses_a_model_without_frames_and_segments_without_frames():
    class StateOnly(Brightness):
        inputs = frozenset({"states"})

    with pytest.raises(ValueError, match="reads frames"):
        RewardModelTeacher(StateOnly())
    with pytest.raises(ValueError, match="frames"):
        RewardModelTeacher(Brightness()).label([Query(seg(np.zeros(6)), seg(np.zeros(6)))])


# --------------------------------------------------------------------- store
META = {"task": "press-button", "state_dim": 3, "action_dim": 2, "segment_length": 5}


def new_store(path: Path, n: int = 4) -> LabelStore:
    store = LabelStore(path, META)
    for i in range(n):
        store.add_query(Query(seg(np.full(5, i)), seg(np.full(5, 2.0))))
    return store


def test_store_keeps_queries_and_labels_across_reopening(tmp_path):
    store = new_store(tmp_path / "s")
    store.add_label(0, "right", "oracle")
    store.add_label(2, "equal", "human")
    store.add_label(3, "skip", "human")
    again = LabelStore(tmp_path / "s", META)
    assert [r["query"] for r in again.records] == [0, 2, 3] and again.pending() == [1]
    qs, ys = again.training_set()
    assert [q.id for q in qs] == [0, 2] and ys == [TARGET["right"], 0.5]
    np.testing.assert_array_equal(qs[1].left.rewards, np.full(5, 2.0))
    assert again.counts()["skip"] == 1


def test_store_answers_are_append_only(tmp_path):
    store = new_store(tmp_path / "s")
    first = store.add_label(1, "left", "human")
    assert store.add_label(1, "left", "human") == first  # a retried POST after a lost acknowledgement
    with pytest.raises(LabelStoreError, match="already labelled 'left'"):
        store.add_label(1, "right", "human")
    with pytest.raises(ValueError, match="label must be one of"):
        store.add_label(2, "up", "human")
    with pytest.raises(LabelStoreError, match="query 9"):
        store.add_label(9, "left", "human")
    assert (tmp_path / "s" / "labels.jsonl").read_text().count("\n") == 1


def test_store_reused_for_another_task_names_the_difference(tmp_path):
    new_store(tmp_path / "s")
    with pytest.raises(LabelStoreError, match="task: store has 'press-button', this run has 'reach'"):
        LabelStore(tmp_path / "s", {**META, "task": "reach"})
    with pytest.raises(LabelStoreError, match="no label store"):
        LabelStore(tmp_path / "nothing")


WRITER = textwrap.dedent("""
    import sys, numpy as np
    from rewards.preference.store import LabelStore
    store = LabelStore(sys.argv[1])
    for q in store.pending():
        store.add_label(q, "left" if q % 2 else "right", "oracle")
        print(q, flush=True)
""")


def test_every_acknowledged_label_survives_a_kill(tmp_path):
    store = new_store(tmp_path / "s", n=400)
    del store
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "s")], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    acked = [int(p.stdout.readline()) for _ in range(25)]
    p.send_signal(signal.SIGKILL)
    p.wait()
    after = LabelStore(tmp_path / "s", META)
    assert set(acked) <= set(after.by_query), "an acknowledged label was lost"
    assert all(after.by_query[q]["label"] == ("left" if q % 2 else "right") for q in after.by_query)
    assert after.pending()[0] == max(after.by_query) + 1  # it resumes at the next unanswered query


def test_a_truncated_last_line_is_reported_by_number_and_can_be_quarantined(tmp_path):
    store = new_store(tmp_path / "s")
    for q in (0, 1):
        store.add_label(q, "right", "oracle")
    path = tmp_path / "s" / "labels.jsonl"
    with open(path, "a") as f:
        f.write('{"query": 2, "label": "le')  # a write cut short
    with pytest.raises(LabelFileError, match=r"line 3: truncated") as e:
        LabelStore(tmp_path / "s", META)
    assert [n for n, _ in e.value.problems] == [3]
    store.close()  # quarantining rewrites the file: it needs to be the one writer
    kept = LabelStore(tmp_path / "s", META, on_malformed="quarantine")
    assert sorted(kept.by_query) == [0, 1] and kept.pending() == [2, 3]
    rejected = [json.loads(x) for x in (tmp_path / "s" / "labels.rejected.jsonl").read_text().splitlines()]
    assert rejected[0]["line"] == 3 and rejected[0]["text"].startswith('{"query": 2')
    assert LabelStore(tmp_path / "s", META).counts()["answered"] == 2  # the file is whole again


def test_every_malformed_line_is_reported_with_its_number(tmp_path):
    new_store(tmp_path / "s")
    good = '{"query": 0, "label": "left", "teacher": "human", "time": 1.0}'
    lines = [good, "not json", '{"query": 1, "label": "up", "teacher": "h"}', "",
             '{"query": 7, "label": "left", "teacher": "h"}', '["a list"]',
             '{"query": 0, "label": "left", "teacher": "h"}', '{"query": -1, "label": "left", "teacher": "h"}',
             '{"query": 2, "label": "left"}']
    (tmp_path / "s" / "labels.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(LabelFileError) as e:
        LabelStore(tmp_path / "s", META)
    rows = {int(r.split(":")[0].split()[1]): r for r in str(e.value).splitlines() if r.startswith("  line ")}
    assert [n for n, _ in e.value.problems] == sorted(rows) == [2, 3, 4, 5, 6, 7, 8, 9]
    for n, word in [(2, "not JSON"), (3, "'label' must be one of"), (4, "empty line"), (5, "query 7 has no file"),
                    (6, "not a JSON object"), (7, "query 0 was already labelled on line 1"), (8, "non-negative"),
                    (9, "'teacher' must be a string")]:
        assert word in rows[n], rows[n]


def test_a_second_writer_is_refused_until_the_first_closes(tmp_path):
    first = new_store(tmp_path / "s", n=2)
    second = LabelStore(tmp_path / "s", META)  # reading is fine
    assert second.pending() == [0, 1]
    with pytest.raises(LabelStoreError, match=f"another writer \\(pid {os.getpid()}\\)"):
        second.add_label(0, "left", "human")
    first.close()
    second.add_label(0, "left", "human")
    assert LabelStore(tmp_path / "s", META).by_query[0]["label"] == "left"


def test_a_dead_writers_unfinished_query_file_is_removed(tmp_path):
    store = new_store(tmp_path / "s", n=2)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stray = tmp_path / "s" / "queries" / f"q_000002.npz.tmp-{int(dead.stdout)}"
    stray.write_bytes(b"half a file")
    again = LabelStore(tmp_path / "s", META)
    assert not stray.exists() and again.query_ids == [0, 1] and store.query_ids == [0, 1]


# --------------------------------------------------------------------- model
def toy(rng: np.random.Generator, n_traj: int, w: np.ndarray) -> list[Trajectory]:
    out = []
    for _ in range(n_traj):
        s = rng.normal(size=(30, len(w))).astype(np.float32)
        out.append(Trajectory(s, rng.normal(size=(30, 2)).astype(np.float32), (0.2 * s @ w).astype(np.float32),
                              "press the red button"))
    return out


def oracle_targets(qs):
    return np.array([TARGET[a] for a in make_simulated("oracle").label(qs)])


def test_bradley_terry_training_improves_held_out_accuracy_on_a_toy_problem():
    rng = np.random.default_rng(0)
    w = rng.normal(size=5)
    train, test = sample_pairs(toy(rng, 40, w), 150, 8, rng), sample_pairs(toy(rng, 40, w), 300, 8, rng)
    model = PreferenceReward(RewardConfig(hidden=64, epochs=15, ensemble=2), 5, 2)
    before = M.preference_accuracy(model.predict(test).mean(0), oracle_targets(test))
    fit = model.train(train, oracle_targets(train))
    after = M.preference_accuracy(model.predict(test).mean(0), oracle_targets(test))
    assert after > 0.85 and after > before + 0.2, (before, after, fit)
    out = model(None, test[0].left.states, "press the red button")  # the RewardModel contract
    assert out.reward.shape == (8,) and out.terms["ensemble_std"].shape == (8,)
    assert np.all(np.abs(out.reward) <= 1)


def test_the_image_reward_learns_from_frames():
    rng = np.random.default_rng(0)

    def traj():
        level = rng.uniform(0, 1, 12)
        frames = (np.ones((12, 16, 16, 3)) * level[:, None, None, None] * 255).astype(np.uint8)
        return Trajectory(np.zeros((12, 1), np.float32), np.zeros((12, 1), np.float32), level.astype(np.float32),
                          "make it bright", frames=frames)

    train = sample_pairs([traj() for _ in range(30)], 120, 4, rng)
    test = sample_pairs([traj() for _ in range(20)], 200, 4, rng)
    model = PreferenceReward(RewardConfig(input="image", hidden=32, epochs=10, ensemble=1, image_size=8), 1, 1)
    model.train(train, oracle_targets(train))
    assert model.inputs == frozenset({"frames"})
    assert M.preference_accuracy(model.predict(test).mean(0), oracle_targets(test)) > 0.8


def test_equal_labels_and_smoothing_shape_the_loss():
    r = torch.tensor([1.0])
    assert bt_loss(r, r, torch.tensor([0.5])) < bt_loss(r, r + 2, torch.tensor([0.5]))  # equal: no gap wanted
    assert bt_loss(r, r + 2, torch.tensor([1.0])) < bt_loss(r, r - 2, torch.tensor([1.0]))
    # smoothing bounds the optimum: a huge margin costs more with it than a moderate one
    big, mid = bt_loss(r, r + 20, torch.tensor([1.0]), 0.1), bt_loss(r, r + 3, torch.tensor([1.0]), 0.1)
    assert big > mid
    assert bt_loss(r, r + 20, torch.tensor([1.0])) < bt_loss(r, r + 3, torch.tensor([1.0]))


def test_a_saved_reward_scores_the_same_and_damage_is_named(tmp_path):
    rng = np.random.default_rng(1)
    qs = sample_pairs(toy(rng, 10, rng.normal(size=4)), 30, 6, rng)
    model = PreferenceReward(RewardConfig(input="state_action", hidden=16, epochs=2, ensemble=2), 4, 2)
    model.train(qs, oracle_targets(qs))
    model.save(tmp_path / "reward.pt")
    back = PreferenceReward.load(tmp_path / "reward.pt")
    x = np.concatenate([qs[0].left.states, qs[0].left.actions], -1)
    np.testing.assert_allclose(back(None, x, "go").reward, model(None, x, "go").reward, rtol=1e-6)
    with pytest.raises(RewardInputError, match="state then action"):
        back(None, qs[0].left.states, "go")
    (tmp_path / "reward.pt").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="damaged"):
        PreferenceReward.load(tmp_path / "reward.pt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        PreferenceReward.load(tmp_path / "other.pt")


def test_bad_reward_settings_and_targets_are_refused():
    with pytest.raises(ValueError, match="reward input must be one of"):
        RewardConfig(input="text")
    with pytest.raises(ValueError, match="smoothing"):
        RewardConfig(smoothing=1.0)
    m = PreferenceReward(RewardConfig(hidden=8, epochs=1), 3, 2)
    q = Query(seg(np.zeros(5)), seg(np.ones(5)))
    with pytest.raises(ValueError, match="targets must be 0"):
        m.train([q], [0.7])


def test_text_features_tell_instructions_apart():
    a, b = text_features("press the red button", 32), text_features("press the blue button", 32)
    assert a.shape == (32,) and np.isclose(np.linalg.norm(a), 1) and not np.allclose(a, b)
    np.testing.assert_array_equal(a, text_features("Press the red button.", 32))


# ------------------------------------------------------------- queries, metrics
def test_selection_keeps_the_most_uncertain_candidates():
    cands = [Query(seg([0.0]), seg([float(i)])) for i in range(4)]
    probs = np.array([[0.5, 0.9, 0.1, 0.99], [0.5, 0.1, 0.2, 0.98]])  # members disagree most on 1
    assert [q.right.ret for q in select(cands, 1, "disagreement", probs)] == [1.0]
    assert [q.right.ret for q in select(cands, 2, "entropy", probs)] == [0.0, 1.0]
    assert select(cands, 2, "uniform", probs) == cands[:2] == select(cands, 2, "entropy", None)
    with pytest.raises(ValueError, match="only 4 candidates"):
        select(cands, 5, "uniform")
    with pytest.raises(ValueError, match="selection must be one of"):
        select(cands, 1, "random")


def test_schedules_spend_the_whole_budget():
    for kind in ("constant", "hyperbolic", "inverse_quadratic"):
        s = schedule(101, 5, kind)
        assert sum(s) == 101 and len(s) == 5 and min(s) >= 0
    assert schedule(10, 5) == [2] * 5
    h = schedule(100, 4, "hyperbolic")
    assert h == sorted(h, reverse=True) and h[0] > h[-1]
    with pytest.raises(ValueError, match="schedule must be one of"):
        schedule(10, 2, "linear")


def test_metrics_against_known_values():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    s, y = rng.normal(size=200), rng.random(200) < 0.4
    assert M.auroc(s, y) == pytest.approx(roc_auc_score(y, s))
    p = rng.uniform(0, 1, 20000)
    outcome = (rng.random(20000) < p).astype(float)
    assert M.expected_calibration_error(p, outcome) < 0.02  # calibrated by construction
    assert M.expected_calibration_error(np.full(1000, 0.9), np.zeros(1000)) == pytest.approx(0.9)
    assert M.preference_accuracy(np.array([0.9, 0.2, 0.6]), np.array([1.0, 1.0, 0.5])) == 0.5
    assert M.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0) and math.isnan(M.spearman([1, 1], [1, 2]))


# ------------------------------------------------------------------------ loop
def tiny(tmp: Path, **kw):
    from embodied.runtime.prefer import PreferConfig

    base = dict(task="press-button", budget=12, rounds=2, episodes_per_round=1, candidates=3, heldout_episodes=1,
                heldout_pairs=20, eval_episodes=2, segment_length=10, oversample=3,
                reward=RewardConfig(hidden=16, epochs=2, ensemble=2), labels=str(tmp / "labels"))
    return PreferConfig(**{**base, **kw})


def test_the_loop_stores_every_label_and_a_second_run_reuses_them(tmp_path):
    from embodied.runtime.prefer import run_prefer

    m1 = run_prefer(tiny(tmp_path), tmp_path)
    assert m1["labels"]["answered"] == 12 and [c["labels"] for c in m1["curve"]] == [6, 12]
    assert m1["final"]["teacher_accuracy"] == 1.0  # the oracle agrees with the ground truth
    steps = [c["env_steps"] for c in m1["curve"]]  # the learner's own episodes only: 3 candidates x <= 60 steps
    assert 0 < steps[0] <= 180 and steps[0] < steps[1] <= 360
    assert {"accuracy", "ece", "return_spearman", "success_auroc"} <= set(m1["final"])
    assert 0 <= m1["policy"]["success_learned"] <= 1 and (tmp_path / "reward.pt").is_file()
    m2 = run_prefer(tiny(tmp_path, teacher="mistake", budget=6, rounds=1), tmp_path)
    assert m2["reused_labels"] == 12 and m2["labels"]["answered"] == 18
    teachers = [json.loads(x)["teacher"] for x in (tmp_path / "labels" / "labels.jsonl").read_text().splitlines()]
    assert teachers == ["oracle"] * 12 + ["mistake"] * 6


def test_queries_an_interrupted_run_posed_are_answered_first(tmp_path):
    from embodied.runtime.prefer import run_prefer

    run_prefer(tiny(tmp_path, budget=4, rounds=1), tmp_path)
    store = LabelStore(tmp_path / "labels")
    old = store.query(0)
    store.add_query(Query(old.left, old.right))  # posed, never answered
    store.close()
    m = run_prefer(tiny(tmp_path, budget=2, rounds=1), tmp_path)
    assert m["labels"]["answered"] == 7 and m["labels"]["queries"] == 7 and m["curve"][0]["asked"] == 3


def test_the_loop_learns_an_image_reward_from_rendered_frames(tmp_path):
    from embodied.runtime.prefer import run_prefer

    m = run_prefer(tiny(tmp_path, budget=4, rounds=2, render_size=16,
                        reward=RewardConfig(input="image", hidden=8, epochs=1, ensemble=2, image_size=8)), tmp_path)
    assert m["labels"]["answered"] == 4 and 0 <= m["final"]["accuracy"] <= 1
    assert PreferenceReward.load(tmp_path / "reward.pt").inputs == frozenset({"frames"})


def test_prefer_settings_are_checked_with_the_allowed_values():
    from embodied.runtime.prefer import PreferConfig

    with pytest.raises(ValueError, match="teacher must be one of"):
        PreferConfig(teacher="god")
    with pytest.raises(ValueError, match="vlm_reward=module:factory"):
        PreferConfig(teacher="vlm")
    with pytest.raises(ValueError, match="segment_length must be >= 1"):
        PreferConfig(segment_length=0)


def test_the_vlm_teacher_runs_the_loop_with_any_frame_reward(tmp_path, monkeypatch):
    from embodied.runtime.prefer import run_prefer

    (tmp_path / "my_frame_reward.py").write_text(textwrap.dedent("""
        from embodied.core.reward import RewardModel, RewardOutput

        class Brightness(RewardModel):
            inputs = frozenset({"frames"})

            def score(self, frames, states, instruction):
                return RewardOutput(frames.reshape(len(frames), -1).mean(1) / 255.0)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    m = run_prefer(tiny(tmp_path, teacher="vlm", vlm_reward="my_frame_reward:Brightness", budget=4,
                        rounds=1, render_size=16), tmp_path)
    assert m["teacher"] == "vlm" and m["labels"]["answered"] == 4
    assert LabelStore(tmp_path / "labels").has_frames(0)


def cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return run_cli(args, cwd=cwd, env=env, timeout=600)


@pytest.mark.slow
def test_embodied_prefer_run_eval_and_plot(tmp_path):
    common = ["task=press-button", "episodes_per_round=1", "candidates=3", "heldout_episodes=1", "heldout_pairs=20",
              "eval_episodes=2", "segment_length=10", "reward.hidden=16", "reward.epochs=2"]
    r = cli("prefer", "budget=6", "rounds=2", *common, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["labels"]["answered"] == 6 and len(m["curve"]) == 2
    r = cli("prefer", "eval", f"reward_path={tmp_path / 'run' / 'reward.pt'}", f"labels={tmp_path / 'run' / 'labels'}",
            *common, f"hydra.run.dir={tmp_path / 'eval'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    e = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert e["store_labels"] == 6 and 0 <= e["accuracy"] <= 1 and "success_learned" in e["policy"]
    r = cli("prefer", "plot", f"runs=[{tmp_path / 'run'}]", f"hydra.run.dir={tmp_path / 'plot'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "plot" / "curve.png").stat().st_size > 1000
    r = cli("prefer", "teacher=god", f"hydra.run.dir={tmp_path / 'bad'}", cwd=tmp_path)
    assert r.returncode == 2 and "teacher must be one of" in r.stderr and "Traceback" not in r.stderr


def test_a_registered_learner_drives_the_loop_through_the_learner_interface(tmp_path, monkeypatch):
    from embodied.runtime import prefer
    from rewards.preference.ranking import RankingLearner

    calls = []

    class Recorder(RankingLearner):
        def improve(self, reward):
            calls.append(type(reward).__name__)
            return super().improve(reward)

        def evaluate(self, episodes, reward):
            return {**super().evaluate(episodes, reward), "who": "recorder"}

    monkeypatch.setitem(prefer.LEARNERS, "recorder",
                        lambda cfg, frames: Recorder(cfg.task, cfg.candidates, cfg.seed, frames, cfg.render_size))
    m = prefer.run_prefer(tiny(tmp_path, learner="recorder", rounds=3, budget=6), tmp_path)
    assert calls == ["PreferenceReward"] * 3 and m["policy"]["who"] == "recorder" and m["learner"] == "recorder"
    with pytest.raises(ValueError, match="learner must be one of"):
        tiny(tmp_path, learner="steering-not-yet")


def test_the_prefer_package_registers_every_learner_and_exports_its_api():
    import embodied.runtime.prefer as prefer
    from rewards.preference.config import LEARNERS

    assert prefer.LEARNERS is LEARNERS and {"ranking", "steer", "pebble"} <= set(LEARNERS)
    assert all(hasattr(prefer, name) for name in prefer.__all__)
