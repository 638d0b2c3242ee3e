"""Datasets in and out as LeRobotDataset v3 (embodied/runtime/lerobot.py), read back with the
library's own ``LeRobotDataset``; nothing is downloaded (every folder is made here).

Video tolerance: cameras go out as AV1 (libsvtav1, the library's default: CRF 30, 4:2:0
chroma), a lossy codec, so frames come back close, not equal. At 32 px a rendered frame
comes back within a mean absolute error of ``VIDEO_MAE`` = 10 grey levels (of 255; measured
4-5), with most pixels within ``VIDEO_PIXEL`` = 24 levels; edges between coloured objects
lose most (4:2:0 keeps one colour sample per 2x2 pixels), which is why a per-pixel bound
would have to be loose. Everything else (state, action, rewards, flags) is compared exactly.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from embodied.core.errors import DatasetError
from embodied.runtime import lerobot
from embodied.runtime.data import Dataset

VIDEO_MAE = 10.0  # mean absolute error per frame, grey levels of 255
VIDEO_PIXEL = 24  # the 90th percentile of the per-pixel error, grey levels


@pytest.fixture(scope="module", autouse=True)
def _datasets_cache(tmp_path_factory):
    """The library reads parquet through ``datasets``, which keeps an arrow copy in its cache: a
    temporary one here, not the user's ~/.cache/huggingface/datasets."""
    import datasets

    mp = pytest.MonkeyPatch()
    cache = tmp_path_factory.mktemp("hf-datasets-cache")
    mp.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    mp.setenv("HF_DATASETS_CACHE", str(cache))  # the command-line tests' interpreters
    yield
    mp.undo()


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """Two short reach datasets from the scripted expert: state only, and two 32 px cameras."""
    from embodied.runtime.collect import collect

    root = tmp_path_factory.mktemp("collected")
    collect(["reach"], root / "state", 3, progress=False)
    collect(["reach"], root / "pixels", 2, obs_mode="pixels", image_size=32, cameras=["side", "top"], progress=False)
    return root


@pytest.fixture(scope="module")
def exported(collected, tmp_path_factory):
    out = tmp_path_factory.mktemp("exported")
    for name in ("state", "pixels"):
        lerobot.export_lerobot(collected / name, out / name, progress=False)
    return out


def _library(path: Path):
    from ledataset.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(f"local/{path.name}", root=path)


def _frames(x) -> np.ndarray:
    return lerobot._to_uint8_hwc(x)


@pytest.mark.parametrize("name", ["state", "pixels"])
def test_export_reads_back_with_the_library_frame_by_frame(collected, exported, name):
    src, lr = Dataset.open(collected / name), _library(exported / name)
    assert lr.meta.info["codebase_version"].startswith("v3.")
    assert (lr.num_episodes, lr.num_frames) == (len(src), sum(src.lengths))
    cams = [k[len("images/"):] for k in src.features if k.startswith("images/")]
    assert sorted(lr.meta.video_keys) == sorted(f"observation.images.{c}" for c in cams)
    j, errors = 0, []
    for i in range(len(src)):
        ep = src[i]
        for t in range(ep["length"]):
            item = lr[j]
            j += 1
            assert int(item["episode_index"]) == i and int(item["frame_index"]) == t
            assert item["task"] == ep["instruction"]
            for ours, theirs in (("state", "observation.state"), ("action", "action"),
                                 ("privileged_state", "observation.environment_state")):
                if ours in ep:
                    np.testing.assert_array_equal(item[theirs].numpy(), ep[ours][t])
            assert float(item["next.reward"]) == ep["reward"][t]
            assert float(item["reward_terms.reach"]) == ep["reward_terms/reach"][t]
            last = t == ep["length"] - 1
            assert bool(item["next.done"]) == last and bool(item["next.success"]) == (last and ep["success"])
            for c in cams:
                err = np.abs(_frames(item[f"observation.images.{c}"]).astype(int) - ep[f"images/{c}"][t])
                errors.append(err.mean())
                assert err.mean() <= VIDEO_MAE and np.percentile(err, 90) <= VIDEO_PIXEL, (c, i, t, err.mean())
    assert j == lr.num_frames
    if cams:
        assert np.mean(errors) <= VIDEO_MAE / 2


