"""Bad input at the boundaries gets a clear error that names the problem, not a raw traceback:
damaged checkpoints, devices that do not exist here, observations that change shape or carry
NaN mid-episode."""

from __future__ import annotations

import json

import numpy as np
import pytest
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
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "embodied.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("args, message", [
    (("eval", "seed=-1"), "seed must be >= 0"),
    (("collect", "seed=-5", "out=ds"), "seed must be >= 0"),
])
def test_negative_seeds_are_refused_and_leave_nothing_behind(tmp_path, args, message):
    r = cli(*args, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "ds").exists()
