"""MLP behaviour cloning: the floor baseline.

cond (observation features || task one-hot) -> MLP -> the whole chunk (B, H, Da),
trained with an MSE on normalised actions and squashed by tanh into [-1, 1]. It is
deterministic and ignores the noise argument (``generative = False``). With the default
``text_encoder="onehot"`` it needs ``task`` (list of B task names from ``task_names``) in
every batch and observation -- there is no language in this baseline.
"""

from __future__ import annotations

import torch
from torch import nn

from policies.common.base import TorchPolicy, masked_mse
from policies.common.encoders import mlp
from policies.mlp.config import MLPConfig


class MLPPolicy(TorchPolicy):
    """Direct chunk regression from state (+ images) and the task id."""

    name = "mlp"
    config_class = MLPConfig
    config: MLPConfig
    generative = False

    def build_head(self, cond_dim: int) -> nn.Module:
        c = self.config
        return mlp(cond_dim, c.hidden, c.horizon * self.action_spec.dim, n_hidden=c.n_layers)

    def _predict(self, model: nn.ModuleDict, cond: torch.Tensor) -> torch.Tensor:
        return torch.tanh(model["head"](cond)).view(-1, *self.noise_shape)

    def head_loss(self, model: nn.ModuleDict, cond: torch.Tensor, action: torch.Tensor,
                  weight: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        return masked_mse(self._predict(model, cond), action, weight), {}

    def sample(self, model: nn.ModuleDict, cond: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return self._predict(model, cond)
