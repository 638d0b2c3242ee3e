"""Policy checkpoints: a directory with ``model.safetensors`` and ``config.json``.

``model.safetensors`` holds every tensor of the policy module: the trained weights
(``model.*``), the EMA weights (``ema.averaged.*``, ``ema.step``) and the normaliser
buffers (``normalizer.*``), so a checkpoint needs no dataset to run. ``config.json``
holds the format version, the policy name, the resolved config, the observation and
action specs, the task names and the text encoder (whose frozen weights are not copied:
MiniLM comes from its package, open_clip from ``openclip_checkpoint``). A policy that
grounds unfamiliar instructions (``ground_instructions``) also has ``grounding.npz``: its
training wordings and the first states of its demonstrations (``policies.common.grounding``).
A steered policy (``policies.steering``) also has ``steering.json`` and ``steering.safetensors``:
its noise actor, wrapped around the rest by ``load_trained``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch

from embodied.core.specs import ActionSpec, ObservationSpec
from embodied.core.policy import Policy, PolicyWrapper
from policies.common.grounding import GROUNDING_FILE, GroundedPolicy
from policies.steering.policy import SteeredPolicy, is_steered, remove_steering

if TYPE_CHECKING:
    from policies.common.base import TorchPolicy

FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def save_policy(policy: Policy, path: str | Path) -> Path:
    """Write the checkpoint directory ``path`` (created if needed); returns it.

    ``policy`` is a ``TorchPolicy``, or wrapper policies around one: a ``GroundedPolicy``
    among them also writes its index (``grounding.npz``), a ``SteeredPolicy`` its noise actor.
    """
    from safetensors.torch import save_file

    grounded = _find_wrapper(policy, GroundedPolicy)
    steered = _find_wrapper(policy, SteeredPolicy)
    policy = policy.unwrapped  # type: ignore[assignment]
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}
    meta = {
        "format_version": FORMAT_VERSION,
        "policy": policy.name,
        "config": dataclasses.asdict(policy.config),
        "obs_spec": policy.obs_spec.to_dict(),
        "action_spec": policy.action_spec.to_dict(),
        "task_names": list(policy.task_names),
        "text_encoder": policy.text.describe(),
    }
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format_version": str(FORMAT_VERSION), "policy": policy.name})
    (out / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    if grounded is not None:
        grounded.grounding.save(out / GROUNDING_FILE)
    else:  # never leave another policy's index beside these weights
        (out / GROUNDING_FILE).unlink(missing_ok=True)
    # latent-noise steering (policies.steering): the noise actor beside the frozen weights
    if steered is not None:
        steered.save_steering(out)
    else:
        remove_steering(out)
    return out


def read_checkpoint_config(path: str | Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a checkpoint directory, with its format checked."""
    d = Path(path)
    if not d.is_dir():
        raise FileNotFoundError(f"policy checkpoint {str(d)!r} is not a directory (expected {CONFIG_FILE} "
                                f"and {WEIGHTS_FILE} inside)")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (d / name).is_file():
            raise FileNotFoundError(f"policy checkpoint {str(d)!r} has no {name}")
    try:
        meta = json.loads((d / CONFIG_FILE).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{d / CONFIG_FILE} is not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{d / CONFIG_FILE} must hold a JSON object (policy, config, specs), got a "
                         f"{type(meta).__name__}")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(f"{d / CONFIG_FILE}: checkpoint format_version={version!r}, this code reads "
                         f"version {FORMAT_VERSION}")
    missing = [k for k in ("policy", "config", "obs_spec", "action_spec") if k not in meta]
    if missing:
        raise ValueError(f"{d / CONFIG_FILE} lacks {missing}")
    return meta


def load_policy(path: str | Path, device: str | torch.device = "auto", obs_spec: ObservationSpec | None = None,
                action_spec: ActionSpec | None = None, tasks: Sequence[str] | None = None) -> "TorchPolicy":
    """Load a saved policy in eval mode; optionally check it against a task's specs.

    Args:
        path: checkpoint directory written by ``save_policy``.
        device: ``"auto"`` (cuda if available), ``"cpu"``, ...
        obs_spec, action_spec, tasks: when given, ``check_spec`` runs before returning and
            raises SpecMismatchError if the checkpoint does not fit.
    """
    from safetensors.torch import load_file

    from policies import policy_class
    from policies.common.base import resolve_device
    from policies.common.config import config_from_dict

    meta = read_checkpoint_config(path)
    cls = policy_class(meta["policy"])
    values = dict(meta["config"])
    legacy_text = "text_pool" not in values  # written before token attention: mean pooling only
    if legacy_text:
        values["text_pool"] = "mean"
    values.setdefault("image_activation", "mish")  # written before the field: the trunk used Mish
    config = config_from_dict(cls.config_class, values)
    dev = resolve_device(device)
    policy = cls(config, ObservationSpec.from_dict(meta["obs_spec"]), ActionSpec.from_dict(meta["action_spec"]),
                 stats=None, task_names=meta.get("task_names") or None, device=dev)
    try:
        state = load_file(str(Path(path) / WEIGHTS_FILE), device=str(dev))
    except Exception as e:  # safetensors raises its own error type for a truncated or damaged file
        raise ValueError(f"{Path(path) / WEIGHTS_FILE} is damaged or truncated ({e}); save the checkpoint "
                         "again or use another one") from None
    if legacy_text:  # the text projection was nn.Sequential(Linear, Mish): ``text.0.*`` -> ``text.proj.*``
        state = {k.replace(".text.0.", ".text.proj."): v for k, v in state.items()}
    try:
        policy.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(f"{Path(path) / WEIGHTS_FILE} does not fit the {meta['policy']!r} policy described by "
                         f"{CONFIG_FILE}: {e}") from None
    policy.eval()
    if obs_spec is not None or action_spec is not None or tasks is not None:
        policy.check_spec(obs_spec or policy.obs_spec, action_spec or policy.action_spec, tasks)
    return policy


def load_trained(path: str | Path, device: str | torch.device = "auto",
                 ground_instructions: bool | None = None) -> Policy:
    """The policy as trained: ``load_policy``, wrapped in a ``GroundedPolicy`` when it grounds
    and in a ``SteeredPolicy`` when the folder holds a steering actor.

    Args:
        path: checkpoint directory.
        device: as in ``load_policy``.
        ground_instructions: None keeps the checkpoint's setting (its config's
            ``ground_instructions`` with a ``grounding.npz``); True asks for grounding (an
            error when the checkpoint has no index); False turns it off.
    """
    from policies.common.grounding import load_grounding

    policy = load_policy(path, device=device)
    grounding = load_grounding(path)
    if ground_instructions and grounding is None:
        raise ValueError(f"ground_instructions=true is not allowed for {str(path)!r}: it has no {GROUNDING_FILE} "
                         "(`embodied train ... ground_instructions=true` builds one)")
    if ground_instructions is not None:
        policy.config.ground_instructions = bool(ground_instructions)
    trained: Policy = policy
    if policy.config.ground_instructions and grounding is not None:
        trained = GroundedPolicy(policy, grounding)
    if is_steered(path):  # latent-noise steering: the noise actor saved beside the weights
        trained = SteeredPolicy.load(path, trained)
    return trained


def _find_wrapper(policy: Policy, cls: type) -> Any:
    """The first wrapper of type ``cls`` from the outside in, or None."""
    while True:
        if isinstance(policy, cls):
            return policy
        if not isinstance(policy, PolicyWrapper):
            return None
        policy = policy.policy
