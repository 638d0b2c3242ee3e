"""``SteeredPolicy``: a frozen flow/diffusion policy whose initial noise a learned actor picks.

    chunk = steered.predict_chunk(obs_batch)
          = base.predict_chunk(obs_batch, to_chunk(clip(actor(features(obs_batch)), -bound, bound)))

It is an ordinary ``Policy`` (``act``, ``predict_chunk``, the action queue), so evaluation,
``embodied play`` and the robot bridge use it unchanged. A noise given to ``predict_chunk``
is ignored: the actor chooses the noise, deterministically (its mean action), so the
steered policy is a deterministic function of the observation history, as evaluation's
``RowwisePolicy`` (which hands every row hashed noise) expects.

Saved beside the base weights (``policies.save_policy``) as ``steering.json`` (format
version, the noise space, the actor's kind and description) and ``steering.safetensors``
(the actor's tensors); ``policies.load_trained`` wraps the base in it again. Actor kinds
are looked up by name in ``ACTORS`` and imported lazily.
"""

from __future__ import annotations

import abc
import json
from pathlib import Path
from typing import Any, ClassVar, Mapping

import numpy as np

from embodied.core.errors import UnknownNameError
from embodied.core.registry import load_object
from embodied.core.policy import Policy, PolicyWrapper, batch_row
from policies.steering.noise import NoiseSpace, check_steerable, feature_dim, features

STEERING_FILE = "steering.json"
STEERING_WEIGHTS = "steering.safetensors"
STEERING_FORMAT = 1

#: actor kind -> "module:Class" (a ``NoiseActor`` subclass)
ACTORS: dict[str, str] = {
    "sb3": "policies.steering.sb3:SB3Actor",
    "mlp": "policies.steering.na:MLPActor",
}


class NoiseActor(abc.ABC):
    """A deterministic map from features (B, C) float32 to noise actions (B, Dw) float32."""

    kind: ClassVar[str] = ""

    @abc.abstractmethod
    def __call__(self, feats: np.ndarray) -> np.ndarray:
        """Noise actions (B, Dw) for features (B, C)."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """What ``restore`` needs besides the tensors (JSON-able)."""

    @abc.abstractmethod
    def tensors(self) -> dict[str, Any]:
        """The actor's weights as name -> torch tensor."""

    @classmethod
    @abc.abstractmethod
    def restore(cls, meta: Mapping[str, Any], tensors: Mapping[str, Any], space: NoiseSpace,
                feature_dim: int) -> "NoiseActor":
        """Rebuild an actor from ``describe()`` and ``tensors()``."""

    def load_tensors(self, tensors: Mapping[str, Any]) -> None:
        """Put weights of ``tensors()`` (of this actor, earlier) back in place."""
        raise NotImplementedError(f"{type(self).__name__} cannot load weights in place")


def actor_class(kind: str) -> type[NoiseActor]:
    if kind not in ACTORS:
        raise UnknownNameError("noise actor kind", str(kind), list(ACTORS))
    return load_object(ACTORS[kind], "noise actor kind")


class SteeredPolicy(PolicyWrapper):
    """``policy`` with its initial noise chosen by ``actor`` (see the module docstring).

    Args:
        policy: the frozen flow/diffusion policy, or wrappers around one (grounding).
        actor: the noise actor (features (B, C) -> noise (B, Dw)).
        space: the noise space the actor acts in.
    """

    def __init__(self, policy: Policy, actor: NoiseActor, space: NoiseSpace):
        super().__init__(policy)
        check_steerable(policy)
        h, da = policy.unwrapped.noise_shape  # type: ignore[attr-defined]
        if (space.horizon, space.action_dim) != (h, da):
            raise ValueError(f"noise space for (H, Da)=({space.horizon}, {space.action_dim}) does not fit the policy's "
                             f"noise shape ({h}, {da})")
        self.actor, self.space = actor, space

    def noise(self, obs_batch: Mapping[str, Any]) -> np.ndarray:
        """The actor's noise actions (B, Dw) for an observation batch, clipped to the bound."""
        w = np.asarray(self.actor(features(self.policy, obs_batch)), np.float32)
        return np.clip(w, -self.space.bound, self.space.bound)

    def predict_chunk(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None) -> np.ndarray:
        """(B, H, Da) chunk of the base policy from the actor's noise; ``noise`` is ignored."""
        return self.policy.predict_chunk(obs_batch, self.space.to_chunk(self.noise(obs_batch)))

    @property
    def batches_rows(self) -> bool:
        """Whether ``predict_rows`` batches the rows: when the policy beneath does."""
        return bool(getattr(self.policy, "batches_rows", False))

    def predict_rows(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None) -> np.ndarray:
        """``predict_chunk`` of each row as if it were alone, bitwise (the contract of the base
        policy's ``predict_rows``): the actor's noise is computed row by row (a small network),
        and the base policy decodes all rows in one ``predict_rows`` call. ``noise`` is ignored."""
        b = len(obs_batch["instruction"])
        rows = [batch_row(obs_batch, i) for i in range(b)]
        if not self.batches_rows:
            return np.concatenate([self.predict_chunk(row) for row in rows])
        w = np.concatenate([self.noise(row) for row in rows])
        return np.asarray(self.policy.predict_rows(obs_batch, self.space.to_chunk(w)))  # type: ignore[attr-defined]

    def save_steering(self, path: str | Path) -> None:
        """Write ``steering.json`` and ``steering.safetensors`` into checkpoint folder ``path``."""
        from safetensors.torch import save_file

        out = Path(path)
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.actor.tensors().items()}
        save_file(tensors, str(out / STEERING_WEIGHTS), metadata={"format_version": str(STEERING_FORMAT)})
        meta = {"format_version": STEERING_FORMAT, "space": self.space.to_dict(), "actor": self.actor.kind,
                "actor_config": self.actor.describe(), "feature_dim": feature_dim(self.policy)}
        (out / STEERING_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path, policy: Policy) -> "SteeredPolicy":
        """``policy`` steered by the actor saved in checkpoint folder ``path``."""
        from safetensors.torch import load_file

        d = Path(path)
        for name in (STEERING_FILE, STEERING_WEIGHTS):
            if not (d / name).is_file():
                raise FileNotFoundError(f"steered checkpoint {str(d)!r} has no {name}")
        try:
            meta = json.loads((d / STEERING_FILE).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{d / STEERING_FILE} is not valid JSON: {e}") from None
        if meta.get("format_version") != STEERING_FORMAT:
            raise ValueError(f"{d / STEERING_FILE}: format_version={meta.get('format_version')!r}, this code reads "
                             f"version {STEERING_FORMAT}")
        space = NoiseSpace.from_dict(meta["space"])
        dim = feature_dim(policy)
        if int(meta.get("feature_dim", dim)) != dim:
            raise ValueError(f"{d / STEERING_FILE}: the actor observes {meta['feature_dim']} features, the policy "
                             f"beside it has {dim}")
        actor = actor_class(meta["actor"]).restore(meta.get("actor_config", {}), load_file(str(d / STEERING_WEIGHTS)),
                                                   space, dim)
        return cls(policy, actor, space)


def is_steered(path: str | Path) -> bool:
    """Whether checkpoint folder ``path`` holds a steering actor."""
    return (Path(path) / STEERING_FILE).is_file()


def remove_steering(path: str | Path) -> None:
    """Delete a steering actor from checkpoint folder ``path`` (when another policy is saved there)."""
    for name in (STEERING_FILE, STEERING_WEIGHTS):
        (Path(path) / name).unlink(missing_ok=True)
