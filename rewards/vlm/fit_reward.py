"""``embodied reward fit``: the in-domain CLIP reward of a suite, from a training bank to a checkpoint.

Read top to bottom: the schema (``RewardFitConfig``), then ``fit_reward``: the open_clip model
and its locked text side, a training bank (``rewards.vlm.bank``), its caption labels
(``rewards.vlm.labels``), the image tower's fit (``rewards.vlm.fit``), the checkpoint
(``rewards.vlm.towers``) with its reference embeddings.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from embodied.core.registry import get_suite, get_task, list_suites, resolve_tasks, suite_hook
from rewards.vlm.bank import BankConfig, bank_for, seed_range, suite_of
from rewards.vlm.fit import FitSettings
from rewards.vlm.labels import LABEL_PROGRESS, captions_from_bank

log = logging.getLogger("embodied.reward")


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
    # ViT of the same speed (docs/results/vlm-rewards.md#what-was-tried-and-what-was-kept).
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
    # (time_progress: a progress label that rises where the dense reward is flat)
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
    # keep the bank's frames in a file while fitting (save_bank's frames.npy, else a scratch folder
    # beside the checkpoint, deleted at the end) and read each batch's rows from it, so that memory
    # does not grow with the bank; false holds them all in memory (the same frames, the same fit)
    stream_frames: bool = True
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


def _required_hook(suite: str, name: str, what: str, pronoun: str) -> Callable[..., Any]:
    """The suite's ``name`` hook (``suite_hook``), which ``name=true`` of a fit needs; a clear error without it."""
    hook = suite_hook(suite, name)
    if hook is None:
        raise ValueError(f"{name}=true needs a suite with {what}; {suite!r} has none "
                         f"(suites with {pronoun}: {[s for s in list_suites() if getattr(get_suite(s), name)]})")
    return hook


def fit_reward(cfg: RewardFitConfig, folder: Path) -> dict[str, Any]:
    """Fit the in-domain reward on a training bank and save it to ``folder``; returns the
    fit's metrics (what ``embodied reward fit`` writes to metrics.json)."""
    scratch = None
    if cfg.stream_frames and not cfg.bank_path and not cfg.save_bank:
        folder.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".bank-frames-", dir=folder.parent))
    try:
        return _fit_reward(cfg, folder, scratch)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _fit_reward(cfg: RewardFitConfig, folder: Path, scratch: Path | None) -> dict[str, Any]:
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
                    cfg.supersample, cfg.stream_frames, scratch)
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
    log.info("saved the reward to %s (%d frames, loss %.4f, %.0f s)", folder, metrics["frames"],
             metrics["final_loss"], metrics["wall_time_s"])
    return metrics
