"""Smoke runs of every command (tiny budgets), their outputs, and bad-config errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli

SMALL = os.environ.get("EMBODIED_SLOW_BUDGET", "full") == "small" or os.environ.get("CI") == "true"


def embodied(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    extra = ["progress=false"] if args[0] in ("collect", "eval", "train") else []
    r = run_cli([*args, *extra], cwd=cwd, timeout=900)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def test_usage_and_unknown_command(tmp_path):
    r = subprocess.run([sys.executable, "-m", "embodied.cli"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and "train" in r.stdout and "eval" in r.stdout
    r = subprocess.run([sys.executable, "-m", "embodied.cli", "trian"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "Did you mean 'train'" in r.stderr


def test_the_warm_runner_gives_what_the_console_command_gives(tmp_path):
    """``run_cli`` (forked from a warm interpreter) against ``python -m embodied.cli``: the same exit
    code, errors and results; a command past its timeout is killed and raises as ``subprocess.run``."""
    for args in (["trian"], ["eval", "episodes=0"],
                 ["eval", "policy=expert", "tasks=[reach]", "episodes=1", "videos=0", "progress=false"]):
        warm = run_cli([*args, f"hydra.run.dir={tmp_path}/warm"], cwd=tmp_path)
        cold = subprocess.run([sys.executable, "-m", "embodied.cli", *args, f"hydra.run.dir={tmp_path}/cold"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert warm.returncode == cold.returncode, (args, warm.stderr[-2000:], cold.stderr[-2000:])
        if warm.returncode:
            assert warm.stderr.replace("warm", "cold") == cold.stderr and warm.stderr.strip(), args
        else:
            runs = [json.loads((tmp_path / f"{k}/metrics.json").read_text()) for k in ("warm", "cold")]
            keys = ("success_rate", "heldout_paraphrase_success_rate")
            assert [runs[0][k] for k in keys] == [runs[1][k] for k in keys], args
            assert runs[0]["per_task"]["reach"]["episodes"] == runs[1]["per_task"]["reach"]["episodes"] == 1
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli(["collect", "tasks=[reach]", "episodes=100000", f"out={tmp_path}/ds", "progress=false",
                 f"hydra.run.dir={tmp_path}/slow"], cwd=tmp_path, timeout=3)
    assert run_cli(["eval", "episodes=0"], cwd=tmp_path).returncode == 2  # the server goes on after a kill


def test_collect_then_eval_expert(tmp_path):
    embodied("collect", "tasks=[reach,press-button]", "episodes=2", f"out={tmp_path}/ds",
             f"hydra.run.dir={tmp_path}/collect", cwd=tmp_path)
    m = json.loads((tmp_path / "collect/metrics.json").read_text())
    assert m["episodes"] == 4
    from embodied.runtime.data import Dataset

    ds = Dataset.open(tmp_path / "ds", validate=True)
    assert {e["task"] for e in ds.episodes_meta} == {"reach", "press-button"}
    assert all(e["success"] for e in ds.episodes_meta)

    embodied("eval", "policy=expert", "tasks=[reach]", "episodes=3", "videos=1", "num_envs=2",
             f"hydra.run.dir={tmp_path}/eval", cwd=tmp_path)
    m = json.loads((tmp_path / "eval/metrics.json").read_text())
    for key in ("success_rate", "heldout_paraphrase_success_rate", "per_task", "wall_time_s"):
        assert key in m
    p = m["per_task"]["reach"]
    assert p["episodes"] == 3 and 0 <= p["ci_low"] <= p["success_rate"] <= p["ci_high"] <= 1
    assert m["success_rate"] == 1.0
    assert (tmp_path / "eval/report.md").exists() and (tmp_path / "eval/success.png").exists()
    assert any((tmp_path / "eval/videos").iterdir())


def test_eval_custom_instructions_file(tmp_path):
    f = tmp_path / "words.yaml"
    f.write_text("press-button: ['give the {color} button a push']\n")
    embodied("eval", "policy=expert", "tasks=[press-button]", "episodes=2", "videos=0", f"instructions_file={f}",
             f"hydra.run.dir={tmp_path}/eval", cwd=tmp_path)
    m = json.loads((tmp_path / "eval/metrics.json").read_text())
    assert m["per_task"]["press-button"]["custom"]["episodes"] == 2
    assert "custom_instruction_success_rate" in m


@pytest.mark.parametrize("args, needle", [
    (("train", "suite=nowhere"), "'nowhere'"),
    (("train", "policy.hiden=3"), "Did you mean 'hidden'"),
    (("train", "stepz=3"), "'stepz'"),
    (("train", "steps=abc"), "steps"),
    (("train", "policy=flwo"), "Did you mean 'flow'"),
    (("train", "obs_mode=depth"), "'depth'"),
    (("train", "policy.obs_mode=pixels"), "obs_mode"),
    (("collect", "suite=nowhere"), "'nowhere'"),
    (("eval", "policy=expert", "policy.horizon=3"), "horizon"),
    (("eval", "episodes=0"), "episodes"),
    (("eval", "vector=threads"), "vector"),
    (("collect", "obs_mode=depth"), "obs_mode"),
    (("train", "policy.horizon=2", "policy.n_action_steps=8"), "horizon"),
    (("train", "policy.sampler=rk4"), "sampler"),
    (("eval", "suite=manipulaton"), "manipulation"),
    (("eval", "checkpoint=/nonexistent/ckpt"), "/nonexistent/ckpt"),
    (("eval", "checkpoint=/nonexistent/a", "checkpoints=[/nonexistent/b]"), "checkpoints"),
    (("train", "snapshot_every=-1"), "snapshot_every"),
])
def test_bad_config_is_a_one_line_error_naming_it(tmp_path, args, needle):
    r = embodied(*args, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path, check=False)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"embodied {args[0]}: error: "), r.stderr[-2000:]
    assert needle in lines[0] and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_bench_smoke(tmp_path):
    embodied("bench", "tasks=[reach]", "sim_steps=100", "render_frames=5", "render_sizes=[32]",
             "sections=[sim,render,train_step]", "policy_demos=2", f"policy_dataset={tmp_path}/ds",
             "train_step_steps=3", f"hydra.run.dir={tmp_path}/bench", cwd=tmp_path)
    m = json.loads((tmp_path / "bench/metrics.json").read_text())
    assert m["sim"]["per_task"]["reach"]["env_steps_per_s"] > 0 and m["render"]["32px_fps"] > 0
    step = m["train_step"]
    assert set(step["phase_share"]) == {"data", "forward", "backward", "clip", "optimizer", "ema"}
    assert abs(sum(step["phase_share"].values()) - 1) < 1e-6 and step["step_ms"] > 0
    assert step["one_thread_step_ms"] > 0 and (step["bf16_step_ms"] is None or step["bf16_step_ms"] > 0)


@pytest.mark.slow
def test_train_compiled_saves_plain_weights_and_resumes_without_compile(tmp_path):
    """compile=true trains through a torch.compile'd loss graph; the checkpoint holds the plain weights
    (no compiled-module prefixes) and evaluates, and the run resumes without compile."""
    from safetensors.numpy import load_file

    common = ("tasks=[reach]", "demos=2", f"dataset={tmp_path}/ds", "eval_episodes=1", "videos=0", "progress=false",
              f"hydra.run.dir={tmp_path}/run")
    r = embodied("train", "steps=6", "compile=true", *common, cwd=tmp_path)
    assert "torch.compile: the training loss (text head, observation encoder, FlowPolicy loss)" in r.stdout + r.stderr
    m = json.loads((tmp_path / "run/metrics.json").read_text())
    assert m["compiled"] is True and np.isfinite(m["final_loss"])
    keys = set(load_file(tmp_path / "run/checkpoint/model.safetensors"))
    assert keys and not any("_orig_mod" in k for k in keys), sorted(keys)[:5]
    r = embodied("train", "steps=8", "compile=false", *common, cwd=tmp_path)  # compile may change on resume
    assert "at step 6" in r.stdout + r.stderr
    assert json.loads((tmp_path / "run/metrics.json").read_text())["compiled"] is False


def test_render_and_train_in_one_process():
    """Rendering with Mesa and then a torch optimiser must not crash (triton/LLVM clash)."""
    code = ("import sim, embodied, torch\n"
            "env = embodied.make_env('reach', obs_mode='pixels'); obs, _ = env.reset(seed=0)\n"
            "assert obs['image'].std() > 0\n"
            "net = torch.nn.Linear(4, 4); opt = torch.optim.Adam(net.parameters())\n"
            "net(torch.ones(1, 4)).sum().backward(); opt.step(); print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


@pytest.mark.slow
def test_train_eval_play_resume(tmp_path):
    steps = 30 if SMALL else 300
    run = tmp_path / "train"
    common = ("tasks=[reach,press-button]", "demos=3", f"dataset={tmp_path}/ds", "eval_episodes=2",
              "num_envs=2", "videos=1", "save_every=10", "ground_instructions=true", f"hydra.run.dir={run}")
    embodied("train", f"steps={steps}", *common, cwd=tmp_path)
    m = json.loads((run / "metrics.json").read_text())
    for key in ("success_rate", "heldout_paraphrase_success_rate", "per_task", "wall_time_s", "success_curve"):
        assert key in m
    assert m["train_threads"] >= 1 and m["precision"] == "fp32"  # what the figures depend on, recorded
    # the flow recipe's checkpoint plays the zero initial noise: in train's evaluation and saved for eval/serve
    assert m["noise_scale"] == 0.0 and json.loads((run / "checkpoint/config.json").read_text())["config"]["noise_scale"] == 0.0
    assert set(m["per_task"]) == {"reach", "press-button"} and "workers" not in m  # 8 episodes: this process
    for f in ("checkpoint/model.safetensors", "checkpoint/config.json", "checkpoint/grounding.npz", "report.md",
              "training_curve.png", "success.png"):
        assert (run / f).exists(), f
    # every held-out wording is new to the policy, so each of those episodes ran on a training wording
    assert all(p["heldout"]["grounded_episodes"] == 2 and "grounded_episodes" not in p for p in m["per_task"].values())
    # resume: the same run dir with more steps continues from the saved step
    r = embodied("train", f"steps={steps + 10}", "workers=2", *common, cwd=tmp_path)
    assert f"resuming from {run}/checkpoint at step {steps}" in r.stderr + r.stdout
    m = json.loads((run / "metrics.json").read_text())  # evaluated in two worker processes from checkpoint/
    assert m["workers"] == 2 and m["runner"] == "local" and m["videos"] and set(m["per_task"]) == {"reach", "press-button"}
    assert m["per_task"]["reach"]["heldout"]["grounded_episodes"] == 2  # the workers ground too
    # the checkpoint evaluates (here without grounding) and plays
    embodied("eval", f"checkpoint={run}/checkpoint", "tasks=[reach]", "episodes=2", "num_envs=2",
             "ground_instructions=false", f"hydra.run.dir={tmp_path}/eval", cwd=tmp_path)
    m = json.loads((tmp_path / "eval/metrics.json").read_text())
    assert "grounded_episodes" not in m["per_task"]["reach"]["heldout"] and m["noise_scale"] == 0.0
    embodied("play", f"checkpoint={run}/checkpoint", "task=reach", "instruction=hover above the green cube",
             f"hydra.run.dir={tmp_path}/play", cwd=tmp_path)
    m = json.loads((tmp_path / "play/metrics.json").read_text())
    assert m["instruction"] == "hover above the green cube" and m["video"]
    assert m["acted_on"] != m["instruction"]  # a new wording: the policy acted on a training one
    # a checkpoint on a task whose spec differs is refused with a clear message
    r = embodied("eval", f"checkpoint={run}/checkpoint", "suite=navigation", "episodes=1",
                 f"hydra.run.dir={tmp_path}/bad", cwd=tmp_path, check=False)
    assert r.returncode != 0 and "does not match" in r.stderr


def test_snapshot_is_atomic_and_never_overwritten(tmp_path, monkeypatch):
    import embodied.runtime.train as train_module
    from embodied.runtime.train import _snapshot

    class FakePolicy:
        saves = 0

    def save(policy, path):
        FakePolicy.saves += 1
        Path(path).mkdir(parents=True)
        (Path(path) / "model.safetensors").write_text(str(FakePolicy.saves))

    monkeypatch.setattr(train_module, "save_policy", save)

    # a leftover temp dir from a crash is replaced, and never looks like a snapshot
    (tmp_path / "checkpoints" / ".step_0000010.tmp").mkdir(parents=True)
    _snapshot(FakePolicy(), 10, tmp_path)
    _snapshot(FakePolicy(), 10, tmp_path)  # exists already (resumed run): kept as it is
    assert FakePolicy.saves == 1
    assert (tmp_path / "checkpoints/step_0000010/model.safetensors").read_text() == "1"
    assert [d.name for d in (tmp_path / "checkpoints").iterdir()] == ["step_0000010"]


def test_eval_checkpoint_series_bad_inputs(tmp_path):
    from embodied.runtime.eval_job import EvalConfig, resolve_checkpoints

    (tmp_path / "empty").mkdir()
    r = embodied("eval", f"checkpoint={tmp_path}/empty", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path, check=False)
    assert r.returncode != 0
    assert f"{tmp_path}/empty" in r.stderr and "empty folder" in r.stderr and "step_*" in r.stderr, r.stderr[-2000:]

    (tmp_path / "junk/other").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"junk.*neither a checkpoint nor a folder of step_\* checkpoints"):
        resolve_checkpoints(EvalConfig(checkpoint=str(tmp_path / "junk")))
    (tmp_path / "series/step_0000005").mkdir(parents=True)  # a step_* folder without the checkpoint files
    with pytest.raises(ValueError, match=r"step_0000005.*config.json"):
        resolve_checkpoints(EvalConfig(checkpoint=str(tmp_path / "series")))
    with pytest.raises(ValueError, match=r"checkpoints: .*junk.* is not a checkpoint"):
        resolve_checkpoints(EvalConfig(checkpoints=[str(tmp_path / "junk")]))
    with pytest.raises(FileNotFoundError, match="missing"):
        resolve_checkpoints(EvalConfig(checkpoints=[str(tmp_path / "missing")]))


@pytest.mark.slow
def test_train_snapshots_then_eval_success_curve(tmp_path):
    run = tmp_path / "train"
    common = ("tasks=[reach]", "demos=2", f"dataset={tmp_path}/ds", "batch_size=8", "snapshot_every=2",
              "save_every=3", "eval_episodes=1", "num_envs=1", "videos=0", "threads=1", f"hydra.run.dir={run}")
    embodied("train", "steps=5", *common, cwd=tmp_path)
    snaps = run / "checkpoints"
    # every multiple of snapshot_every and the final step; policy only (no optimiser state)
    assert sorted(d.name for d in snaps.iterdir()) == ["step_0000002", "step_0000004", "step_0000005"]
    for d in snaps.iterdir():
        assert (d / "model.safetensors").is_file() and (d / "config.json").is_file()
        assert not (d / "trainer_state.pt").exists()
    kept = {d.name: (d / "model.safetensors").stat().st_mtime_ns for d in snaps.iterdir()}
    # resuming adds the new snapshots and leaves the existing ones alone
    embodied("train", "steps=8", *common, cwd=tmp_path)
    assert sorted(d.name for d in snaps.iterdir()) == sorted([*kept, "step_0000006", "step_0000008"])
    assert all((snaps / n / "model.safetensors").stat().st_mtime_ns == t for n, t in kept.items())

    ev = tmp_path / "eval"
    embodied("eval", f"checkpoint={snaps}", "tasks=[reach]", "episodes=2", "num_envs=2", "videos=1",
             f"hydra.run.dir={ev}", cwd=tmp_path)
    m = json.loads((ev / "metrics.json").read_text())
    entries = m["checkpoints"]
    assert [e["step"] for e in entries] == [2, 4, 5, 6, 8]  # parsed from the names, increasing
    assert [Path(e["checkpoint"]).name for e in entries] == [f"step_{s:07d}" for s in (2, 4, 5, 6, 8)]
    for e in entries:
        assert set(e["per_task"]) == {"reach"} and e["per_task"]["reach"]["episodes"] == 2
        for rate, ci in ((e["success_rate"], e["ci"]), (e["heldout_paraphrase_success_rate"], e["heldout_ci"])):
            assert 0 <= ci[0] <= rate <= ci[1] <= 1
    # the top-level keys describe the last (highest-step) checkpoint ...
    last = entries[-1]
    for key in ("success_rate", "heldout_paraphrase_success_rate", "per_task"):
        assert m[key] == last[key]
    assert m["wall_time_s"] > 0 and m["policy"] == last["checkpoint"] and m["videos"]
    # ... and match an evaluation of that checkpoint alone (same seeds and settings)
    embodied("eval", f"checkpoint={last['checkpoint']}", "tasks=[reach]", "episodes=2", "num_envs=2", "videos=0",
             f"hydra.run.dir={tmp_path}/one", cwd=tmp_path)
    one = json.loads((tmp_path / "one/metrics.json").read_text())
    assert "checkpoints" not in one
    for a, b in ((one["per_task"]["reach"], m["per_task"]["reach"]),
                 (one["per_task"]["reach"]["heldout"], m["per_task"]["reach"]["heldout"])):
        assert (a["success_rate"], a["episodes"]) == (b["success_rate"], b["episodes"])

    assert (ev / "success_curve.png").stat().st_size > 0
    report = (ev / "report.md").read_text()
    assert "## Success vs training step" in report and "![success vs training step](success_curve.png)" in report
    rows = [line for line in report.splitlines() if line.startswith("| ") and "step_" in line]
    assert [int(r.split("|")[1]) for r in rows] == [2, 4, 5, 6, 8]


def test_checkpoint_series_reports_each_custom_wording_figure(tmp_path):
    """With instructions_file= (custom wordings, splits=[]) every checkpoint's custom success and its
    Wilson interval are in its entry and in the report's series table, not only the last one's."""
    from embodied.runtime.evaluate import _series_section, checkpoint_entry
    from embodied.runtime.rollout import wilson_interval

    def metrics(k: int) -> dict:
        return {"success_rate": None, "heldout_paraphrase_success_rate": None, "custom_instruction_success_rate":
                k / 100, "per_task": {"reach": {"custom": {"success_rate": k / 100, "episodes": 100}}}}

    entries = [checkpoint_entry(f"/ck/{k}", i, metrics(k), step_source="index") for i, k in enumerate((69, 57))]
    assert [e["custom_instruction_success_rate"] for e in entries] == [0.69, 0.57]
    assert entries[0]["custom_ci"] == list(wilson_interval(69, 100)) and entries[0]["ci"] is None
    rows = [r for r in _series_section(tmp_path, entries) if r.startswith("| ")]
    assert "custom wordings" in rows[0]
    assert rows[1].startswith("| 0 | – | – | 69% [59, 77] | `/ck/69` |")
    assert rows[2].startswith("| 1 | – | – | 57% [47, 66] | `/ck/57` |")
    # without custom wordings the table keeps its three columns
    plain = checkpoint_entry("/ck/p", 0, {"success_rate": 0.5, "heldout_paraphrase_success_rate": None,
                                          "per_task": {"reach": {"success_rate": 0.5, "episodes": 10}}})
    rows = [r for r in _series_section(tmp_path, [plain]) if r.startswith("| ")]
    assert "custom" not in rows[0] and rows[1].count("|") == 5


CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# train.yaml's recipe layers, in the order they apply: (group under configs/recipe/, option)
LAYERS = (("suite", "{suite}"), ("obs_mode", "{obs_mode}"), ("suite_obs_mode", "{suite}_{obs_mode}"),
          ("policy", "{policy}"))


def _train_config(*overrides: str):
    from embodied.commands.app import compose
    from embodied.runtime.train import TrainConfig

    return compose("train", TrainConfig, overrides)


def _layer(group: str, option: str) -> dict:
    """What configs/recipe/<group>/<option>.yaml sets (flat keys; {} without the file), its defaults list followed."""
    if (group, option) not in _LAYER_CACHE:
        from hydra import compose, initialize_config_module
        from omegaconf import OmegaConf

        values = {}
        if (CONFIGS / "recipe" / group / f"{option}.yaml").exists():
            with initialize_config_module("configs", version_base="1.3"):
                values = _flat(OmegaConf.to_container(compose(f"recipe/{group}/{option}")))
        _LAYER_CACHE[group, option] = values
    return dict(_LAYER_CACHE[group, option])


_LAYER_CACHE: dict = {}


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _plain(cfg) -> dict:
    import dataclasses

    return json.loads(json.dumps(dataclasses.asdict(cfg)))  # tuples -> lists, as YAML has them


def _expected(suite: str, obs_mode: str, policy: str, cli: dict) -> dict:
    """The schemas' defaults, then each recipe layer that has a file, then the command line (flat keys)."""
    import dataclasses

    from embodied.runtime.train import TrainConfig
    from policies import config_class

    want = _flat({**{f.name: getattr(TrainConfig(), f.name) for f in dataclasses.fields(TrainConfig)},
                  "policy": {"name": policy, **dataclasses.asdict(config_class(policy)())}})
    want.update(suite=suite, obs_mode=obs_mode)
    for group, option in LAYERS:
        want.update(_layer(group, option.format(suite=suite, obs_mode=obs_mode, policy=policy)))
    want.update(cli)
    # the policy observes what the run observes and grounds when the run does (train.yaml)
    want["policy.obs_mode"] = cli.get("policy.obs_mode", want["obs_mode"])
    want["policy.ground_instructions"] = cli.get("policy.ground_instructions", want["ground_instructions"])
    return json.loads(json.dumps(want))


