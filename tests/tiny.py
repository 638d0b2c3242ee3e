"""Tiny untrained checkpoints for command tests (steering, the preference steer learner)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

#: a small flow policy config: history 2, chunk 8, 4 executed steps, 3 sampler steps
TINY_FLOW = {"n_obs_steps": 2, "horizon": 8, "n_action_steps": 4, "state_hidden": 32, "obs_dim": 16, "text_dim": 16,
             "warmup_steps": 0, "hidden": 64, "n_layers": 2, "time_emb_dim": 16, "num_inference_steps": 3}


def reach_checkpoint(path: Path, family: str = "flow", tasks: tuple[str, ...] = ("reach",),
                     config: dict | None = None) -> Path:
    """An untrained ``family`` policy for ``reach`` (or ``tasks`` of reach's suite), saved at
    ``path`` (unit stats, seed 0; the same weights whatever ``config`` adds to TINY_FLOW)."""
    import embodied
    from policies import make_policy, save_policy

    env = embodied.make_env("reach")
    obs_spec, act_spec = env.unwrapped.observation_spec, env.unwrapped.action_spec
    env.close()
    ds, da = obs_spec.state_dim, act_spec.dim
    stats = {"state": {"mean": np.zeros(ds), "std": np.ones(ds), "min": -np.ones(ds), "max": np.ones(ds)},
             "action": {"mean": np.zeros(da), "std": np.ones(da), "min": -np.ones(da), "max": np.ones(da)}}
    cfg = {k: v for k, v in TINY_FLOW.items() if family == "flow" or k not in ("time_emb_dim", "num_inference_steps")}
    cfg.update(config or {})
    torch.manual_seed(0)
    return save_policy(make_policy(family, cfg, obs_spec, act_spec, stats, list(tasks), device="cpu"), path)
