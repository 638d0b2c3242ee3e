"""Contract tests over every registered policy family (tiny configs, fake specs; no simulator).

Checks: chunk shape/dtype/range, determinism given the noise, the action queue, a real
learning test (one constant chunk per instruction), checkpoint round-trip, spec
mismatch, bad configs and bad inputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.core.errors import SpecMismatchError, UnknownNameError
from embodied.core.specs import ActionSpec, ObservationSpec
from policies import POLICIES, config_class, load_policy, make_config, make_policy, policy_class, save_policy

DS, DA, TO, H, TA = 5, 3, 2, 8, 4
OBS_SPEC = ObservationSpec(state_dim=DS)
ACTION_SPEC = ActionSpec(dim=DA)
TASKS = ["lift", "push"]
INSTRUCTIONS = ["lift the red block", "push the blue block"]
STATS = {
    "state": {"mean": np.linspace(-1, 1, DS), "std": np.full(DS, 2.0), "min": np.full(DS, -5.0), "max": np.full(DS, 5.0)},
    "action": {"mean": np.zeros(DA), "std": np.ones(DA), "min": np.full(DA, -1.0), "max": np.full(DA, 1.0)},
}
TINY = dict(n_obs_steps=TO, horizon=H, n_action_steps=TA, state_hidden=32, obs_dim=16, text_dim=16, lr=3e-3,
            warmup_steps=0)
DENOISER = dict(hidden=64, n_layers=2, time_emb_dim=16, down_dims=(16, 32), n_groups=4, num_inference_steps=4)
# (family, config overrides): every registered family, the U-Net on both generative ones.
VARIANTS = {
    "flow": ("flow", {**TINY, **DENOISER}),
    "flow-unet": ("flow", {**TINY, **DENOISER, "net": "unet", "sampler": "heun"}),
    "diffusion": ("diffusion", {**TINY, **DENOISER}),
    "diffusion-unet": ("diffusion", {**TINY, **DENOISER, "net": "unet", "sampler": "dpm"}),
    "mlp": ("mlp", {**TINY, "hidden": 64, "n_layers": 2}),
}
GENERATIVE = [k for k, (family, _) in VARIANTS.items() if family != "mlp"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def build(variant: str, seed: int = 0, **overrides):
    family, cfg = VARIANTS[variant]
    torch.manual_seed(seed)
    return make_policy(family, {**cfg, **overrides}, OBS_SPEC, ACTION_SPEC, STATS, TASKS, device="cpu")


def obs_batch(b: int = 2, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"state": rng.normal(size=(b, TO, DS)).astype(np.float32),
            "instruction": [INSTRUCTIONS[i % 2] for i in range(b)], "task": [TASKS[i % 2] for i in range(b)]}


def noise(b: int = 2, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(b, H, DA)).astype(np.float32)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_family_composes_through_hydra_and_builds(name):
    """`embodied train policy=<name> policy.<field>=...` composes for every registered family (its
    config dataclass in Hydra's ConfigStore) into a config that builds that family's policy."""
    import dataclasses

    from embodied.commands.app import compose
    from embodied.runtime.train import TrainConfig

    family, tiny = next(v for v in VARIANTS.values() if v[0] == name)
    cfg = compose("train", TrainConfig, [f"policy={name}"] + [f"policy.{k}={list(v) if isinstance(v, tuple) else v}"
                                                               for k, v in tiny.items()])
    assert cfg.policy["name"] == name
    policy = make_policy(name, cfg.policy, OBS_SPEC, ACTION_SPEC, STATS, TASKS, device="cpu")
    assert isinstance(policy, policy_class(name))
    # the fields given took effect, the others are the family's defaults or its recipe's (recipe/policy/<family>.yaml)
    import yaml

    recipe = Path(__file__).parents[1] / "configs/recipe/policy" / f"{name}.yaml"
    recipe_policy = (yaml.safe_load(recipe.read_text()) or {}).get("policy", {}) if recipe.exists() else {}
    want = dataclasses.replace(config_class(name)(), **{**recipe_policy, **tiny})
    assert policy.config == want
    assert policy.predict_chunk(obs_batch(2), noise(2)).shape == (2, H, DA)


def test_unknown_policy_name_suggests():
    with pytest.raises(UnknownNameError, match="Did you mean 'flow'"):
        make_policy("flwo", {}, OBS_SPEC, ACTION_SPEC, STATS)
    with pytest.raises(UnknownNameError):
        config_class("transformer")


@pytest.mark.parametrize("variant", VARIANTS)
def test_predict_chunk_contract(variant):
    policy = build(variant)
    chunk = policy.predict_chunk(obs_batch(3), noise(3))
    assert chunk.shape == (3, H, DA) and chunk.dtype == np.float32
    assert np.isfinite(chunk).all() and chunk.min() >= -1.0 and chunk.max() <= 1.0
    assert policy.noise_shape == (H, DA)
    assert policy.encode_obs(obs_batch(3)).shape[0] == 3


@pytest.mark.parametrize("variant", VARIANTS)
def test_deterministic_given_noise(variant):
    policy = build(variant)
    a = policy.predict_chunk(obs_batch(), noise(seed=1))
    b = policy.predict_chunk(obs_batch(), noise(seed=1))
    np.testing.assert_array_equal(a, b)
    if variant in GENERATIVE:
        c = policy.predict_chunk(obs_batch(), noise(seed=2))
        assert not np.allclose(a, c), "a different initial noise must give a different chunk"


@pytest.mark.parametrize("sampler", ["ddim", "dpm", "ddpm"])
def test_diffusion_samplers_deterministic(sampler):
    policy = build("diffusion", sampler=sampler)
    policy.num_inference_steps = 10
    a = policy.predict_chunk(obs_batch(), noise(seed=3))
    np.testing.assert_array_equal(a, policy.predict_chunk(obs_batch(), noise(seed=3)))
    # a row's chunk does not depend on the other rows (DDPM's per-row generators)
    one = policy.predict_chunk({k: v[:1] for k, v in obs_batch().items()}, noise(seed=3)[:1])
    np.testing.assert_allclose(one[0], a[0], atol=1e-5)


def test_flow_steps_and_sampler_change_after_build():
    policy = build("flow")
    outs = {}
    for steps, sampler in [(1, "euler"), (10, "euler"), (4, "midpoint")]:
        policy.num_inference_steps, policy.sampler = steps, sampler
        outs[(steps, sampler)] = policy.predict_chunk(obs_batch(), noise())
    assert not np.allclose(outs[(1, "euler")], outs[(10, "euler")])
    with pytest.raises(ValueError, match="num_inference_steps"):
        policy.num_inference_steps = 0
    with pytest.raises(ValueError, match="sampler"):
        policy.sampler = "rk45"


@pytest.mark.parametrize("variant", ["flow", "mlp"])
def test_act_pops_n_action_steps_per_chunk(variant, monkeypatch):
    policy = build(variant)
    calls = []
    real = policy.predict_chunk

    def counting(batch, noise=None):
        calls.append(batch)
        return real(batch, noise)

    monkeypatch.setattr(policy, "predict_chunk", counting)
    policy.reset()
    rng = np.random.default_rng(0)
    for _ in range(2 * TA + 1):
        a = policy.act({"state": rng.normal(size=DS).astype(np.float32), "instruction": INSTRUCTIONS[0],
                        "task": TASKS[0]})
        assert a.shape == (DA,) and a.dtype == np.float32
    assert len(calls) == 3  # chunks requested at steps 0, Ta and 2 Ta
    assert calls[0]["state"].shape == (1, TO, DS)
    policy.reset()
    policy.act({"state": np.zeros(DS, np.float32), "instruction": INSTRUCTIONS[0], "task": TASKS[0]})
    assert len(calls) == 4  # reset empties the queue


def _targets() -> torch.Tensor:
    """One constant chunk per instruction: a ramp up for the first, a ramp down for the second."""
    ramp = torch.linspace(-0.6, 0.6, H)[:, None].expand(H, DA)
    return torch.stack([ramp, -ramp])


# Epsilon-prediction diffusion learns more slowly than flow matching and its few-step
# samplers need an accurate model, so it trains longer and samples with 100 DDPM steps here.
LEARN = {"flow": 150, "flow-unet": 300, "mlp": 150, "diffusion": 600, "diffusion-unet": 600}


@pytest.mark.parametrize("variant", VARIANTS)
def test_learns_a_chunk_per_instruction(variant):
    policy = build(variant, seed=1)
    b, steps = 32, LEARN[variant]
    batch = obs_batch(b, seed=5)
    targets = _targets()
    batch["action"] = targets[torch.arange(b) % 2]
    opt = policy.make_optimizer()
    sched = policy.make_scheduler(opt, steps)
    losses = []
    for _ in range(steps):
        loss, logs = policy.compute_loss(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        policy.ema_update()
        losses.append(logs["loss"])
    assert np.mean(losses[-10:]) < 0.2 * np.mean(losses[:10])
    if VARIANTS[variant][0] == "diffusion":
        policy.sampler, policy.num_inference_steps = "ddpm", 100
    test = obs_batch(4, seed=9)  # unseen states, both instructions
    chunk = torch.from_numpy(policy.predict_chunk(test, noise(4, seed=4)))
    want = targets[torch.arange(4) % 2]
    err_own = (chunk - want).abs().mean(dim=(1, 2))
    err_other = (chunk - targets[(torch.arange(4) + 1) % 2]).abs().mean(dim=(1, 2))
    assert (err_own < 0.25).all(), f"chunks far from their instruction's target: {err_own}"
    assert (err_own < err_other).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_checkpoint_round_trip(variant, tmp_path):
    policy = build(variant)
    opt = policy.make_optimizer()
    batch = {**obs_batch(8), "action": torch.rand(8, H, DA) * 2 - 1}
    for _ in range(3):  # make the EMA and trained weights differ from their initial values
        loss, _ = policy.compute_loss(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        policy.ema_update()
    save_policy(policy, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file() and (tmp_path / "ckpt" / "config.json").is_file()
    loaded = load_policy(str(tmp_path / "ckpt"), device="cpu")
    assert type(loaded) is type(policy) and loaded.task_names == TASKS
    np.testing.assert_array_equal(policy.predict_chunk(obs_batch(), noise()), loaded.predict_chunk(obs_batch(), noise()))
    for name, tensor in policy.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0, msg=name)


def test_checkpoint_spec_mismatch(tmp_path):
    save_policy(build("flow"), tmp_path / "ckpt")
    with pytest.raises(SpecMismatchError, match="state_dim"):
        load_policy(str(tmp_path / "ckpt"), device="cpu", obs_spec=ObservationSpec(DS + 1))
    policy = load_policy(str(tmp_path / "ckpt"), device="cpu", obs_spec=OBS_SPEC, action_spec=ACTION_SPEC)
    with pytest.raises(SpecMismatchError, match="dim"):
        policy.check_spec(OBS_SPEC, ActionSpec(DA + 1))
    onehot = build("mlp")
    onehot.check_spec(OBS_SPEC, ACTION_SPEC, tasks=TASKS)
    with pytest.raises(SpecMismatchError, match="stack"):
        onehot.check_spec(OBS_SPEC, ACTION_SPEC, tasks=["stack"])


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_policy(str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_policy(str(tmp_path / "empty"))


@pytest.mark.parametrize("family,field,value", [
    ("flow", "horizon", 3),  # < n_action_steps (4)
    ("flow", "n_action_steps", 0),
    ("flow", "n_obs_steps", 0),
    ("flow", "num_inference_steps", 0),
    ("flow", "num_inference_steps", 1001),
    ("flow", "sampler", "rk4"),
    ("flow", "obs_mode", "rgb"),
    ("flow", "text_encoder", "bert"),
    ("flow", "text_encoder", "openclip"),  # needs openclip_checkpoint
    ("flow", "net", "transformer"),
    ("flow", "lr", 0.0),
    ("diffusion", "num_inference_steps", 101),  # > num_train_timesteps
    ("diffusion", "sampler", "euler"),
    ("diffusion", "prediction_type", "v_prediction"),
    ("mlp", "hidden", 0),
    ("flow", "image_activation", "tanh"),
    ("flow", "not_a_field", 1),
])
def test_bad_config_names_the_field(family, field, value):
    with pytest.raises(ValueError, match=field):
        make_config(family, {field: value})


def test_unet_horizon_must_divide():
    with pytest.raises(ValueError, match="horizon"):
        make_config("flow", {"net": "unet", "horizon": 10, "down_dims": (16, 32, 64), "n_groups": 4,
                             "n_action_steps": 4})


@pytest.mark.parametrize("variant", ["flow", "mlp"])
def test_bad_inputs_are_named(variant):
    policy = build(variant)
    good = obs_batch()
    with pytest.raises(ValueError, match=r"state.*\(B, To=2, Ds=5\)"):
        policy.predict_chunk({**good, "state": good["state"][:, 0]})
    with pytest.raises(TypeError, match="instruction"):
        policy.predict_chunk({**good, "instruction": "lift the red block"})
    with pytest.raises(ValueError, match="instruction"):
        policy.predict_chunk({**good, "instruction": INSTRUCTIONS * 2})
    with pytest.raises(ValueError, match="noise"):
        policy.predict_chunk(good, np.zeros((2, H, DA + 1), np.float32))
    with pytest.raises(ValueError, match="action"):
        policy.compute_loss({**good, "action": torch.zeros(2, H - 1, DA)})


def test_onehot_needs_known_task():
    policy = build("mlp")
    good = obs_batch()
    with pytest.raises(ValueError, match="task"):
        policy.predict_chunk({k: v for k, v in good.items() if k != "task"})
    with pytest.raises(UnknownNameError, match="stack"):
        policy.predict_chunk({**good, "task": ["stack", "lift"]})


def test_padded_actions_do_not_count():
    policy = build("mlp")
    batch = {**obs_batch(4), "action": torch.zeros(4, H, DA), "action_is_pad": torch.zeros(4, H, dtype=torch.bool)}
    batch["action_is_pad"][:, H // 2:] = True
    loss_a, _ = policy.compute_loss(batch)
    batch["action"][:, H // 2:] = 1.0  # only padded entries change
    loss_b, _ = policy.compute_loss(batch)
    assert torch.equal(loss_a, loss_b)


def test_pixel_policy_with_random_shift():
    spec = ObservationSpec(state_dim=4, cameras=("front",), image_size=16)
    policy = make_policy("flow", {**VARIANTS["flow"][1], "obs_mode": "pixels", "image_keypoints": 4}, spec,
                         ACTION_SPEC, None, device="cpu")
    rng = np.random.default_rng(0)
    batch = {"state": rng.normal(size=(2, TO, 4)).astype(np.float32),
             "image": rng.integers(0, 255, size=(2, TO, 16, 16, 3), dtype=np.uint8), "instruction": INSTRUCTIONS}
    loss, _ = policy.compute_loss({**batch, "action": torch.zeros(2, H, DA)})
    loss.backward()
    chunk = policy.predict_chunk(batch, noise())
    assert chunk.shape == (2, H, DA)
    np.testing.assert_array_equal(chunk, policy.predict_chunk(batch, noise()))  # no augmentation at inference
    with pytest.raises(TypeError, match="uint8"):
        policy.predict_chunk({**batch, "image": batch["image"].astype(np.float32)}, noise())
    with pytest.raises(SpecMismatchError):
        make_policy("flow", {"obs_mode": "pixels"}, OBS_SPEC, ACTION_SPEC, None)


def test_image_activation_is_chosen_and_old_checkpoints_keep_mish(tmp_path):
    """The conv trunk uses ``image_activation`` (SiLU by default); a checkpoint written before the
    field existed loads with Mish, the activation it was trained with, and predicts as it did."""
    spec = ObservationSpec(state_dim=4, cameras=("front",), image_size=16)
    cfg = {**VARIANTS["flow"][1], "obs_mode": "pixels", "image_keypoints": 4}
    acts = {a: [type(m) for m in make_policy("flow", {**cfg, "image_activation": a}, spec, ACTION_SPEC, None,
                                             device="cpu").model["obs"].image.trunk if not isinstance(
                                                 m, (torch.nn.Conv2d, torch.nn.GroupNorm))]
            for a in ("silu", "relu", "mish")}
    assert acts == {"silu": [torch.nn.SiLU] * 4, "relu": [torch.nn.ReLU] * 4, "mish": [torch.nn.Mish] * 4}
    assert make_config("flow", {}).image_activation == "silu"

    old = make_policy("flow", {**cfg, "image_activation": "mish"}, spec, ACTION_SPEC, None, device="cpu")
    rng = np.random.default_rng(0)
    batch = {"state": rng.normal(size=(2, TO, 4)).astype(np.float32),
             "image": rng.integers(0, 255, size=(2, TO, 16, 16, 3), dtype=np.uint8), "instruction": INSTRUCTIONS}
    want = old.predict_chunk(batch, noise())
    path = save_policy(old, tmp_path / "old")
    meta = json.loads((path / "config.json").read_text())
    del meta["config"]["image_activation"]  # as written before the field existed
    (path / "config.json").write_text(json.dumps(meta))
    loaded = load_policy(str(path), device="cpu")
    assert loaded.config.image_activation == "mish"
    np.testing.assert_array_equal(loaded.predict_chunk(batch, noise()), want)
    silu = make_policy("flow", cfg, spec, ACTION_SPEC, None, device="cpu")
    silu.model.load_state_dict(old.model.state_dict())
    assert not np.array_equal(silu.predict_chunk(batch, noise()), want)  # the activation matters


def test_pixel_policy_learns_privileged_state_from_images(tmp_path):
    """The auxiliary loss regresses the current step's full state from the image features.

    A bright pixel sits at a random place in each image; its (row, col) is the privileged
    state. Training on the aux loss alone must bring it well below the untrained loss, its
    gradient must reach the conv trunk, and the head must survive a checkpoint round-trip.
    """
    spec = ObservationSpec(state_dim=4, cameras=("front",), image_size=16)
    stats = {**STATS, "state": {k: v[:4] for k, v in STATS["state"].items()},
             "privileged_state": {"mean": np.full(2, 7.5), "std": np.full(2, 4.6), "min": np.zeros(2),
                                  "max": np.full(2, 15.0)}}
    torch.manual_seed(0)
    cfg = {**VARIANTS["flow"][1], "obs_mode": "pixels", "image_keypoints": 8, "aux_state_dim": 2, "crop_pad": 0,
           "lr": 3e-3}
    policy = make_policy("flow", cfg, spec, ACTION_SPEC, stats, device="cpu")
    rng = np.random.default_rng(0)

    def batch(n: int) -> dict:
        pos = rng.integers(0, 16, size=(n, 2))
        img = np.zeros((n, TO, 16, 16, 3), np.uint8)
        img[np.arange(n), :, pos[:, 0], pos[:, 1]] = 255
        return {"state": np.zeros((n, TO, 4), np.float32), "image": img, "instruction": ["lift"] * n,
                "action": torch.zeros(n, H, DA),
                "privileged_state": np.repeat(pos[:, None].astype(np.float32), TO, 1)}

    loss, logs = policy.compute_loss(batch(8))
    assert {"aux_state_loss", "action_loss"} <= set(logs)
    assert logs["loss"] == pytest.approx(logs["action_loss"] + logs["aux_state_loss"], rel=1e-5)
    loss.backward()
    assert policy.model["obs"].image.trunk[0].weight.grad.abs().sum() > 0
    opt = policy.make_optimizer()
    aux_losses = []
    for _ in range(150):  # the aux loss alone: the action target is constant anyway
        b = batch(32)
        _, pred = policy._encode(policy.model, policy._read_obs(b, "batch"), aux=True)
        aux = torch.nn.functional.mse_loss(pred, policy._aux_target(b, 32))
        opt.zero_grad()
        aux.backward()
        opt.step()
        aux_losses.append(aux.item())
    assert np.mean(aux_losses[-10:]) < 0.5 * np.mean(aux_losses[:10])
    # without the privileged state the loss is the action loss alone
    no_priv = {k: v for k, v in batch(4).items() if k != "privileged_state"}
    assert "aux_state_loss" not in policy.compute_loss(no_priv)[1]
    save_policy(policy, str(tmp_path / "ckpt"))
    again = load_policy(str(tmp_path / "ckpt"), device="cpu")
    assert again.config.aux_state_dim == 2
    torch.testing.assert_close(again.normalizer.privileged_mean, policy.normalizer.privileged_mean)
    with pytest.raises(ValueError, match="aux_state_dim"):
        make_config("flow", {"aux_state_dim": 3})  # a state policy has no images to train


def test_text_dropout_acts_in_training_only():
    from policies.common.encoders import TextPool

    torch.manual_seed(0)
    pooled, tokens = torch.randn(4, 12), torch.randn(4, 6, 12)
    mask = torch.ones(4, 6, dtype=torch.bool)
    pool = TextPool(12, 8, "attention", token_dropout=0.5)
    pool.train()
    assert not torch.equal(pool(pooled, tokens, mask), pool(pooled, tokens, mask))  # other words hidden
    pool.eval()
    torch.testing.assert_close(pool(pooled, tokens, mask), pool(pooled, tokens, mask))
    only_first = mask.clone()
    only_first[:, 1:] = False  # a one-token instruction keeps its token: never an empty attention
    pool.train()
    assert torch.isfinite(pool(pooled, tokens, only_first)).all()
    feats = TextPool(12, 8, "attention", feature_dropout=0.5)
    feats.train()
    assert (feats(pooled, tokens, mask) == 0).any()  # dropped features
    feats.eval()
    torch.testing.assert_close(feats(pooled, tokens, mask), feats(pooled, tokens, mask))
    plain = TextPool(12, 8, "attention")
    plain.train()
    torch.testing.assert_close(plain(pooled, tokens, mask), plain(pooled, tokens, mask))
    with pytest.raises(ValueError, match="text_token_dropout"):
        make_config("flow", {"text_token_dropout": 1.0})


@pytest.mark.parametrize("variant", [*VARIANTS, "flow-midpoint", "diffusion-ddim", "diffusion-dpm"])
@pytest.mark.parametrize("widths", [{}, {"state_hidden": 20, "obs_dim": 13, "text_dim": 7}])
def test_predict_rows_is_each_row_alone_bitwise(variant, widths):
    """Evaluation batches rows with ``predict_rows``: each must be what the row gives alone."""
    name, sampler = variant.split("-") if variant.count("-") and "unet" not in variant else (variant, None)
    family, cfg = VARIANTS[name]
    torch.manual_seed(0)
    policy = make_policy(family, {**cfg, **widths, **({"sampler": sampler} if sampler else {})}, OBS_SPEC,
                         ACTION_SPEC, STATS, TASKS, device="cpu")
    words = ["lift the red block", "push the blue block to the far left corner of the table", "lift it"]
    for b in (2, 5):
        batch = obs_batch(b, seed=b)
        batch["instruction"] = [words[i % 3] for i in range(b)]  # lengths differ: padded when batched
        z = noise(b, seed=b)
        alone = np.concatenate([policy.predict_chunk({k: v[i: i + 1] for k, v in batch.items()}, z[i: i + 1])
                                for i in range(b)])
        assert np.array_equal(policy.predict_rows(batch, z), alone), f"{variant} {widths} b={b}"
    assert policy.batches_rows == (cfg.get("net", "mlp") == "mlp")
    policy.train()  # a policy in training mode is put back in it
    before = policy.inference_model.training
    policy.predict_rows(batch, z)
    assert policy.model.training and policy.inference_model.training == before


def test_text_attention_matches_the_direct_form():
    """``TextPool`` attends in the token space; it must be the textbook key/value attention."""
    from policies.common.encoders import TextPool

    torch.manual_seed(0)
    pool = TextPool(12, 8, "attention", queries=3, key_dim=5)
    with torch.no_grad():  # a norm that is not the identity, and key/value biases
        pool.norm.weight.uniform_(0.5, 2.0)
        pool.norm.bias.normal_()
        pool.key.bias.normal_()
        pool.value.bias.normal_()
    tokens = torch.randn(4, 6, 12) * 3 + 1
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 3:] = False
    mask[2, 1:] = False

    def direct(p: TextPool) -> torch.Tensor:
        t = p.norm(tokens)
        k, v = p.key(t), p.value(t)
        logits = torch.einsum("qd,bld->bql", p.queries, k) / k.shape[-1] ** 0.5
        logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
        return torch.einsum("bql,bld->bqd", torch.softmax(logits, dim=-1), v).flatten(1)

    fast, slow = pool._attend(tokens, mask), direct(pool)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    grads = []
    for out in (fast, slow):
        pool.zero_grad()
        (out * torch.linspace(-1, 1, out.shape[1])).sum().backward(retain_graph=True)
        grads.append({n: p.grad.clone() for n, p in pool.named_parameters() if p.grad is not None})
    # the key's bias shifts every logit of a query alike: no gradient in either form
    assert torch.allclose(grads[1].pop("key.bias"), torch.zeros(5), atol=1e-6) and "key.bias" not in grads[0]
    assert grads[0].keys() == grads[1].keys() and {"queries", "norm.weight", "value.weight"} <= grads[0].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-5, msg=name)
    padded = torch.where(mask[..., None], tokens, torch.full_like(tokens, 1e3))  # padding is never read
    torch.testing.assert_close(pool._attend(padded, mask), fast)


def test_lr_schedule_warms_up_then_decays():
    policy = build("flow", warmup_steps=10)
    opt = policy.make_optimizer()
    sched = policy.make_scheduler(opt, 100)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    peak = policy.config.lr
    assert lrs[0] < 0.2 * peak and max(lrs) == pytest.approx(peak) and lrs[-1] < 0.01 * peak


@pytest.mark.parametrize("variant", ["flow", "flow-unet", "flow-midpoint", "flow-heun", "diffusion", "mlp"])
def test_a_frozen_policy_gives_one_row_chunks_bitwise_the_eager_ones(variant):
    """``freeze_for_inference`` (what eval, play and serve load) runs one-row chunks as a traced graph: the
    chunk must be bitwise the eager one, and the batched rows of evaluation must stay what each row gives."""
    name, sampler = variant.split("-") if variant.count("-") and "unet" not in variant else (variant, None)
    family, cfg = VARIANTS[name]
    torch.manual_seed(0)
    policy = make_policy(family, {**cfg, **({"sampler": sampler} if sampler else {})}, OBS_SPEC, ACTION_SPEC, STATS,
                         TASKS, device="cpu")
    with torch.no_grad():  # FiLM starts at zero: give every weight a value that matters
        for p in policy.inference_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    rows = [({k: v[i: i + 1] for k, v in obs_batch(3, seed=7).items()}, noise(3, seed=7)[i: i + 1]) for i in range(3)]
    eager = [policy.predict_chunk(b, z) for b, z in rows]
    assert policy.freeze_for_inference() == (family == "flow")
    for _ in range(4):  # traced on the first call, then run by TorchScript's executor (which profiles, then optimises)
        for (b, z), want in zip(rows, eager):
            assert np.array_equal(policy.predict_chunk(b, z), want), variant
    batch, z = obs_batch(3, seed=7), noise(3, seed=7)
    assert np.array_equal(policy.predict_rows(batch, z), np.concatenate(eager))
    if family == "flow":
        assert len(policy._frozen.graphs) == 1 and len(policy._frozen.text) == 2
        policy.num_inference_steps = 2  # another setting: another graph, still the eager chunk
        fresh = policy.predict_chunk(*rows[0])
        policy._frozen, kept = None, policy._frozen
        assert np.array_equal(fresh, policy.predict_chunk(*rows[0]))
        policy._frozen = kept
        assert len(policy._frozen.graphs) == 2
    policy.train()  # the weights may change from here: the graphs are dropped
    assert policy._frozen is None
