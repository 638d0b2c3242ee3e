"""Rewards in the loop: rollout banks, fitting the in-domain CLIP reward, reward-quality
evaluation and throughput (``embodied reward fit | eval | bench``).

A rollout bank is a set of episodes of a suite's tasks played by scripted experts, noisy
experts, partial experts (the expert for part of its episode, then standing still or acting
at random) and random actions, from a range of seeds and one instruction split. Every step
keeps the frame the reward reads (one camera's observation image, or ``env.render()``, at
the reward's frame side), the privileged state and the ground truth: success and the task's
dense reward. Banks feed
both fitting (training seeds, training wordings) and evaluation (held-out seeds, held-out
wordings); any ``RewardModel`` can be evaluated on one. Fitting labels each frame with how far
its goal holds, 1/2 progress + 1/2 success, with progress per ``RewardFitConfig.label_progress``:
the dense reward (``dense``), its rise along the episode (``episode``), or the elapsed fraction
of an episode up to its first success, the dense reward in episodes that never succeed (``time``).

    embodied reward fit suite=manipulation                     # -> RUN/reward (the checkpoint)
    embodied reward eval suite=manipulation reward.checkpoint=RUN/reward
    embodied reward bench suite=manipulation reward.checkpoint=RUN/reward
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import numpy as np

from embodied.core.errors import EmbodiedError
from embodied.core.registry import get_suite, get_task, list_suites, make_env, resolve_tasks, suite_hook
from embodied.core.reward import RewardModel
from embodied.runtime.evaluate import write_json
from rewards.vlm.fit import FitSettings
from rewards.wrappers import frame_env_kwargs, read_frame

log = logging.getLogger("embodied.reward")
BEHAVIOURS = ("expert", "noisy", "partial", "random")
BANK_ARRAYS = ("frames", "states", "episode", "step", "success", "gt_reward", "post")


# ---------------------------------------------------------------------------------- banks
@dataclass
class BankConfig:
    """Which episodes a rollout bank holds (the ``bank`` part of fit and eval configs)."""

    seeds: int = 30  # seeds per task; every behaviour plays each seed once
    seed: int = 0  # first seed: task i of T plays seeds seed + i, seed + i + T, ... (see seed_range)
    split: str = "train"  # instruction split of the episodes: train | heldout
    behaviours: list[str] = field(default_factory=lambda: list(BEHAVIOURS))
    noise: float = 0.4  # std of the Gaussian added to the noisy expert's actions
    hold_steps: int = 5  # steps kept after the first success (the goal still holds, or not)
    frame_stride: int = 1  # keep every k-th frame (and always the last); 1 keeps all
    random_extra_steps: int = 10  # random episodes last the seed's expert length plus this
    partial_tail: int = 20  # steps a partial episode goes on after the expert stops

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise ValueError(f"bank.seeds must be >= 1, got {self.seeds}")
        if self.split not in ("train", "heldout"):
            raise ValueError(f"bank.split must be 'train' or 'heldout', got {self.split!r}")
        bad = [b for b in self.behaviours if b not in BEHAVIOURS]
        if bad or not self.behaviours:
            raise ValueError(f"bank.behaviours must be a non-empty subset of {list(BEHAVIOURS)}, got {self.behaviours}")
        if self.noise < 0 or self.hold_steps < 0 or self.frame_stride < 1:
            raise ValueError(f"bank.noise and bank.hold_steps must be >= 0 and bank.frame_stride >= 1, got "
                             f"{self.noise}, {self.hold_steps}, {self.frame_stride}")


def seed_range(cfg: BankConfig, n_tasks: int) -> tuple[int, int]:
    """[lo, hi) of the seeds a bank of ``n_tasks`` tasks plays. Each task plays its own seeds
    (interleaved), so that every episode of the bank starts from a different scene: the
    suites' tasks share one scene distribution, and the same seed would repeat a scene."""
    return cfg.seed, cfg.seed + cfg.seeds * n_tasks


@dataclass
class RolloutBank:
    """Frames and ground truth of many episodes; rows are kept frames (N,), one per step.

    Arrays: ``frames`` uint8 (N, S, S, 3); ``states`` float32 (N, Ds) privileged state;
    ``episode`` int (N,) index into ``episodes``; ``step`` int (N,) steps taken (1 = the frame
    after the first action); ``success`` bool (N,); ``gt_reward`` float32 (N,) the task's dense
    reward of the step; ``post`` bool (N,) after the episode's first success (hold steps).
    ``episodes``: one dict per episode (task, seed, behaviour, instruction, params, split,
    success, length, gt_return over all its steps).
    """

    frames: np.ndarray
    states: np.ndarray
    episode: np.ndarray
    step: np.ndarray
    success: np.ndarray
    gt_reward: np.ndarray
    post: np.ndarray
    episodes: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    def rows(self, task: str) -> np.ndarray:
        ids = np.array([i for i, e in enumerate(self.episodes) if e["task"] == task], int)
        return np.flatnonzero(np.isin(self.episode, ids))

    def save(self, folder: str | Path) -> Path:
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "bank.npz", **{k: getattr(self, k) for k in BANK_ARRAYS})
        write_json(out / "bank.json", {"episodes": self.episodes, "meta": self.meta})
        return out

    @classmethod
    def load(cls, folder: str | Path) -> "RolloutBank":
        root = Path(folder)
        if not (root / "bank.npz").is_file() or not (root / "bank.json").is_file():
            raise FileNotFoundError(f"rollout bank {str(folder)!r} must be a folder with bank.npz and bank.json "
                                    "(written with save_bank=PATH)")
        arrays = np.load(root / "bank.npz")
        info = json.loads((root / "bank.json").read_text())
        return cls(**{k: arrays[k] for k in BANK_ARRAYS}, episodes=info["episodes"], meta=info["meta"])


