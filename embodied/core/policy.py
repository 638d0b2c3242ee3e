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

from embodied.core.errors import InvalidObservationError

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


class Episode:
    """The acting state of one episode: observation history (To) and action queue (Ta).

    ``Policy.act`` keeps one; batched acting (``embodied.runtime.rollout.BatchActor``) keeps
    one per environment and the same steps: ``push`` the observation the policy saw (after
    ``Policy.observe``), ``batch`` the history when the queue ``needs_chunk``, ``fill`` it
    with row (H, Da) of the chunk, ``pop`` the next action. ``memo`` holds what a wrapper
    policy remembers for the episode (e.g. the wording it grounded an instruction to).
    """

    def __init__(self, n_obs_steps: int, n_action_steps: int):
        self.n_action_steps = max(1, int(n_action_steps))
        self.history: deque[Observation] = deque(maxlen=max(1, int(n_obs_steps)))
        self.queue: deque[np.ndarray] = deque()
        self.memo: dict[str, Any] = {}

    def push(self, obs: Observation) -> None:
        """Append an observation; the first one also pads the history to To.

        Raises InvalidObservationError for a ``state`` with NaN/inf or of another shape than
        the episode's first, even while queued actions would not need it yet.
        """
        if "state" in obs:
            state = np.asarray(obs["state"])
            if not np.all(np.isfinite(state)):
                raise InvalidObservationError(f"observation 'state' contains NaN/inf: {state}")
            if self.history and "state" in self.history[-1]:
                before = np.shape(self.history[-1]["state"])
                if state.shape != before:
                    raise InvalidObservationError(f"observation 'state' has shape {state.shape}, but this episode's "
                                                  f"states have shape {before}")
        if not self.history:
            for _ in range(self.history.maxlen - 1):  # type: ignore[operator]
                self.history.append(obs)
        self.history.append(obs)

    @property
    def needs_chunk(self) -> bool:
        return not self.queue

    @property
    def instruction(self) -> str | None:
        """The instruction of the last observation pushed (the one the policy acts on)."""
        return str(self.history[-1]["instruction"]) if self.history and "instruction" in self.history[-1] else None

    def batch(self) -> dict[str, Any]:
        """The history as a batch of one (see ``stack_history``)."""
        return stack_history(list(self.history))

    def fill(self, chunk: np.ndarray) -> None:
        """Queue the first Ta actions of one row (H, Da) of a chunk."""
        self.queue.extend(np.asarray(chunk[: self.n_action_steps], np.float32))

    def pop(self) -> np.ndarray:
        return self.queue.popleft()


def check_chunk(chunk: Any, rows: int) -> np.ndarray:
    """``chunk`` as a (rows, H, Da) array; ValueError for another shape, FloatingPointError for NaN/inf."""
    out = np.asarray(chunk)
    if out.ndim != 3 or out.shape[0] != rows:
        raise ValueError(f"predict_chunk must return ({rows}, H, Da), got shape {out.shape}")
    if not np.all(np.isfinite(out)):
        raise FloatingPointError("policy produced a non-finite action chunk")
    return out


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
        self._episode: Episode | None = None

    @property
    def unwrapped(self) -> "Policy":
        """The innermost policy (itself here; see ``PolicyWrapper``), as ``env.unwrapped`` in gymnasium."""
        return self

    def new_episode(self) -> Episode:
        """Fresh acting state for one episode with this policy's horizons."""
        return Episode(self.n_obs_steps, self.n_action_steps)

    def reset(self) -> None:
        """Forget the action queue and observation history (call at episode start)."""
        self._episode = self.new_episode()

    def observe(self, episode: Episode, obs: Observation) -> Observation:
        """The observation this policy acts on when ``obs`` arrives in ``episode``.

        The identity here. A wrapper policy may rewrite it per episode (grounding replaces an
        unfamiliar instruction, see ``policies.common.grounding.GroundedPolicy``); both
        ``act`` and batched acting call it once per step, before the history is updated.
        """
        return obs

    def act(self, obs: Observation) -> np.ndarray:
        """Return the next action (Da,) float32 for one observation; refills the queue."""
        if self._episode is None:
            self._episode = self.new_episode()
        ep = self._episode
        ep.push(self.observe(ep, obs))
        if ep.needs_chunk:
            ep.fill(check_chunk(self.predict_chunk(ep.batch()), 1)[0])
        return ep.pop()

    @abc.abstractmethod
    def predict_chunk(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None) -> np.ndarray:
        """Predict (B, H, Da) float32 actions in [-1, 1].

        Args:
            obs_batch: ``state`` (B, To, Ds) float32, optional ``image`` (B, To, H, W, 3)
                uint8, ``instruction`` list of B str.
            noise: optional (B, H, Da) initial noise for generative policies; sampling is
                deterministic given it. Policies that ignore noise accept and ignore it.
        """


class PolicyWrapper(Policy):
    """A policy around another: same horizons, ``predict_chunk`` and ``observe`` passed through.

    Subclasses override what they change. Nothing else is forwarded (no attribute magic):
    reach the wrapped policy as ``.policy``, the innermost one as ``.unwrapped``.
    """

    def __init__(self, policy: Policy):
        self.policy = policy
        self.n_obs_steps, self.horizon, self.n_action_steps = policy.n_obs_steps, policy.horizon, policy.n_action_steps
        super().__init__()

    @property
    def unwrapped(self) -> Policy:
        return self.policy.unwrapped

    def observe(self, episode: Episode, obs: Observation) -> Observation:
        return self.policy.observe(episode, obs)

    def predict_chunk(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None) -> np.ndarray:
        return self.policy.predict_chunk(obs_batch, noise)
