"""Config of the flow-matching policy (rectified flow as in pi0 / openpi)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.common.config import DenoiserConfig, check_choice, check_float

FLOW_SAMPLERS = ("euler", "midpoint", "heun")


@dataclass
class FlowConfig(DenoiserConfig):
    """Flow policy settings (plus every ``DenoiserConfig`` / ``PolicyConfig`` field).

    Attributes:
        sampler: ODE integrator from t=1 (noise) to t=0 (actions): ``"euler"`` (1 network
            call per step), ``"midpoint"`` or ``"heun"`` (2 calls per step, 2nd order).
        num_inference_steps: integration steps (1..1000; 10 as in pi0, 4 is usually as good).
        time_beta_alpha, time_beta_beta: training times t ~ Beta(alpha, beta), which with
            (1.5, 1) favours the noisy end (pi0).
        time_min: t is scaled into (time_min, 1) so the target is never exactly the data.
    """

    sampler: str = "euler"
    time_beta_alpha: float = 1.5
    time_beta_beta: float = 1.0
    time_min: float = 0.001

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("sampler", self.sampler, FLOW_SAMPLERS)
        check_float("time_beta_alpha", self.time_beta_alpha, 0.0, low_open=True)
        check_float("time_beta_beta", self.time_beta_beta, 0.0, low_open=True)
        check_float("time_min", self.time_min, 0.0, 0.5)
