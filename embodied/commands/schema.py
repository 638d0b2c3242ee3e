"""The typed schemas of the commands, filled from Hydra's composed config and checked.

Hydra's ConfigStore holds the schemas (``<name>_schema``) and two groups made from the
registries (``register_configs``): ``suite`` (``suite=<name>`` sets ``suite``; one option per
registered suite) and ``policy`` (one node per family of ``policies.POLICY_CONFIGS``, its config
dataclass, so no YAML repeats a default and a typo'd ``policy.<field>`` is refused; and
``expert``, the scripted experts). The recipes are YAML (``configs/recipe/``, see
``configs/train.yaml``).

Besides a schema's own ``__post_init__`` checks, every command's numbers (and those of a
nested structured node such as ``policy``) are checked here (``check_numbers``): an ``int``
field must be >= 0 (counts, sizes, steps and seeds; a field whose ``metadata`` has
``signed=True`` may be negative) and a ``float`` field must be finite, unless the value is the
field's default.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any


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
    its own ``__post_init__`` checks run (and ``check_numbers``), and is then passed on as a plain dict.
    """
    from omegaconf import OmegaConf, SCMode

    for key in cfg:
        node = cfg[key]
        if OmegaConf.is_dict(node) and OmegaConf.get_type(node) not in (dict, None):
            check_numbers(OmegaConf.to_object(node))
    values = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, structured_config_mode=SCMode.DICT)
    obj = _build(schema, values)  # its own checks first: they say more than the generic ones
    check_numbers(obj)
    return obj


def _build(schema: type, values: dict[str, Any]) -> Any:
    """``schema(**values)``, with each field typed as a dataclass (``loop: LoopConfig``) built as one too."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        kind = hints.get(f.name)
        if dataclasses.is_dataclass(kind) and isinstance(values.get(f.name), dict):
            values[f.name] = _build(kind, values[f.name])
    return schema(**values)


def check_numbers(cfg: Any) -> None:
    """Refuse a negative ``int`` field (unless its metadata has ``signed=True``) or a NaN/inf ``float`` field.

    Every count, size, step and seed of a command is >= 0, so a negative one is a typo
    whatever the command; a number that is not finite is not a setting. A field's own default
    is always allowed (e.g. ``float("inf")`` for "no limit").
    """
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        v, kind = getattr(cfg, f.name), hints.get(f.name)
        if isinstance(v, bool) or v is None or (f.default is not dataclasses.MISSING and v == f.default):
            continue
        if kind in (int, typing.Optional[int]) and isinstance(v, int) and v < 0 and not f.metadata.get("signed"):
            raise ValueError(f"{f.name}={v} is not allowed: must be an int >= 0 (a count, size, step or seed)")
        if kind in (float, typing.Optional[float]) and isinstance(v, (int, float)) and not math.isfinite(v):
            raise ValueError(f"{f.name}={v} is not allowed: must be a finite number")