def _other(value):
    """A valid value unlike ``value`` (for the recipes' fields)."""
    if isinstance(value, bool):
        return not value
    return value + 1 if isinstance(value, int) else value / 2


@pytest.mark.parametrize("policy", ["flow", "diffusion", "mlp"])
@pytest.mark.parametrize("obs_mode", ["state", "pixels"])
def test_recipes_compose_in_order_and_the_command_line_wins(obs_mode, policy):
    """Every suite's recipe composes as train.yaml documents it: the schemas' defaults, then the suite's,
    the observation mode's, the suite's for that mode and the family's recipe, each over the ones
    before; then any key=value, even one that equals a schema default."""
    from embodied.core.registry import list_suites

    for suite in list_suites():
        base = ("suite=" + suite, "obs_mode=" + obs_mode, "policy=" + policy)
        got = _flat(_plain(_train_config(*base)))
        assert got == _expected(suite, obs_mode, policy, {}), suite
        recipe = {k: v for group, option in LAYERS
                  for k, v in _layer(group, option.format(suite=suite, obs_mode=obs_mode, policy=policy)).items()}
        defaults = _expected("manipulation", "state", policy, {})
        for cli in ({k: _other(v) for k, v in recipe.items()},  # unlike the recipe's values
                    {k: defaults[k] for k, v in recipe.items() if defaults[k] != v}):  # the schema's defaults
            if cli.get("ground_instructions") and defaults["policy.text_encoder"] == "onehot":
                cli["policy.text_encoder"] = "minilm"  # a one-hot policy has no words to ground
            got = _flat(_plain(_train_config(*base, *(f"{k}={json.dumps(v)}" for k, v in cli.items()))))
            assert got == _expected(suite, obs_mode, policy, cli), (suite, cli)
            assert all(got[k] == v for k, v in cli.items())


