"""Config of the diffusion policy (Diffusion Policy, Chi et al. 2023, on diffusers schedulers)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.common.config import DenoiserConfig, check_choice, check_int

DIFFUSION_SAMPLERS = ("ddim", "dpm", "ddpm")
PREDICTION_TYPES = ("epsilon", "sample")


@dataclass
class DiffusionConfig(DenoiserConfig):
    """Diffusion policy settings (plus every ``DenoiserConfig`` / ``PolicyConfig`` field).

    Attributes:
        num_train_timesteps: DDPM training steps (100, ``squaredcos_cap_v2`` betas).
        prediction_type: ``"epsilon"`` (the network predicts the noise; DP's default) or
            ``"sample"`` (it predicts the clean chunk).
        sampler: ``"ddim"`` (eta = 0, deterministic), ``"dpm"`` (DPM-Solver++ 2nd order,
            deterministic) or ``"ddpm"`` (adds noise each step; that noise is drawn from
            generators seeded by the initial noise, so results still repeat exactly).
        num_inference_steps: denoising steps, 1..num_train_timesteps (10 by default).
    """

    num_train_timesteps: int = 100
    prediction_type: str = "epsilon"
    sampler: str = "ddim"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("num_train_timesteps", self.num_train_timesteps, 2, 1000)
        check_choice("prediction_type", self.prediction_type, PREDICTION_TYPES)
        check_choice("sampler", self.sampler, DIFFUSION_SAMPLERS)
        check_int("num_inference_steps", self.num_inference_steps, 1, self.num_train_timesteps)
