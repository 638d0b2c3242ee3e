"""The noise action space of a frozen policy, and the two calls steering makes into it.

A steering agent sees the frozen policy's conditioning features (``encode_obs``: the
observation history and the instruction, as the policy itself reads them) and acts with a
bounded noise vector w (Dw,). ``NoiseSpace.to_chunk`` turns w into the policy's initial
noise (H, Da) and ``predict_chunk(obs, noise)`` decodes it deterministically (the flow ODE,
or DDIM with eta=0), so env'(s, w) = env(s, decode(s, w)) is an ordinary MDP.

    space = NoiseSpace.for_policy(policy, SteerConfig())
    feats = features(policy, obs_batch)                     # (B, C) float32
    chunk = policy.predict_chunk(obs_batch, space.to_chunk(w))   # (B, H, Da)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

import gymnasium as gym
import numpy as np

from embodied.core.errors import EmbodiedError, InvalidActionError
from embodied.core.policy import Policy
from policies.steering.config import NOISE_MODES, SteerConfig


class NotSteerableError(EmbodiedError, ValueError):
    """The policy's chunk does not depend on its noise (or it has no features to steer by)."""


def check_steerable(policy: Policy) -> Any:
    """The innermost policy of ``policy`` when noise can steer it; NotSteerableError otherwise."""
    inner = policy.unwrapped
    name = getattr(inner, "name", "") or type(inner).__name__
    if not getattr(inner, "generative", False) or getattr(inner, "noise_shape", None) is None:
        raise NotSteerableError(f"policy {name!r} cannot be steered: its action chunk does not depend on an initial "
                                "noise (generative=False). Latent-noise steering needs a flow or diffusion policy "
                                "(`embodied train policy=flow` or `policy=diffusion`)")
    if not callable(getattr(inner, "encode_obs", None)):
        raise NotSteerableError(f"policy {name!r} cannot be steered: it has no encode_obs(obs_batch) -> (B, C) "
                                "features for the noise policy to observe")
    return inner


@dataclass(frozen=True)
class NoiseSpace:
    """Box(-bound, bound)^dim and its map onto a policy's (H, Da) initial noise.

    Attributes:
        horizon, action_dim: the policy's noise shape (H, Da).
        mode: ``"full"`` (``rows`` x Da values, the chunk's first ``rows`` steps; the rest 0)
            or ``"shared"`` (Da values repeated over all H steps).
        rows: chunk steps covered by ``full`` noise (Ta..H); H for ``shared``.
        bound: noise values lie in [-bound, bound].
    """

    horizon: int
    action_dim: int
    mode: str
    rows: int
    bound: float

    def __post_init__(self) -> None:
        if self.mode not in NOISE_MODES:
            raise ValueError(f"noise mode={self.mode!r} is not allowed: must be one of {NOISE_MODES}")
        if not 1 <= self.rows <= self.horizon:
            raise ValueError(f"rows={self.rows} is not allowed: must be in 1..{self.horizon}")
        if not self.bound > 0:
            raise ValueError(f"bound={self.bound} is not allowed: must be > 0")

    @classmethod
    def for_policy(cls, policy: Policy, cfg: SteerConfig) -> "NoiseSpace":
        inner = check_steerable(policy)
        h, da = inner.noise_shape
        return cls(int(h), int(da), cfg.noise, cfg.noise_rows(int(h), policy.n_action_steps), float(cfg.bound))

    @property
    def dim(self) -> int:
        """Dw, the size of one noise action."""
        return self.rows * self.action_dim if self.mode == "full" else self.action_dim

    def box(self) -> "NoiseBox":
        return NoiseBox(self.bound, self.dim)

    def check(self, w: Any, rows: int | None = None) -> np.ndarray:
        """``w`` as a (B, Dw) float32 array; InvalidActionError for a wrong shape, NaN/inf, or a
        value outside [-bound, bound] (the bound is enforced, not clipped)."""
        a = np.asarray(w, dtype=np.float32)
        if a.ndim == 1:
            a = a[None]
        if a.ndim != 2 or a.shape[1] != self.dim or (rows is not None and a.shape[0] != rows):
            want = f"({rows if rows is not None else 'B'}, {self.dim})"
            raise InvalidActionError(f"noise action must have shape {want} ({self.mode} noise), got {np.shape(w)}")
        if not np.isfinite(a).all():
            raise InvalidActionError("noise action contains NaN or inf; refusing to decode it")
        worst = float(np.abs(a).max(initial=0.0))
        if worst > self.bound * (1 + 1e-6):
            raise InvalidActionError(f"noise action value {worst:.4g} is outside the noise bound [-{self.bound}, "
                                     f"{self.bound}]; the noise policy must act inside its Box")
        return a

    def to_chunk(self, w: Any) -> np.ndarray:
        """(B, Dw) noise actions -> (B, H, Da) initial noise for ``predict_chunk``."""
        a = self.check(w)
        if self.mode == "shared":
            return np.repeat(a[:, None, :], self.horizon, axis=1)
        out = np.zeros((a.shape[0], self.horizon, self.action_dim), np.float32)
        out[:, : self.rows] = a.reshape(a.shape[0], self.rows, self.action_dim)
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "NoiseSpace":
        return cls(int(d["horizon"]), int(d["action_dim"]), str(d["mode"]), int(d["rows"]), float(d["bound"]))


class NoiseBox(gym.spaces.Box):
    """Box(-bound, bound)^dim whose ``sample()`` is the base policy's own noise, N(0, I) clipped.

    Learners that start with random actions (SB3's ``learning_starts``) then collect the
    base policy's behaviour, not uniform noise (DSRL's initial rollouts).
    """

    def __init__(self, bound: float, dim: int, seed: int | None = None):
        super().__init__(-bound, bound, (dim,), np.float32, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None) -> np.ndarray:
        w = self.np_random.standard_normal(self.shape)
        return np.clip(w, self.low, self.high).astype(np.float32)


def features(policy: Policy, obs_batch: Mapping[str, Any]) -> np.ndarray:
    """(B, C) float32 conditioning features of the frozen policy for an observation batch."""
    f = policy.unwrapped.encode_obs(obs_batch)  # type: ignore[attr-defined]
    return f.detach().cpu().numpy().astype(np.float32, copy=False)


def feature_dim(policy: Policy) -> int:
    """C, the size of ``features``."""
    c = policy.unwrapped.config  # type: ignore[attr-defined]
    return int(c.obs_dim + c.text_dim)


def decode_features(policy: Policy, cond: Any, noise: Any) -> Any:
    """(B, H, Da) torch chunk in env units from features (B, C) and initial noise (B, H, Da).

    The same chunk as ``predict_chunk(obs, noise)`` for the observations whose features are
    ``cond`` (``features`` returns the policy's conditioning), without encoding them again:
    DSRL-NA decodes replayed states this way. Runs the inference weights in eval mode, no grad.
    """
    import torch

    inner = policy.unwrapped
    model = inner.inference_model  # type: ignore[attr-defined]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            chunk = inner.sample(model, torch.as_tensor(cond, device=inner.device),  # type: ignore[attr-defined]
                                 torch.as_tensor(noise, dtype=torch.float32, device=inner.device))
            chunk = inner.normalizer.unnormalize_action(chunk.clamp(-1.0, 1.0))  # type: ignore[attr-defined]
            spec = inner.action_spec  # type: ignore[attr-defined]
            return chunk.clamp(spec.low, spec.high).float()
    finally:
        model.train(was_training)
