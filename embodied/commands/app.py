"""Hydra plumbing shared by every command: typed schemas, run directory, clean errors.

Each command module defines a dataclass schema (validated in ``__post_init__``) and a
function ``run(cfg) -> metrics``; ``hydra_command`` turns it into a Hydra app whose
config is ``configs/<name>.yaml`` composed over the schema, and hands ``run`` exactly the
config that ``embodied <name> ... --cfg job --resolve`` prints. The run directory is
``hydra.run.dir``; ``metrics.json`` is written there.

Hydra's ConfigStore holds the schemas (``<name>_schema``) and two groups made from the
registries: ``suite`` (``suite=<name>`` sets ``suite``; one option per registered suite) and
``policy`` (one node per family of ``policies.POLICY_CONFIGS``, its config dataclass, so no YAML
repeats a default and a typo'd ``policy.<field>`` is refused; and ``expert``, the scripted
experts). The recipes are YAML (``configs/recipe/``, see ``configs/train.yaml``).

A user error (a value the schema refuses, an unknown option or field) ends the command
with one line on stderr, ``embodied <name>: error: ...``, and exit status 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

log = logging.getLogger("embodied")


def run_dir() -> Path:
    """The current Hydra run directory (``hydra.run.dir``)."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def register_configs() -> None:
    """Store the ``suite`` and ``policy`` groups in Hydra's ConfigStore (imports the suite plugins)."""
    from hydra.core.config_store import ConfigStore

    from embodied.core.registry import list_suites
    from policies import POLICY_CONFIGS, config_node

    cs = ConfigStore.instance()
    for suite in list_suites():
        cs.store(group="suite", name=suite, node={"suite": suite}, package="_global_")
    for family in POLICY_CONFIGS:
        cs.store(group="policy", name=family, node=config_node(family))
    cs.store(group="policy", name="expert", node={"name": "expert"})


def to_schema(cfg: Any, schema: type) -> Any:
    """The ``schema`` instance of the composed config ``cfg``, every interpolation resolved.

    A nested structured node (a ``policy`` family) is first built as its dataclass, so that
    its own ``__post_init__`` checks run, and is then passed on as a plain dict.
    """
    from omegaconf import OmegaConf, SCMode

    for key in cfg:
        node = cfg[key]
        if OmegaConf.is_dict(node) and OmegaConf.get_type(node) not in (dict, None):
            OmegaConf.to_object(node)
    values = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, structured_config_mode=SCMode.DICT)
    return schema(**values)


def compose(name: str, schema: type, overrides: Sequence[str] = ()) -> Any:
    """The ``schema`` instance that ``embodied <name> *overrides`` runs (Hydra's compose API).

    E.g. ``compose("train", TrainConfig, ["suite=metaworld-mt50"])`` is MT50's recipe. Hydra's
    and OmegaConf's errors are raised as they are (``describe_error`` says them in one line).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=f"{name}_schema", node=schema)
    register_configs()
    with initialize_config_module("configs", version_base="1.3"):
        return to_schema(hydra_compose(name, overrides=list(overrides)), schema)


def _allowed_keys(error: Any) -> str:
    """For a key error on a dataclass node: a Did-you-mean and the fields allowed; else an empty string."""
    kind = getattr(error, "object_type", None)
    key = getattr(error, "key", None)
    if not (dataclasses.is_dataclass(kind) and isinstance(key, str)):
        return ""
    names = [f.name for f in dataclasses.fields(kind)]
    if key in names:
        return ""
    close = difflib.get_close_matches(key, names, n=3)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    return f"{hint} Allowed fields of {kind.__name__}: {', '.join(sorted(names))}"


def describe_error(error: BaseException) -> str:
    """One line saying what is wrong with a command line that Hydra or OmegaConf refused."""
    from hydra.errors import MissingConfigException

    if isinstance(error, MissingConfigException) and error.options is not None and error.missing_cfg_file:
        group, _, option = error.missing_cfg_file.rpartition("/")
        close = difflib.get_close_matches(option, error.options, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        return f"unknown {group or 'config'} {option!r}.{hint} Allowed: {', '.join(sorted(error.options))}"
    parts = [str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__]
    cause = error.__cause__ or error.__context__
    for e in (error, cause):
        msg = getattr(e, "msg", None)
        if e is not None and msg and msg.splitlines()[0] not in parts[0]:
            parts.append(msg.splitlines()[0])
        if e is not None and _allowed_keys(e):
            parts.append(_allowed_keys(e).strip())
            break
    return " ".join(p if p.endswith((".", "?")) else p + "." for p in parts)


def _fail(name: str, message: str) -> None:
    print(f"embodied {name}: error: {message}", file=sys.stderr)
    sys.exit(2)


def hydra_command(name: str, schema: type) -> Callable[[Callable[[Any], Any]], Callable[[], Any]]:
    """Decorate ``run(cfg: schema)`` into a Hydra main for ``embodied <name>``."""
    import hydra
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from embodied.core.errors import EmbodiedError

    ConfigStore.instance().store(name=f"{name}_schema", node=schema)
    user_errors = (EmbodiedError, ValueError, FileNotFoundError)

    def deco(fn: Callable[[Any], Any]) -> Callable[[], Any]:
        started = []  # set once `fn` runs: errors from then on are its own

        @hydra.main(version_base="1.3", config_path="pkg://configs", config_name=name)
        def run(cfg: Any) -> Any:
            logging.getLogger("OpenGL").setLevel(logging.WARNING)
            try:
                obj = to_schema(cfg, schema)
            except OmegaConfBaseException as e:
                _fail(name, describe_error(e))
            except user_errors as e:
                _fail(name, str(e))
            started.append(True)
            try:
                return fn(obj)
            except user_errors as e:
                # A user error: say what is wrong, without a traceback.
                cause = e.__cause__ if type(e).__name__ == "InstantiationException" and e.__cause__ else e
                _fail(name, str(cause))

        @functools.wraps(fn)
        def main() -> Any:
            # Hydra reports a bad command line (an unknown option, a typo'd key) itself, over
            # several lines and with exit status 1; HYDRA_FULL_ERROR=1 makes it raise the error
            # here instead, to be said in one line.
            previous = os.environ.get("HYDRA_FULL_ERROR")
            os.environ["HYDRA_FULL_ERROR"] = "1"
            try:
                register_configs()
                return run()
            except (HydraException, OmegaConfBaseException) as e:
                if started:
                    raise
                _fail(name, describe_error(e))
            finally:
                if previous is None:
                    os.environ.pop("HYDRA_FULL_ERROR", None)
                else:
                    os.environ["HYDRA_FULL_ERROR"] = previous

        return main

    return deco
