"""Normalisation of states and actions, stored as buffers so it travels in the checkpoint.

States: z = (x - mean) / std, std clamped to >= 1e-2 so constant features stay finite.
Actions: min/max mapped to [-1, 1]; generative samples are clipped to [-1, 1] in that
space, so unnormalised actions never leave the range seen in the data. Environment
actions already lie in [-1, 1], so without action stats the spec's [low, high] is used.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from embodied.core.specs import ActionSpec

MIN_STD = 1e-2
MIN_RANGE = 1e-2


def _vector(stats: Mapping[str, Any], feature: str, key: str, dim: int) -> torch.Tensor:
    if key not in stats:
        raise ValueError(f"stats[{feature!r}] has no {key!r} entry (has {sorted(stats)}); "
                         "expected {'mean', 'std', 'min', 'max'} per feature")
    v = torch.as_tensor(np.asarray(stats[key], dtype=np.float32)).reshape(-1)
    if v.numel() != dim:
        raise ValueError(f"stats[{feature!r}][{key!r}] has {v.numel()} values, the spec says {dim}")
    if not torch.isfinite(v).all():
        raise ValueError(f"stats[{feature!r}][{key!r}] has non-finite values")
    return v


def _mean_std(stats: Mapping[str, Any], feature: str, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardisation of ``feature``: its mean and std (clamped to ``MIN_STD``), else identity."""
    if feature not in stats:
        return torch.zeros(dim), torch.ones(dim)
    return (_vector(stats[feature], feature, "mean", dim),
            _vector(stats[feature], feature, "std", dim).clamp_min(MIN_STD))


class Normalizer(nn.Module):
    """State standardisation and action min/max scaling.

    Args:
        stats: dataset statistics ``{feature: {"mean", "std", "min", "max"}}`` with features
            ``"state"`` (Ds values each), ``"action"`` (Da values each) and, with
            ``privileged_dim``, ``"privileged_state"``. ``None`` (or a
            missing feature) means identity for the state and the spec's bounds for the
            action -- what a checkpoint is built with before its buffers are loaded.
        state_dim: Ds.
        action_spec: the action spec (Da and bounds).
        privileged_dim: size of the full state a pixel policy predicts (0: none).
    """

    def __init__(self, stats: Mapping[str, Mapping[str, Any]] | None, state_dim: int,
                 action_spec: ActionSpec, privileged_dim: int = 0) -> None:
        super().__init__()
        stats = stats or {}
        da = action_spec.dim
        mean, std = _mean_std(stats, "state", state_dim)
        if "action" in stats:
            lo = _vector(stats["action"], "action", "min", da)
            hi = _vector(stats["action"], "action", "max", da)
            if (hi < lo).any():
                raise ValueError("stats['action']: some 'max' values are below 'min'")
        else:
            lo, hi = torch.full((da,), float(action_spec.low)), torch.full((da,), float(action_spec.high))
        centre, half = (hi + lo) / 2, ((hi - lo) / 2).clamp_min(MIN_RANGE / 2)
        self.register_buffer("state_mean", mean)
        self.register_buffer("state_std", std)
        self.register_buffer("action_centre", centre)
        self.register_buffer("action_half_range", half)
        if privileged_dim:  # the auxiliary target of pixel policies (``privileged_state``)
            pmean, pstd = _mean_std(stats, "privileged_state", privileged_dim)
            self.register_buffer("privileged_mean", pmean)
            self.register_buffer("privileged_std", pstd)

    def normalize_privileged(self, state: torch.Tensor) -> torch.Tensor:
        """(..., Dp) privileged state in env units -> standardised (needs ``privileged_dim``)."""
        return (state - self.privileged_mean) / self.privileged_std

    def normalize_state(self, state: torch.Tensor) -> torch.Tensor:
        """(..., Ds) env units -> standardised."""
        return (state - self.state_mean) / self.state_std

    def normalize_action(self, action: torch.Tensor) -> torch.Tensor:
        """(..., Da) env units -> [-1, 1] over the data's range."""
        return (action - self.action_centre) / self.action_half_range

    def unnormalize_action(self, action: torch.Tensor) -> torch.Tensor:
        """(..., Da) in [-1, 1] -> env units."""
        return action * self.action_half_range + self.action_centre
