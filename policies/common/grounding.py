"""Grounding an unfamiliar instruction in the scene, once per episode.

A policy conditioned on a frozen sentence encoder acts well on the wordings it was trained
on and on wordings that land near them. A wording that lands far from all of them (a word
the training wordings never use: "end effector" for "gripper") gives text features unlike
any it trained on, and the chunk can mix skills even where the encoder ranks the right
task first. ``InstructionGrounding`` keeps the training wordings (with their tasks and
sentence vectors) and the first state of every training demonstration. At the start of an
episode, an instruction that is not a training wording is replaced, for that episode, by
the training wording nearest to it in the encoder's sentence space (cosine) among the
tasks whose demonstrations start nearest to this scene (the tasks of the ``k`` nearest
first states, in per-dimension standardised units). So the scene narrows the choice to
the tasks that can be asked of it (on Meta-World MT50 mostly one, at most a few: reach,
push and pick-place share a table and a puck) and the words choose among those; the policy
then runs on a wording it knows. A training wording is always acted on as given, so what
the policy does with known instructions (and ``swap_instructions``) does not change.

Limits: only the first observation's state picks the candidate tasks, so this suits state
observations in which the scene (objects, goal) is visible; with pixels the state is
proprioception only. Instructions with parameters (which block, which colour) are snapped
whole to one training instruction, so grounding is off unless a recipe turns it on
(``PolicyConfig.ground_instructions``).

``GroundedPolicy`` is the wrapper policy that applies it: it rewrites the instruction in
``Policy.observe``, once per episode, so ``act`` and batched evaluation ground alike, and
the wrapped policy knows nothing of it. Stored in a checkpoint as ``grounding.npz`` (plain
arrays, no pickles).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from embodied.core.policy import Episode, Observation, Policy, PolicyWrapper

GROUNDING_FILE = "grounding.npz"

Embed = Callable[[list[str]], "np.ndarray"]


class InstructionGrounding:
    """Training wordings and demonstration scenes of a policy; see the module docstring.

    Args:
        task_names: the tasks, indexed by ``instruction_tasks`` and ``scene_tasks``.
        instructions: the training wordings, one entry per (wording, task) pair: tasks may
            share a wording ("lift the handle all the way up").
        instruction_tasks: (N,) task index of each entry.
        scenes: (E, Ds) first state of each training demonstration.
        scene_tasks: (E,) task index of each demonstration.
        state_mean, state_std: (Ds,) standardisation of the states (the demonstrations').
        k: how many nearest demonstrations name the candidate tasks.
        embeddings: (N, D) unit sentence vectors of ``instructions``, kept as given (computed
            on first use when not given).
    """

    def __init__(self, task_names: Sequence[str], instructions: Sequence[str], instruction_tasks: Sequence[int],
                 scenes: np.ndarray, scene_tasks: Sequence[int], state_mean: np.ndarray, state_std: np.ndarray,
                 k: int = 20, embeddings: np.ndarray | None = None) -> None:
        self.task_names = [str(t) for t in task_names]
        self.instructions = [str(s) for s in instructions]
        self.instruction_tasks = np.asarray(instruction_tasks, dtype=np.int64)
        self.scenes = np.asarray(scenes, dtype=np.float32)
        self.scene_tasks = np.asarray(scene_tasks, dtype=np.int64)
        self.state_mean = np.asarray(state_mean, dtype=np.float32)
        self.state_std = np.asarray(state_std, dtype=np.float32)
        self.k = int(k)
        n_tasks = len(self.task_names)
        if not self.instructions:
            raise ValueError("grounding needs a non-empty list of training instructions")
        if self.instruction_tasks.shape != (len(self.instructions),):
            raise ValueError(f"instruction_tasks has shape {self.instruction_tasks.shape}, expected "
                             f"({len(self.instructions)},): one task index per instruction")
        if self.scenes.ndim != 2 or len(self.scenes) == 0 or self.scene_tasks.shape != (len(self.scenes),):
            raise ValueError(f"scenes must be (E, Ds) with E >= 1 and scene_tasks (E,); got {self.scenes.shape} "
                             f"and {self.scene_tasks.shape}")
        ds = self.scenes.shape[1]
        if self.state_mean.shape != (ds,) or self.state_std.shape != (ds,) or not (self.state_std > 0).all():
            raise ValueError(f"state_mean and state_std must be ({ds},), the std positive")
        for name, idx in (("instruction_tasks", self.instruction_tasks), ("scene_tasks", self.scene_tasks)):
            if idx.size and (idx.min() < 0 or idx.max() >= n_tasks):
                raise ValueError(f"{name} must index the {n_tasks} task names")
        if len(set(zip(self.instructions, self.instruction_tasks.tolist()))) != len(self.instructions):
            raise ValueError("grounding lists an (instruction, task) pair twice")
        if self.k < 1:
            raise ValueError(f"k={self.k} is not allowed: must be >= 1")
        self._known = set(self.instructions)
        self._z = (self.scenes - self.state_mean) / self.state_std
        self.embeddings = None if embeddings is None else np.asarray(embeddings, dtype=np.float32)
        if self.embeddings is not None and self.embeddings.shape[0] != len(self.instructions):
            raise ValueError(f"embeddings has {self.embeddings.shape[0]} rows for {len(self.instructions)} "
                             "instructions")

    @classmethod
    def from_demonstrations(cls, instructions_by_task: Mapping[str, Sequence[str]], first_states: np.ndarray,
                            first_tasks: Sequence[str], all_states: np.ndarray, k: int = 20) -> "InstructionGrounding":
        """Build from each task's training instructions and the demonstrations' first states
        (``first_tasks`` names each one's task); ``all_states`` (N, Ds) standardises them."""
        names = sorted(set(instructions_by_task) | set(first_tasks))
        index = {t: i for i, t in enumerate(names)}
        pairs = sorted({(str(s), t) for t, ss in instructions_by_task.items() for s in ss})
        states = np.asarray(all_states, dtype=np.float64)
        return cls(names, [s for s, _ in pairs], [index[t] for _, t in pairs], np.asarray(first_states),
                   [index[t] for t in first_tasks], states.mean(0), states.std(0) + 1e-3, k)

    def is_known(self, instruction: str) -> bool:
        return instruction in self._known

    def candidate_tasks(self, state: np.ndarray) -> list[str]:
        """The tasks of the ``k`` demonstrations whose first state is nearest to ``state`` (Ds,)."""
        return [self.task_names[i] for i in self._candidates(state)]

    def _candidates(self, state: np.ndarray) -> np.ndarray:
        s = np.asarray(state, dtype=np.float32).reshape(-1)
        if s.shape != self.state_mean.shape:
            raise ValueError(f"state has {s.size} values, the grounding's scenes {self.state_mean.size}")
        d = (((self._z - (s - self.state_mean) / self.state_std) ** 2).sum(1))
        k = min(self.k, len(d))
        return np.unique(self.scene_tasks[np.argsort(d, kind="stable")[:k]])

    def ground(self, instruction: str, state: np.ndarray, embed: Embed) -> str:
        """The wording to act on for an episode that starts in ``state`` (Ds,).

        ``embed(texts)`` gives unit sentence vectors (len(texts), D) of the policy's encoder.
        """
        if instruction in self._known:
            return instruction
        self.ensure_embeddings(embed)
        query = _unit(np.asarray(embed([instruction]), dtype=np.float32))[0]
        sims = self.embeddings @ query
        sims[~np.isin(self.instruction_tasks, self._candidates(state))] = -np.inf
        return self.instructions[int(np.argmax(sims))]

    def ensure_embeddings(self, embed: Embed) -> None:
        """Compute the training wordings' sentence vectors now (they are saved with the index)."""
        if self.embeddings is None:
            self.embeddings = _unit(np.asarray(embed(self.instructions), dtype=np.float32))

    def tasks_of(self, instruction: str) -> list[str]:
        """The tasks a training instruction belongs to (none for any other wording)."""
        return [self.task_names[int(t)] for s, t in zip(self.instructions, self.instruction_tasks) if s == instruction]

    def save(self, path: str | Path) -> None:
        arrays = {"task_names": np.array(self.task_names, dtype=str), "instructions": np.array(self.instructions, dtype=str),
                  "instruction_tasks": self.instruction_tasks, "scenes": self.scenes, "scene_tasks": self.scene_tasks,
                  "state_mean": self.state_mean, "state_std": self.state_std, "k": np.array(self.k)}
        if self.embeddings is not None:
            arrays["embeddings"] = self.embeddings
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "InstructionGrounding":
        try:
            with np.load(path, allow_pickle=False) as z:
                a = {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise ValueError(f"{path} is not a grounding file: {e}") from None
        missing = {"task_names", "instructions", "instruction_tasks", "scenes", "scene_tasks", "state_mean",
                   "state_std", "k"} - set(a)
        if missing:
            raise ValueError(f"{path} lacks {sorted(missing)}")
        return cls(a["task_names"].tolist(), a["instructions"].tolist(), a["instruction_tasks"], a["scenes"],
                   a["scene_tasks"], a["state_mean"], a["state_std"], int(a["k"]), a.get("embeddings"))


def load_grounding(checkpoint: str | Path) -> InstructionGrounding | None:
    """The grounding index saved in a checkpoint folder, or None when it has none."""
    path = Path(checkpoint) / GROUNDING_FILE
    return InstructionGrounding.load(path) if path.is_file() else None


class GroundedPolicy(PolicyWrapper):
    """``policy`` acting on grounded instructions (see the module docstring).

    Args:
        policy: the policy to wrap; its innermost policy must embed sentences
            (``sentence_vectors(texts) -> (N, D)``) unless ``embed`` is given.
        grounding: the index built from the policy's training data.
        embed: unit sentence vectors of the wrapped policy's text encoder.
    """

    def __init__(self, policy: Policy, grounding: InstructionGrounding, embed: Embed | None = None):
        super().__init__(policy)
        if embed is None:
            embed = getattr(policy.unwrapped, "sentence_vectors", None)
            if embed is None:
                raise TypeError(f"{type(policy.unwrapped).__name__} has no sentence encoder to ground "
                                "instructions with (a one-hot policy reads no words)")
        self.grounding, self.embed = grounding, embed
        grounding.ensure_embeddings(embed)

    def ground(self, instruction: str, obs: Observation) -> str:
        """The wording to act on when ``instruction`` arrives with ``obs`` (its first observation)."""
        if "state" not in obs:
            return instruction
        state = np.asarray(obs["state"], dtype=np.float32)
        if state.ndim > 1:  # a history: its first step
            state = state.reshape(-1, state.shape[-1])[0]
        return self.grounding.ground(instruction, state, self.embed)

    def observe(self, episode: Episode, obs: Observation) -> Observation:
        obs = self.policy.observe(episode, obs)
        if "instruction" not in obs:
            return obs
        given = str(obs["instruction"])
        memo = episode.memo.get("grounding")
        if memo is None or memo[0] != given:  # a new instruction: ground it with this observation
            memo = episode.memo["grounding"] = (given, self.ground(given, obs))
        return obs if memo[1] == given else {**obs, "instruction": memo[1]}

    @property
    def batches_rows(self) -> bool:
        return bool(getattr(self.policy, "batches_rows", False))

    def predict_rows(self, obs_batch: Mapping[str, Any], noise: Any = None) -> np.ndarray:
        return self.policy.predict_rows(obs_batch, noise)  # type: ignore[attr-defined]


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
