"""Flow-matching policy over action chunks (rectified flow as in pi0 / openpi).

Conventions (Black et al. 2024, pi0; Liu et al. 2022, rectified flow), in the
normaliser's [-1, 1] action space:

    x_t = t * noise + (1 - t) * a          t = 1: pure noise, t = 0: the action chunk
    u   = dx_t/dt = noise - a              the network v(x_t, t, cond) regresses u (MSE)
    t ~ Beta(1.5, 1) scaled into (0.001, 1), which favours the noisy end

Sampling integrates dx/dt = v from t = 1 (the given noise) to t = 0 in
``num_inference_steps`` steps of dt = -1/steps. The ODE has no randomness, so the chunk is
a deterministic function of (observation, noise), as latent-noise steering requires.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from policies.common.base import TorchPolicy, masked_mse
from policies.common.config import check_choice, check_int
from policies.common.nets import make_denoiser
from policies.flow.config import FLOW_SAMPLERS, FlowConfig

# t in (0, 1) is scaled to the 0..100 range that the diffusion policy's integer timesteps
# use, so both families share the sinusoidal time embedding's useful frequencies.
TIME_SCALE = 100.0

Velocity = Callable[[torch.Tensor, float], torch.Tensor]


def sample_times(batch: int, alpha: float, beta: float, t_min: float, device: torch.device) -> torch.Tensor:
    """(B,) training times t ~ Beta(alpha, beta) scaled into (t_min, 1)."""
    dist = torch.distributions.Beta(torch.tensor(alpha, device=device), torch.tensor(beta, device=device))
    return dist.sample((batch,)) * (1.0 - t_min) + t_min


def integrate(velocity: Velocity, x: torch.Tensor, steps: int, sampler: str = "euler") -> torch.Tensor:
    """Integrate dx/dt = velocity(x, t) from t = 1 to t = 0 in ``steps`` equal steps.

    ``euler``: x += dt v(x, t).  ``midpoint``: x += dt v(x + dt/2 v(x, t), t + dt/2).
    ``heun``: x += dt/2 (v(x, t) + v(x + dt v(x, t), t + dt)). The last two cost 2 network
    calls per step and are 2nd-order accurate.
    """
    dt = -1.0 / steps
    for i in range(steps):
        t = 1.0 - i / steps
        v = velocity(x, t)
        if sampler == "euler":
            x = x + dt * v
        elif sampler == "midpoint":
            x = x + dt * velocity(x + 0.5 * dt * v, t + 0.5 * dt)
        elif sampler == "heun":
            x = x + 0.5 * dt * (v + velocity(x + dt * v, max(t + dt, 0.0)))
        else:
            raise ValueError(f"sampler={sampler!r} is not allowed: must be one of {FLOW_SAMPLERS}")
    return x


class FlowPolicy(TorchPolicy):
    """Language-conditioned flow-matching policy; see the module docstring for the math.

    ``num_inference_steps`` and ``sampler`` can be changed on a loaded policy.
    """

    name = "flow"
    config_class = FlowConfig
    config: FlowConfig
    graph_sampling = True

    def build_head(self, cond_dim: int) -> nn.Module:
        return make_denoiser(self.config, self.action_spec.dim, cond_dim)

    @property
    def num_inference_steps(self) -> int:
        return self.config.num_inference_steps

    @num_inference_steps.setter
    def num_inference_steps(self, steps: int) -> None:
        check_int("num_inference_steps", steps, 1, 1000)
        self.config.num_inference_steps = steps

    @property
    def sampler(self) -> str:
        return self.config.sampler

    @sampler.setter
    def sampler(self, name: str) -> None:
        check_choice("sampler", name, FLOW_SAMPLERS)
        self.config.sampler = name

    def velocity(self, model: nn.ModuleDict, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """v(x_t, t, cond): (B, H, Da) velocity at times t (B,) in [0, 1]."""
        return model["head"](x, t * TIME_SCALE, cond)

    def head_loss(self, model: nn.ModuleDict, cond: torch.Tensor, action: torch.Tensor,
                  weight: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.config
        noise = torch.randn_like(action)
        t = sample_times(action.shape[0], c.time_beta_alpha, c.time_beta_beta, c.time_min, action.device)
        tt = t[:, None, None]
        x_t = tt * noise + (1.0 - tt) * action
        return masked_mse(self.velocity(model, x_t, t, cond), noise - action, weight), {}

    def sample(self, model: nn.ModuleDict, cond: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        b = noise.shape[0]

        def velocity(x: torch.Tensor, t: float) -> torch.Tensor:
            return self.velocity(model, x, torch.full((b,), t, device=x.device), cond)

        return integrate(velocity, noise, self.config.num_inference_steps, self.config.sampler)
