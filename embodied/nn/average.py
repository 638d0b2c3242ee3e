"""Exponential moving averages of weights: ``average <- decay * average + (1 - decay) * live``.

``lerp_average`` is the one update (a fused foreach lerp); a policy's EMA copy
(``policies/common/ema.py``, decay on a schedule) and ``WeightAverage`` (a fixed decay over
tensors trained in place, as a reward fit's image tower) both apply it.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def lerp_average(average: list[torch.Tensor], live: list[torch.Tensor], decay: float) -> None:
    """Move each tensor of ``average`` towards its partner in ``live``, in place, by ``1 - decay``.

    Raises:
        ValueError: the two lists differ in length.
    """
    if len(average) != len(live):
        raise ValueError(f"the average holds {len(average)} tensors, the live weights {len(live)}")
    torch._foreach_lerp_(average, live, 1.0 - decay)


class WeightAverage:
    """An exponential moving average of tensors trained in place (a module's parameters and
    buffers): ``update()`` after each optimiser step, ``copy_to_live()`` writes the average back.
    Floating tensors are averaged; others (BatchNorm's step counters) are left as trained."""

    def __init__(self, tensors: list[torch.Tensor], decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"the average's decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.live = [t.detach() for t in tensors if t.is_floating_point()]  # views of the trained storage
        self.mean = [t.clone() for t in self.live]

    def update(self) -> None:
        lerp_average(self.mean, self.live, self.decay)

    @torch.no_grad()
    def copy_to_live(self) -> None:
        for t, m in zip(self.live, self.mean):
            t.copy_(m)
