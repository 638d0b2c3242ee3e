"""Property: every field of every command's config, given a bad value, gets a clear one-line error.

For each command (train, eval, collect, play, bench, data) every field of its schema dataclass,
and for train every field of every policy family's config (``policy.<field>``), is given bad values
drawn by type with a fixed seed: wrong types, negatives, NaN/inf, empty strings and lists, unknown
names. Each must be refused by composition + schema validation, the path ``embodied <command>``
takes before it runs, with the one line the CLI prints (``embodied.commands.user_errors.user_error``):
a user error, on one line, naming the field or the value. A few (field, kind) pairs are accepted on
purpose; ``ACCEPTED`` (and ``ACCEPTED_KINDS``) list them with the reason, and the test fails on
any other acceptance and on any allowance that no case uses any more.

Most cases apply the override to the command's composed config the way Hydra applies it
(``ConfigLoaderImpl._apply_overrides_to_config``, on a copy), which takes milliseconds; a fixed
sample, and every config-group field, goes through Hydra's whole ``compose``, which must agree;
and a handful run the real CLI for exit status 2 and no traceback.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import random
import subprocess
import sys
import typing
from typing import Any

import pytest

SEED = 14
SAMPLED_COMPOSES = 40  # cases also run through Hydra's compose
CLI_CASES = 6  # cases also run through the real command line


def commands() -> dict[str, type]:
    from embodied.commands.data import DataConfig
    from embodied.runtime.sim_bench import BenchConfig
    from embodied.runtime.collect import CollectConfig
    from embodied.runtime.eval_job import EvalConfig
    from embodied.runtime.play import PlayConfig
    from embodied.runtime.train import TrainConfig

    return {"train": TrainConfig, "eval": EvalConfig, "collect": CollectConfig, "play": PlayConfig,
            "bench": BenchConfig, "data": DataConfig}


# (command, field, kind) accepted on purpose, with why. ``kind`` as in ``bad_values``.
ACCEPTED = {
    **{(cmd, f, "unknown"): "a path that the command creates (or reads when it exists)"
       for cmd, f in (("train", "dataset"), ("collect", "out"), ("bench", "policy_dataset"))},
    ("play", "instruction", "unknown"): "free text: any words are an instruction",
    **{(cmd, "ray_address", "unknown"): "a Ray address (HOST:PORT, auto); checked when runner=ray connects"
       for cmd in ("eval", "collect")},
    ("train", "policy.openclip_checkpoint", "unknown"): "a path read only with text_encoder=openclip (policies/ "
                                                       "names a missing file when it loads it)",
    **{("bench", "tasks", kind): "BenchConfig (runtime/sim_bench.py) does not check its tasks; bench names a bad one "
       "when it starts, with exit status 2 (embodied.core.registry)" for kind in ("type", "empty", "unknown")},
    **{("bench", "policy_families", kind): "BenchConfig (runtime/sim_bench.py) does not check its families; policy_bench "
       "names an unknown one when its section starts" for kind in ("type", "empty", "unknown")},
    **{("train", "policy.openclip_model", kind): "the open_clip architecture, read only with text_encoder=openclip "
       "(policies/common/text.py names a bad one when it builds the encoder)" for kind in ("empty", "unknown")},
}


# kinds accepted for any field of the type, with why (not checked for use: not every field meets them)
ACCEPTED_KINDS = {"int_as_bool": "OmegaConf reads an int as a bool (0 false, any other true)"}


def _token(rng: random.Random) -> str:
    return f"no-such-{rng.randrange(16 ** 6):06x}"


def bad_values(kind: Any, default: Any, rng: random.Random) -> list[tuple[str, str]]:
    """(kind, override value as typed on the command line) for a field of type ``kind``."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    optional = origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and type(None) in args
    if optional:
        kind = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is bool:
        return [("type", "maybe"), ("int_as_bool", "2"), ("type", "[true]"), ("empty", "''")]
    if kind is int:
        return [("type", "abc"), ("type", "1.5"), ("type", "[1]"), ("nonfinite", "nan"), ("negative", "-1"),
                ("negative", str(-rng.randrange(2, 10 ** 9))), ("empty", "''")]
    if kind is float:
        return [("type", "abc"), ("type", "[0.5]"), ("nonfinite", "nan"), ("nonfinite", "inf"),
                ("nonfinite", "-inf"), ("negative", "-0.5"), ("negative", f"-{rng.uniform(1, 1e6):.3f}"),
                ("empty", "''")]
    if kind is str:
        out = [("type", "[a,b]"), ("type", "{a:1}"), ("unknown", _token(rng))]
        return out + ([("empty", "''")] if default not in ("", None) else [])
    if origin in (list, tuple) and args and args[0] in (int, float):
        return [("type", "abc"), ("type", "[abc]"), ("negative", "[-1]"), ("nonfinite", "[nan]"), ("empty", "[]")]
    if origin in (list, tuple):
        return [("type", "abc"), ("type", "[[a]]"), ("empty", "['']"), ("unknown", f"[{_token(rng)}]")]
    raise AssertionError(f"no bad values for type {kind}")