def _policy_action(u: Any, behaviour: str, t: int, switch: int, tail: str, rng: np.random.Generator,
                   noise: float, shape: tuple[int, ...]) -> np.ndarray:
    if behaviour == "random" or (behaviour == "partial" and t >= switch and tail == "random"):
        return rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    if behaviour == "partial" and t >= switch:
        return np.zeros(shape, np.float32)
    a = u.expert_action()  # the expert keeps its memory current only when asked every step
    if behaviour == "noisy":
        a = np.clip(a + rng.normal(0.0, noise, shape), -1.0, 1.0).astype(np.float32)
    return a


def play_bank_episode(env: Any, seed: int, behaviour: str, expert_len: int, cfg: BankConfig,
                      rng: np.random.Generator, record: bool = True, camera: str | None = None) -> dict[str, Any]:
    """One episode of ``behaviour`` from ``seed``; frames rendered when ``record``."""
    obs, info = env.reset(seed=seed)
    u = env.unwrapped
    shape = env.action_space.shape
    cap = int(u.max_episode_steps)
    switch, tail = cap + 1, "stop"
    if behaviour == "random":
        cap = min(cap, expert_len + cfg.random_extra_steps)
    elif behaviour == "partial":
        switch = max(1, int(rng.uniform(0.2, 0.9) * expert_len))
        tail = "random" if rng.random() < 0.5 else "stop"
        cap = min(cap, switch + cfg.partial_tail)
    rows: dict[str, list[Any]] = {k: [] for k in ("frames", "states", "step", "success", "gt_reward", "post")}
    first, t, ret = None, 0, 0.0
    while True:
        a = _policy_action(u, behaviour, t, switch, tail, rng, cfg.noise, shape)
        obs, r, term, trunc, info = env.step(a)
        t += 1
        ret += float(r) if first is None else 0.0
        ok = bool(info["success"])
        if first is None and ok:
            first = t
            end = cfg.hold_steps == 0
        elif first is not None:
            end = t - first >= cfg.hold_steps
        else:
            end = bool(trunc or term) or t >= cap
        if record and (t % cfg.frame_stride == 0 or end or t == first):
            rows["frames"].append(read_frame(env, obs, camera))
            rows["states"].append(u.privileged_state())
            rows["step"].append(t)
            rows["success"].append(ok)
            rows["gt_reward"].append(float(r))
            rows["post"].append(first is not None and t > first)
        if end:
            break
    return {"rows": rows, "instruction": obs["instruction"], "params": dict(u.params), "success": first is not None,
            "length": first if first is not None else t, "gt_return": ret, "switch": switch if behaviour == "partial"
            else None}


def collect_bank(tasks: Sequence[str], cfg: BankConfig, image_size: int, progress: bool = True,
                 camera: str | None = None, supersample: int = 1) -> RolloutBank:
    """Play ``cfg.seeds`` seeds of every task with every behaviour; see ``RolloutBank``.
    Frames are ``camera``'s observation images, or ``env.render()`` when it is None, drawn with
    ``make_env``'s ``supersample``."""
    from tqdm import tqdm

    arrays: dict[str, list[np.ndarray]] = {k: [] for k in BANK_ARRAYS}
    episodes: list[dict[str, Any]] = []
    bar = tqdm(total=len(tasks) * cfg.seeds, desc="rollout bank", disable=not progress, unit="seed")
    t0 = time.perf_counter()
    for i, task in enumerate(tasks):
        env = make_env(task, instruction_split=cfg.split, **frame_env_kwargs(camera, image_size, supersample))
        try:
            for k in range(cfg.seeds):
                seed = cfg.seed + k * len(tasks) + i
                rng = np.random.default_rng([seed, 7])
                expert = play_bank_episode(env, seed, "expert", 0, cfg, rng, "expert" in cfg.behaviours, camera)
                for b in cfg.behaviours:
                    ep = expert if b == "expert" else play_bank_episode(env, seed, b, expert["length"], cfg, rng,
                                                                        True, camera)
                    rows = ep.pop("rows")
                    n = len(rows["step"])
                    arrays["frames"].append(np.asarray(rows["frames"], np.uint8).reshape(n, image_size, image_size, 3))
                    arrays["states"].append(np.asarray(rows["states"], np.float32).reshape(n, -1))
                    arrays["episode"].append(np.full(n, len(episodes), np.int64))
                    for key, dt in (("step", np.int64), ("success", bool), ("gt_reward", np.float32), ("post", bool)):
                        arrays[key].append(np.asarray(rows[key], dt))
                    episodes.append({"task": task, "seed": seed, "behaviour": b, "split": cfg.split,
                                     "frames": n, **ep})
                bar.update(1)
        finally:
            env.close()
    bar.close()
    cat = {k: np.concatenate(v) for k, v in arrays.items()}
    meta = {"tasks": list(tasks), "suites": sorted({get_task(t).suite for t in tasks}), "image_size": image_size,
            "camera": camera, "supersample": supersample, "bank": asdict(cfg), "wall_time_s": time.perf_counter() - t0}
    log.info("rollout bank: %d episodes, %d frames (%.0f s)", len(episodes), len(cat["step"]), meta["wall_time_s"])
    return RolloutBank(**cat, episodes=episodes, meta=meta)


