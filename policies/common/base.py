"""TorchPolicy: the torch side of the ``embodied.Policy`` contract, shared by every family.

A policy is normaliser + encoders + a family-specific head, in one ``nn.Module``:

    instruction --frozen TextEmbedder--> pooled (B, 384) + tokens (B, L, 384) --TextPool--> text (B, text_dim) --+
    obs (B, To, ...) --ObsEncoder, FiLM-modulated by text--> obs features (B, obs_dim) --+--> cond (B, C)
    cond (+ noise) --head (flow / diffusion / MLP)--> chunk (B, H, Da) in [-1, 1] (normalised)

A family subclasses ``TorchPolicy`` and supplies three methods: ``build_head(cond_dim)``,
``head_loss(model, cond, action, weight)`` and ``sample(model, cond, noise)``. The trainable parts
are ``self.model`` (an ``nn.ModuleDict`` with ``obs``, ``text``, ``head``); ``self.ema``
holds their moving average, which inference uses when present.

Training loop (written by the caller)::

    opt = policy.make_optimizer(); sched = policy.make_scheduler(opt, total_steps)
    for batch in loader:
        loss, logs = policy.compute_loss(batch)
        opt.zero_grad(); loss.backward(); opt.step(); sched.step(); policy.ema_update()
    policies.save_policy(policy, run_dir / "checkpoint")
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from embodied.core.errors import SpecMismatchError
from embodied.core.policy import Policy, batch_row
from embodied.core.specs import ActionSpec, ObservationSpec, check_compatible
from policies.common.config import PolicyConfig, check_noise_scale
from policies.common.ema import EMA
from policies.common.encoders import ObsEncoder, TextPool
from policies.common.nets import row_invariant
from policies.common.normalize import Normalizer
from policies.common.text import make_text_embedder


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> cuda when available, else cpu; a device that does not exist here is an error."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device={device!r} is not a torch device ({e}); use auto, cpu or cuda[:N]") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}, but this machine has no CUDA GPU; device=auto picks what exists")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}, but this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r}, but MPS is not available here; device=auto picks what exists")
    return dev


def _as_tensor(value: Any, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    raise TypeError(f"{what} must be a numpy array or torch tensor, got {type(value).__name__}")


def _check_shape(t: torch.Tensor, what: str, expected: tuple[int | None, ...], names: str) -> None:
    ok = t.ndim == len(expected) and all(e is None or e == s for e, s in zip(expected, t.shape))
    if not ok:
        want = ", ".join(n if e is None else f"{n}={e}" for n, e in zip(names.split(","), expected))
        raise ValueError(f"{what} must have shape ({want}), got {tuple(t.shape)}")


def _str_list(value: Any, what: str, batch: int) -> list[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple, np.ndarray)):
        raise TypeError(f"{what} must be a list of {batch} str (one per batch row), got {type(value).__name__}")
    out = [str(v) for v in value]
    if len(out) != batch:
        raise ValueError(f"{what} has {len(out)} entries, the batch has {batch} rows")
    return out


def _text_head(model: nn.ModuleDict, pooled: torch.Tensor, tokens: torch.Tensor | None,
               mask: torch.Tensor | None) -> torch.Tensor:
    """The trained text head on the frozen encoder's output (token features with ``text_pool=attention``)."""
    return model["text"](pooled) if tokens is None else model["text"](pooled, tokens, mask)


