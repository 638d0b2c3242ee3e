"""``embodied serve``: a checkpoint's policy behind a websocket, in openpi's wire format.

    embodied serve checkpoint=outputs/train/.../checkpoint port=8000

The job is ``embodied.runtime.serve``.
"""

from __future__ import annotations

from typing import Any

from embodied.commands.app import hydra_command, run_dir
from embodied.runtime.serve import ServeConfig, serve_checkpoint


@hydra_command("serve", ServeConfig)
def main(cfg: ServeConfig) -> dict[str, Any]:
    return serve_checkpoint(cfg, run_dir())
