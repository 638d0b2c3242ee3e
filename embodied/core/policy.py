"""The Policy contract: one object for simulation, evaluation and the robot bridge.

A policy predicts action *chunks*: given a batch of observation histories it returns
(B, H, Da) actions. ``act`` serves one robot/env step at a time from a queue that is
refilled with the first ``n_action_steps`` (Ta) actions of a fresh chunk whenever it runs
dry. Given the same observation and the same ``noise``, ``predict_chunk`` is
deterministic; latent-noise steering and the bridge rely on this.
"""

from __future__ import annotations

import abc
from collections import deque
from typing import Any, Mapping

import numpy as np

Observation = Mapping[str, Any]


def stack_history(history: list[Observation]) -> dict[str, Any]:
    """Turn To single-step observations into one batch of size 1.

    ``state`` (Ds,) -> (1, To, Ds); ``image`` (H, W, 3) -> (1, To, H, W, 3);
    ``instruction`` str -> [str].
    """
    out: dict[str, Any] = {"instruction": [str(history[-1]["instruction"])]}
    if "task" in history[-1]:  # the one-hot baseline reads the task name instead of the words
        out["task"] = [str(history[-1]["task"])]
    out["state"] = np.stack([np.asarray(o["state"], np.float32) for o in history])[None]
    if "image" in history[-1]:
        out["image"] = np.stack([np.asarray(o["image"], np.uint8) for o in history])[None]
    if "images" in history[-1]:
        out["images"] = {k: np.stack([o["images"][k] for o in history])[None] for k in history[-1]["images"]}
    return out


def batch_row(value: Any, i: int) -> Any:
    """Row ``i`` of an observation batch (arrays, lists, nested mappings) as a batch of one."""
    if isinstance(value, Mapping):
        return {k: batch_row(v, i) for k, v in value.items()}
    if isinstance(value, str) or not hasattr(value, "__getitem__"):
        return value
    return value[i: i + 1]


def with_grounded(policy: "Policy", memo: tuple[str, str] | None, obs: Observation
                  ) -> tuple[tuple[str, str] | None, Observation]:
    """``obs`` with the instruction ``policy`` acts on, and the new memo.

    ``memo`` is (instruction given, instruction acted on) of the episode so far: a new
    instruction is grounded once, with the first observation that carries it (see
    ``Policy.ground_instruction``).
    """
    if "instruction" not in obs:
        return memo, obs
    given = str(obs["instruction"])
    if memo is None or memo[0] != given:
        memo = (given, policy.ground_instruction(given, obs))
    return memo, (obs if memo[1] == given else {**obs, "instruction": memo[1]})


class Policy(abc.ABC):
    """Base class. Subclasses set the three horizons and implement ``predict_chunk``.

    Attributes:
        n_obs_steps: To, observation steps the policy conditions on.
        horizon: H, actions predicted per chunk.
        n_action_steps: Ta <= H, actions executed before the next chunk is requested.
    """

    n_obs_steps: int = 1
    horizon: int = 1
    n_action_steps: int = 1

    def __init__(self) -> None:
        self._queue: deque[np.ndarray] = deque()
        self._history: deque[Observation] = deque(maxlen=max(1, self.n_obs_steps))
        self._grounded: tuple[str, str] | None = None

    def reset(self) -> None:
        """Forget the action queue, observation history and grounded instruction (call at episode start)."""
        self._queue.clear()
        self._history = deque(maxlen=max(1, self.n_obs_steps))
        self._grounded = None

    def ground_instruction(self, instruction: str, obs: Observation) -> str:
        """The wording this policy acts on when ``instruction`` is given with ``obs`` (the
        first observation that carries it). The identity here; a policy may map wordings it
        was not trained on to ones it was (see ``policies.common.grounding``)."""
        return instruction

    def act(self, obs: Observation) -> np.ndarray:
        """Return the next action (Da,) float32 for one observation; refills the queue."""
        self._grounded, obs = with_grounded(self, self._grounded, obs)
        if not self._history:  # pad history with the first observation
            for _ in range(max(1, self.n_obs_steps) - 1):
                self._history.append(obs)
        self._history.append(obs)
        if not self._queue:
            chunk = np.asarray(self.predict_chunk(stack_history(list(self._history))))
            if chunk.ndim != 3 or chunk.shape[0] != 1:
                raise ValueError(f"predict_chunk must return (1, H, Da), got shape {chunk.shape}")
            if not np.all(np.isfinite(chunk)):
                raise FloatingPointError("policy produced a non-finite action chunk")
            self._queue.extend(chunk[0, : self.n_action_steps].astype(np.float32))
        return self._queue.popleft()

    @abc.abstractmethod
    def predict_chunk(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None) -> np.ndarray:
        """Predict (B, H, Da) float32 actions in [-1, 1].

        Args:
            obs_batch: ``state`` (B, To, Ds) float32, optional ``image`` (B, To, H, W, 3)
                uint8, ``instruction`` list of B str.
            noise: optional (B, H, Da) initial noise for generative policies; sampling is
                deterministic given it. Policies that ignore noise accept and ignore it.
        """