@pytest.mark.parametrize("name", ["state", "pixels"])
def test_import_gives_back_the_original(collected, exported, tmp_path, name):
    report = lerobot.import_lerobot(exported / name, tmp_path / "back", progress=False)
    a, b = Dataset.open(collected / name), Dataset.open(tmp_path / "back")
    assert report["with_embodied_meta"] and report["episodes"] == len(a)
    assert (b.features, b.info, b.lengths) == (a.features, a.info, a.lengths)
    index = ("episode", "file", "bytes")
    assert [{k: v for k, v in m.items() if k not in index} for m in b.episodes_meta] == \
           [{k: v for k, v in m.items() if k not in index} for m in a.episodes_meta]
    for i in range(len(a)):
        x, y = a[i], b[i]
        for k in a.features:
            assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape, k
            if k.startswith("image"):
                assert np.abs(x[k].astype(int) - y[k]).mean() <= VIDEO_MAE / 2, k
            else:
                np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_a_robot_run_recording_keeps_its_flags(tmp_path):
    """``embodied robot run`` adds policy_action, intervention and hold; the episode's safety counts ride along."""
    feats = {"state": ("float32", (3,)), "action": ("float32", (2,)), "reward": ("float32", ()),
             "policy_action": ("float32", (2,)), "intervention": ("bool", ()), "hold": ("bool", ())}
    ds = Dataset.create(tmp_path / "run", feats, {"source": "embodied robot run", "robot": "SimRobot"})
    rng = np.random.default_rng(0)
    for n, success in ((5, True), (4, False)):
        hold = np.arange(n) == 1
        ds.append({"state": rng.normal(size=(n, 3)).astype(np.float32), "action": rng.normal(size=(n, 2)),
                   "reward": np.zeros(n), "policy_action": np.where(hold[:, None], 0, rng.normal(size=(n, 2))),
                   "intervention": hold | (np.arange(n) == 3), "hold": hold},
                  task="reach", instruction="", seed=n, success=success, ended_by="done", interventions=2)
    lerobot.export_lerobot(tmp_path / "run", tmp_path / "out", progress=False)
    lr = _library(tmp_path / "out")
    assert lr[0]["task"] == "reach"  # no instruction: the task name is the task string
    got = np.stack([lr[j]["intervention"].numpy() for j in range(len(lr))]).ravel()
    want = np.concatenate([ds[i]["intervention"] for i in range(len(ds))])
    np.testing.assert_array_equal(got, want)
    lerobot.import_lerobot(tmp_path / "out", tmp_path / "back", progress=False)
    back = Dataset.open(tmp_path / "back")
    assert back.features == ds.features
    for i in range(len(ds)):
        for k in feats:
            np.testing.assert_array_equal(back[i][k], ds[i][k], err_msg=k)
        assert back[i]["interventions"] == 2 and back[i]["success"] == ds[i]["success"]


def _foreign(root: Path, features: dict, episodes=((6, "pick up the red cube"), (4, "stack the blocks"))) -> Path:
    """A user's own recording, written with the library (no meta/embodied.json)."""
    from ledataset.datasets.lerobot_dataset import LeRobotDataset

    lr = LeRobotDataset.create("me/arm", fps=30, features=features, root=root, robot_type="so100")
    rng = np.random.default_rng(1)
    for n, words in episodes:
        for _ in range(n):
            frame = {k: rng.normal(size=f["shape"]).astype(f["dtype"]) for k, f in features.items()}
            lr.add_frame({**frame, "task": words})
        lr.save_episode()
    lr.finalize()
    return root


def test_a_users_recording_needs_only_state_action_and_task(tmp_path):
    feats = {"observation.state": {"dtype": "float32", "shape": (4,), "names": None},
             "action": {"dtype": "float32", "shape": (4,), "names": None}}
    _foreign(tmp_path / "arm", feats)
    report = lerobot.import_lerobot(tmp_path / "arm", tmp_path / "ours", task="reach", progress=False)
    ds = Dataset.open(tmp_path / "ours")
    assert not report["with_embodied_meta"] and ds.lengths == [6, 4] and set(ds.features) == {"state", "action"}
    assert [(m["task"], m["instruction"]) for m in ds.episodes_meta] == [("reach", "pick up the red cube"),
                                                                         ("reach", "stack the blocks")]
    assert ds.info["lerobot"]["fps"] == 30 and ds.info["observation_spec"]["state_dim"] == 4
    # train reads such a folder directly, imported once into the run folder; the episodes keep their own words
    from embodied.runtime.train import Batcher, TrainConfig, _ensure_dataset

    cfg = TrainConfig(tasks=["reach"], dataset=str(tmp_path / "arm"), progress=False, workers=1)
    run = tmp_path / "run"
    got = _ensure_dataset(cfg, ["reach"], run)
    assert got.root == run / "lerobot-import" and got.lengths == [6, 4]
    batch = Batcher(got, ["reach"], 1, 2, False, 0).sample(8)
    assert set(batch["instruction"]) <= {"pick up the red cube", "stack the blocks"}


def test_train_reads_an_export_of_ours_as_the_original(collected, exported, tmp_path):
    from embodied.runtime.train import TrainConfig, _ensure_dataset

    cfg = TrainConfig(tasks=["reach"], dataset=str(exported / "state"), progress=False, workers=1)
    got, want = _ensure_dataset(cfg, ["reach"], tmp_path), Dataset.open(collected / "state")
    assert got.stats == want.stats and [m["params"] for m in got.episodes_meta] == \
        [m["params"] for m in want.episodes_meta]


