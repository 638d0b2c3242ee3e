"""Exponential moving average of a module's weights (Diffusion Policy's schedule).

decay(step) = 1 - (1 + step) ** -power, clamped to [0, max_decay]; power 0.75 reaches
0.999 after ~10k steps and 0.995 after ~1k, so short CPU runs still get a useful average
(Karras et al. 2022 discuss the power schedule). The averaged copy is a sub-module, so it
is saved in the checkpoint, and it always stays in eval mode.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from embodied.nn.average import lerp_average


def ema_decay(step: int, power: float = 0.75, max_decay: float = 0.9999) -> float:
    """Decay used for the update after ``step`` completed updates (0 for the first)."""
    if step <= 0:
        return 0.0
    return float(min(max_decay, max(0.0, 1.0 - (1.0 + step) ** -power)))


class EMA(nn.Module):
    """Holds ``averaged``, a frozen copy of ``model`` updated by ``update(model)``."""

    def __init__(self, model: nn.Module, power: float = 0.75, max_decay: float = 0.9999) -> None:
        super().__init__()
        self.power, self.max_decay = power, max_decay
        self.averaged = copy.deepcopy(model).requires_grad_(False).eval()
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    def train(self, mode: bool = True) -> "EMA":
        super().train(mode)
        self.averaged.eval()
        return self

    @torch.no_grad()
    def update(self, model: nn.Module) -> float:
        """Move the average towards ``model``'s current weights; returns the decay used."""
        decay = ema_decay(int(self.step), self.power, self.max_decay)
        lerp_average(list(self.averaged.parameters()), [p.detach() for p in model.parameters()], decay)
        for b_avg, b_cur in zip(self.averaged.buffers(), model.buffers()):
            b_avg.copy_(b_cur)
        self.step += 1
        return decay
