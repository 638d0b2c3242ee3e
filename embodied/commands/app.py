"""Hydra plumbing shared by every command: typed schemas, run directory, clean errors.

Each command module defines a dataclass schema (validated in ``__post_init__``) and a
function ``run(cfg) -> metrics``; ``hydra_command`` turns it into a Hydra app whose
config is ``configs/<name>.yaml`` (composed over the schema). The run directory is
``hydra.run.dir``; ``metrics.json`` is written there.
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("embodied")


def run_dir() -> Path:
    """The current Hydra run directory (``hydra.run.dir``)."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def hydra_command(name: str, schema: type) -> Callable[[Callable[[Any], Any]], Callable[[], Any]]:
    """Decorate ``run(cfg: schema)`` into a Hydra main for ``embodied <name>``."""
    import hydra
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name=f"{name}_schema", node=schema)

    def deco(fn: Callable[[Any], Any]) -> Callable[[], Any]:
        @hydra.main(version_base="1.3", config_path="pkg://configs", config_name=name)
        @functools.wraps(fn)
        def main(cfg: Any) -> Any:
            from embodied.core.errors import EmbodiedError

            logging.getLogger("OpenGL").setLevel(logging.WARNING)
            try:
                obj = OmegaConf.to_object(cfg)
                return fn(obj)
            except (EmbodiedError, ValueError, FileNotFoundError) as e:
                # A user error: say what is wrong, without a traceback.
                cause = e.__cause__ if type(e).__name__ == "InstantiationException" and e.__cause__ else e
                print(f"embodied {name}: error: {cause}", file=sys.stderr)
                sys.exit(2)

        return main

    return deco
