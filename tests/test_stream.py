"""The streaming training path (embodied.runtime.stream, issue 37): batches read from the episode
files equal the in-memory batches bit for bit, the options are checked, and a dataset that lacks
what training needs, or loses a file while it streams, is named."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.core.errors import DatasetError
from embodied.runtime.data import Dataset, make_windows
from embodied.runtime.stream import DEFAULT_MEMORY_GB, WindowIndex, arrays_bytes
from embodied.runtime.train import Batcher, TrainConfig

TASKS = ["reach", "push"]


def pixel_dataset(root, episodes: int = 12, seed: int = 0) -> Dataset:
    """Random pixel episodes of reach and push (lengths 1..9, so windows pad at both ends)."""
    rng = np.random.default_rng(seed)
    ds = Dataset.create(root, {"state": ("float32", (4,)), "action": ("float32", (3,)), "reward": ("float32", ()),
                               "image": ("uint8", (8, 8, 3)), "privileged_state": ("float32", (6,))})
    for e in range(episodes):
        t = int(rng.integers(1, 10))
        ds.append({"state": rng.normal(size=(t, 4)), "action": rng.uniform(-1, 1, (t, 3)), "reward": rng.random(t),
                   "image": rng.integers(0, 256, (t, 8, 8, 3), dtype=np.uint8),
                   "privileged_state": rng.normal(size=(t, 6))},
                  task=TASKS[e % 2], instruction="", params={"color": ["red", "green", "blue"][e % 3]})
    return ds


def same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("n_obs_steps, horizon", [(1, 1), (2, 8)])
def test_streamed_batches_equal_in_memory_batches(tmp_path, n_obs_steps, horizon):
    ds = pixel_dataset(tmp_path / "ds")
    mem = Batcher(ds, TASKS, n_obs_steps, horizon, True, 7, privileged=True, stream="false")
    streamed = Batcher(ds, TASKS, n_obs_steps, horizon, True, 7, privileged=True, stream="true")
    assert not mem.streamed and streamed.streamed
    for size in (16, 16, 3, 16, 1, 16):  # another batch size takes back the draws made ahead
        same(mem.sample(size), streamed.sample(size))
    streamed.close()
    same(mem.sample(5), streamed.sample(5))  # after close: read in this thread, still the same


def test_grounding_index_is_the_same_streamed(tmp_path):
    ds = pixel_dataset(tmp_path / "ds")
    a = Batcher(ds, TASKS, 1, 4, False, 0, stream="false").grounding(3)
    b = Batcher(ds, TASKS, 1, 4, False, 0, stream="true").grounding(3)
    for name in ("scenes", "scene_tasks", "state_mean", "state_std", "instruction_tasks"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.instructions == b.instructions and a.task_names == b.task_names
    s = np.zeros(4, np.float32)
    assert a.candidate_tasks(s) == b.candidate_tasks(s)


def test_read_gives_the_arrays_np_load_gives(tmp_path):
    ds = pixel_dataset(tmp_path / "ds", episodes=5)
    feats = sorted(ds.features)  # scalar (reward), vector and image features
    for i in range(len(ds)):
        got, want = ds.read(i, feats), ds[i]
        for f in feats:
            assert got[f].dtype == want[f].dtype and np.array_equal(got[f], want[f]), f
    with pytest.raises(DatasetError, match=r"unknown features \['depth'\]"):
        ds.read(0, ["depth"])


def test_window_index_numbers_windows_as_make_windows_lists_them():
    lengths = [3, 1, 5, 2]
    ends = np.cumsum(lengths)
    r = np.arange(int(ends[-1]))
    assert np.array_equal(WindowIndex(lengths)[r], make_windows(ends, horizon=4))


def test_auto_streams_when_the_arrays_exceed_the_budget(tmp_path):
    ds = pixel_dataset(tmp_path / "ds")
    nbytes = arrays_bytes(ds, ("state", "action", "image"), ds.select(TASKS))
    assert nbytes == sum(ds.lengths) * (16 + 12 + 192)
    assert not Batcher(ds, TASKS, 1, 4, True, 0, stream="auto").streamed
    assert Batcher(ds, TASKS, 1, 4, True, 0, stream="auto", memory_gb=nbytes / 2**30 / 2).streamed
    assert not Batcher(ds, TASKS, 1, 4, True, 0, stream="auto", memory_gb=nbytes / 2**30).streamed


@pytest.mark.parametrize("kwargs, named", [
    ({"stream": "sometimes"}, "stream must be one of ('auto', 'true', 'false')"),
    ({"stream": 1}, "stream must be one of ('auto', 'true', 'false')"),
    ({"stream_memory_gb": 0}, "stream_memory_gb must be a number of GB > 0"),
    ({"stream_memory_gb": -2.5}, "got -2.5"),
    ({"stream_memory_gb": "lots"}, "got 'lots'"),
    ({"stream": "true", "stream_memory_gb": 2}, "stream_memory_gb=2 has no effect with stream=true"),
    ({"stream": False, "stream_memory_gb": 2}, "stream_memory_gb=2 has no effect with stream=false"),
])
def test_bad_stream_settings_are_named(kwargs, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**kwargs)


def test_stream_settings_are_normalised_and_resumable():
    from embodied.runtime.train import RESUMABLE

    assert TrainConfig(stream=True).stream == "true" and TrainConfig(stream="FALSE").stream == "false"
    assert TrainConfig().stream == "auto" and TrainConfig().stream_memory_gb == DEFAULT_MEMORY_GB
    assert {"stream", "stream_memory_gb"} <= RESUMABLE  # the batches are the same: not a different run


def test_stream_true_on_the_command_line_is_the_string_true(tmp_path):
    from cli_runner import run_cli

    r = run_cli(["train", "stream=true", "--cfg", "job"], cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and "stream: 'true'" in r.stdout.lower(), r.stderr[-2000:]  # Hydra's bool as a string
    r = run_cli(["train", "stream=maybe", f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "stream must be one of" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("stream", ["true", "false"])
def test_a_feature_the_dataset_lacks_is_named(tmp_path, stream):
    ds = Dataset.create(tmp_path / "ds", {"state": ("float32", (4,)), "action": ("float32", (3,))})
    ds.append({"state": np.zeros((3, 4)), "action": np.zeros((3, 3))}, task="reach", params={"color": "red"})
    with pytest.raises(DatasetError, match=r"unknown features \['image'\]"):
        Batcher(ds, ["reach"], 1, 4, True, 0, stream=stream)
    with pytest.raises(DatasetError, match=r"tasks \['push'\] have no episodes"):
        Batcher(ds, ["reach", "push"], 1, 4, False, 0, stream=stream)


def test_a_folder_that_is_not_a_dataset_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DatasetError, match="is not a dataset: .*meta.json is missing"):
        Dataset.open(tmp_path)


def test_an_episode_file_damaged_while_streaming_is_named(tmp_path):
    ds = pixel_dataset(tmp_path / "ds", episodes=4)
    b = Batcher(ds, TASKS, 1, 4, True, 0, stream="true")
    b.sample(8)
    victim = tmp_path / "ds/episodes" / ds.episodes_meta[0]["file"]
    victim.write_bytes(victim.read_bytes()[:40])
    with pytest.raises(DatasetError, match=victim.name):
        for _ in range(20):  # the batch read ahead may not touch it; one of the next does
            b.sample(8)
    b.close()


@pytest.mark.slow
def test_train_streamed_gives_the_in_memory_loss_curve(tmp_path):
    """Two short runs of one config, in memory and streamed: the same losses (the same batches)."""
    from embodied.runtime.train import train

    common = dict(tasks=["reach"], demos=4, eval_episodes=1, num_envs=1, videos=0, threads=1, workers=1, batch_size=8,
                  steps=30, save_every=30, snapshot_every=0, policy={"name": "mlp"}, progress=False,
                  dataset=str(tmp_path / "ds"))
    curves = {}
    for stream in ("false", "true"):
        m = train(TrainConfig(**common, stream=stream), tmp_path / f"run-{stream}")
        assert m["streamed"] is (stream == "true") and m["train_peak_rss_mb"] > 0
        curves[stream] = losses(tmp_path / f"run-{stream}/tb")
    assert len(curves["true"]) == 2 and curves["true"] == curves["false"]


def losses(tb) -> list[tuple[int, float]]:
    """(step, training loss) as TensorBoard recorded them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("train/loss")]
