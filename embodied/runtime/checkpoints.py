"""Loading a checkpoint for evaluation, and the env arguments that give it the observations it was trained on."""

from __future__ import annotations

from typing import Any


def env_kwargs(obs_mode: str, image_size: int, cameras: list[str] | tuple[str, ...]) -> dict[str, Any]:
    kw: dict[str, Any] = {"obs_mode": obs_mode}
    if obs_mode != "state":
        kw["image_size"] = image_size
        if cameras:
            kw["cameras"] = list(cameras)
    return kw


def load_for_eval(checkpoint: str, device: str = "auto", num_inference_steps: int = 0,
                  ground_instructions: bool | None = None) -> Any:
    from policies import load_policy

    policy = load_policy(checkpoint, device=device)
    if num_inference_steps:
        policy.num_inference_steps = num_inference_steps
    if ground_instructions is not None:
        if ground_instructions and getattr(policy, "grounding", None) is None:
            raise ValueError(f"ground_instructions=true is not allowed for {checkpoint!r}: it has no grounding.npz "
                             "(`embodied train ... ground_instructions=true` builds one)")
        policy.config.ground_instructions = bool(ground_instructions)
    return policy


def policy_env_kwargs(policy: Any, tasks: list[str]) -> dict[str, Any]:
    """Env arguments that give ``policy`` the observations it was trained on; checks specs."""
    from embodied.core.registry import make_env

    spec = policy.obs_spec
    kw = env_kwargs(policy.config.obs_mode, spec.image_size, list(spec.cameras))
    from embodied.core.errors import SpecMismatchError

    for t in tasks:
        env = make_env(t, **kw)
        try:
            policy.check_spec(env.unwrapped.observation_spec, env.unwrapped.action_spec)
        except SpecMismatchError as e:
            trained = list(getattr(policy, "task_names", []) or [])
            if trained and t not in trained:  # most likely the suite was not given
                shown = ", ".join(trained[:8]) + (", ..." if len(trained) > 8 else "")
                raise SpecMismatchError(f"{e} -- this checkpoint was trained on tasks [{shown}]: pass the "
                                        f"matching suite=... or tasks=[...] (task {t!r} is not one of them)") from None
            raise
        finally:
            env.close()
    return kw