def _condition(model: nn.ModuleDict, state: torch.Tensor, images: torch.Tensor | None, text: torch.Tensor,
               aux: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Conditioning features (B, C) from the normalised state, the images and the text features: the
    observation encoder's output beside the text; with ``aux`` also the predicted privileged state."""
    out = model["obs"](state, images, text, aux=aux)
    if aux:
        return torch.cat([out[0], text], dim=-1), out[1]
    return torch.cat([out, text], dim=-1)


def masked_mse(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """Mean squared error over (B, H, Da), counting only entries with weight 1."""
    if weight is None:
        return torch.nn.functional.mse_loss(pred, target)
    w = weight.expand_as(pred)
    return ((pred - target) ** 2 * w).sum() / w.sum().clamp_min(1.0)


class TorchPolicy(Policy, nn.Module):
    """Base of flow, diffusion and MLP policies.

    Args:
        config: the family's config dataclass.
        obs_spec, action_spec: what the task observes and accepts.
        stats: dataset statistics for the normaliser (see ``Normalizer``); ``None`` when the
            buffers come from a checkpoint.
        task_names: task vocabulary (required by ``text_encoder="onehot"``; recorded in the
            checkpoint in every case).
        device: ``"auto"`` (cuda if available), ``"cpu"``, ``"cuda:0"``, ...
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type[PolicyConfig]] = PolicyConfig
    generative: ClassVar[bool] = True  # False: the chunk does not depend on the noise

    def __init__(self, config: PolicyConfig, obs_spec: ObservationSpec, action_spec: ActionSpec,
                 stats: Mapping[str, Mapping[str, Any]] | None = None, task_names: Sequence[str] | None = None,
                 device: str | torch.device = "auto") -> None:
        nn.Module.__init__(self)
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        if not isinstance(obs_spec, ObservationSpec) or not isinstance(action_spec, ActionSpec):
            raise TypeError("obs_spec must be an ObservationSpec and action_spec an ActionSpec")
        if config.obs_mode == "pixels" and (not obs_spec.cameras or obs_spec.image_size <= 0):
            raise SpecMismatchError(f"obs_mode='pixels' needs cameras in the observation spec, got {obs_spec}")
        self.config = dataclasses.replace(config)  # a private copy: inference settings may change
        self.n_obs_steps, self.horizon, self.n_action_steps = config.n_obs_steps, config.horizon, config.n_action_steps
        Policy.__init__(self)
        self.obs_spec, self.action_spec = obs_spec, action_spec
        self.task_names = [str(t) for t in task_names] if task_names else []
        self.cameras = tuple(obs_spec.cameras) if config.obs_mode == "pixels" else ()
        self.text = make_text_embedder(config.text_encoder, self.task_names, config.openclip_model,
                                       config.openclip_checkpoint)
        self.normalizer = Normalizer(stats, obs_spec.state_dim, action_spec, config.aux_state_dim)
        obs = ObsEncoder(obs_spec.state_dim, config.n_obs_steps, config.state_hidden, config.obs_dim,
                         config.state_layers, config.text_dim if config.text_film else 0, len(self.cameras),
                         config.image_keypoints, config.crop_pad, config.image_channels, config.aux_state_dim,
                         config.image_activation)
        text = TextPool(self.text.dim, config.text_dim, config.text_pool, config.text_queries,
                        token_dropout=config.text_token_dropout, feature_dropout=config.text_feature_dropout)
        self.model = nn.ModuleDict({"obs": obs, "text": text,
                                    "head": self.build_head(config.obs_dim + config.text_dim)})
        self.ema = EMA(self.model, config.ema_power, config.ema_max_decay) if config.ema else None
        self._generator = torch.Generator().manual_seed(config.seed)
        self._frozen: _FrozenInference | None = None  # freeze_for_inference()
        self.to(resolve_device(device))

    # ---- family hooks -------------------------------------------------------------------
    @abc.abstractmethod
    def build_head(self, cond_dim: int) -> nn.Module:
        """The family's network, conditioned on (B, cond_dim) features."""

    @abc.abstractmethod
    def head_loss(self, model: nn.ModuleDict, cond: torch.Tensor, action: torch.Tensor,
                  weight: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        """Training loss for normalised actions (B, H, Da) given cond (B, C).

        ``weight`` (B, H, 1) masks padded actions (None: every action counts); use
        ``masked_mse``.
        """

    @abc.abstractmethod
    def sample(self, model: nn.ModuleDict, cond: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Normalised chunk (B, H, Da) from cond (B, C) and initial noise (B, H, Da)."""

    # ---- properties ---------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.normalizer.state_mean.device

    @property
    def noise_shape(self) -> tuple[int, int]:
        """(H, Da): the shape of one sample's initial noise."""
        return (self.horizon, self.action_spec.dim)

    @property
    def inference_model(self) -> nn.ModuleDict:
        """The EMA weights when EMA is on, else the trained weights."""
        return self.ema.averaged if self.ema is not None else self.model

    # ---- inputs -------------------------------------------------------------------------
    def _read_obs(self, batch: Mapping[str, Any], what: str) -> dict[str, Any]:
        """Validate ``state``/``image(s)``/``instruction``/``task`` and move them to the device."""
        if not isinstance(batch, Mapping):
            raise TypeError(f"{what} must be a dict, got {type(batch).__name__}")
        if "state" not in batch:
            raise ValueError(f"{what} has no 'state' (B, To, Ds); keys: {sorted(batch)}")
        state = _as_tensor(batch["state"], f"{what}['state']")
        _check_shape(state, f"{what}['state']", (None, self.n_obs_steps, self.obs_spec.state_dim), "B,To,Ds")
        b = state.shape[0]
        images = [self._read_image(batch, cam, b, what) for cam in self.cameras] or None
        if "instruction" not in batch:
            raise ValueError(f"{what} has no 'instruction' (list of B str); keys: {sorted(batch)}")
        tasks = batch.get("task")
        return {"state": state.to(self.device, torch.float32), "images": images,
                "instruction": _str_list(batch["instruction"], f"{what}['instruction']", b),
                "task": None if tasks is None else _str_list(tasks, f"{what}['task']", b)}

    def _read_image(self, batch: Mapping[str, Any], camera: str, b: int, what: str) -> torch.Tensor:
        if len(self.cameras) == 1 and "image" in batch:
            value, key = batch["image"], f"{what}['image']"
        elif isinstance(batch.get("images"), Mapping) and camera in batch["images"]:
            value, key = batch["images"][camera], f"{what}['images'][{camera!r}]"
        else:
            raise ValueError(f"{what} has no image for camera {camera!r} (pixel policy; keys: {sorted(batch)})")
        img = _as_tensor(value, key)
        s = self.obs_spec.image_size
        _check_shape(img, key, (b, self.n_obs_steps, s, s, 3), "B,To,H,W,C")
        if img.dtype != torch.uint8:
            raise TypeError(f"{key} must be uint8 (0..255), got {img.dtype}")
        return img.to(self.device)

    @property
    def noise_scale(self) -> float:
        """Factor on the initial noise drawn when none is given (``config.noise_scale``; 1
        for a family whose config has none)."""
        return float(getattr(self.config, "noise_scale", 1.0))

    @noise_scale.setter
    def noise_scale(self, value: float) -> None:
        if not hasattr(self.config, "noise_scale"):
            raise ValueError(f"noise_scale has no effect on a {self.name!r} policy: only flow and diffusion "
                             "policies draw initial noise")
        check_noise_scale(value)
        self.config.noise_scale = float(value)

    def _read_noise(self, noise: Any, b: int) -> torch.Tensor:
        if noise is None:
            drawn = torch.randn((b, *self.noise_shape), generator=self._generator)
            scale = self.noise_scale
            return (drawn if scale == 1.0 else drawn * scale).to(self.device)
        t = _as_tensor(noise, "noise")
        _check_shape(t, "noise", (b, *self.noise_shape), "B,H,Da")
        t = t.to(self.device, torch.float32)
        if not torch.isfinite(t).all():
            raise ValueError("noise has non-finite values")
        return t

    def _encode(self, model: nn.ModuleDict, obs: dict[str, Any], aux: bool = False, text: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Conditioning features (B, C); with ``aux`` also the predicted privileged state.
        ``text``: the text features, when already computed."""
        if text is None:
            text = self._text_features(model, obs["instruction"], obs["task"])
        return _condition(model, self.normalizer.normalize_state(obs["state"]), obs["images"], text, aux)

    def _text_features(self, model: nn.ModuleDict, instructions: Sequence[str],
                       tasks: Sequence[str] | None) -> torch.Tensor:
        """Text features (B, text_dim) of the instructions (and task names, for one-hot)."""
        return _text_head(model, *self._text_inputs(instructions, tasks))

    def _text_inputs(self, instructions: Sequence[str], tasks: Sequence[str] | None
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The frozen text encoder's output for the text head: pooled (B, D), and with
        ``text_pool=attention`` the token features and their mask (else None, None)."""
        pooled = self.text.embed(instructions, tasks).to(self.device)
        if self.config.text_pool == "attention":
            tokens, mask = self.text.embed_tokens(instructions, tasks)
            return pooled, tokens.to(self.device), mask.to(self.device)
        return pooled, None, None

    # ---- public API ---------------------------------------------------------------------
    def freeze_for_inference(self, runtime: str = "torchscript") -> bool:
        """Run one-row chunks through a traced, frozen graph of the inference weights as they are now.

        A one-row ``predict_chunk`` (a served robot, ``play``) then costs a fraction of the
        eager call: the observation encoder and the head's whole integration run as one graph,
        and each instruction's text features are computed once. ``runtime``:

        - ``"torchscript"`` (``torch.jit.trace`` + ``torch.jit.freeze``): the same kernels on
          the same inputs, so the chunk is bitwise the eager one (tests/test_policies.py);
        - ``"onnxruntime"``: the graph exported to ONNX and run by ONNX Runtime on one thread,
          about twice as fast again, but its chunks differ from torch's in the last bits
          (about 1e-6), so they are no longer bitwise what ``embodied eval`` computes.

        It applies on a CPU, with state observations, to families whose ``sample`` is a fixed
        loop (``graph_sampling``: flow); otherwise, and for batches, the eager path runs. The
        weights are pinned: ``train()`` drops the graphs. Returns whether it applies.
        """
        if runtime not in FROZEN_RUNTIMES:
            raise ValueError(f"runtime must be one of {FROZEN_RUNTIMES}, got {runtime!r}")
        ok = self.graph_sampling and self.device.type == "cpu" and self.config.obs_mode == "state"
        self._frozen = _FrozenInference(runtime) if ok else None
        return ok

    graph_sampling: ClassVar[bool] = False  # sample() is a fixed sequence of tensor ops (traceable)

    def train(self, mode: bool = True) -> "TorchPolicy":
        if mode:
            self._frozen = None  # the weights may change: the traced graphs would be stale
        return super().train(mode)

    def prepare_instructions(self, instructions: Sequence[str]) -> None:
        """Embed (and cache) these instructions now, in one batch, instead of as batches meet them."""
        if self.config.text_encoder == "onehot" or not instructions:
            return
        self.text.embed(list(instructions))
        if self.config.text_pool == "attention":
            self.text.embed_tokens(list(instructions))

    def sentence_vectors(self, texts: list[str]) -> np.ndarray:
        """Sentence vectors (N, D) of this policy's frozen text encoder (for grounding)."""
        return self.text.embed(texts).numpy()

    @torch.no_grad()
    def encode_obs(self, obs_batch: Mapping[str, Any]) -> torch.Tensor:
        """Conditioning features (B, C) of the inference weights for an observation batch."""
        model = self.inference_model
        was_training = model.training
        model.eval()
        try:
            return self._encode(model, self._read_obs(obs_batch, "obs_batch"))
        finally:
            model.train(was_training)

    @torch.no_grad()
    def predict_chunk(self, obs_batch: Mapping[str, Any], noise: np.ndarray | torch.Tensor | None = None) -> np.ndarray:
        """Predict (B, H, Da) float32 actions in the spec's bounds ([-1, 1]).

        Args:
            obs_batch: ``state`` (B, To, Ds) float32; ``image`` (B, To, S, S, 3) uint8 (or
                ``images`` {camera: ...}) for pixel policies; ``instruction`` list of B str;
                ``task`` list of B task names (required by ``text_encoder="onehot"``).
            noise: initial noise (B, H, Da); ``None`` draws it from the policy's generator
                (seeded by ``config.seed``). Same observation + same noise -> same chunk.
        """
        obs = self._read_obs(obs_batch, "obs_batch")
        return self._chunk(obs, self._read_noise(noise, obs["state"].shape[0]))

    def _chunk(self, obs: dict[str, Any], noise_t: torch.Tensor, rowwise: bool = False) -> np.ndarray:
        """The chunk (B, H, Da) in env units from read observations and noise, by the
        inference weights in eval mode. ``rowwise``: text features row by row, the rest as
        one batch under ``row_invariant`` (see ``predict_rows``)."""
        model = self.inference_model
        was_training = model.training
        if was_training:  # train()/eval() walk every module: not free on a one-row chunk
            model.eval()
        try:
            if rowwise:
                tasks = obs["task"]
                text = torch.cat([self._text_features(model, obs["instruction"][i: i + 1],
                                                      None if tasks is None else tasks[i: i + 1])
                                  for i in range(len(obs["instruction"]))])
                with row_invariant():
                    chunk = self.sample(model, self._encode(model, obs, text=text), noise_t)
            elif self._frozen is not None and noise_t.shape[0] == 1:
                chunk = self._frozen.chunk(self, model, obs, noise_t)
            else:
                chunk = self.sample(model, self._encode(model, obs), noise_t)
        finally:
            if was_training:
                model.train()
        chunk = self.normalizer.unnormalize_action(chunk.clamp(-1.0, 1.0))
        return chunk.clamp(self.action_spec.low, self.action_spec.high).float().cpu().numpy()

    @property
    def batches_rows(self) -> bool:
        """Whether ``predict_rows`` runs its rows as one batch: on a CPU, with state
        observations and an MLP head, whose kernels ``row_invariant`` makes row-invariant.
        Otherwise rows run one by one: the image encoder's and the U-Net's convolutions are
        not row-invariant, nor are GPU matmuls checked to be."""
        return (self.device.type == "cpu" and self.config.obs_mode == "state"
                and getattr(self.config, "net", "mlp") == "mlp")

    @torch.no_grad()
    def predict_rows(self, obs_batch: Mapping[str, Any], noise: np.ndarray | torch.Tensor | None = None) -> np.ndarray:
        """``predict_chunk`` of each row as if it were alone, bitwise, for less than one call per row.

        ``predict_chunk`` on a batch is not the same, in the last bits, as on each row alone:
        CPU kernels change with the batch size, and padding the instructions to one length
        changes the text attention's products. Evaluation needs each episode to depend only
        on itself (``embodied.runtime.evaluate.RowwisePolicy``), so here the text features are
        computed row by row (once per chunk, cheap) and the observation encoder and the
        head's integration run as one batch under ``row_invariant``. Policies whose
        model has other cross-row kernels (``batches_rows`` False) loop over the rows.
        """
        obs = self._read_obs(obs_batch, "obs_batch")
        b = obs["state"].shape[0]
        noise_t = self._read_noise(noise, b)
        if self.batches_rows:
            return self._chunk(obs, noise_t, rowwise=b > 1)
        return np.concatenate([self.predict_chunk(batch_row(obs_batch, i), noise_t[i: i + 1]) for i in range(b)])

    def compute_loss(self, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        """Training loss on a batch; returns (scalar loss with grad, logs of floats).

        Args:
            batch: the ``predict_chunk`` observation keys plus ``action`` (B, H, Da) float32
                in env units and optionally ``action_is_pad`` (B, H) bool, True where the
                chunk runs past the episode end (left out of the loss when
                ``config.mask_padding``; see ``embodied.runtime.data.sample_windows``), and
                ``privileged_state`` (B, To, Dp): with ``config.aux_state_dim`` a pixel
                policy also learns to predict it (the current step's) from its image
                features, weighted by ``config.aux_state_weight``.
        """
        obs = self._read_obs(batch, "batch")
        if "action" not in batch:
            raise ValueError(f"batch has no 'action' (B, H, Da); keys: {sorted(batch)}")
        action = _as_tensor(batch["action"], "batch['action']")
        _check_shape(action, "batch['action']", (obs["state"].shape[0], *self.noise_shape), "B,H,Da")
        action = self.normalizer.normalize_action(action.to(self.device, torch.float32))
        weight = self._loss_weight(batch, action)
        aux_target = self._aux_target(batch, obs["state"].shape[0])
        state = self.normalizer.normalize_state(obs["state"])
        text = self._text_inputs(obs["instruction"], obs["task"])
        total, loss, aux_loss, logs = self.loss_graph(self.model, state, obs["images"], *text, action, weight,
                                                      aux_target)
        if aux_loss is None:
            return total, {"loss": float(total.detach()), **logs}
        return total, {"loss": float(total.detach()), **logs, "action_loss": float(loss.detach()),
                       "aux_state_loss": float(aux_loss.detach())}

    def loss_graph(self, model: nn.ModuleDict, state: torch.Tensor, images: torch.Tensor | None,
                   pooled: torch.Tensor, tokens: torch.Tensor | None, mask: torch.Tensor | None,
                   action: torch.Tensor, weight: torch.Tensor | None, aux_target: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, dict[str, float]]:
        """The tensor-only part of ``compute_loss``, from the normalised state, the frozen text
        encoder's output and the normalised actions: the text head, the observation encoder and
        the family's loss (one graph for ``torch.compile``; see ``embodied.runtime.train``).

        Returns (total loss, action loss, auxiliary state loss or None, the head's logs).
        """
        text = _text_head(model, pooled, tokens, mask)
        if aux_target is None:
            loss, logs = self.head_loss(model, _condition(model, state, images, text), action, weight)
            return loss, loss, None, logs
        cond, aux_pred = _condition(model, state, images, text, aux=True)
        loss, logs = self.head_loss(model, cond, action, weight)
        aux_loss = torch.nn.functional.mse_loss(aux_pred, aux_target)
        return loss + self.config.aux_state_weight * aux_loss, loss, aux_loss, logs

    def _aux_target(self, batch: Mapping[str, Any], b: int) -> torch.Tensor | None:
        """Normalised privileged state of the current step (B, Dp), when the loss applies."""
        c = self.config
        if not c.aux_state_dim or not c.aux_state_weight or batch.get("privileged_state") is None:
            return None
        p = _as_tensor(batch["privileged_state"], "batch['privileged_state']")
        _check_shape(p, "batch['privileged_state']", (b, self.n_obs_steps, c.aux_state_dim), "B,To,Dp")
        return self.normalizer.normalize_privileged(p[:, -1].to(self.device, torch.float32))

    def _loss_weight(self, batch: Mapping[str, Any], action: torch.Tensor) -> torch.Tensor | None:
        """(B, H, 1) weights that drop padded actions from the loss (``mask_padding``)."""
        if not self.config.mask_padding or batch.get("action_is_pad") is None:
            return None
        pad = _as_tensor(batch["action_is_pad"], "batch['action_is_pad']")
        _check_shape(pad, "batch['action_is_pad']", tuple(action.shape[:2]), "B,H")
        return (~pad.to(self.device, torch.bool)).float().unsqueeze(-1)

    def make_optimizer(self) -> torch.optim.Optimizer:
        """AdamW over the trainable weights (not the EMA copy nor the normaliser).

        Uses the fused kernel on CPU and CUDA: on a CPU the per-tensor implementation is a
        large share of a small policy's training step.
        """
        c = self.config
        fused = self.device.type in ("cpu", "cuda")
        return torch.optim.AdamW(self.model.parameters(), lr=c.lr, betas=c.betas, weight_decay=c.weight_decay,
                                 fused=fused)

    def make_scheduler(self, optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
        """Linear warm-up over ``config.warmup_steps`` then cosine decay to 0 at ``total_steps``."""
        if total_steps < 1:
            raise ValueError(f"total_steps={total_steps} is not allowed: must be >= 1")
        warmup = min(self.config.warmup_steps, total_steps // 2)

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
            return 0.5 * (1.0 + math.cos(math.pi * progress))

        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def ema_update(self) -> float | None:
        """Update the EMA weights after an optimiser step; returns the decay (None if off)."""
        return None if self.ema is None else self.ema.update(self.model)

    def check_spec(self, obs_spec: ObservationSpec, action_spec: ActionSpec,
                   tasks: Sequence[str] | None = None) -> None:
        """Raise SpecMismatchError naming what differs between this policy and a task.

        State size and action size/bounds must match; cameras and image size too for pixel
        policies. One-hot policies must also know every task in ``tasks``.
        """
        pixels = self.config.obs_mode == "pixels"
        check_compatible(f"{self.name} policy's observation spec", self.obs_spec, obs_spec, check_cameras=pixels)
        check_compatible(f"{self.name} policy's action spec", self.action_spec, action_spec)
        if tasks is not None and self.config.text_encoder == "onehot":
            unknown = [t for t in tasks if t not in self.task_names]
            if unknown:
                raise SpecMismatchError(f"{self.name} policy (one-hot task ids) was not trained on tasks {unknown}; "
                                        f"it knows {self.task_names}")


class _ChunkGraph(nn.Module):
    """One row's chunk (before clamping) from its state, text features and noise: what
    ``TorchPolicy._chunk`` computes eagerly, as one module to trace."""

    def __init__(self, policy: TorchPolicy, model: nn.ModuleDict) -> None:
        super().__init__()
        self.model = model
        self._policy = [policy]  # not a submodule: the policy's own weights are the model's

    def forward(self, state: torch.Tensor, text: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        policy = self._policy[0]
        cond = policy._encode(self.model, {"state": state, "images": None}, text=text)
        return policy.sample(self.model, cond, noise)


FROZEN_RUNTIMES = ("torchscript", "onnxruntime")


class _OnnxChunk:
    """A ``_ChunkGraph`` exported to ONNX (in memory) and run by ONNX Runtime on one thread."""

    def __init__(self, graph: _ChunkGraph, example: tuple[torch.Tensor, ...]) -> None:
        import io

        from embodied.nn.onnx import cpu_session

        buffer = io.BytesIO()
        torch.onnx.export(graph, example, buffer, input_names=["state", "text", "noise"], output_names=["chunk"],
                          dynamo=False, opset_version=17)
        self.session = cpu_session(buffer.getvalue(), threads=1)

    def __call__(self, state: torch.Tensor, text: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        feed = {"state": state.numpy(), "text": text.numpy(), "noise": noise.numpy()}
        return torch.from_numpy(self.session.run(None, feed)[0])


class _FrozenInference:
    """The graphs (one per sampler setting) and the text features (one per instruction) of a
    policy's inference weights, for one-row chunks; ``runtime`` runs the graphs."""

    def __init__(self, runtime: str = "torchscript") -> None:
        self.runtime = runtime
        self.graphs: dict[tuple, Any] = {}
        self.text: dict[tuple[str, str | None], torch.Tensor] = {}

    def chunk(self, policy: TorchPolicy, model: nn.ModuleDict, obs: dict[str, Any],
              noise: torch.Tensor) -> torch.Tensor:
        task = None if obs["task"] is None else obs["task"][0]
        key = (obs["instruction"][0], task)
        text = self.text.get(key)
        if text is None:
            text = self.text[key] = policy._text_features(model, obs["instruction"], obs["task"])
        setting = (id(model), getattr(policy.config, "num_inference_steps", 0), getattr(policy.config, "sampler", ""))
        graph = self.graphs.get(setting)
        if graph is None:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the tracer's notes on Python floats baked in as constants
                module, example = _ChunkGraph(policy, model).eval(), (obs["state"], text, noise)
                if self.runtime == "onnxruntime":
                    graph = _OnnxChunk(module, example)
                else:
                    graph = torch.jit.freeze(torch.jit.trace(module, example, check_trace=False))
            self.graphs[setting] = graph
        return graph(obs["state"], text, noise)
