"""Caption labels of a bank's frames (the reward design of ``embodied reward fit``).

Fitting labels each frame with how far its goal holds, 1/2 progress + 1/2 success
(``rewards.vlm.fit.caption_label``), with progress per ``RewardFitConfig.label_progress``: the
dense reward (``dense``), its rise along the episode (``episode``), or the elapsed fraction of
an episode up to its first success, the dense reward in episodes that never succeed (``time``).
``captions_from_bank`` pairs every frame with its goal's wordings and label, and with hindsight
goals (other goals of the suite in the same scene) when the suite has a hindsight labeller.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import numpy as np

from rewards.vlm.bank import RolloutBank


def episode_progress(gt_reward: np.ndarray, episode: np.ndarray) -> np.ndarray:
    """Each frame's dense reward as its rise since its episode's first frame, in [0, 1]:
    (r_t - r_0) / (1 - r_0), clipped (dense rewards lie in [0, 1])."""
    r = np.clip(np.asarray(gt_reward, np.float64), 0.0, 1.0)
    ids, first = np.unique(np.asarray(episode), return_index=True)  # each episode's earliest frame
    r0 = r[first][np.searchsorted(ids, episode)]
    return np.clip((r - r0) / np.maximum(1.0 - r0, 1e-3), 0.0, 1.0).astype(np.float32)


def time_progress(step: np.ndarray, episode: np.ndarray, first_success: np.ndarray,
                  gt_reward: np.ndarray) -> np.ndarray:
    """Each frame's progress in [0, 1] as the elapsed fraction of a successful episode.

    Args:
        step: int (N,), steps taken at each frame (1 = the frame after the first action).
        episode: int (N,), each frame's episode index into ``first_success``.
        first_success: int (E,), the step of each episode's first success; 0 for an episode
            that never succeeds.
        gt_reward: float (N,), the task's dense reward of each frame's step, in [0, 1].

    Returns:
        float32 (N,): ``step / first_success`` clipped to 1 in an episode that succeeds (its
        frames from the first success on are complete, so a hold frame where the goal no longer
        holds gets the caption label 1/2), the clipped dense reward in the others.

    This is how progress estimators trained on demonstrations label frames (the elapsed
    fraction of a successful demonstration); it rises where a task's dense reward is flat, as
    Meta-World's is for most of the approach of drawer-close and the window tasks (issue 16).
    max(elapsed fraction, dense reward) was tried on MT10 and scored alike (docs/results.md,
    MT10, "time labels"): where the dense reward is flat and low the two are equal, and
    elsewhere the max brings back the dense reward's spikes and dips. The plain fraction is
    kept as the simpler label, monotone along every successful episode.
    """
    first = np.asarray(first_success, np.int64)[np.asarray(episode)]
    dense = np.clip(np.asarray(gt_reward, np.float64), 0.0, 1.0)
    elapsed = np.asarray(step, np.float64) / np.maximum(first, 1)
    return np.where(first > 0, np.clip(elapsed, 0.0, 1.0), dense).astype(np.float32)


def _first_success_steps(bank: RolloutBank) -> np.ndarray:
    """int (E,): each episode's first success step (its recorded length), 0 if it never succeeds."""
    return np.array([int(e["length"]) if e["success"] else 0 for e in bank.episodes], np.int64)


# the progress half of the caption labels, by RewardFitConfig.label_progress: bank -> float (N,)
LABEL_PROGRESS: dict[str, Callable[[RolloutBank], np.ndarray]] = {
    "dense": lambda bank: bank.gt_reward,
    "episode": lambda bank: episode_progress(bank.gt_reward, bank.episode),
    "time": lambda bank: time_progress(bank.step, bank.episode, _first_success_steps(bank), bank.gt_reward),
}


def goal_progress(label_progress: str, reward: np.ndarray, success: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The progress half of one goal's caption labels along one episode, per ``label_progress``:
    ``LABEL_PROGRESS`` applied to that episode alone (float32 (T,) from (T,) arrays)."""
    first = np.flatnonzero(success)
    episode = SimpleNamespace(gt_reward=reward, episode=np.zeros(len(reward), np.int64), step=step,
                              episodes=[{"success": len(first) > 0, "length": int(step[first[0]]) if len(first) else 0}])
    return LABEL_PROGRESS[label_progress](episode)


def _fields(params: dict[str, Any]) -> dict[str, str]:
    """An episode's instruction fields: its string parameters."""
    return {k: v for k, v in params.items() if isinstance(v, str)}


def _key(task: str, params: dict[str, Any]) -> str:
    return json.dumps([task, _fields(params)], sort_keys=True)


def captions_from_bank(bank: RolloutBank, templates: dict[str, Sequence[str]], label_progress: str = "dense",
                       hindsight: Callable[..., Any] | None = None):
    """Ground-truth captions of a bank's frames: each frame's goal (its episode's task and
    parameters, in every template of ``templates[task]``) with its label (``caption_label``;
    its progress half per ``label_progress``, see ``RewardFitConfig``).

    ``hindsight``: a suite's hindsight labeller (``SuiteSpec.hindsight``). With it, each frame
    is also captioned with every other goal of the ``templates`` tasks in its episode's scene,
    labelled the same way from the labeller's ground truth (success and dense reward of that
    goal along the episode); these pairs are marked ``CaptionedFrames.hindsight``.
    """
    from rewards.vlm.fit import CaptionedFrames, caption_label, goal_wordings

    if label_progress not in LABEL_PROGRESS:
        raise ValueError(f"label_progress must be one of {list(LABEL_PROGRESS)}, got {label_progress!r}")
    keys: dict[str, int] = {}
    groups: list[list[str]] = []

    def group_of(task: str, params: dict[str, Any]) -> int:
        key = _key(task, params)
        if key not in keys:
            keys[key] = len(groups)
            groups.append(goal_wordings(templates[task], _fields(params)))
        return keys[key]

    ep_group = np.array([group_of(e["task"], e["params"]) for e in bank.episodes], np.int64)
    label = caption_label(bank.success, LABEL_PROGRESS[label_progress](bank))
    frame, group, labels = [np.arange(len(label))], [ep_group[bank.episode]], [label]
    if hindsight is not None:
        first = np.flatnonzero(np.r_[True, bank.episode[1:] != bank.episode[:-1]])
        for a, b in zip(first, np.r_[first[1:], len(bank.episode)]):
            e = bank.episodes[int(bank.episode[a])]
            own = _key(e["task"], e["params"])
            for task, fields, ok, reward in hindsight(bank.states[a:b], list(templates)):
                if _key(task, fields) == own:
                    continue
                frame.append(np.arange(a, b))
                group.append(np.full(b - a, group_of(task, fields), np.int64))
                labels.append(caption_label(ok, goal_progress(label_progress, reward, ok, bank.step[a:b])))
    flags = np.concatenate([np.zeros(len(label), bool)] + [np.ones(len(f), bool) for f in frame[1:]])
    return CaptionedFrames(bank.frames, np.concatenate(frame), np.concatenate(group), np.concatenate(labels), groups,
                           bank.states, bank.episode, flags if hindsight is not None else None)
