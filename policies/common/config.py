"""Config schema shared by every policy family: typed dataclasses with checked fields.

Each family subclasses one of these in its own ``config.py`` and adds its fields; Hydra
registers the dataclasses as schemas and YAML only overrides values. Every check names
the field, the value received and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

OBS_MODES = ("state", "pixels")
TEXT_ENCODERS = ("minilm", "openclip", "onehot")
TEXT_POOLS = ("attention", "mean")
DENOISER_NETS = ("mlp", "unet")


def check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    """Raise ValueError unless ``low <= value (<= high)`` and value is an int."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    ok = ok and (high is None or value <= high)
    if not ok:
        allowed = f"an int >= {low}" if high is None else f"an int in {low}..{high}"
        raise ValueError(f"{name}={value!r} is not allowed: must be {allowed}")


def check_float(name: str, value: Any, low: float, high: float | None = None, low_open: bool = False) -> None:
    """Raise ValueError unless value is a number in [low, high] (or (low, high])."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        lo = f"> {low}" if low_open else f">= {low}"
        hi = "" if high is None else f" and <= {high}"
        raise ValueError(f"{name}={value!r} is not allowed: must be a number {lo}{hi}")


def check_noise_scale(value: Any) -> None:
    """Raise ValueError unless value is a finite number >= 0 (a factor on N(0, I) noise)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise ValueError(f"noise_scale={value!r} is not allowed: must be a finite number >= 0 (1: the trained "
                         "N(0, I) noise, 0: the zero noise)")


IMAGE_ACTIVATIONS = ("silu", "relu", "mish")


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed: must be one of {', '.join(map(repr, allowed))}")


