"""The RewardModel contract: learned and zero-shot rewards behind one interface.

A reward model scores a batch of observations (rendered frames, states, or both) against
an instruction and returns one reward per row plus its named components, so any reward
(a VLM's, a learned preference reward, the task's own) can be swapped in any loop and
its terms logged (``info["reward_terms"]``-style).

Shapes:
    ``frames``: uint8 (B, H, W, 3), RGB, or None for a state-only model.
    ``states``: float32 (B, Ds), or None for an image-only model.
    ``instruction``: one str for the whole batch, or a list of B str.
    returns ``RewardOutput``: ``reward`` float32 (B,), ``terms`` name -> float32 (B,).

A model says what it reads with ``inputs`` (a subset of ``{"frames", "states"}``) and the
range its rewards lie in with ``reward_range`` (documented, so wrappers can normalise).
A model fitted in-domain also says what it was fitted for: ``suite`` (it refuses another
suite's tasks, ``check_suite``), ``image_size`` (the side S of the square frames it reads:
frames must then be (B, S, S, 3); None reads any size) and ``camera`` (which view). ``states`` are a task's privileged
state (``env.unwrapped.privileged_state()``), what rollout banks record.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from embodied.core.errors import EmbodiedError


class RewardInputError(EmbodiedError, ValueError):
    """A reward model was given inputs of the wrong shape, dtype or kind."""


class RewardMismatchError(EmbodiedError, ValueError):
    """A reward model is used on a suite (or with frames) other than the one it was fitted for."""


@dataclass
class RewardOutput:
    """One reward per row and its named components (each (B,) float32)."""

    reward: np.ndarray
    terms: dict[str, np.ndarray] = field(default_factory=dict)


class RewardModel(abc.ABC):
    """Base class of every reward model: ``score(frames, states, instruction) -> RewardOutput``."""

    #: which inputs the model reads: a subset of {"frames", "states"}
    inputs: frozenset[str] = frozenset({"frames"})
    #: (low, high) bounds of ``reward``; (-inf, inf) if unbounded
    reward_range: tuple[float, float] = (-np.inf, np.inf)
    #: the suite the model was fitted for (None: not fitted for one, usable on any)
    suite: str | None = None
    #: side S of the square frames the model reads, (B, S, S, 3); None: any size
    image_size: int | None = None
    #: the camera whose observation images the model reads (``obs["image"]`` of an env made
    #: with ``cameras=[camera]``); None: the env's ``render()`` frames
    camera: str | None = None
    #: anti-aliasing of those frames: the ``supersample`` factor of the env that draws them
    #: (``make_env(..., supersample=k)``; 1: none)
    supersample: int = 1

    def check_suite(self, suite: str) -> None:
        """Raise ``RewardMismatchError`` unless the model may score tasks of ``suite``."""
        if self.suite is not None and suite != self.suite:
            raise RewardMismatchError(f"{type(self).__name__} was fitted for suite {self.suite!r}, not {suite!r}: "
                                      f"fit one for it (`embodied reward fit suite={suite}`) or use it on "
                                      f"{self.suite!r} tasks only")

    @abc.abstractmethod
    def score(self, frames: np.ndarray | None, states: np.ndarray | None,
              instruction: str | Sequence[str]) -> RewardOutput:
        """Rewards (B,) for a batch; see the module docstring for shapes."""

    def __call__(self, frames: np.ndarray | None, states: np.ndarray | None,
                 instruction: str | Sequence[str]) -> RewardOutput:
        b = check_reward_inputs(self.inputs, frames, states, instruction, self.image_size)
        out = self.score(frames, states, instruction)
        r = np.asarray(out.reward, np.float32)
        if r.shape != (b,):
            raise ValueError(f"{type(self).__name__}.score returned reward of shape {r.shape}, expected ({b},)")
        return RewardOutput(r, {k: np.asarray(v, np.float32) for k, v in out.terms.items()})


def check_reward_inputs(inputs: frozenset[str], frames: np.ndarray | None, states: np.ndarray | None,
                        instruction: str | Sequence[str], image_size: int | None = None) -> int:
    """Validate a batch for a model reading ``inputs`` (frames of side ``image_size`` when
    given); return its size B."""
    sizes = []
    if "frames" in inputs:
        if frames is None:
            raise RewardInputError("this reward model reads frames: give frames of shape (B, H, W, 3) uint8")
        f = np.asarray(frames)
        if f.ndim != 4 or f.shape[-1] != 3 or f.dtype != np.uint8:
            raise RewardInputError(f"frames must be uint8 of shape (B, H, W, 3) (RGB, channels last), "
                                   f"got {f.dtype} {f.shape}")
        if image_size is not None and f.shape[1:3] != (image_size, image_size):
            raise RewardInputError(f"frames are {f.shape[1]}x{f.shape[2]}, but this reward model reads "
                                   f"{image_size}x{image_size} frames: render them at that size "
                                   f"(make_env(..., render_mode='rgb_array', render_size={image_size}))")
        sizes.append(f.shape[0])
    if "states" in inputs:
        if states is None:
            raise RewardInputError("this reward model reads states: give states of shape (B, Ds) float32")
        s = np.asarray(states)
        if s.ndim != 2:
            raise RewardInputError(f"states must have shape (B, Ds), got {s.shape}")
        if not np.all(np.isfinite(s)):
            raise RewardInputError("states contain NaN/inf")
        sizes.append(s.shape[0])
    if not sizes:
        raise RewardInputError(f"reward model inputs must name 'frames' and/or 'states', got {sorted(inputs)}")
    if len(set(sizes)) != 1:
        raise RewardInputError(f"frames and states disagree on the batch size: {sizes}")
    b = sizes[0]
    texts = [instruction] if isinstance(instruction, str) else list(instruction)
    if not isinstance(instruction, str) and len(texts) != b:
        raise RewardInputError(f"give one instruction or one per row ({b}), got {len(texts)}")
    for t in texts:
        if not isinstance(t, str) or not t.strip():
            raise RewardInputError(f"instruction must be a non-empty string, got {t!r}")
    return b