def test_bad_folders_are_named(collected, exported, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="empty is not a LeRobotDataset .it has no meta/info.json"):
        lerobot.import_lerobot(tmp_path / "empty", tmp_path / "x")
    with pytest.raises(DatasetError, match="holds an embodied dataset"):
        lerobot.import_lerobot(collected / "state", tmp_path / "x")
    with pytest.raises(DatasetError, match="is a LeRobotDataset already"):
        lerobot.export_lerobot(exported / "state", tmp_path / "x")
    with pytest.raises(DatasetError, match="is not a dataset"):
        lerobot.dataset_info(tmp_path / "empty")
    old = tmp_path / "old"
    shutil.copytree(exported / "state", old)
    info = json.loads((old / "meta/info.json").read_text())
    (old / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v2.1"}))
    with pytest.raises(DatasetError, match=r"codebase version 'v2.1': this reads v3.x only \(convert"):
        lerobot.import_lerobot(old, tmp_path / "x")
    (old / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v4.0"}))
    with pytest.raises(DatasetError, match="codebase version 'v4.0': this reads v3.x only"):
        lerobot.dataset_info(old)
    feats = {"observation.state": {"dtype": "float32", "shape": (4,), "names": None}}
    _foreign(tmp_path / "no-action", feats, episodes=((3, "wave"),))
    with pytest.raises(DatasetError, match="has no 'action' feature: a dataset to import needs observation.state "
                                           "and action"):
        lerobot.import_lerobot(tmp_path / "no-action", tmp_path / "x")
    with pytest.raises(DatasetError, match="exists and is not empty"):
        lerobot.export_lerobot(collected / "state", exported / "pixels")
    assert not (tmp_path / "x").exists()


def test_without_the_library_export_says_how_to_install_it(collected, tmp_path, monkeypatch):
    """setup.sh installs lerobot-dataset with --no-deps (its huggingface-hub cap), so a plain pip install of
    embodied lacks it: one line naming the fix, and nothing written."""
    from embodied.core.errors import EmbodiedError

    monkeypatch.setitem(sys.modules, "ledataset.datasets", None)  # the import fails as if it were not installed
    with pytest.raises(EmbodiedError, match=r"needs the lerobot-dataset package .*run ./setup.sh, or pip install "
                                            r"--no-deps lerobot-dataset==0.4.4"):
        lerobot.export_lerobot(collected / "state", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_an_interrupted_export_leaves_nothing(collected, tmp_path, monkeypatch):
    from ledataset.datasets.lerobot_dataset import LeRobotDataset

    real, calls = LeRobotDataset.save_episode, []

    def ctrl_c_on_the_second(self, *a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *a, **kw)

    monkeypatch.setattr(LeRobotDataset, "save_episode", ctrl_c_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        lerobot.export_lerobot(collected / "state", tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []
    # a dead writer's leftover (kill -9) goes on the next run
    stale = tmp_path / ".out.partial-999999999"
    stale.mkdir()
    monkeypatch.setattr(LeRobotDataset, "save_episode", real)
    lerobot.export_lerobot(collected / "state", tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def run_cli(*args, cwd, code=""):
    """``embodied ARGS``; with ``code`` (e.g. a patch) run first in the command's process."""
    from cli_runner import run_cli as warm

    return warm(args, cwd=cwd, timeout=300, prelude=code)


def test_the_commands(collected, exported, tmp_path):
    """export|import|info from the command line; a bad folder is one line with exit 2; Ctrl-C exits 130
    and leaves no folder behind."""
    (tmp_path / "empty").mkdir()
    r = run_cli("data", "import", "src=empty", "out=x", f"hydra.run.dir={tmp_path}/r1", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "empty is not a LeRobotDataset" in r.stderr and "meta/info.json" in r.stderr
    r = run_cli("data", "info", f"path={exported / 'pixels'}", f"hydra.run.dir={tmp_path}/r2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "r2/metrics.json").read_text())
    assert report["format"] == "LeRobotDataset" and report["embodied_meta"] and len(report["cameras"]) == 2
    patch = ("from ledataset.datasets.lerobot_dataset import LeRobotDataset\n"
             "def _interrupt(self, *a, **kw): raise KeyboardInterrupt\n"
             "LeRobotDataset.save_episode = _interrupt")
    r = run_cli("data", "export", f"src={collected / 'state'}", "out=out", "progress=false",
                f"hydra.run.dir={tmp_path}/r3", cwd=tmp_path, code=patch)
    assert r.returncode == 130, r.stderr
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    r = run_cli("data", "import", f"src={exported / 'state'}", "out=back", "progress=false",
                f"hydra.run.dir={tmp_path}/r4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert Dataset.open(tmp_path / "back").lengths == Dataset.open(collected / "state").lengths
