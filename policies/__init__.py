"""Policies: language-conditioned flow-matching and diffusion policies over action chunks,
plus an MLP behaviour-cloning baseline.

Families are looked up by name and imported lazily (``"module:Class"`` entry points, as in
gymnasium's registry); each lives in its own folder with ``config.py`` and ``model.py``.

    policy = make_policy("flow", {"horizon": 16}, obs_spec, action_spec, stats, task_names)
    chunk = policy.predict_chunk(obs_batch, noise)        # (B, H, Da) float32 in [-1, 1]
    save_policy(policy, "ckpt"); policy = load_policy("ckpt")   # load_trained: with its wrappers
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from embodied.core.errors import UnknownNameError
from embodied.core.registry import load_object
from embodied.core.specs import ActionSpec, ObservationSpec

if TYPE_CHECKING:
    import torch

    from policies.common.base import TorchPolicy

#: name -> "module:Class" of the policy (a ``TorchPolicy`` subclass).
POLICIES: dict[str, str] = {
    "flow": "policies.flow.model:FlowPolicy",
    "diffusion": "policies.diffusion.model:DiffusionPolicy",
    "mlp": "policies.mlp.model:MLPPolicy",
}
#: name -> "module:Class" of its config dataclass (importable without building a network).
POLICY_CONFIGS: dict[str, str] = {
    "flow": "policies.flow.config:FlowConfig",
    "diffusion": "policies.diffusion.config:DiffusionConfig",
    "mlp": "policies.mlp.config:MLPConfig",
}


def _resolve(table: dict[str, str], name: str) -> Any:
    if name not in table:
        raise UnknownNameError("policy", str(name), list(table))
    return load_object(table[name], f"policy {name!r}")


def policy_class(name: str) -> type["TorchPolicy"]:
    """The policy class registered as ``name`` (UnknownNameError on a typo)."""
    return _resolve(POLICIES, name)


def config_class(name: str) -> type:
    """The config dataclass of policy ``name``."""
    return _resolve(POLICY_CONFIGS, name)


@functools.cache
def config_node(name: str) -> type:
    """``config_class(name)`` plus a ``name`` field fixed to ``name``: the schema of Hydra's
    ``policy/<name>`` node, so a composed config says which family its fields belong to.

    Building it runs the family's ``__post_init__`` checks; ``make_config`` ignores ``name``.
    """
    cls = config_class(name)
    return dataclasses.make_dataclass(cls.__name__, [("name", str, dataclasses.field(default=name))], bases=(cls,))


def make_config(name: str, cfg: Mapping[str, Any] | Any = None) -> Any:
    """A validated config of policy ``name`` from a dict / DictConfig / dataclass / None."""
    from policies.common.config import config_from_dict

    return config_from_dict(config_class(name), cfg)


def make_policy(name: str, cfg: Mapping[str, Any] | Any, obs_spec: ObservationSpec, action_spec: ActionSpec,
                stats: Mapping[str, Mapping[str, Any]] | None, task_names: Sequence[str] | None = None,
                device: "str | torch.device" = "auto") -> "TorchPolicy":
    """Build a fresh policy of family ``name``.

    Args:
        name: ``"flow"``, ``"diffusion"`` or ``"mlp"``.
        cfg: config overrides (dict / DictConfig) or a config dataclass; a ``name`` key is ignored.
        obs_spec, action_spec: the task's specs.
        stats: dataset statistics ``{"state": {"mean", "std", ...}, "action": {"min", "max", ...}}``.
        task_names: the training tasks (one-hot vocabulary; recorded in the checkpoint).
        device: ``"auto"`` (cuda if available), ``"cpu"``, ...
    """
    cls = policy_class(name)
    return cls(make_config(name, cfg), obs_spec, action_spec, stats=stats, task_names=task_names, device=device)


def load_policy(path: str, device: "str | torch.device" = "auto", obs_spec: ObservationSpec | None = None,
                action_spec: ActionSpec | None = None, tasks: Sequence[str] | None = None) -> "TorchPolicy":
    """Load the network of a checkpoint directory written by ``save_policy`` (see ``common/checkpoint.py``)."""
    from policies.common.checkpoint import load_policy as _load

    return _load(path, device=device, obs_spec=obs_spec, action_spec=action_spec, tasks=tasks)


def save_policy(policy: Any, path: str) -> Any:
    """Write ``policy`` (a ``TorchPolicy``, or wrappers around one) as a checkpoint directory."""
    from policies.common.checkpoint import save_policy as _save

    return _save(policy, path)


def load_trained(path: str, device: "str | torch.device" = "auto", ground_instructions: bool | None = None) -> Any:
    """The policy as trained, with its wrappers (grounding); see ``common/checkpoint.py``."""
    from policies.common.checkpoint import load_trained as _load

    return _load(path, device=device, ground_instructions=ground_instructions)


__all__ = ["POLICIES", "POLICY_CONFIGS", "config_class", "config_node", "load_policy", "load_trained", "make_config",
           "make_policy", "policy_class", "save_policy"]
