"""Behavioural tests of the on-disk episode dataset (embodied/runtime/data.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from embodied.runtime import data
from embodied.runtime.data import Dataset, EpisodeRecorder, check_dataset, make_windows, sample_windows
from embodied.core.errors import DatasetError
from embodied.core.specs import ActionSpec, ObservationSpec

FEATURES = {
    "state": ("float32", (3,)),
    "action": ("float32", (2,)),
    "reward": ("float32", ()),
    "reward_terms/dist": ("float32", ()),
    "image": ("uint8", (4, 4, 3)),
}


def make_episode(rng: np.random.Generator, T: int) -> dict[str, np.ndarray]:
    return {
        "state": rng.normal(size=(T, 3)).astype(np.float32),
        "action": rng.uniform(-1, 1, size=(T, 2)).astype(np.float32),
        "reward": rng.normal(size=T).astype(np.float32),
        "reward_terms/dist": rng.normal(size=T).astype(np.float32),
        "image": rng.integers(0, 256, size=(T, 4, 4, 3), dtype=np.uint8),
    }


@pytest.fixture
def filled(tmp_path):
    """A dataset with 3 episodes of lengths 5, 7, 4, and the episodes themselves."""
    rng = np.random.default_rng(0)
    ds = Dataset.create(tmp_path / "ds", FEATURES, info={"suite": "toy", "obs_mode": "pixels"})
    eps = [make_episode(rng, T) for T in (5, 7, 4)]
    for i, ep in enumerate(eps):
        ds.append(ep, task=f"task{i % 2}", instruction=f"do {i}", instruction_split="train",
                  success=bool(i % 2), seed=100 + i)
    return ds, eps


def test_round_trip_values_and_meta(filled):
    ds, eps = filled
    reopened = Dataset.open(ds.root, validate=True)
    assert len(reopened) == 3 and reopened.info["suite"] == "toy"
    for i, ep in enumerate(eps):
        got = reopened[i]
        for k, v in ep.items():
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k
        assert got["instruction"] == f"do {i}" and got["seed"] == 100 + i
        assert got["success"] is bool(i % 2) and got["length"] == len(ep["state"])
    meta = reopened.episodes_meta
    assert [m["task"] for m in meta] == ["task0", "task1", "task0"]
    assert [e["seed"] for e in reopened.iter_episodes(tasks=["task0"])] == [100, 102]
    assert reopened[-1]["seed"] == 102
    with pytest.raises(IndexError):
        reopened[3]


def test_stats_equal_numpy_over_all_steps(filled):
    ds, eps = filled
    for stats in (ds.stats, Dataset.open(ds.root).stats):
        for k in ("state", "action", "reward", "reward_terms/dist"):
            x = np.concatenate([e[k] for e in eps]).astype(np.float64)
            s = stats[k]
            assert s["count"] == 16
            np.testing.assert_allclose(s["mean"], x.mean(0), rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(s["std"], x.std(0), rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(s["min"], x.min(0))
            np.testing.assert_allclose(s["max"], x.max(0))
        assert stats["image"] == {"count": 16}


def test_stats_recomputed_when_missing_or_stale(filled):
    ds, eps = filled
    expected = ds.stats
    (ds.root / "stats.json").unlink()
    assert Dataset.open(ds.root).stats == expected
    (ds.root / "stats.json").write_text("{not json")
    assert Dataset.open(ds.root).stats == expected
    # stats that cover only the first episode (a crash before the stats write) are completed
    one = Dataset.create(ds.root.parent / "one", FEATURES)
    one.append(eps[0])
    (ds.root / "stats.json").write_text((one.root / "stats.json").read_text())
    np.testing.assert_allclose(Dataset.open(ds.root).stats["state"]["mean"], expected["state"]["mean"])


def test_append_after_reopen_and_exist_ok(filled):
    ds, eps = filled
    rng = np.random.default_rng(1)
    again = Dataset.create(ds.root, FEATURES, exist_ok=True)
    assert len(again) == 3
    extra = make_episode(rng, 6)
    assert again.append(extra, task="task9") == 3
    final = Dataset.open(ds.root, validate=True)
    assert len(final) == 4 and np.array_equal(final[3]["state"], extra["state"])
    assert final.stats["state"]["count"] == 22
    assert sorted(p.name for p in (ds.root / "episodes").iterdir())[-1] == "ep_000003.npz"


def test_create_refuses_existing_and_names_mismatched_feature(filled):
    ds, _ = filled
    with pytest.raises(DatasetError, match="exist_ok"):
        Dataset.create(ds.root, FEATURES)
    bad = {**FEATURES, "state": ("float32", (4,))}
    with pytest.raises(DatasetError, match=r"'state'.*\(3,\).*\(4,\)"):
        Dataset.create(ds.root, bad, exist_ok=True)
    with pytest.raises(DatasetError, match="'wrist'.*missing"):
        Dataset.create(ds.root, {**FEATURES, "wrist": ("uint8", (2, 2, 3))}, exist_ok=True)
    with pytest.raises(DatasetError, match="not a dataset"):
        Dataset.open(ds.root.parent / "nowhere")


def test_append_validates_episode(tmp_path):
    ds = Dataset.create(tmp_path / "ds", FEATURES)
    ep = make_episode(np.random.default_rng(0), 5)
    with pytest.raises(DatasetError, match=r"'action'.*\(T, 2\).*\(5, 3\)"):
        ds.append({**ep, "action": np.zeros((5, 3), np.float32)})
    with pytest.raises(DatasetError, match="'image'.*uint8.*float32"):
        ds.append({**ep, "image": ep["image"].astype(np.float32)})
    with pytest.raises(DatasetError, match="missing.*reward"):
        ds.append({k: v for k, v in ep.items() if k != "reward"})
    with pytest.raises(DatasetError, match="different lengths"):
        ds.append({**ep, "reward": ep["reward"][:4]})
    with pytest.raises(DatasetError, match="reserved"):
        ds.append(ep, length=3)
    # float64 input is cast to the spec's float32
    assert ds.append({**ep, "state": ep["state"].astype(np.float64)}) == 0
    assert ds[0]["state"].dtype == np.float32


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_rejected(tmp_path, bad):
    ds = Dataset.create(tmp_path / "ds", FEATURES)
    ep = make_episode(np.random.default_rng(0), 5)
    ep["state"][2, 1] = bad
    with pytest.raises(DatasetError, match="'state'.*NaN or inf"):
        ds.append(ep)
    assert len(ds) == 0 and len(Dataset.open(ds.root)) == 0


def test_truncated_file_named_and_skippable(filled):
    ds, eps = filled
    victim = ds.root / "episodes" / "ep_000001.npz"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.raises(DatasetError, match="ep_000001.npz.*truncated"):
        Dataset.open(ds.root)
    with pytest.warns(UserWarning, match="ep_000001.npz"):
        ok = Dataset.open(ds.root, on_corrupt="skip")
    assert [m["seed"] for m in ok.episodes_meta] == [100, 102]
    assert np.array_equal(ok[1]["state"], eps[2]["state"])
    assert ok.stats["state"]["count"] == 9
    # skipping does not hide it: the next plain open reports it again
    with pytest.raises(DatasetError, match="ep_000001.npz.*truncated"):
        Dataset.open(ds.root)
    (ds.root / "index.jsonl").unlink()  # without an index the file itself is read
    with pytest.raises(DatasetError, match="ep_000001.npz.*unreadable"):
        Dataset.open(ds.root)
    # appending continues after the highest file number; nothing is overwritten
    ok.append(eps[0])
    assert (ds.root / "episodes" / "ep_000003.npz").exists()


def test_validate_detects_wrong_content(filled):
    ds, eps = filled
    # a well-formed npz whose content does not fit the spec (same size is not required)
    path = ds.root / "episodes" / "ep_000000.npz"
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["state"] = arrays["state"][:, :2]
    np.savez_compressed(path, **arrays)
    index = [json.loads(line) for line in (ds.root / "index.jsonl").read_text().splitlines()]
    index[0]["bytes"] = path.stat().st_size
    (ds.root / "index.jsonl").write_text("".join(json.dumps(e) + "\n" for e in index))
    assert len(Dataset.open(ds.root)) == 3  # the quick check only looks at sizes
    with pytest.raises(DatasetError, match=r"ep_000000.npz.*'state'"):
        Dataset.open(ds.root, validate=True)
    with pytest.raises(DatasetError, match=r"ep_000000.npz.*'state'"):
        Dataset.open(ds.root)[0]


def test_missing_file_listed_in_index_is_reported(filled):
    ds, _ = filled
    (ds.root / "episodes" / "ep_000002.npz").unlink()
    with pytest.raises(DatasetError, match="ep_000002.npz.*missing"):
        Dataset.open(ds.root)


def test_interrupted_append_loses_no_earlier_episode(filled, monkeypatch):
    ds, eps = filled
    real = np.savez_compressed

    def write_half_then_interrupt(f, **arrays):
        f.write(b"PK\x03\x04 half an episode")
        raise KeyboardInterrupt

    monkeypatch.setattr(data.np, "savez_compressed", write_half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        ds.append(eps[0], task="lost")
    monkeypatch.setattr(data.np, "savez_compressed", real)
    assert len(ds) == 3
    assert sorted(p.name for p in (ds.root / "episodes").iterdir()) == [
        "ep_000000.npz", "ep_000001.npz", "ep_000002.npz"]
    reopened = Dataset.open(ds.root, validate=True)
    assert len(reopened) == 3 and reopened.stats["state"]["count"] == 16
    # the same object can go on appending
    assert ds.append(eps[1], task="after") == 3
    assert len(Dataset.open(ds.root, validate=True)) == 4


def test_crash_between_episode_file_and_index(filled, monkeypatch):
    """The npz is in place but the index line is half written: the file wins."""
    ds, eps = filled

    def commit_half(self):
        with open(self.root / "index.jsonl", "a") as f:
            f.write('{"episode": 3, "fi')
        raise KeyboardInterrupt

    monkeypatch.setattr(Dataset, "_commit_caches", commit_half)
    with pytest.raises(KeyboardInterrupt):
        ds.append(eps[1], task="kept", seed=7)
    monkeypatch.undo()
    reopened = Dataset.open(ds.root, validate=True)
    assert len(reopened) == 4 and reopened[3]["seed"] == 7
    assert np.array_equal(reopened[3]["action"], eps[1]["action"])
    assert reopened.stats["state"]["count"] == 23  # stats.json did not have it: completed
    lines = (ds.root / "index.jsonl").read_text().splitlines()
    assert [json.loads(line)["episode"] for line in lines] == [0, 1, 2, 3]


def test_interrupt_right_after_rename_keeps_the_episode(filled, monkeypatch):
    from embodied.core import files

    ds, eps = filled
    real = files.fsync_dir

    def interrupt_once(path):
        monkeypatch.setattr(files, "fsync_dir", real)
        raise KeyboardInterrupt

    monkeypatch.setattr(files, "fsync_dir", interrupt_once)
    with pytest.raises(KeyboardInterrupt):
        ds.append(eps[0], seed=1)
    assert len(ds) == 4  # the file was in place: it counts
    assert ds.append(eps[1], seed=2) == 4
    assert [m["seed"] for m in Dataset.open(ds.root, validate=True).episodes_meta][-2:] == [1, 2]


def test_corrupt_meta_is_named(filled):
    ds, _ = filled
    (ds.root / "meta.json").write_text('{"format_version": 1, "features": {"state": {"dtype": "float32"}}}')
    with pytest.raises(DatasetError, match="meta.json is corrupt.*shape"):
        Dataset.open(ds.root)


def test_stray_temp_files_ignored_and_cleaned(filled):
    ds, _ = filled
    dead = ds.root / "episodes" / "ep_000003.npz.tmp-4194305"  # above Linux PID_MAX_LIMIT: never alive
    dead.write_bytes(b"PK partial")
    (ds.root / "stats.json.tmp-4194305").write_text("{")
    mine = ds.root / "episodes" / f"ep_000004.npz.tmp-{os.getpid()}"  # a live writer's
    mine.write_bytes(b"PK partial")
    reopened = Dataset.open(ds.root, validate=True)
    assert len(reopened) == 3
    assert not dead.exists() and mine.exists()
    assert not (ds.root / "stats.json.tmp-4194305").exists()


def test_recorder_collects_steps(tmp_path):
    feats = data.features_for(ObservationSpec(3, ("front",), 4), ActionSpec(2), reward_terms=("dist",))
    assert feats == FEATURES
    ds = Dataset.create(tmp_path / "ds", feats)
    rec = EpisodeRecorder(ds)
    rng = np.random.default_rng(0)
    states = []
    rec.start(task="reach", seed=3, instruction_split="test")
    state = np.zeros(3, np.float32)
    for t in range(4):
        state[:] = t  # the env reuses its buffer: the recorder must copy
        states.append(state.copy())
        obs = {"state": state, "image": rng.integers(0, 256, (4, 4, 3), dtype=np.uint8),
               "instruction": "reach the cube"}
        rec.add(obs, np.full(2, 0.1 * t), 1.0 * t, {"reward_terms": {"dist": -t}, "success": t == 3})
    assert rec.finish() == 0 and not rec.recording
    ep = ds[0]
    assert np.array_equal(ep["state"], np.stack(states)) and ep["reward"].tolist() == [0, 1, 2, 3]
    assert ep["reward_terms/dist"].tolist() == [0, -1, -2, -3]
    assert ep["instruction"] == "reach the cube" and ep["success"] is True and ep["seed"] == 3
    assert ep["instruction_split"] == "test"
    rec.start(task="reach")
    rec.add(obs, np.zeros(2), 0.0, {"reward_terms": {"dist": 0.0}})
    rec.discard()
    assert len(ds) == 1
    rec.start(task="reach")
    with pytest.raises(DatasetError, match="'reward_terms/dist'"):
        rec.add(obs, np.zeros(2), 0.0, {})
    with pytest.raises(DatasetError, match="already"):
        rec.start()


def test_windows_padding_convention(tmp_path):
    ds = Dataset.create(tmp_path / "ds", {"state": ("float32", (1,)), "action": ("float32", (1,))})
    for T, base in ((3, 0), (4, 100)):
        x = np.arange(base, base + T, dtype=np.float32)[:, None]
        ds.append({"state": x, "action": x + 0.5})
    arrays, ends = ds.load_arrays(("state", "action"))
    assert ends.tolist() == [3, 7] and arrays["state"][:, 0].tolist() == [0, 1, 2, 100, 101, 102, 103]
    idx = make_windows(ends, horizon=3)
    assert idx.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2], [1, 3]]
    b = sample_windows(arrays, ends, idx, n_obs_steps=2, horizon=3)
    assert b["state"].shape == (7, 2, 1) and b["action"].shape == (7, 3, 1)
    # first frame repeated before the start
    assert b["state"][0, :, 0].tolist() == [0, 0] and b["state"][3, :, 0].tolist() == [100, 100]
    assert b["state"][4, :, 0].tolist() == [100, 101]
    # actions from the current step, the last action repeated past the end
    assert b["action"][1, :, 0].tolist() == [1.5, 2.5, 2.5]
    assert b["action"][6, :, 0].tolist() == [103.5, 103.5, 103.5]
    assert b["action_is_pad"][1].tolist() == [False, False, True]
    assert not b["action_is_pad"][3].any()
    # Diffusion Policy's pad_after = n_action_steps - 1 drops windows that pad more
    assert make_windows(ends, horizon=3, max_action_pad=1).tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]]
    with pytest.raises(ValueError, match="outside"):
        sample_windows(arrays, ends, np.array([[0, 3]]), 2, 3)
    with pytest.raises(DatasetError, match="have no episodes"):  # not silently zero rows
        ds.load_arrays(("state",), tasks=["none"])


def test_quarantine_moves_bad_files_aside_and_keeps_every_whole_episode(filled):
    ds, eps = filled
    victim = ds.root / "episodes" / "ep_000001.npz"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    report = check_dataset(ds.root)  # validate only: nothing moves
    assert report["episodes"] == 2 and report["quarantined"] == [] and victim.exists()
    assert len(report["corrupt"]) == 1 and "ep_000001.npz" in report["corrupt"][0]
    report = check_dataset(ds.root, repair=True)
    assert report["quarantined"] == ["ep_000001.npz"] and report["episodes"] == 2
    assert (ds.root / "quarantine" / "ep_000001.npz").read_bytes() == data[: len(data) // 2]  # kept, not deleted
    reopened = Dataset.open(ds.root, validate=True)  # now opens cleanly
    assert [m["seed"] for m in reopened.episodes_meta] == [100, 102]
    assert np.array_equal(reopened[1]["state"], eps[2]["state"])
    reopened.append(eps[0])  # a new episode never takes the quarantined one's number
    assert (ds.root / "episodes" / "ep_000003.npz").exists()


def test_a_deleted_file_listed_in_the_index_can_be_repaired(filled):
    ds, _ = filled
    (ds.root / "episodes" / "ep_000002.npz").unlink()
    assert check_dataset(ds.root, repair=True)["episodes"] == 2
    assert len(Dataset.open(ds.root)) == 2


def test_load_arrays_names_an_unknown_task(filled):
    ds, _ = filled
    with pytest.raises(DatasetError, match=r"tasks \['nope'\] have no episodes"):
        ds.load_arrays(tasks=["nope"])


def run_cli(*args, cwd):
    from cli_runner import run_cli

    return run_cli(args, cwd=cwd, timeout=300)


def test_a_truncated_episode_does_not_block_collection(tmp_path):
    """From the command line: collect names the bad file and the way out; quarantine goes on;
    `embodied data validate|repair` report and mend a dataset without collecting."""
    out = tmp_path / "ds"
    args = ("collect", "tasks=[reach]", "episodes=2", f"out={out}", "progress=false")
    assert run_cli(*args, f"hydra.run.dir={tmp_path}/c1", cwd=tmp_path).returncode == 0
    victim = out / "episodes" / "ep_000000.npz"
    victim.write_bytes(victim.read_bytes()[:64])
    r = run_cli(*args, "episodes=3", f"hydra.run.dir={tmp_path}/c2", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "ep_000000.npz" in r.stderr and "embodied data repair" in r.stderr
    r = run_cli("data", "validate", f"path={out}", f"hydra.run.dir={tmp_path}/v", cwd=tmp_path)
    assert r.returncode == 1 and "ep_000000.npz" in r.stderr + r.stdout
    r = run_cli(*args, "episodes=3", "on_corrupt=quarantine", f"hydra.run.dir={tmp_path}/c3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (out / "quarantine" / "ep_000000.npz").exists()
    assert len(Dataset.open(out, validate=True)) == 3  # the whole one kept, two new ones
    r = run_cli("data", "repair", f"path={out}", f"hydra.run.dir={tmp_path}/r", cwd=tmp_path)
    assert r.returncode == 0 and json.loads((tmp_path / "r" / "metrics.json").read_text())["episodes"] == 3
    r = run_cli("data", "mend", f"path={out}", cwd=tmp_path)
    assert r.returncode == 2 and "action must be one of ('validate', 'repair', 'info', 'export', 'import')" in r.stderr
