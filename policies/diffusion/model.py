"""Diffusion policy over action chunks (Chi et al. 2023), on diffusers' schedulers.

Training (DDPM, Ho et al. 2020): pick k ~ U{0..K-1} (K = 100), noise the normalised chunk
with the ``squaredcos_cap_v2`` schedule, x_k = sqrt(abar_k) a + sqrt(1 - abar_k) eps, and
regress eps (``prediction_type="epsilon"``) with an MSE.

Sampling starts from the given noise x_K and runs ``num_inference_steps`` denoising steps
with ``trailing`` timestep spacing (the first step is at k = K-1, where the initial noise
really is pure noise; Lin et al. 2024). The clean-chunk estimate is clipped to [-1, 1] at
every step (at k = K-1, abar ~ 2e-7, so an unclipped estimate amplifies errors ~2000x).

- ``ddim`` (Song et al. 2021) with eta = 0: deterministic, the default;
- ``dpm``: DPM-Solver++ 2M (Lu et al. 2022): deterministic, often good at fewer steps;
- ``ddpm``: ancestral sampling, which injects fresh noise each step. To keep
  (observation, noise) -> chunk a function, that noise comes from one CPU generator per
  batch row seeded with a hash of the row's initial noise: a row's result does not depend
  on the other rows, and the same noise always gives the same chunk.

Epsilon prediction needs a well-trained model before few-step samplers are accurate: on a
short CPU budget the flow policy learns faster (``prediction_type="sample"`` also helps).
"""

from __future__ import annotations

import hashlib
import warnings

import numpy as np
import torch
from diffusers import DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler
from torch import nn

from policies.common.base import TorchPolicy, masked_mse
from policies.common.config import check_choice, check_int
from policies.common.nets import make_denoiser
from policies.diffusion.config import DIFFUSION_SAMPLERS, DiffusionConfig


def make_noise_scheduler(kind: str, config: DiffusionConfig):
    """A diffusers scheduler of ``kind`` (``ddpm`` for training; any sampler for inference)."""
    common = dict(num_train_timesteps=config.num_train_timesteps, beta_schedule="squaredcos_cap_v2",
                  prediction_type=config.prediction_type)
    if kind == "ddpm":
        return DDPMScheduler(**common, clip_sample=True, variance_type="fixed_small", timestep_spacing="trailing")
    if kind == "ddim":
        return DDIMScheduler(**common, clip_sample=True, set_alpha_to_one=True, steps_offset=0,
                             timestep_spacing="trailing")
    if kind == "dpm":
        # thresholding with sample_max_value=1 clips the x0 estimate to [-1, 1] like clip_sample
        return DPMSolverMultistepScheduler(**common, algorithm_type="dpmsolver++", solver_order=2,
                                           timestep_spacing="trailing", lower_order_final=True,
                                           thresholding=True, sample_max_value=1.0)
    raise ValueError(f"sampler={kind!r} is not allowed: must be one of {DIFFUSION_SAMPLERS}")


def noise_generators(noise: torch.Tensor) -> list[torch.Generator]:
    """One CPU generator per batch row, seeded by a hash of that row's values."""
    rows = noise.detach().float().cpu().numpy()
    seeds = [int.from_bytes(hashlib.blake2b(np.ascontiguousarray(r).tobytes(), digest_size=8).digest(), "little")
             & 0x7FFF_FFFF_FFFF_FFFF for r in rows]
    return [torch.Generator().manual_seed(s) for s in seeds]


class DiffusionPolicy(TorchPolicy):
    """Language-conditioned diffusion policy; see the module docstring.

    ``num_inference_steps`` and ``sampler`` can be changed on a loaded policy.
    """

    name = "diffusion"
    config_class = DiffusionConfig
    config: DiffusionConfig

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.noise_scheduler = make_noise_scheduler("ddpm", self.config)
        self._samplers: dict[str, object] = {}

    def build_head(self, cond_dim: int) -> nn.Module:
        return make_denoiser(self.config, self.action_spec.dim, cond_dim)

    @property
    def num_inference_steps(self) -> int:
        return self.config.num_inference_steps

    @num_inference_steps.setter
    def num_inference_steps(self, steps: int) -> None:
        check_int("num_inference_steps", steps, 1, self.config.num_train_timesteps)
        self.config.num_inference_steps = steps

    @property
    def sampler(self) -> str:
        return self.config.sampler

    @sampler.setter
    def sampler(self, name: str) -> None:
        check_choice("sampler", name, DIFFUSION_SAMPLERS)
        self.config.sampler = name

    def head_loss(self, model: nn.ModuleDict, cond: torch.Tensor, action: torch.Tensor,
                  weight: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        noise = torch.randn_like(action)
        k = torch.randint(0, self.config.num_train_timesteps, (action.shape[0],), device=action.device)
        noisy = self.noise_scheduler.add_noise(action, noise, k)
        pred = model["head"](noisy, k.float(), cond)
        target = noise if self.config.prediction_type == "epsilon" else action
        return masked_mse(pred, target, weight), {}

    def sample(self, model: nn.ModuleDict, cond: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        kind = self.config.sampler
        if kind not in self._samplers:
            self._samplers[kind] = make_noise_scheduler(kind, self.config)
        scheduler = self._samplers[kind]
        with warnings.catch_warnings():  # diffusers' DPM solver trips a numpy-2 DeprecationWarning
            warnings.simplefilter("ignore", DeprecationWarning)
            scheduler.set_timesteps(self.config.num_inference_steps, device=noise.device)  # resets solver state
        generators = noise_generators(noise) if kind == "ddpm" else None
        x = noise * scheduler.init_noise_sigma
        for k in scheduler.timesteps:
            out = model["head"](x, k.float().expand(x.shape[0]), cond)
            x = scheduler.step(out, k, x, generator=generators).prev_sample
        return x
