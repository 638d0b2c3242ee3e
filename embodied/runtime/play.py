"""``embodied play``: one episode with your own words, saved as a video.

    embodied play checkpoint=outputs/train/.../checkpoint task=pick instruction="lift the blue cube"
    embodied play policy=expert task=open-drawer

Writes ``episode.mp4`` (GIF without an encoder) and ``metrics.json`` (success, length,
return, the instruction given and the one acted on: a checkpoint that grounds unfamiliar
wordings runs on its nearest training wording, see ``policies.common.grounding``) to
``hydra.run.dir``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from embodied.core.registry import get_task
from embodied.runtime.evaluate import save_videos, write_json

log = logging.getLogger("embodied.play")


@dataclass
class PlayConfig:
    """Schema of ``configs/play.yaml``."""

    task: str = "pick"
    instruction: str = ""  # your wording; empty: a training paraphrase of the task
    checkpoint: str = ""
    policy: dict[str, Any] = field(default_factory=lambda: {"name": "expert"})
    seed: int = 0
    render_size: int = 224
    device: str = "auto"
    ground_instructions: Optional[bool] = None  # null: the checkpoint's setting (policies.common.grounding)

    def __post_init__(self) -> None:
        if not self.checkpoint and self.policy.get("name") != "expert":
            raise ValueError("give checkpoint=PATH (a trained policy) or policy=expert")
        if self.render_size < 16:
            raise ValueError(f"render_size must be >= 16, got {self.render_size}")


def play(cfg: PlayConfig, out: Path) -> dict[str, Any]:
    """Run one episode of ``cfg.task`` (the user's wording when given), save its video and ``metrics.json`` in ``out``."""
    from functools import partial

    from embodied.core.registry import make_env
    from embodied.runtime.checkpoints import load_for_eval, policy_env_kwargs
    from embodied.runtime.rollout import run_episodes

    get_task(cfg.task)
    policy: Any = "expert"
    kw: dict[str, Any] = {}
    if cfg.checkpoint:
        policy = load_for_eval(cfg.checkpoint, cfg.device, ground_instructions=cfg.ground_instructions)
        kw = policy_env_kwargs(policy, [cfg.task])
    if cfg.instruction:
        kw["instructions"] = [cfg.instruction]
    res = run_episodes(partial(make_env, cfg.task, render_mode="rgb_array", render_size=cfg.render_size, **kw),
                       [cfg.seed], policy, num_envs=1, record=1, task=cfg.task)[0]
    kind = "success" if res.success else "failure"
    videos = save_videos(out, {f"{cfg.task}/train": [res]})
    metrics = {"task": cfg.task, "instruction": res.instruction, "acted_on": res.grounded or res.instruction,
               "success": res.success, "length": res.length, "return": res.ret, "seed": cfg.seed,
               "video": videos.get(f"{cfg.task}/{kind}"), "policy": cfg.checkpoint or "expert"}
    write_json(out / "metrics.json", metrics)
    grounded = f" (acted on {res.grounded!r})" if res.grounded else ""
    log.info("%s: %r%s -> %s in %d steps; video %s", cfg.task, res.instruction, grounded, kind, res.length,
             out / str(metrics["video"]))
    return metrics
