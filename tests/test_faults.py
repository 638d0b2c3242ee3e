"""Bad input at the boundaries gets a clear error that names the problem, not a raw traceback:
damaged checkpoints, devices that do not exist here, observations that change shape or carry
NaN mid-episode; and runs that cannot lie: a rerun resumes only the same run and never
goes back, no command writes over another's results, settings without effect are refused, Ctrl-C
says what was kept."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli
import torch

from embodied.core.errors import InvalidObservationError
from embodied.core.policy import Policy
from embodied.core.specs import ActionSpec, ObservationSpec
from policies import load_policy, make_policy, save_policy
from policies.common.base import resolve_device


def tiny(tmp_path):
    stats = {"state": {"mean": np.zeros(3), "std": np.ones(3), "min": -np.ones(3), "max": np.ones(3)},
             "action": {"mean": np.zeros(2), "std": np.ones(2), "min": -np.ones(2), "max": np.ones(2)}}
    cfg = dict(n_obs_steps=1, horizon=4, n_action_steps=4, state_hidden=16, obs_dim=8, text_dim=8, hidden=16,
               n_layers=1, time_emb_dim=8, num_inference_steps=2, ema=False)
    policy = make_policy("flow", cfg, ObservationSpec(3), ActionSpec(2), stats, ["reach"], device="cpu")
    save_policy(policy, tmp_path / "ck")
    return policy, tmp_path / "ck"


def test_a_truncated_weights_file_is_named(tmp_path):
    _, ck = tiny(tmp_path)
    weights = ck / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"model\.safetensors is damaged or truncated"):
        load_policy(str(ck), device="cpu")


def test_a_config_that_is_json_but_not_an_object_is_named(tmp_path):
    _, ck = tiny(tmp_path)
    (ck / "config.json").write_text(json.dumps(["flow"]))
    with pytest.raises(ValueError, match=r"config\.json must hold a JSON object .* got a list"):
        load_policy(str(ck), device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: device=cuda is valid here")
def test_cuda_without_a_gpu_says_so_and_names_auto():
    with pytest.raises(ValueError, match="no CUDA GPU; device=auto picks what exists"):
        resolve_device("cuda")


def test_an_unknown_device_lists_the_choices():
    with pytest.raises(ValueError, match="device='gpu0' is not a torch device.*use auto, cpu or cuda"):
        resolve_device("gpu0")
    assert resolve_device("cpu") == torch.device("cpu")


class Queue(Policy):
    """Four actions per chunk, so three steps run from the queue without a new prediction."""

    n_obs_steps, horizon, n_action_steps = 1, 4, 4

    def predict_chunk(self, obs_batch, noise=None):
        return np.zeros((1, 4, 2), np.float32)


@pytest.mark.parametrize("bad, match", [(np.zeros(4), r"shape \(4,\), but this episode's states have shape \(3,\)"),
                                        (np.array([0.0, np.nan, 0.0]), "NaN/inf")])
def test_a_bad_state_is_refused_while_actions_are_queued(bad, match):
    p = Queue()
    p.act({"state": np.zeros(3), "instruction": "reach"})
    with pytest.raises(InvalidObservationError, match=match):
        p.act({"state": bad, "instruction": "reach"})


def test_a_torch_policy_refuses_a_bad_state_mid_chunk(tmp_path):
    policy, _ = tiny(tmp_path)
    policy.act({"state": np.zeros(3, np.float32), "instruction": "reach"})
    with pytest.raises(InvalidObservationError, match="NaN/inf"):
        policy.act({"state": np.full(3, np.inf, np.float32), "instruction": "reach"})


def cli(*args, cwd):
    return run_cli(args, cwd=cwd, timeout=300)


@pytest.mark.parametrize("args, message", [
    (("eval", "seed=-1"), "seed must be >= 0"),
    (("collect", "seed=-5", "out=ds"), "seed must be >= 0"),
])
def test_negative_seeds_are_refused_and_leave_nothing_behind(tmp_path, args, message):
    r = cli(*args, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "ds").exists()


# ---- runs that cannot lie -------------------------------------------------------------------------

TINY = ("tasks=[reach]", "demos=2", "eval_episodes=1", "num_envs=1", "videos=0", "threads=1", "workers=1",
        "batch_size=8", "save_every=2", "snapshot_every=2", "policy=mlp", "progress=false")


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes): a folder's whole record."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 3-step training run of the MLP on reach (its dataset beside it)."""
    root = tmp_path_factory.mktemp("trained")
    r = cli("train", *TINY, "steps=3", f"dataset={root}/ds", f"hydra.run.dir={root}/run", cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    return root


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the trained run, to rerun into (the dataset is shared: it is recorded by path)."""
    shutil.copytree(trained / "run", tmp_path / "run")
    return tmp_path / "run"


def rerun(run: Path, trained: Path, *args: str) -> subprocess.CompletedProcess:
    return cli("train", *TINY, f"dataset={trained}/ds", *args, f"hydra.run.dir={run}", cwd=run.parent)


@pytest.mark.slow
@pytest.mark.parametrize("change, named", [
    (("policy=flow",), "policy.name: recorded 'mlp', now 'flow'"),
    (("tasks=[push]",), "tasks: recorded ['reach'], now ['push']"),
    (("policy.hidden=32",), "policy.hidden: recorded {hidden}, now 32"),  # {hidden}: the checkpoint's
    (("batch_size=4", "demos=3"), "batch_size: recorded 8, now 4; demos: recorded 2, now 3"),
])
def test_resume_refuses_a_rerun_with_other_settings_and_names_each(run, trained, change, named):
    before = tree(run)
    named = named.format(hidden=json.loads((run / "checkpoint/config.json").read_text())["config"]["hidden"])
    r = rerun(run, trained, "steps=5", *change)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("embodied train: error: ") and named in line, line
    assert "hydra.run.dir" in line and "restart=true" in line  # the ways out
    assert tree(run) == before  # nothing written, Hydra's .hydra/ files included


@pytest.mark.slow
def test_resume_of_a_run_from_before_the_record_checks_its_checkpoint(run, trained):
    (run / "checkpoint" / "train_run.json").unlink()  # as written before the record existed
    (run / "embodied-run.json").unlink()
    r = rerun(run, trained, "steps=5", "policy=flow")
    assert r.returncode == 2 and "policy.name: recorded 'mlp', now 'flow'" in r.stderr, r.stderr[-3000:]


@pytest.mark.slow
def test_restart_moves_the_old_run_aside_and_starts_over(run, trained):
    before = tree(run)
    r = rerun(run, trained, "steps=2", "policy=flow", "restart=true")
    assert r.returncode == 0, r.stderr[-3000:]
    assert tree(run.with_name("run.old-1")) == before  # every file of the old run, as it was
    m = json.loads((run / "metrics.json").read_text())
    assert m["policy"] == "flow" and m["steps"] == 2 and m["resumed_from_step"] == 0
    assert json.loads((run / "checkpoint/config.json").read_text())["policy"] == "flow"


@pytest.mark.slow
def test_fewer_steps_than_done_are_refused_and_no_snapshot_is_mislabelled(run, trained):
    before = tree(run)
    r = rerun(run, trained, "steps=2")
    assert r.returncode == 2 and "has trained 3 steps; steps=2 would go back" in r.stderr, r.stderr[-3000:]
    assert tree(run) == before  # no step_0000002 rewritten, no counter moved back, no negative samples/s


@pytest.mark.slow
def test_a_finished_run_rerun_with_its_steps_says_so_and_does_not_train(run, trained):
    before = tree(run)
    r = rerun(run, trained, "steps=3")
    assert r.returncode == 0 and "finished at step 3" in r.stderr and "nothing to train" in r.stderr, r.stderr[-3000:]
    assert tree(run) == before


@pytest.mark.slow
def test_a_resumed_run_continues_and_labels_snapshots_by_their_step(run, trained):
    r = rerun(run, trained, "steps=5", "eval_episodes=2")  # eval settings may change on resume
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((run / "metrics.json").read_text())
    assert (m["steps"], m["resumed_from_step"]) == (5, 3) and m["train_samples_per_s"] > 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_0000002", "step_0000003", "step_0000004", "step_0000005"]
    assert json.loads((run / "checkpoint/train_run.json").read_text())["step"] == 5
    assert (run / ".hydra/previous/1/config.yaml").is_file()  # the first invocation's record is kept


def test_a_command_never_writes_over_another_commands_results(tmp_path):
    collected = tmp_path / "collect"
    r = cli("collect", "tasks=[reach]", "episodes=1", f"out={tmp_path}/ds", "progress=false",
            f"hydra.run.dir={collected}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((collected / "embodied-run.json").read_text()) == {"command": "collect"}
    legacy = tmp_path / "train"  # a training run written before the marker existed
    (legacy / "checkpoint").mkdir(parents=True)
    (legacy / "metrics.json").write_text('{"success_rate": 0.5}')
    for folder, owner in ((collected, "collect"), (legacy, "train")):
        before = tree(folder)
        r = cli("eval", "tasks=[reach]", "episodes=1", "videos=0", f"hydra.run.dir={folder}", cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert f"holds the results of `embodied {owner}`" in r.stderr and f"hydra.run.dir={folder}/eval" in r.stderr
        assert tree(folder) == before
    r = cli("eval", "tasks=[reach]", "episodes=1", "videos=0", "progress=false", f"hydra.run.dir={collected}/eval",
            cwd=tmp_path)  # the way out it names works, and a command may run again in its own folder
    assert r.returncode == 0, r.stderr[-3000:]
    r = cli("eval", "tasks=[reach]", "episodes=1", "videos=0", "progress=false", f"hydra.run.dir={collected}/eval",
            cwd=tmp_path)
    assert r.returncode == 0 and (collected / "eval/.hydra/previous/1/config.yaml").is_file(), r.stderr[-3000:]


def test_an_empty_instruction_list_is_an_error(tmp_path):
    from embodied.commands.app import compose
    from embodied.commands.user_errors import user_error
    from embodied.core.registry import make_env
    from embodied.runtime.eval_job import EvalConfig, load_instructions

    with pytest.raises(Exception) as e:
        compose("eval", EvalConfig, ["tasks=[reach]", "+instructions.reach=[]"])
    assert "instructions.reach must be a non-empty list" in user_error(e.value)
    with pytest.raises(ValueError, match=r"instructions=\[\] is empty"):
        make_env("reach", instructions=[])
    (tmp_path / "none.yaml").write_text("{}\n")
    with pytest.raises(ValueError, match="names none"):
        load_instructions(str(tmp_path / "none.yaml"))
    (tmp_path / "blank.yaml").write_text("reach: ['  ']\n")
    with pytest.raises(ValueError, match="task 'reach' must be a non-empty list"):
        load_instructions(str(tmp_path / "blank.yaml"))


def test_a_template_field_the_task_lacks_is_named_before_any_episode(tmp_path, monkeypatch):
    import embodied.runtime.eval_job as eval_module
    from embodied.runtime.eval_job import EvalConfig, run_eval

    def no_episodes(*args, **kwargs):
        raise AssertionError("an episode ran before the templates were checked")

    monkeypatch.setattr(eval_module, "evaluate", no_episodes)
    cfg = EvalConfig(tasks=["reach"], episodes=1, videos=0, progress=False,
                     instructions={"reach": ["go to the {color} block", "go to the {colour} block"]})
    with pytest.raises(ValueError, match=r"'go to the \{colour\} block' uses field 'colour'.*fields: \['color'"):
        run_eval(cfg, tmp_path)


@pytest.mark.parametrize("schema, kwargs, named", [
    ("eval", {"checkpoint": "ck", "policy": {"name": "flow", "horizon": 16}},
     "policy='flow' (and its fields) has no effect"),
    ("eval", {"checkpoints": ["a", "b"], "policy": {"name": "mlp"}}, "policy='mlp' has no effect"),
    ("eval", {"num_inference_steps": 4}, "num_inference_steps=4 has no effect on the scripted experts"),
    ("eval", {"ground_instructions": True}, "ground_instructions=True has no effect on the scripted experts"),
    ("play", {"checkpoint": "ck", "policy": {"name": "diffusion"}}, "policy='diffusion' has no effect"),
    ("play", {"ground_instructions": False}, "ground_instructions=False has no effect"),
])
def test_a_setting_without_effect_is_an_error_naming_it(schema, kwargs, named):
    from embodied.runtime.eval_job import EvalConfig
    from embodied.runtime.play import PlayConfig

    with pytest.raises(ValueError, match=re.escape(named)):
        {"eval": EvalConfig, "play": PlayConfig}[schema](**kwargs)


def test_policy_name_beside_a_checkpoint_on_the_command_line_is_refused(tmp_path):
    r = cli("eval", "checkpoint=/nonexistent", "policy.name=flow", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 2 and "policy='flow' has no effect with checkpoint=" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "run").exists()  # refused before Hydra made the folder


def test_step_before_reset_is_a_clear_error():
    import gymnasium as gym

    from embodied.core.registry import make_env

    for task in ("reach", "goto-room"):
        env = make_env(task)
        with pytest.raises(gym.error.ResetNeeded, match="step\\(\\) before reset\\(\\)"):
            env.step(np.zeros(env.action_space.shape, np.float32))
        env.reset(seed=0)
        env.step(np.zeros(env.action_space.shape, np.float32))  # after reset it steps
        env.close()


@pytest.mark.parametrize("size", [0, -4, 4096])
def test_render_size_out_of_range_is_refused_at_construction(size):
    from embodied.core.registry import make_env

    with pytest.raises(ValueError, match=f"render_size must be in .* got {size}"):
        make_env("reach", render_mode="rgb_array", render_size=size)


@pytest.mark.parametrize("k", [0, 5, 1.5, True])
def test_supersample_out_of_range_is_refused_at_construction(k):
    from embodied.core.registry import make_env

    with pytest.raises(ValueError, match=r"supersample must be an integer in \[1, 4\]"):
        make_env("reach", render_mode="rgb_array", render_size=32, supersample=k)
    with pytest.raises(ValueError, match="supersample=4 draws frames of 4096 pixels"):
        make_env("reach", render_mode="rgb_array", render_size=1024, supersample=4)


def test_train_passes_on_corrupt_to_the_dataset(tmp_path):
    from embodied.core.errors import DatasetError
    from embodied.runtime.collect import collect
    from embodied.runtime.train import TrainConfig, _ensure_dataset

    collect(["reach"], tmp_path / "ds", 2, progress=False)
    victim = sorted((tmp_path / "ds/episodes").iterdir())[1]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])

    def cfg(on_corrupt):
        return TrainConfig(tasks=["reach"], demos=1, dataset=str(tmp_path / "ds"), on_corrupt=on_corrupt,
                           progress=False, workers=1)

    with pytest.raises(DatasetError, match="truncated"):
        _ensure_dataset(cfg("raise"), ["reach"])
    with pytest.warns(UserWarning, match="skipped"):
        assert len(_ensure_dataset(cfg("skip"), ["reach"])) == 1
    assert victim.exists()  # skip leaves the file where it is
    with pytest.raises(ValueError, match="on_corrupt must be one of"):
        cfg("ignore")


def sigint_as_by_default() -> None:
    """``preexec_fn`` of a child that is sent Ctrl-C: a background job of a non-interactive shell
    ignores SIGINT and its children inherit that, so Python would install no KeyboardInterrupt
    handler and the test would wait for an exit that never comes."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt(args: list[str], cwd: Path, ready) -> tuple[int, str]:
    """Start ``embodied ARGS``, send Ctrl-C (SIGINT) once ``ready(output so far)`` holds; (status, output)."""
    import threading
    import time

    p = subprocess.Popen([sys.executable, "-m", "embodied.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, preexec_fn=sigint_as_by_default)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(p.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.time() + 600
        while not ready("".join(out)):
            assert p.poll() is None and time.time() < deadline, "".join(out)[-3000:]
            time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running 120 s after Ctrl-C; its SIGINT is {sigint_disposition(p.pid)}\n"
                                 + "".join(out)[-3000:]) from None
    finally:  # a failed check never leaves the command running beside the next tests
        if p.poll() is None:
            p.kill()
            p.wait()
    reader.join(timeout=60)
    return p.returncode, "".join(out)


def sigint_disposition(pid: int) -> str:
    """Whether process ``pid`` blocks, ignores or catches SIGINT (from /proc), for a failure message."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as e:
        return f"unknown ({e})"
    masks = {k: int(status.split(f"{k}:")[1].split()[0], 16) for k in ("SigBlk", "SigIgn", "SigCgt")}
    bit = 1 << (signal.SIGINT - 1)
    return ", ".join(f"{k}={'yes' if m & bit else 'no'}" for k, m in masks.items())


def test_ctrl_c_inside_a_zip_write_comes_out_as_an_interrupt_and_leaves_no_file(tmp_path):
    """np.savez writes through zipfile, whose clean-up raises ValueError when Ctrl-C lands between
    its writes; atomic_write hands the interrupt on (so a command exits 130, not with that error)."""
    import contextlib
    import zipfile

    from embodied.core.files import atomic_write

    left: list = []

    def interrupted_savez(f):
        with zipfile.ZipFile(f, "w") as z:
            handle = z.open("state.npy", "w")
            left.extend([handle, z])
            handle.write(b"half an array")
            raise KeyboardInterrupt  # Ctrl-C while an entry is open

    with pytest.raises(KeyboardInterrupt) as caught:
        atomic_write(tmp_path / "ep.npz", interrupted_savez)
    assert "Can't close the ZIP file" in str(caught.value.__cause__)  # what it would have been
    assert list(tmp_path.iterdir()) == []  # neither the episode nor its temporary file
    for part in left:  # their file is closed: shut them here, not in the garbage collector
        with contextlib.suppress(ValueError, OSError):
            part.close()

    def broken(f):
        raise ValueError("not an interrupt")

    with pytest.raises(ValueError, match="not an interrupt"):  # other errors pass unchanged
        atomic_write(tmp_path / "ep.npz", broken)


@pytest.mark.slow
def test_ctrl_c_in_collect_says_what_was_kept_and_exits_130(tmp_path):
    code, out = interrupt(["collect", "tasks=[reach]", "episodes=100000", f"out={tmp_path}/ds", "progress=false",
                           f"hydra.run.dir={tmp_path}/run"], tmp_path,
                          lambda _: len(list((tmp_path / "ds/episodes").glob("*.npz"))) >= 2)
    assert code == 130 and "Traceback" not in out, out[-3000:]
    assert "complete episodes are safe in" in out and out.strip().endswith("embodied collect: interrupted")
    from embodied.runtime.data import Dataset

    assert len(Dataset.open(tmp_path / "ds", validate=True)) >= 2  # every episode written is whole


@pytest.mark.slow
@pytest.mark.parametrize("stream", ["false", "true"])  # true: a thread reads the next batch when Ctrl-C comes
def test_ctrl_c_in_train_says_what_was_kept_and_exits_130(trained, tmp_path, stream):
    record = tmp_path / "run/checkpoint/train_run.json"  # written at the first save (save_every=2)
    code, out = interrupt(["train", *TINY, "steps=1000000", f"stream={stream}", f"dataset={trained}/ds",
                           f"hydra.run.dir={tmp_path}/run"], tmp_path, lambda _: record.is_file())
    assert code == 130 and "Traceback" not in out, out[-3000:]
    m = re.search(r"interrupted at step (\d+) of 1000000: (\S+) holds the policy at step \1", out)
    assert m and out.strip().endswith("embodied train: interrupted"), out[-3000:]
    assert json.loads((tmp_path / "run/checkpoint/train_run.json").read_text())["step"] == int(m.group(1))


PLAY_LINES = ("""embodied play task=pick "instruction='lift the cube, then hold it'\"""",
              """embodied play task=pick instruction="\\"don't drop the cube, please\\\"\"""")


def test_help_documents_quoting_and_its_command_lines_work(tmp_path):
    import shlex

    r = cli("play", "--help", cwd=tmp_path)
    assert r.returncode == 0 and all(line in r.stdout for line in PLAY_LINES), r.stdout[-2000:]
    assert "instruction_file=" in r.stdout
    for k, line in enumerate(PLAY_LINES):  # the words a shell passes for each documented line
        args = shlex.split(line)[2:]
        r = cli("play", *args, "render_size=32", f"hydra.run.dir={tmp_path}/{k}", cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        want = ("lift the cube, then hold it", "don't drop the cube, please")[k]
        assert json.loads((tmp_path / f"{k}/metrics.json").read_text())["instruction"] == want
    r = cli("play", "instruction=don't drop it", f"hydra.run.dir={tmp_path}/bad", cwd=tmp_path)  # unquoted
    assert r.returncode == 2 and "instruction_file=PATH" in r.stderr and "Traceback" not in r.stderr


def test_play_reads_the_instruction_from_a_file(tmp_path):
    words = tmp_path / "words.txt"
    words.write_text("don't drop the {color} cube, then [wait]\n")
    r = cli("play", "task=pick", f"instruction_file={words}", "render_size=32", f"hydra.run.dir={tmp_path}/run",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads((tmp_path / "run/metrics.json").read_text())
    assert m["instruction"].startswith("don't drop the ") and m["instruction"].endswith(" cube, then [wait]")
    assert "{color}" not in m["instruction"] and m["instruction_file"] == str(words)
    words.write_text("one\ntwo\n")
    r = cli("play", f"instruction_file={words}", f"hydra.run.dir={tmp_path}/two", cwd=tmp_path)
    assert r.returncode == 2 and "holds 2 lines" in r.stderr


def test_train_precision_is_fp32_or_bf16_and_bf16_needs_the_cpu_for_it():
    import torch

    from embodied.runtime.train import TrainConfig, _autocast

    with pytest.raises(ValueError, match=r"precision must be one of \('fp32', 'bf16'\), got 'fp16'"):
        TrainConfig(precision="fp16")
    a, b = torch.ones(4, 4), torch.ones(4, 4)
    with _autocast("fp32", torch.device("cpu"))():
        assert (a @ b).dtype == torch.float32
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        with _autocast("bf16", torch.device("cpu"))():
            assert (a @ b).dtype == torch.bfloat16
    else:
        with pytest.raises(ValueError, match="no bf16 instructions"):
            _autocast("bf16", torch.device("cpu"))


def test_ctrl_c_during_a_checkpoint_write_waits_for_the_write_and_then_interrupts(tmp_path):
    """A Ctrl-C raised inside shutil.rmtree can surface as an OSError (exit 1) and leave a half-swapped
    checkpoint; train holds it through every write and raises KeyboardInterrupt once the write is whole."""
    import os

    from embodied.runtime.train import _held_interrupts, _save

    policy, _ = tiny(tmp_path / "made")
    out = tmp_path / "run"
    opt = torch.optim.Adam(policy.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    _save(policy, opt, sched, 1, [], out)
    with pytest.raises(KeyboardInterrupt):
        with _held_interrupts():
            os.kill(os.getpid(), signal.SIGINT)  # arrives before the write starts
            _save(policy, opt, sched, 2, [], out)
    assert torch.load(out / "checkpoint/trainer_state.pt")["step"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint"]  # no .tmp or .old left half-swapped