@dataclass
class PolicyConfig:
    """Fields every policy has.

    Attributes:
        n_obs_steps: To, observation steps conditioned on (>= 1).
        horizon: H, actions predicted per chunk (>= n_action_steps).
        n_action_steps: Ta, actions executed per chunk (>= 1).
        obs_mode: ``"state"`` (state vector only) or ``"pixels"`` (camera image(s) plus the
            state vector, which then holds proprioception only).
        state_hidden: width of the state MLP.
        state_layers: hidden layers of the state MLP (each FiLM-modulated by the text).
        obs_dim: size of the observation feature vector.
        image_keypoints: spatial-softmax keypoints per camera (pixels only).
        image_channels: width of the conv trunk (its first two layers; the last two have twice
            as many). Small for a CPU; raise it on a GPU.
        image_activation: the conv trunk's activation, ``"silu"``, ``"relu"`` or ``"mish"``. SiLU
            trains as well as Mish here and costs far less on a CPU (Mish on the trunk's feature maps
            was the largest single cost of a pixel training step); checkpoints saved before this
            field existed load with ``"mish"``, the activation they were trained with.
        crop_pad: random-shift augmentation in pixels (0 turns it off; pixels only).
        aux_state_dim: size of the privileged (full) state that a pixel policy learns to
            predict from its image features, an auxiliary loss that teaches the keypoints to
            find the objects (0: off). ``embodied train`` sets it from a pixel dataset's
            ``privileged_state`` feature; the policy never reads that state as input.
        aux_state_weight: weight of that auxiliary loss (0 turns it off in ``embodied train``).
        text_encoder: ``"minilm"`` (frozen all-MiniLM-L6-v2, 384-d, offline), ``"openclip"``
            (frozen open_clip text tower from ``openclip_checkpoint``) or ``"onehot"``
            (task id from ``obs["task"]``; no language).
        text_dim: size of the projected text feature vector.
        text_pool: ``"attention"`` (learned queries attend over the instruction's contextual
            token vectors, plus the pooled sentence vector; keeps word order, which mean
            pooling nearly erases) or ``"mean"`` (the pooled sentence vector only).
        text_queries: attention queries of ``text_pool="attention"``.
        text_token_dropout: probability that a training step hides a token of the instruction
            from the attention (word dropout; 0: off), so that no single word decides the task
            and held-out wordings are read as their training paraphrases.
        text_feature_dropout: dropout on the projected text features in training (0: off).
        text_film: FiLM-modulate the state MLP with the text features (see ``ObsEncoder``).
        ground_instructions: at the start of an episode, replace a wording the policy was not
            trained on by the nearest training wording (sentence vectors) among the tasks whose
            demonstrations start nearest to the scene (see ``policies.common.grounding``);
            ``embodied train`` stores the index in the checkpoint. Suits state observations
            that show the scene and instructions without parameters (Meta-World's recipe).
        ground_neighbours: how many nearest demonstrations name the candidate tasks.
        openclip_model: open_clip architecture name of the checkpoint.
        openclip_checkpoint: local path of open_clip weights (required for ``openclip``).
        lr, weight_decay, betas: AdamW settings.
        warmup_steps: linear warm-up before the cosine decay.
        mask_padding: leave actions past the episode end (``action_is_pad``) out of the loss.
        ema: keep an exponential moving average of the weights (used for inference).
        ema_power, ema_max_decay: EMA schedule, decay = 1 - (1 + step) ** -power.
        seed: seed of the generator that samples noise when none is given.
    """

    n_obs_steps: int = 2
    horizon: int = 8
    n_action_steps: int = 4
    obs_mode: str = "state"
    state_hidden: int = 512
    state_layers: int = 2
    obs_dim: int = 256
    image_keypoints: int = 32
    image_channels: int = 16
    image_activation: str = "silu"
    crop_pad: int = 4
    aux_state_dim: int = 0
    aux_state_weight: float = 1.0
    text_encoder: str = "minilm"
    text_dim: int = 64
    text_pool: str = "attention"
    text_queries: int = 4
    text_token_dropout: float = 0.0
    text_feature_dropout: float = 0.0
    text_film: bool = True
    ground_instructions: bool = False
    ground_neighbours: int = 20
    openclip_model: str = "ViT-B-32"
    openclip_checkpoint: str | None = None
    lr: float = 1e-3
    weight_decay: float = 1e-6
    betas: tuple[float, float] = (0.95, 0.999)
    warmup_steps: int = 200
    mask_padding: bool = True
    ema: bool = True
    ema_power: float = 0.75
    ema_max_decay: float = 0.9999
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("n_obs_steps", self.n_obs_steps, 1)
        check_int("n_action_steps", self.n_action_steps, 1)
        check_int("horizon", self.horizon, 1)
        if self.horizon < self.n_action_steps:
            raise ValueError(f"horizon={self.horizon} is not allowed: must be >= n_action_steps "
                             f"({self.n_action_steps})")
        check_choice("obs_mode", self.obs_mode, OBS_MODES)
        for name in ("state_hidden", "state_layers", "obs_dim", "image_keypoints", "text_dim"):
            check_int(name, getattr(self, name), 1)
        check_int("image_channels", self.image_channels, 8)
        check_choice("image_activation", self.image_activation, IMAGE_ACTIVATIONS)
        if self.image_channels % 8:
            raise ValueError(f"image_channels={self.image_channels} is not allowed: must be a multiple of 8 "
                             f"(GroupNorm with 8 groups)")
        check_int("crop_pad", self.crop_pad, 0)
        check_int("aux_state_dim", self.aux_state_dim, 0)
        check_float("aux_state_weight", self.aux_state_weight, 0.0)
        if self.aux_state_dim and self.obs_mode != "pixels":
            raise ValueError(f"aux_state_dim={self.aux_state_dim} is not allowed with obs_mode={self.obs_mode!r}: "
                             "the auxiliary state loss trains image features (obs_mode='pixels'); use 0")
        check_choice("text_encoder", self.text_encoder, TEXT_ENCODERS)
        check_choice("text_pool", self.text_pool, TEXT_POOLS)
        check_int("text_queries", self.text_queries, 1)
        check_float("text_token_dropout", self.text_token_dropout, 0.0, 0.9)
        check_float("text_feature_dropout", self.text_feature_dropout, 0.0, 0.9)
        if self.text_encoder == "openclip" and not self.openclip_checkpoint:
            raise ValueError("openclip_checkpoint=None is not allowed with text_encoder='openclip': give the "
                             "path of a local open_clip checkpoint (nothing is downloaded), or use "
                             "text_encoder='minilm'")
        check_float("lr", self.lr, 0.0, low_open=True)
        check_float("weight_decay", self.weight_decay, 0.0)
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        if len(self.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas={self.betas!r} is not allowed: must be two numbers in [0, 1)")
        check_int("warmup_steps", self.warmup_steps, 0)
        check_int("ground_neighbours", self.ground_neighbours, 1)
        if self.ground_instructions is True and self.text_encoder == "onehot":
            raise ValueError("ground_instructions=True is not allowed with text_encoder='onehot': a one-hot policy "
                             "reads the task name, not the words; use a sentence encoder ('minilm')")
        for name in ("ema", "mask_padding", "text_film", "ground_instructions"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed: must be true or false")
        check_float("ema_power", self.ema_power, 0.0, low_open=True)
        check_float("ema_max_decay", self.ema_max_decay, 0.0, 1.0)
        check_int("seed", self.seed, 0)


@dataclass
class DenoiserConfig(PolicyConfig):
    """Fields of the noise-conditioned network shared by flow and diffusion policies.

    Attributes:
        net: ``"mlp"`` (FiLM residual MLP over the flattened chunk; the default: its training
            step costs far less on a CPU than the U-Net's; see
            docs/results/policies.md#speed-what-each-design-choice-saves) or
            ``"unet"`` (1-D temporal conv U-Net with FiLM, as in Diffusion Policy; for long
            smooth chunks, pixels, or a GPU).
        hidden: width of the MLP denoiser.
        n_layers: residual blocks of the MLP denoiser.
        time_emb_dim: size of the sinusoidal time embedding.
        down_dims: channels per U-Net level (horizon must divide by 2**(levels-1)).
        kernel_size: U-Net temporal kernel (odd).
        n_groups: GroupNorm groups of the U-Net (must divide every entry of down_dims).
        num_inference_steps: denoising / integration steps at inference; can be changed
            after loading (``policy.num_inference_steps = 4``).
        noise_scale: factor on the initial noise the policy draws at inference when it is given
            none (1: N(0, I), the noise it was trained from; 0: always the zero noise, the
            flow's mode); noise passed in (steering's) is used as given. An inference
            setting: it does not change training, and can be changed after loading
            (``policy.noise_scale = 0``).
    """

    net: str = "mlp"
    hidden: int = 256
    n_layers: int = 3
    time_emb_dim: int = 64
    down_dims: tuple[int, ...] = (64, 128, 256)
    kernel_size: int = 5
    n_groups: int = 8
    num_inference_steps: int = 10
    noise_scale: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("net", self.net, DENOISER_NETS)
        check_noise_scale(self.noise_scale)
        check_int("hidden", self.hidden, 1)
        check_int("n_layers", self.n_layers, 1)
        check_int("time_emb_dim", self.time_emb_dim, 2)
        if self.time_emb_dim % 2:
            raise ValueError(f"time_emb_dim={self.time_emb_dim} is not allowed: must be even")
        self.down_dims = tuple(self.down_dims)
        if not self.down_dims or not all(isinstance(d, int) and d >= 1 for d in self.down_dims):
            raise ValueError(f"down_dims={self.down_dims!r} is not allowed: must be a non-empty list of ints >= 1")
        check_int("kernel_size", self.kernel_size, 1)
        if self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size={self.kernel_size} is not allowed: must be odd")
        check_int("n_groups", self.n_groups, 1)
        if self.net == "unet":
            bad = [d for d in self.down_dims if d % self.n_groups]
            if bad:
                raise ValueError(f"n_groups={self.n_groups} is not allowed: must divide every entry of "
                                 f"down_dims={self.down_dims} (not {bad})")
            factor = 2 ** (len(self.down_dims) - 1)
            if self.horizon % factor:
                raise ValueError(f"horizon={self.horizon} is not allowed with net='unet' and "
                                 f"{len(self.down_dims)} levels: must be a multiple of {factor}")
        check_int("num_inference_steps", self.num_inference_steps, 1, 1000)


def config_from_dict(cls: type, values: Mapping[str, Any] | Any) -> Any:
    """Build config ``cls`` from a dict (or return a dataclass instance of it unchanged).

    Unknown keys raise ValueError naming them and the allowed fields; a ``name`` key is
    ignored (Hydra policy groups carry it). Lists become tuples (JSON has no tuples).
    """
    if isinstance(values, cls):
        return values
    if dataclasses.is_dataclass(values) and not isinstance(values, type):
        raise TypeError(f"config must be a {cls.__name__} or a dict, got a {type(values).__name__}")
    if hasattr(values, "_metadata") and hasattr(values, "items"):  # omegaconf DictConfig
        from omegaconf import OmegaConf

        values = OmegaConf.to_container(values, resolve=True)
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise TypeError(f"config must be a {cls.__name__} or a dict, got a {type(values).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in values.items() if k != "name"}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; allowed fields: {', '.join(sorted(names))}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
