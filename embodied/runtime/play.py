"""``embodied play``: one episode with your own words, saved as a video.

    embodied play checkpoint=outputs/train/.../checkpoint task=pick instruction="lift the blue cube"
    embodied play policy=expert task=open-drawer
    embodied play task=pick "instruction='lift the cube, then hold it'"    # a comma: quote for Hydra
    embodied play task=pick instruction="\"don't drop the cube, please\""  # an apostrophe too
    embodied play task=pick instruction_file=words.txt                   # any text, no quoting

Hydra reads ``key=value`` with its override grammar, in which a comma separates values
(``a,b`` is a sweep) and quotes, brackets and braces have meaning. Text holding them must reach
Hydra as one quoted string: wrap the whole ``key=value`` in single quotes for the shell and
the text in double quotes for Hydra (or the other way round when the text has an
apostrophe: ``instruction="\"...\""``), or put the text in a file and pass
``instruction_file=PATH`` (the file holds one instruction; surrounding blank space is dropped).

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
    instruction_file: str = ""  # a text file holding your wording (no command-line quoting needed)
    checkpoint: str = ""
    policy: dict[str, Any] = field(default_factory=lambda: {"name": "expert"})
    seed: int = 0
    render_size: int = 224
    device: str = "auto"
    ground_instructions: Optional[bool] = None  # null: the checkpoint's setting (policies.common.grounding)

    def __post_init__(self) -> None:
        from embodied.runtime.eval_job import check_device, check_policy_settings

        if not self.checkpoint and self.policy.get("name") != "expert":
            raise ValueError("give checkpoint=PATH (a trained policy) or policy=expert")
        check_policy_settings(self.policy, bool(self.checkpoint), 0, self.ground_instructions)
        if not 16 <= self.render_size <= 1024:
            raise ValueError(f"render_size must be in [16, 1024] pixels, got {self.render_size}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.instruction and self.instruction_file:
            raise ValueError("give instruction=TEXT or instruction_file=PATH, not both")
        if self.instruction_file:
            self.instruction = read_instruction(self.instruction_file)
        check_device(self.device)
        get_task(self.task)
        if self.checkpoint and not Path(self.checkpoint).exists():
            raise FileNotFoundError(f"checkpoint {self.checkpoint!r} does not exist (give a checkpoint folder, "
                                    "e.g. outputs/train/.../checkpoint)")


def read_instruction(path: str) -> str:
    """The instruction held in the text file ``path`` (surrounding blank space dropped)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"instruction_file {path!r} does not exist")
    try:
        text = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"instruction_file {path!r} cannot be read as UTF-8 text: {e}") from None
    if not text:
        raise ValueError(f"instruction_file {path!r} is empty: write the instruction in it")
    if "\n" in text:
        raise ValueError(f"instruction_file {path!r} holds {len(text.splitlines())} lines: one instruction, "
                         "on one line")
    return text


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
               "video": videos.get(f"{cfg.task}/{kind}"), "policy": cfg.checkpoint or "expert",
               **({"instruction_file": cfg.instruction_file} if cfg.instruction_file else {})}
    write_json(out / "metrics.json", metrics)
    grounded = f" (acted on {res.grounded!r})" if res.grounded else ""
    log.info("%s: %r%s -> %s in %d steps; video %s", cfg.task, res.instruction, grounded, kind, res.length,
             out / str(metrics["video"]))
    return metrics
