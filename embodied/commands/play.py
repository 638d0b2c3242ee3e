"""``embodied play``: one episode with your own instruction, saved as a video (see ``embodied.runtime.play``)."""

from __future__ import annotations

from typing import Any

from embodied.commands.app import hydra_command, run_dir
from embodied.runtime.play import PlayConfig, play


@hydra_command("play", PlayConfig)
def main(cfg: PlayConfig) -> dict[str, Any]:
    return play(cfg, run_dir())