def bank_for(tasks: Sequence[str], cfg: BankConfig, image_size: int, camera: str | None, path: str, save: str,
             progress: bool, supersample: int = 1) -> RolloutBank:
    """A saved bank (``path``) after checking it matches ``cfg``, else a freshly played one."""
    if path:
        bank = RolloutBank.load(path)
        want = {"tasks": list(tasks), "image_size": image_size, "camera": camera, "supersample": supersample,
                "bank": asdict(cfg)}
        have = {k: bank.meta.get(k, 1 if k == "supersample" else None) for k in want}  # (older banks: none)
        if have != want:
            diff = {k: (have[k], want[k]) for k in want if have[k] != want[k]}
            raise ValueError(f"rollout bank {path!r} was played with other settings (have, want): {diff}")
        return bank
    bank = collect_bank(tasks, cfg, image_size, progress, camera, supersample)
    if save:
        bank.save(save)
        log.info("saved the rollout bank to %s", save)
    return bank


def suite_of(tasks: Sequence[str]) -> str:
    suites = sorted({get_task(t).suite for t in tasks})
    if len(suites) != 1:
        raise ValueError(f"a reward is fitted and evaluated on one suite at a time; tasks {list(tasks)} span {suites}")
    return suites[0]


# ------------------------------------------------------------------------------------ fit
@dataclass
class RewardFitConfig:
    """Schema of ``configs/reward_fit.yaml``: fit the in-domain CLIP reward on a rollout bank."""

    suite: str = "manipulation"
    tasks: list[str] = field(default_factory=list)  # default: the suite's tasks
    # training seeds, training wordings: 100 seeds per task, every other frame
    bank: BankConfig = field(default_factory=lambda: BankConfig(seeds=100, frame_stride=2))
    image_size: int = 64  # frame side
    # the camera whose observation images the reward reads ("": env.render(), the render camera);
    # `embodied reward fit` takes a suite's choice from configs/reward_fit_suite/<suite>.yaml
    camera: str = ""
    # anti-aliasing of the frames (make_env's supersample: drawn at k times image_size, each k x k
    # block averaged); stored in the checkpoint, and every env the reward reads must draw the same
    supersample: int = 1
    # open_clip architecture: a built-in name plus overrides of its config. The default is CLIP's
    # ResNet (open_clip's ModifiedResNet, as in RN50) shrunk for CPU speed: one bottleneck block
    # per stage, width 8, attention pooling, at 64x64. On these frames it learnt faster than a
    # ViT of the same speed (see the report).
    arch: str = "RN50"
    vision: dict[str, Any] = field(default_factory=lambda: {"image_size": 64, "layers": [1, 1, 1, 1], "width": 8,
                                                            "head_width": 8})
    center_text: bool = True  # remove the mean embedding of the training wordings (rewards.vlm.text.CenteredText)
    text: str = "auto"  # minilm (frozen all-MiniLM-L6-v2) | open_clip (the init checkpoint's own tower) | auto
    # read instructions clause by clause (rewards.vlm.text.ClauseText: the whole instruction, then its
    # later clauses; twice the embedding width), so that which named object is the goal and which the
    # one to avoid survives the sentence encoder. MiniLM text side only
    text_clauses: bool = False
    # with text_clauses, the first half: "sentence" (the whole instruction) or "clause" (its first
    # clause only, as checkpoints before this option)
    clause_head: str = "sentence"
    # project instructions onto the span of the fitted goals' mean text embeddings
    # (rewards.vlm.text.ProjectedText), stored in the checkpoint
    project_text: bool = False
    # add the suite's relational state features (SuiteSpec.state_features: e.g. the robot's distance to
    # each pair of balls' midpoint) to the auxiliary state loss's targets; suites without them refuse it
    state_features: bool = False
    init: str = ""  # a local open_clip weights file of `arch` to fine-tune instead of starting from scratch
    # with init: entries of the arch's open_clip config to replace (e.g. {vision_cfg: {image_size: 64}})
    init_overrides: dict[str, Any] = field(default_factory=dict)
    fit: FitSettings = field(default_factory=FitSettings)  # optimisation (rewards.vlm.fit)
    # the progress half of each frame's caption label (captions_from_bank): "dense" = the dense
    # reward; "episode" = the dense reward's rise since the episode's first frame, scaled so
    # that it reaches 1 at the dense reward's maximum (labels rise from 0 along every episode);
    # "time" = in an episode that succeeds, the elapsed fraction up to its first success
    # (step / first success step, 1 from the success on), the dense reward in the others
    # (time_progress: a progress label that rises where the dense reward is flat, issue 16)
    label_progress: str = "dense"
    # hindsight captions: also label every frame for every other goal the suite's tasks could have
    # given in its episode's scene (from the suite's ground truth, SuiteSpec.hindsight), so the
    # tower learns which goal a frame satisfies, not only how far along its own episode is.
    # Suites without a hindsight labeller refuse it
    hindsight: bool = False
    # frames of the fitting bank (drawn at random) whose image embeddings the checkpoint keeps, so
    # that the reward is a z-score per instruction against them (rewards.vlm.model); 0: none
    reference_frames: int = 2048
    out: str = ""  # checkpoint folder (default: RUN/reward)
    bank_path: str = ""  # reuse a saved bank (must match `bank`)
    save_bank: str = ""  # save the bank here
    threads: int = 1  # torch threads
    progress: bool = True

    def __post_init__(self) -> None:
        if self.bank.split != "train":
            raise ValueError(f"bank.split must be 'train' for fitting (held-out wordings are never used to fit), "
                             f"got {self.bank.split!r}")
        if self.text not in ("auto", "minilm", "open_clip"):
            raise ValueError(f"text must be 'auto', 'minilm' or 'open_clip', got {self.text!r}")
        if self.text == "open_clip" and not self.init:
            raise ValueError("text=open_clip locks the text tower of a checkpoint: give init=PATH (open_clip weights)")
        if self.clause_head not in ("sentence", "clause"):
            raise ValueError(f"clause_head must be 'sentence' or 'clause', got {self.clause_head!r}")
        if self.text_clauses and self.init:  # (text=open_clip needs init, refused above without it)
            raise ValueError("text_clauses=true reads instructions with the MiniLM text side, whose width it doubles; "
                             "a fine-tuned checkpoint (init=PATH) keeps its own text tower and width: drop one of them")
        if self.text == "minilm" and self.init:
            raise ValueError("init=PATH fine-tunes a user's open_clip model against its own text tower: use "
                             "text=auto or text=open_clip")
        if not 8 <= self.image_size <= 512:
            raise ValueError(f"image_size must be in [8, 512], got {self.image_size}")
        if not 1 <= self.supersample <= 4:
            raise ValueError(f"supersample must be in [1, 4] (1: none), got {self.supersample}")
        if self.reference_frames < 0 or self.reference_frames == 1:
            raise ValueError(f"reference_frames must be 0 (none) or >= 2, got {self.reference_frames}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.label_progress not in LABEL_PROGRESS:
            raise ValueError(f"label_progress must be one of {list(LABEL_PROGRESS)}, got {self.label_progress!r}")


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


def _required_hook(suite: str, name: str, what: str, pronoun: str) -> Callable[..., Any]:
    """The suite's ``name`` hook (``suite_hook``), which ``name=true`` of a fit needs; a clear error without it."""
    hook = suite_hook(suite, name)
    if hook is None:
        raise ValueError(f"{name}=true needs a suite with {what}; {suite!r} has none "
                         f"(suites with {pronoun}: {[s for s in list_suites() if getattr(get_suite(s), name)]})")
    return hook


def run_fit(cfg: RewardFitConfig, out: Path) -> dict[str, Any]:
    """Fit the in-domain reward on a training bank and save it to ``cfg.out`` or ``out/reward``."""
    import torch

    from rewards.vlm.fit import fit_image_tower
    from rewards.vlm.model import ClipReward, ImagePreprocess
    from rewards.vlm.text import MINILM_DIM, CenteredText, ClauseText, MiniLMText, OpenClipText, ProjectedText
    from rewards.vlm.towers import (OPENAI_MEAN, OPENAI_STD, PLACEHOLDER_TEXT, build_open_clip, image_size_of,
                                    load_open_clip, save_reference, save_reward_checkpoint)

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.fit.seed)
    tasks = resolve_tasks(cfg.suite, cfg.tasks)
    suite = suite_of(tasks)
    labeller = _required_hook(suite, "hindsight", "a hindsight labeller", "one") if cfg.hindsight else None
    extra = _required_hook(suite, "state_features", "relational state features", "them") \
        if cfg.state_features else None
    t0 = time.perf_counter()
    if cfg.init:
        overrides = dict(cfg.init_overrides)
        model, text_name = load_open_clip(cfg.arch, cfg.init, overrides), "open_clip"
    else:
        overrides = {"embed_dim": MINILM_DIM * (2 if cfg.text_clauses else 1), "vision_cfg": dict(cfg.vision),
                     "text_cfg": PLACEHOLDER_TEXT}
        model, text_name = build_open_clip(cfg.arch, overrides), "minilm"
    text = MiniLMText() if text_name == "minilm" else OpenClipText(model, cfg.arch)
    if cfg.text_clauses:
        text = ClauseText(text, cfg.clause_head)
    size = image_size_of(model)
    pre = ImagePreprocess(size, OPENAI_MEAN, OPENAI_STD)
    bank = bank_for(tasks, cfg.bank, cfg.image_size, cfg.camera or None, cfg.bank_path, cfg.save_bank, cfg.progress,
                    cfg.supersample)
    data = captions_from_bank(bank, {t: get_task(t).train_instructions for t in tasks}, cfg.label_progress, labeller)
    center = None
    if cfg.center_text:
        center = text.encode(sorted({w for g in data.groups for w in g})).mean(0)
        text = CenteredText(text, center)
    if extra is not None:
        if data.states is None:
            raise ValueError("state_features=true needs the bank's privileged states, and this bank has none")
        data.states = np.concatenate([data.states, extra(data.states)], axis=1)
    basis = None
    if cfg.project_text:
        basis = ProjectedText.basis_of(torch.stack([text.encode(g).mean(0) for g in data.groups]))
        text = ProjectedText(text, basis)
    settings = cfg.fit
    record = fit_image_tower(model, text, pre, data, settings)
    folder = Path(cfg.out) if cfg.out else out / "reward"
    meta = {"suite": suite, "tasks": tasks, "arch": cfg.arch, "overrides": overrides, "text": text.describe(),
            "image_size": cfg.image_size, "tower_image_size": size, "mean": list(OPENAI_MEAN), "std": list(OPENAI_STD),
            "camera": cfg.camera or None, "supersample": cfg.supersample,
            "calibration": record["calibration"], "text_center": None if center is None else center.tolist(),
            "text_basis": None if basis is None else basis.tolist(),
            "text_clauses": cfg.text_clauses, "clause_head": cfg.clause_head if cfg.text_clauses else None,
            "reference_frames": 0,
            "fitted": {"seeds": list(seed_range(cfg.bank, len(tasks))), "split": "train",
                       "bank": asdict(cfg.bank), "init": cfg.init or None, "settings": asdict(settings),
                       "label_progress": cfg.label_progress, "hindsight": cfg.hindsight,
                       "state_features": cfg.state_features, "state_targets": record["state_targets"],
                       "history": record["history"], "pairs": record["pairs"], "groups": record["groups"],
                       "wordings": record["wordings"],
                       # every training wording, filled with the episodes' parameters (the goals it was fitted on)
                       "train_wordings": sorted({w for g in data.groups for w in g})}}
    if cfg.reference_frames:
        pick = np.sort(np.random.default_rng(settings.seed).choice(
            len(bank.frames), min(cfg.reference_frames, len(bank.frames)), replace=False))
        reference = ClipReward(model, text, pre, optimize=False).embed_images(bank.frames[pick])
        meta["reference_frames"] = len(pick)
    save_reward_checkpoint(folder, model, meta)
    if cfg.reference_frames:
        save_reference(folder, reference)
    metrics = {"suite": suite, "tasks": tasks, "checkpoint": str(folder), "frames": int(len(bank.step)),
               "episodes": len(bank.episodes), "bank_time_s": bank.meta.get("wall_time_s"),
               "train_time_s": record["train_time_s"], "final_loss": record["history"][-1]["loss"],
               "wall_time_s": time.perf_counter() - t0, "text": text.describe(), "arch": cfg.arch}
    write_json(out / "metrics.json", metrics)
    log.info("saved the reward to %s (%d frames, loss %.4f, %.0f s)", folder, metrics["frames"],
             metrics["final_loss"], metrics["wall_time_s"])
    return metrics