def _capture_train(*args: str, cwd: Path) -> dict:
    """The TrainConfig that `embodied train ARGS` hands to train(), which is replaced to print it."""
    code = ("import dataclasses, json\n"
            "import embodied.commands.train as cmd\n"
            "def capture(cfg, out):\n"
            "    print('CONFIG ' + json.dumps(dataclasses.asdict(cfg)))\n"
            "    raise SystemExit(0)\n"
            "cmd.train = capture\n")
    r = run_cli(["train", *args, "progress=false", f"hydra.run.dir={cwd}/run"], cwd=cwd, timeout=300, prelude=code)
    lines = [line for line in r.stdout.splitlines() if line.startswith("CONFIG ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    return json.loads(lines[0][len("CONFIG "):])


@pytest.mark.parametrize("args", [("suite=metaworld-mt50",),
                                  ("suite=navigation", "obs_mode=pixels", "policy=diffusion"),
                                  ("suite=metaworld-mt10", "obs_mode=pixels", "policy=mlp", "steps=7",
                                   "policy.hidden=64")])
def test_cfg_job_prints_the_config_train_runs(tmp_path, args):
    import yaml

    r = run_cli(["train", *args, "progress=false", "--cfg", "job", "--resolve"], cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    printed = yaml.safe_load(r.stdout)
    assert printed == _capture_train(*args, cwd=tmp_path)
    assert printed == _plain(_train_config(*args, "progress=false"))  # and what compose() gives


def test_help_lists_the_choices(tmp_path):
    from embodied.core.registry import list_suites
    from policies import POLICY_CONFIGS

    out = embodied("train", "--help", cwd=tmp_path).stdout
    listing = out[out.index("== Configuration groups =="):out.index("== Config ==")]
    groups = {line.split(":")[0]: line.split(":", 1)[1] for line in listing.splitlines() if ": " in line}
    assert set(groups["suite"].replace(",", " ").split()) == set(list_suites())
    assert set(POLICY_CONFIGS) <= set(groups["policy"].replace(",", " ").split())
    assert set(groups["obs_mode"].replace(",", " ").split()) == {"state", "pixels"}
    assert "expert" in embodied("eval", "--help", cwd=tmp_path).stdout


def test_collect_refuses_to_mix_action_noise_settings(tmp_path):
    from embodied.runtime.collect import collect
    from embodied.runtime.data import Dataset

    out = tmp_path / "demos"
    collect(["reach"], out, 1, "state", 64, [], action_noise=0.0, progress=False)
    assert [m["action_noise"] for m in Dataset.open(out).episodes_meta] == [0.0]
    with pytest.raises(ValueError, match="action_noise"):
        collect(["reach"], out, 2, "state", 64, [], action_noise=0.3, progress=False)
    assert len(Dataset.open(out)) == 1  # nothing recorded under the other setting
    collect(["reach"], out, 2, "state", 64, [], action_noise=0.0, progress=False)  # same setting resumes
    assert len(Dataset.open(out)) == 2


def test_a_pixel_policy_trains_and_evaluates_from_two_cameras(tmp_path):
    """Several cameras are recorded as ``images/<camera>``; training reads each view, and evaluation
    (one env, a vector of envs) hands every view to the policy."""
    from embodied.runtime.data import Dataset
    from embodied.runtime.train import Batcher

    run = tmp_path / "run"
    embodied("train", "obs_mode=pixels", "cameras=[side,front]", "image_size=16", "tasks=[reach]", "demos=2",
             "steps=3", "eval_episodes=1", "videos=0", "workers=0", f"dataset={tmp_path}/ds", f"hydra.run.dir={run}",
             cwd=tmp_path)
    ds = Dataset.open(tmp_path / "ds")
    assert {"images/side", "images/front"} <= set(ds.features) and "image" not in ds.features
    batch = Batcher(ds, ["reach"], 1, 4, True, 0).sample(3)
    assert {c: v.shape for c, v in batch["images"].items()} == {"side": (3, 1, 16, 16, 3), "front": (3, 1, 16, 16, 3)}
    assert not np.array_equal(batch["images"]["side"], batch["images"]["front"])  # two views, not one twice
    assert json.loads((run / "metrics.json").read_text())["per_task"].keys() == {"reach"}
    embodied("eval", f"checkpoint={run}/checkpoint", "tasks=[reach]", "episodes=2", "videos=0", "num_envs=2",
             "workers=0", f"hydra.run.dir={tmp_path}/eval", cwd=tmp_path)  # a vector of envs (train's was one env)
    assert json.loads((tmp_path / "eval/metrics.json").read_text())["per_task"]["reach"]["episodes"] == 2


def test_pixel_collection_keeps_the_full_state_and_train_uses_it(tmp_path):
    """Pixel demos record ``privileged_state`` (the step's full state, beside its image);
    ``train`` turns the pixel policy's auxiliary loss on from it, and off for older datasets."""
    from embodied.runtime.collect import collect
    from embodied.runtime.train import _with_aux_state
    from embodied.runtime.data import Dataset
    from embodied.core.registry import make_env
    from policies import make_config

    out = tmp_path / "px"
    collect(["push"], out, 1, "pixels", 16, [], progress=False)
    ds = Dataset.open(out)
    ep = ds[0]
    full = make_env("push").unwrapped.observation_spec.state_dim
    assert ds.features["privileged_state"]["shape"] == [full]
    assert ep["privileged_state"].shape == (len(ep["action"]), full)
    np.testing.assert_allclose(ep["privileged_state"][:, :4], ep["state"])  # the proprio part is the state
    assert np.ptp(ep["privileged_state"][:, 4:13], axis=0).max() > 0.01  # the pushed block moves
    pcfg = make_config("flow", {"obs_mode": "pixels"})
    assert _with_aux_state(pcfg, ds).aux_state_dim == full
    from embodied.runtime.train import _check_dataset

    for kw in ({"image_size": 16}, {"image_size": 16, "cameras": ["front"]}, {"image_size": 32}):
        env = make_env("push", obs_mode="pixels", **kw)
        spec, aspec = env.unwrapped.observation_spec, env.unwrapped.action_spec
        env.close()
        if kw == {"image_size": 16}:  # the default camera, as recorded
            _check_dataset(ds, spec, aspec)
        else:
            with pytest.raises(ValueError, match="holds images of cameras"):
                _check_dataset(ds, spec, aspec)
    assert _with_aux_state(make_config("flow", {"obs_mode": "pixels", "aux_state_weight": 0.0}), ds).aux_state_dim == 0
    old = tmp_path / "old"  # a pixel dataset recorded before privileged_state existed
    Dataset.create(old, {k: (v["dtype"], v["shape"]) for k, v in ds.features.items() if k != "privileged_state"})
    assert _with_aux_state(pcfg, Dataset.open(old)).aux_state_dim == 0
    collect(["push"], old, 1, "pixels", 16, [], progress=False)  # appending keeps the old format
    assert "privileged_state" not in Dataset.open(old).features and len(Dataset.open(old)) == 1


def test_eval_spec_mismatch_names_the_tasks_the_checkpoint_knows():
    from embodied.runtime.checkpoints import policy_env_kwargs
    from embodied.core.errors import SpecMismatchError
    from embodied.core.registry import make_env
    from policies import make_policy

    env = make_env("reach-v3")
    policy = make_policy("flow", {"state_hidden": 16, "obs_dim": 8, "text_dim": 8, "hidden": 16},
                         env.unwrapped.observation_spec, env.unwrapped.action_spec, None,
                         task_names=["reach-v3"], device="cpu")
    env.close()
    assert policy_env_kwargs(policy, ["reach-v3"]) == {"obs_mode": "state"}
    with pytest.raises(SpecMismatchError, match=r"trained on tasks \[reach-v3\].*suite="):
        policy_env_kwargs(policy, ["reach"])  # a manipulation task: the suite was not given