def cases() -> list[dict[str, Any]]:
    """Every (command, base overrides, field, kind, override) to try, in a fixed order."""
    from policies import POLICY_CONFIGS, config_class

    rng = random.Random(SEED)
    out = []

    def add(cmd: str, base: list[str], field: str, kind: str, override: str) -> None:
        out.append({"cmd": cmd, "base": base, "field": field, "kind": kind, "override": override})

    for cmd, schema in commands().items():
        hints = typing.get_type_hints(schema)
        base = ["path=."] if cmd == "data" else []
        for f in dataclasses.fields(schema):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            kind = hints[f.name]
            if f.name == "policy":  # a config group; its fields below
                add(cmd, base, "policy", "unknown", f"policy={_token(rng)}")
                continue
            if typing.get_origin(kind) is dict:  # task or family -> values: an unknown key, an empty or bad value
                add(cmd, base, f.name, "unknown", f"+{f.name}.{_token(rng)}=[x]")
                add(cmd, base, f.name, "type", f"+{f.name}.reach={{a:1}}")
                if typing.get_args(kind)[1] != str:
                    add(cmd, ["tasks=[reach]", *base], f.name, "empty", f"+{f.name}.reach=[]")
                continue
            for k, value in bad_values(kind, default, rng):
                add(cmd, base, f.name, k, f"{f.name}={value}")
    for family in POLICY_CONFIGS:
        schema = config_class(family)
        hints = typing.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for k, value in bad_values(hints[f.name], default, rng):
                add("train", [f"policy={family}"], f"policy.{f.name}", k, f"policy.{f.name}={value}")
    return out


def _groups(name: str) -> set[str]:
    """The config groups of ``configs/<name>.yaml``'s defaults (suite, policy, obs_mode, ...)."""
    from hydra.core.global_hydra import GlobalHydra

    loader = GlobalHydra.instance().config_loader()
    return {g for g in ("suite", "policy", "obs_mode") if loader.get_group_options(g)}


class Outcome(typing.NamedTuple):
    accepted: bool
    message: str | None  # the CLI's line for a refusal; None for a crash (not a user error)
    error: str


def _outcome(fn) -> Outcome:
    from embodied.commands.user_errors import user_error

    try:
        fn()
    except Exception as e:  # what the CLI would say about it
        return Outcome(False, user_error(e), f"{type(e).__name__}: {e}")
    return Outcome(True, None, "")


def _compose(hydra_compose, name: str, overrides: list[str], schema: type) -> None:
    from embodied.commands.schema import to_schema

    to_schema(hydra_compose(name, overrides=overrides), schema)