# ----------------------------------------------------------------------------------- eval
@dataclass
class RewardEvalConfig:
    """Schema of ``configs/reward_eval.yaml``: reward quality on a held-out rollout bank."""

    suite: str = "manipulation"
    tasks: list[str] = field(default_factory=list)
    # reward=clip (config group configs/reward/): any model of rewards.registry
    reward: dict[str, Any] = field(default_factory=lambda: {"name": "clip"})
    # held-out seeds and wordings: 40 seeds per task (40 successful expert episodes for VOC); with 10
    # the per-task figures of one checkpoint moved by up to 0.05 AUROC and 0.2 VOC (docs/results.md,
    # issue 16, eighth round). A suite may choose otherwise in configs/reward_eval_suite/<suite>.yaml
    bank: BankConfig = field(default_factory=lambda: BankConfig(seeds=40, seed=1_000_000, split="heldout"))
    image_size: int = 64  # frame side for a reward that reads any size
    # sensitivity to alpha (the goal-baseline projection, with the reward's own baselines)
    alphas: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    wordings: bool = True  # sensitivity to wording: every training and held-out template of each task
    gamma: float = 0.99  # EPIC's discount
    epic_pool: int = 512  # coverage states EPIC canonicalises over, per task
    bank_path: str = ""
    save_bank: str = ""
    plots: bool = True
    threads: int = 1
    progress: bool = True

    def __post_init__(self) -> None:
        if any(not 0.0 <= a <= 1.0 for a in self.alphas):
            raise ValueError(f"alphas must lie in [0, 1], got {self.alphas}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.epic_pool < 2 or self.threads < 1:
            raise ValueError(f"epic_pool must be >= 2 and threads >= 1, got {self.epic_pool}, {self.threads}")


class _Scorer:
    """Scores bank rows with a reward model; a CLIP-like model's image embeddings are computed
    once and reused for every instruction and option (alpha, wording)."""

    def __init__(self, model: RewardModel, bank: RolloutBank, chunk: int = 1024):
        self.model, self.bank, self.chunk = model, bank, chunk
        self.reuse = callable(getattr(model, "embed_images", None)) and callable(
            getattr(model, "score_embeddings", None))
        self._emb: dict[int, Any] = {}

    def __call__(self, rows: np.ndarray, instructions: Sequence[str], model: RewardModel | None = None
                 ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        m = model or self.model
        out_r, out_t = [], []
        for i in range(0, len(rows), self.chunk):
            r, ins = rows[i:i + self.chunk], list(instructions[i:i + self.chunk])
            if self.reuse:
                key = int(r[0]) * 1_000_003 + len(r)
                if key not in self._emb:
                    self._emb[key] = self.model.embed_images(self.bank.frames[r])
                o = m.score_embeddings(self._emb[key], ins)
            else:
                o = m(self.bank.frames[r] if "frames" in m.inputs else None,
                      self.bank.states[r] if "states" in m.inputs else None, ins)
            out_r.append(np.asarray(o.reward, np.float32))
            out_t.append(o.terms)
        terms = {k: np.concatenate([t[k] for t in out_t]) for k in out_t[0]} if out_t else {}
        return np.concatenate(out_r) if out_r else np.zeros(0, np.float32), terms


def _smooth_rows(bank: RolloutBank, rows: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """Causal mean over the last ``k`` frames within each episode (rows are in episode order)."""
    if k <= 1:
        return values
    from rewards.vlm.model import causal_mean

    out = values.copy()
    ep = bank.episode[rows]
    for e in np.unique(ep):
        sel = np.flatnonzero(ep == e)
        out[sel] = causal_mean(values[sel], k)
    return out


def quality(bank: RolloutBank, rows: np.ndarray, reward: np.ndarray, gamma: float, pool: int,
            rng: np.random.Generator) -> dict[str, Any]:
    """Success AUROC, VOC, return Spearman and EPIC of ``reward`` (per row of ``rows``)."""
    import torch

    from rewards.quality import auroc, epic_distance, next_state_reward, spearman, voc

    ep = bank.episode[rows]
    post = bank.post[rows]
    vocs, rets, gts = [], [], []
    for e in np.unique(ep):
        sel = np.flatnonzero((ep == e) & ~post)
        info = bank.episodes[int(e)]
        if info["behaviour"] == "expert" and info["success"] and len(sel) >= 2:
            vocs.append(voc(reward[sel]))
        rets.append(float(reward[sel].sum()))
        gts.append(float(bank.gt_reward[rows[sel]].sum()))
    # EPIC over consecutive kept frames of each episode, canonicalised over coverage states
    local = np.arange(len(rows))
    cont = np.flatnonzero(ep[1:] == ep[:-1])
    s, s_next = torch.from_numpy(local[cont]), torch.from_numpy(local[cont + 1])
    pool_idx = torch.from_numpy(rng.choice(len(rows), min(pool, len(rows)), replace=False))
    epic = epic_distance(next_state_reward(torch.from_numpy(reward.astype(np.float64))),
                         next_state_reward(torch.from_numpy(bank.gt_reward[rows].astype(np.float64))),
                         s, s_next, pool_idx, gamma) if len(cont) >= 2 else float("nan")
    vocs = [v for v in vocs if np.isfinite(v)]
    return {"auroc": auroc(reward, bank.success[rows]), "voc": float(np.mean(vocs)) if vocs else float("nan"),
            "voc_min": float(np.min(vocs)) if vocs else float("nan"), "voc_episodes": len(vocs),
            "return_spearman": spearman(np.array(rets), np.array(gts)), "epic": epic,
            "frames": int(len(rows)), "success_frames": int(bank.success[rows].sum()), "episodes": len(rets)}


def _mean(values: list[float]) -> float:
    v = [x for x in values if x is not None and np.isfinite(x)]
    return float(np.mean(v)) if v else float("nan")


def evaluate_reward(model: RewardModel, bank: RolloutBank, tasks: Sequence[str], alphas: Sequence[float] = (),
                    wordings: bool = True, gamma: float = 0.99, epic_pool: int = 512,
                    seed: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reward quality of any ``RewardModel`` on a bank: (metrics, per-task curves for plots).

    Each frame is scored with its episode's instruction (the bank's split). ``alphas`` and
    ``wordings`` add sensitivity analyses (alpha needs a model with ``with_options``).
    """
    scorer = _Scorer(model, bank)
    k = int(getattr(model, "smoothing", 1))
    rng = np.random.default_rng(seed)
    per_task, gt_ref, curves = {}, {}, {}
    sens_alpha: dict[str, dict[str, Any]] = {}
    sens_words: dict[str, Any] = {}
    for task in tasks:
        rows = bank.rows(task)
        if len(rows) == 0:
            raise EmbodiedError(f"the rollout bank has no frames of task {task!r}")
        ins = [bank.episodes[int(e)]["instruction"] for e in bank.episode[rows]]
        raw, terms = scorer(rows, ins)
        reward = _smooth_rows(bank, rows, raw, k)
        per_task[task] = quality(bank, rows, reward, gamma, epic_pool, rng)
        gt_ref[task] = quality(bank, rows, bank.gt_reward[rows], gamma, epic_pool, rng)
        curves[task] = {"rows": rows, "reward": reward, "terms": terms}
        if alphas and callable(getattr(model, "with_options", None)):
            for a in alphas:
                variant = model.with_options(alpha=float(a))
                r = _smooth_rows(bank, rows, scorer(rows, ins, variant)[0], k)
                q = quality(bank, rows, r, gamma, epic_pool, rng)
                sens_alpha.setdefault(f"{a:g}", {})[task] = {m: q[m] for m in ("auroc", "voc", "epic")}
        if wordings:
            sens_words[task] = _wording_sensitivity(bank, rows, task, scorer, k, gamma, epic_pool, rng)
    keys = ("auroc", "voc", "return_spearman", "epic")
    metrics: dict[str, Any] = {m: _mean([per_task[t][m] for t in tasks]) for m in keys}
    metrics.update({f"{m}_min": float(np.nanmin([per_task[t][m] for t in tasks])) for m in ("auroc", "voc")})
    metrics["per_task"] = per_task
    metrics["ground_truth_dense_reward"] = {**{m: _mean([gt_ref[t][m] for t in tasks]) for m in keys},
                                            "per_task": gt_ref}
    if sens_alpha:
        metrics["alpha_sensitivity"] = {a: {**{m: _mean([v[t][m] for t in tasks]) for m in ("auroc", "voc", "epic")},
                                            "per_task": v} for a, v in sens_alpha.items()}
    if sens_words:
        metrics["wording_sensitivity"] = sens_words
    return metrics, curves


def _wording_sensitivity(bank: RolloutBank, rows: np.ndarray, task: str, scorer: _Scorer, k: int, gamma: float,
                         pool: int, rng: np.random.Generator) -> dict[str, Any]:
    """AUROC and VOC with each template of the task (training and held-out) filled per episode."""
    from rewards.vlm.fit import goal_wordings

    spec = get_task(task)
    out: dict[str, Any] = {"train": {}, "heldout": {}}
    for split, templates in (("train", spec.train_instructions), ("heldout", spec.heldout_instructions)):
        for tpl in templates:
            ins = [goal_wordings([tpl], {a: b for a, b in bank.episodes[int(e)]["params"].items()
                                         if isinstance(b, str)})[0] for e in bank.episode[rows]]
            r = _smooth_rows(bank, rows, scorer(rows, ins)[0], k)
            q = quality(bank, rows, r, gamma, pool, rng)
            out[split][tpl] = {"auroc": q["auroc"], "voc": q["voc"]}
    for split in ("train", "heldout"):
        a = [v["auroc"] for v in out[split].values()]
        vv = [v["voc"] for v in out[split].values()]
        out[f"{split}_auroc_mean"], out[f"{split}_auroc_min"] = _mean(a), float(np.nanmin(a))
        out[f"{split}_voc_mean"], out[f"{split}_voc_min"] = _mean(vv), float(np.nanmin(vv))
    return out


def run_reward_eval(cfg: RewardEvalConfig, out: Path, model: RewardModel | None = None) -> dict[str, Any]:
    """Evaluate ``model`` (else the one ``cfg.reward`` names) on a bank; write metrics.json and report.md."""
    import torch

    from rewards.registry import make_reward

    torch.set_num_threads(cfg.threads)
    tasks = resolve_tasks(cfg.suite, cfg.tasks)
    suite = suite_of(tasks)
    model = model if model is not None else make_reward(cfg.reward)
    model.check_suite(suite)
    fitted = getattr(model, "meta", {}).get("fitted") or {}
    if fitted.get("seeds"):
        lo, hi = fitted["seeds"]
        elo, ehi = seed_range(cfg.bank, len(tasks))
        if elo < hi and lo < ehi:
            raise ValueError(f"evaluation seeds [{elo}, {ehi}) overlap the seeds the reward was fitted on "
                             f"[{lo}, {hi}): choose bank.seed >= {hi}")
    size = model.image_size or cfg.image_size
    t0 = time.perf_counter()
    bank = bank_for(tasks, cfg.bank, size, model.camera, cfg.bank_path, cfg.save_bank, cfg.progress,
                    model.supersample)
    t1 = time.perf_counter()
    metrics, curves = evaluate_reward(model, bank, tasks, cfg.alphas, cfg.wordings, cfg.gamma, cfg.epic_pool)
    describe = getattr(model, "describe", None)
    metrics.update({"suite": suite, "tasks": tasks,
                    "reward": describe() if callable(describe) else type(model).__name__,
                    "bank": {"episodes": len(bank.episodes), "frames": int(len(bank.step)), **asdict(cfg.bank)},
                    "bank_time_s": t1 - t0, "score_time_s": time.perf_counter() - t1,
                    "wall_time_s": time.perf_counter() - t0})
    write_json(out / "metrics.json", metrics)
    from rewards.report import write_reward_report

    write_reward_report(out, metrics, bank, curves, plots=cfg.plots)
    return metrics


# ---------------------------------------------------------------------------------- bench
@dataclass
class RewardBenchConfig:
    """Schema of ``configs/reward_bench.yaml``: reward throughput on this machine, as ratios."""

    suite: str = "manipulation"
    task: str = ""  # default: the suite's first task
    reward: dict[str, Any] = field(default_factory=lambda: {"name": "clip"})
    image_size: int = 64  # frame side for a reward that reads any size
    frames: int = 2048  # frames scored per round (embedding + similarity)
    steps: int = 200  # vector-env steps per round (step + render, with and without the reward)
    num_envs: int = 8  # sub-envs of the SB3 vector env (frames scored per batch)
    rounds: int = 3  # measurements alternate; the median of each figure is reported
    threads: int = 1  # threads of torch and of the image tower's runtime (one: one core)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("frames", "steps", "num_envs", "rounds", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def _sb3_envs(task: str, n: int, size: int, seed: int, states: bool, camera: str | None,
              supersample: int = 1) -> Any:
    """An SB3 DummyVecEnv of ``n`` copies of ``task`` whose steps carry frames in ``info``."""
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rewards.wrappers import RewardInputs

    def make(k: int) -> Callable[[], Any]:
        def thunk() -> Any:
            env = make_env(task, **frame_env_kwargs(camera, size, supersample))
            return gym.wrappers.FilterObservation(RewardInputs(env, states=states, camera=camera), ["state"])
        return thunk

    venv = DummyVecEnv([make(k) for k in range(n)])
    venv.seed(seed)
    return venv


def run_reward_bench(cfg: RewardBenchConfig, out: Path) -> dict[str, Any]:
    """Frames/s of scoring alone, and the SB3 loop's rate with the reward as a fraction of
    the same loop rendering frames without it (alternating rounds, one process)."""
    import torch

    from rewards.registry import make_reward
    from rewards.wrappers import VecRewardWrapper

    torch.set_num_threads(cfg.threads)
    task = cfg.task or resolve_tasks(cfg.suite)[0]
    model = make_reward(cfg.reward)
    model.check_suite(get_task(task).suite)
    size = model.image_size or cfg.image_size
    states_needed = "states" in model.inputs
    venv = _sb3_envs(task, cfg.num_envs, size, cfg.seed, states_needed, model.camera, model.supersample)
    rng = np.random.default_rng(cfg.seed)
    shape = (cfg.num_envs,) + venv.action_space.shape
    venv.reset()
    frames: list[np.ndarray] = []
    instruction = ""
    while len(frames) * cfg.num_envs < min(cfg.frames, 4096):
        _, _, _, infos = venv.step(rng.uniform(-1, 1, shape).astype(np.float32))
        frames.append(np.stack([i["frame"] for i in infos]))
        instruction = infos[0]["instruction"]
    bank = np.concatenate(frames)
    reps = int(np.ceil(cfg.frames / len(bank)))
    batch = int(getattr(model, "batch_size", 64))
    scored = VecRewardWrapper(venv, model)

    def score_rate() -> float:
        states = np.zeros((batch, 1), np.float32) if states_needed else None
        t = time.perf_counter()
        n = 0
        for _ in range(reps):
            for i in range(0, len(bank), batch):
                f = bank[i:i + batch]
                model(f, None if states is None else states[:len(f)], instruction)
                n += len(f)
        return n / (time.perf_counter() - t)

    def loop_rate(v: Any) -> float:
        t = time.perf_counter()
        for _ in range(cfg.steps):
            v.step(rng.uniform(-1, 1, shape).astype(np.float32))
        return cfg.steps * cfg.num_envs / (time.perf_counter() - t)

    score_rate()  # warm-up: the text cache, the allocator, the image tower's graph
    runtime = getattr(model, "runtime", None)  # what embeds the frames (ClipReward)
    rounds = []
    for _ in range(cfg.rounds):
        venv.reset()
        render = loop_rate(venv)
        scored.reset()
        both = loop_rate(scored)
        rounds.append({"score_frames_per_s": score_rate(), "step_render_frames_per_s": render,
                       "step_render_reward_frames_per_s": both, "end_to_end_fraction": both / render})
    venv.close()
    med = {k: float(np.median([r[k] for r in rounds])) for k in rounds[0]}
    metrics = {"task": task, "image_size": size, "supersample": model.supersample, "threads": cfg.threads,
               "num_envs": cfg.num_envs, "batch_size": batch, "image_tower_runtime": runtime, **med,
               "rounds": rounds,
               "reward": getattr(model, "describe", lambda: None)()}
    write_json(out / "metrics.json", metrics)
    log.info("%s at %dx%d, %d thread(s)%s: reward scoring %.0f frames/s (embedding + similarity); SB3 loop of "
             "%d envs: step+render %.0f frames/s, with the reward %.0f frames/s = %.0f%% of step+render "
             "(medians of %d alternating rounds)", task, size, size, cfg.threads,
             f", image tower on {runtime}" if runtime else "", med["score_frames_per_s"],
             cfg.num_envs, med["step_render_frames_per_s"], med["step_render_reward_frames_per_s"],
             100 * med["end_to_end_fraction"], cfg.rounds)
    return metrics
