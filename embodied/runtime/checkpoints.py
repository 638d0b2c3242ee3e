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
    """The policy of ``checkpoint`` as trained (with its grounding wrapper when it grounds).

    ``num_inference_steps`` (when > 0) overrides the sampler's steps; ``ground_instructions``
    None keeps the checkpoint's setting, True/False turns grounding on/off. The weights are
    final, so one-row chunks run through a traced graph (``TorchPolicy.freeze_for_inference``:
    bitwise the eager chunk, for a fraction of its cost) where the policy allows it.
    """
    from policies import load_trained

    policy = load_trained(checkpoint, device=device, ground_instructions=ground_instructions)
    if num_inference_steps:
        policy.unwrapped.num_inference_steps = num_inference_steps
    freeze = getattr(policy.unwrapped, "freeze_for_inference", None)
    if freeze is not None:
        freeze()
    return policy


def load_remote(url: str, api_key: str = "") -> Any:
    """The policy served at ``url`` (``embodied serve``, or an openpi server) as a ``Policy``."""
    from embodied.bridge.client import RemotePolicy

    return RemotePolicy(url, api_key=api_key or None)


def check_trained_task(policy: Any, task: str, checkpoint: str) -> None:
    """Refuse to improve ``policy`` on a task it was not trained on (steering selects among the
    behaviours a checkpoint already has; a task it never saw is most likely a mistyped ``task=``)."""
    trained = list(getattr(policy.unwrapped, "task_names", []) or [])
    if trained and task not in trained:
        shown = ", ".join(trained[:8]) + (", ..." if len(trained) > 8 else "")
        raise ValueError(f"task={task!r} is not one of the tasks checkpoint {checkpoint!r} was trained on: [{shown}]")


def policy_env_kwargs(policy: Any, tasks: list[str]) -> dict[str, Any]:
    """Env arguments that give ``policy`` the observations it was trained on; checks specs."""
    from embodied.core.registry import make_env

    policy = policy.unwrapped
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