def _apply(loader, overrides, cfg, schema: type) -> None:
    """Apply ``overrides`` to the composed ``cfg`` as Hydra's compose does, then read it as the command does."""
    from embodied.commands.schema import to_schema

    loader._apply_overrides_to_config(overrides, cfg)
    to_schema(cfg, schema)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Each case's outcome, through the fast path (all) and Hydra's compose (a sample and the groups),
    worked out once per test session, by whichever xdist worker asks first."""
    from conftest import built_once

    _, built = built_once(tmp_path_factory, "config-fuzz", _results)
    fast, full = ({int(i): Outcome(*o) for i, o in built[k].items()} for k in ("fast", "full"))
    return built["cases"], fast, full


def _results(folder):
    import os

    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.config_store import ConfigStore
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from embodied.commands.schema import register_configs

    cwd = os.getcwd()
    os.chdir(folder)  # `path=.` and friends resolve in an empty folder
    try:
        all_cases = cases()
        for name, schema in commands().items():
            ConfigStore.instance().store(name=f"{name}_schema", node=schema)
        register_configs()
        parser = OverridesParser.create()
        rng = random.Random(SEED)
        fast, full = {}, {}
        with initialize_config_module("configs", version_base="1.3"):
            groups = {name: _groups(name) for name in commands()}
            bases: dict[tuple[str, tuple[str, ...]], Any] = {}
            sample = set(rng.sample(range(len(all_cases)), SAMPLED_COMPOSES))
            for i, c in enumerate(all_cases):
                schema = commands()[c["cmd"]]
                key = c["override"].lstrip("+").split("=", 1)[0]
                is_group = key in groups[c["cmd"]]
                overrides = [*c["base"], c["override"]]
                if i in sample or is_group:
                    full[i] = _outcome(functools.partial(_compose, hydra_compose, c["cmd"], overrides, schema))
                if is_group:
                    fast[i] = full[i]
                    continue
                base = bases.get((c["cmd"], tuple(c["base"])))
                if base is None:
                    base = bases[c["cmd"], tuple(c["base"])] = hydra_compose(c["cmd"], overrides=c["base"])
                fast[i] = _outcome(functools.partial(_apply, ConfigLoaderImpl, parser.parse_overrides([c["override"]]),
                                                     copy.deepcopy(base), schema))
    finally:
        os.chdir(cwd)
    return {"cases": all_cases, "fast": fast, "full": full}


def test_every_bad_value_of_every_field_is_a_clear_one_line_error(results):
    all_cases, fast, _ = results
    assert len(all_cases) > 800  # every field of six commands and three policy families
    crashes, unclear, accepted, used = [], [], [], set()
    for i, c in enumerate(all_cases):
        out = fast[i]
        where = f"embodied {c['cmd']} {' '.join(c['base'])} {c['override']}"
        if out.accepted:
            allowance = (c["cmd"], c["field"], c["kind"])
            if c["kind"] in ACCEPTED_KINDS:
                continue
            if allowance in ACCEPTED:
                used.add(allowance)
            else:
                accepted.append(where)
            continue
        if out.message is None:
            crashes.append(f"{where}: {out.error}")
            continue
        name = c["field"].rsplit(".", 1)[-1]
        token = c["override"].split("=", 1)[1].strip("[]'")
        if "\n" in out.message or not (name in out.message or name.rstrip("s") in out.message
                                       or (token and token in out.message)):
            unclear.append(f"{where}: {out.message!r}")
    unused = [str(a) for a in sorted(set(ACCEPTED) - used)]
    found = (("not a user error (a traceback on the CLI)", crashes),
             ("not one line naming the field or the value", unclear),
             ("accepted", accepted), ("allowances no case needs", unused))
    report = [(title, items) for title, items in found if items]
    assert not report, "\n".join(f"{title}:\n  " + "\n  ".join(items) for title, items in report)


def test_hydra_compose_agrees_with_the_fast_path(results):
    all_cases, fast, full = results
    assert len(full) >= SAMPLED_COMPOSES
    for i, out in full.items():
        assert (out.accepted, out.message is None) == (fast[i].accepted, fast[i].message is None), all_cases[i]


def test_a_few_of_them_on_the_command_line_exit_2_without_a_traceback(results, tmp_path):
    all_cases, fast, _ = results
    rng = random.Random(SEED)
    refused = [i for i in range(len(all_cases)) if not fast[i].accepted]
    by_cmd: dict[str, list[int]] = {}
    for i in refused:
        by_cmd.setdefault(all_cases[i]["cmd"], []).append(i)
    picked = [rng.choice(v) for _, v in sorted(by_cmd.items())][:CLI_CASES]
    for k, i in enumerate(picked):
        c = all_cases[i]
        run = tmp_path / f"run{k}"
        r = subprocess.run([sys.executable, "-m", "embodied.cli", c["cmd"], *c["base"], c["override"],
                            f"hydra.run.dir={run}"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           check=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (c, r.stderr[-2000:])
        assert lines[0] == f"embodied {c['cmd']}: error: {fast[i].message}"  # the line the fast path gave
        assert not run.exists()  # refused before Hydra made the run folder
