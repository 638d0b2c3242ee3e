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

Besides a schema's own ``__post_init__`` checks, every command's numbers (and those of a
nested structured node such as ``policy``) are checked here: an ``int`` field must be >= 0
(counts, sizes, steps and seeds; a field whose ``metadata`` has ``signed=True`` may be
negative) and a ``float`` field must be finite, unless the value is the field's default.

A user error (a value the schema refuses, an unknown option or field) ends the command
with one line on stderr, ``embodied <name>: error: ...``, and exit status 2; Ctrl-C ends it
with ``embodied <name>: interrupted`` (after the command has said what it kept) and exit
status 130, without a traceback.

Run folders are owned. The first command to write into a ``hydra.run.dir`` leaves
``embodied-run.json`` there naming itself; any other command pointed at that folder is
refused before anything is written (Hydra's ``.hydra/`` included), with the way out
(``hydra.run.dir=RUN/<command>``, or any new folder). A folder from before the marker
existed belongs to the command named in its ``.hydra/hydra.yaml``, or to ``train`` when it
holds ``checkpoint/``; a folder holding other files than Hydra's is refused. The same
command may run again in its own folder (``train`` resumes there); the ``.hydra/`` files of
the earlier invocation are then kept in ``.hydra/previous/<k>/``. A command may also pass
``prepare(cfg, run_dir)`` to ``hydra_command``: it runs after these checks and before Hydra
writes anything, to refuse (a user error) or to end early (``AlreadyDone``), e.g. a resume
that does not fit the run.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import logging
import math
import os
import shutil
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Sequence

from hydra.experimental.callback import Callback

log = logging.getLogger("embodied")

OWNER_FILE = "embodied-run.json"  # in a run folder: the command whose results it holds
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what Hydra writes to .hydra/ at each start
INTERRUPTED = 130  # exit status after Ctrl-C (128 + SIGINT), as shells report it
# command name -> (schema, prepare): filled by hydra_command, read by RunDirGuard
_COMMANDS: dict[str, tuple[type, Callable[[Any, Path], None] | None]] = {}
QUOTING = ("Hydra reads key=value with its override grammar: text holding a comma, an apostrophe or quote, "
           "brackets or braces must reach it quoted, e.g. \"instruction='lift it, then hold it'\" or "
           "instruction=\"\\\"don't drop it\\\"\" in a shell (see the command's --help), or come from a file "
           "(embodied play instruction_file=PATH, embodied eval instructions_file=PATH)")


class AlreadyDone(Exception):
    """Raised by a command's ``prepare`` when its run folder already holds what was asked:
    the command prints the message and exits with status 0 without writing anything."""


class RunDirError(Exception):
    """A run folder that this command may not write into (it holds another command's results)."""


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
    from hydra.errors import CompactHydraException, MissingConfigException, OverrideParseException

    if isinstance(error, MissingConfigException) and error.options is not None and error.missing_cfg_file:
        group, _, option = error.missing_cfg_file.rpartition("/")
        close = difflib.get_close_matches(option, error.options, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        return f"unknown {group or 'config'} {option!r}.{hint} Allowed: {', '.join(sorted(error.options))}"
    text = str(error).strip()
    if isinstance(error, CompactHydraException):
        # Hydra's own lines are all meant for the user (how to quote, how to append a key), but
        # not its caret under the parsed text or the grammar's web page
        lines = [line.strip() for line in text.splitlines()
                 if line.strip() and set(line.strip()) != {"^"} and not line.startswith("See https://")]
        cause = error.__cause__ or error.__context__
        if cause is not None and _allowed_keys(cause):  # a schema's field: appending one is refused too
            lines = [line for line in lines if not line.startswith("To append to your config")]
        parts = [" ".join(line if line.endswith((".", "?", ":")) else line + "." for line in lines)
                 or type(error).__name__]
        if isinstance(error, OverrideParseException):
            parts.append(QUOTING)
    else:
        parts = [text.splitlines()[0] if text else type(error).__name__]
    cause = error.__cause__ or error.__context__
    for e in (error, cause):
        msg = getattr(e, "msg", None)
        if e is not None and msg and msg.splitlines()[0] not in parts[0]:
            parts.append(msg.splitlines()[0])
        if e is not None and _allowed_keys(e):
            parts.append(_allowed_keys(e).strip())
            break
    return " ".join(p if p.endswith((".", "?")) else p + "." for p in parts)


def user_error(error: BaseException, command_line: bool = True) -> str | None:
    """What the CLI says about ``error`` in ``embodied <name>: error: ...``, or None when it is
    not a user error (a bug, which keeps its traceback).

    User errors: ours (``EmbodiedError``), ``ValueError`` and ``FileNotFoundError`` raised for
    bad input (also as the cause of Hydra's ``InstantiationException``), and, while the command
    line is read (``command_line``), Hydra's and OmegaConf's, said by ``describe_error``.
    """
    from hydra.errors import HydraException, InstantiationException
    from omegaconf.errors import OmegaConfBaseException

    from embodied.core.errors import EmbodiedError

    if isinstance(error, InstantiationException) and error.__cause__ is not None:
        error = error.__cause__
    if isinstance(error, (EmbodiedError, ValueError, FileNotFoundError, RunDirError)):
        return str(error)
    if command_line and isinstance(error, (HydraException, OmegaConfBaseException)):
        return describe_error(error)
    return None


def _fail(name: str, message: str) -> None:
    print(f"embodied {name}: error: {message}", file=sys.stderr)
    sys.exit(2)


# ---- run folders -----------------------------------------------------------------------------

def _read_owner(run: Path) -> str:
    path = run / OWNER_FILE
    try:
        owner = json.loads(path.read_text()).get("command")
    except (OSError, ValueError, AttributeError) as e:
        raise RunDirError(f"{path} is unreadable or not a JSON object naming a command ({e}); the folder's "
                          "owner is unknown, so nothing is written there: give a new hydra.run.dir=PATH") from None
    if not isinstance(owner, str) or not owner:
        raise RunDirError(f"{path} names no command; give a new hydra.run.dir=PATH")
    return owner


def _hydra_config_name(run: Path) -> str | None:
    """``hydra.job.config_name`` in ``run/.hydra/hydra.yaml`` (the command that wrote it), if any."""
    path = run / ".hydra" / "hydra.yaml"
    if not path.is_file():
        return None
    try:
        from omegaconf import OmegaConf

        name = OmegaConf.select(OmegaConf.load(path), "hydra.job.config_name")
    except Exception:  # an unreadable leftover only loses the hint
        return None
    return name if isinstance(name, str) else None


def run_owner(run: Path) -> str | None:
    """The command whose results ``run`` holds, or None for a folder with nothing in it but
    Hydra's files and logs (or no folder at all).

    Raises:
        RunDirError: ``run`` is a file, its marker is unreadable, or it holds files that no
            command of ours wrote (refused: they might be someone's results).
    """
    if not run.exists():
        return None
    if not run.is_dir():
        raise RunDirError(f"hydra.run.dir={str(run)!r} is a file, not a folder: give a folder")
    if (run / OWNER_FILE).exists():
        return _read_owner(run)
    held = sorted(p.name for p in run.iterdir() if p.name != ".hydra" and p.suffix != ".log")
    if not held:
        return None
    if (run / "checkpoint").is_dir():  # a training run from before the marker
        return "train"
    name = _hydra_config_name(run)
    if name:
        return name
    shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
    raise RunDirError(f"hydra.run.dir={str(run)!r} already holds files that no embodied command wrote "
                      f"({shown}); give an empty or new folder, e.g. hydra.run.dir={run}/run")


def check_owner(run: Path, name: str) -> str | None:
    """``run_owner(run)``, refused (``RunDirError``) when it is another command than ``name``."""
    owner = run_owner(run)
    if owner is not None and owner != name:
        raise RunDirError(f"hydra.run.dir={str(run)!r} holds the results of `embodied {owner}` (see its "
                          f"{OWNER_FILE if (run / OWNER_FILE).exists() else 'files'}); `embodied {name}` does "
                          f"not write over them: give it its own folder, e.g. hydra.run.dir={run}/{name}")
    return owner


def claim_run_dir(run: Path, name: str) -> None:
    """Refuse ``run`` if another command owns it; else mark it as ``name``'s (creating it)."""
    check_owner(run, name)
    run.mkdir(parents=True, exist_ok=True)
    if not (run / OWNER_FILE).exists():
        tmp = run / f".{OWNER_FILE}.tmp"
        tmp.write_text(json.dumps({"command": name}) + "\n")
        os.replace(tmp, run / OWNER_FILE)


def _keep_hydra_files(run: Path) -> None:
    """Copy the ``.hydra/`` files of an earlier invocation to ``.hydra/previous/<k>/`` before Hydra
    writes this one's over them."""
    src = run / ".hydra"
    files = [src / f for f in HYDRA_FILES if (src / f).is_file()]
    if not files:
        return
    k = 1
    while (src / "previous" / str(k)).exists():
        k += 1
    dest = src / "previous" / str(k)
    dest.mkdir(parents=True)
    for f in files:
        shutil.copy2(f, dest / f.name)


class RunDirGuard(Callback):
    """A Hydra callback (``hydra.callbacks``) that ``hydra_command`` adds to every command.

    ``on_run_start`` runs before Hydra creates the run folder or writes ``.hydra/``: it checks
    who owns the folder, validates the config against the schema and runs the command's
    ``prepare``, so a refused command leaves nothing behind. Hydra turns an exception in a
    callback into a warning and goes on, so a refusal ends the process here (``SystemExit``).
    """

    def __init__(self, command: str):
        self.command = command

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        import copy
        import traceback

        from omegaconf import open_dict, read_write

        try:
            run = Path(str(config.hydra.run.dir)).absolute()
            schema, prepare = _COMMANDS[self.command]
            owner = check_owner(run, self.command)
            task_cfg = copy.deepcopy(config)
            with read_write(task_cfg), open_dict(task_cfg):
                del task_cfg["hydra"]
            obj = to_schema(task_cfg, schema)
            if prepare is not None:
                prepare(obj, run)
            if owner == self.command and run.exists():
                _keep_hydra_files(run)
            _GUARDED.add(run)
        except AlreadyDone as e:
            print(f"embodied {self.command}: {e}", file=sys.stderr)
            sys.exit(0)
        except Exception as e:
            message = user_error(e)
            if message is None:
                traceback.print_exc()
                sys.exit(1)
            _fail(self.command, message)


_GUARDED: set[Path] = set()  # run folders RunDirGuard checked in this process (a multirun's jobs are not)


_VALUED_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir",
                 "-cd", "--experimental-rerun"}  # Hydra's options that take the next word as their value


def _with_hydra_overrides(name: str, args: list[str]) -> list[str]:
    """``args`` (a command line) with what ``hydra_command`` adds to it: the job name (so the log
    is ``<name>.log``) and the run-folder guard. They go just before the user's first override,
    since Hydra reads the overrides as one run of words, and so the user's own win."""
    ours = [f"hydra.job.name={name}",
            f"+hydra.callbacks.embodied_run_dir={{_target_:{__name__}.RunDirGuard,command:{name}}}"]
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in _VALUED_FLAGS else 1
    return [*args[:i], *ours, *args[i:]]


def hydra_command(name: str, schema: type, prepare: Callable[[Any, Path], None] | None = None
                  ) -> Callable[[Callable[[Any], Any]], Callable[[], Any]]:
    """Decorate ``run(cfg: schema)`` into a Hydra main for ``embodied <name>``.

    ``prepare(cfg, run_dir)``, when given, runs before Hydra writes anything to ``run_dir``
    (see the module docstring): it may raise a user error or ``AlreadyDone``.
    """
    import hydra
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    ConfigStore.instance().store(name=f"{name}_schema", node=schema)
    _COMMANDS[name] = (schema, prepare)

    def deco(fn: Callable[[Any], Any]) -> Callable[[], Any]:
        started = []  # set once `fn` runs: errors from then on are its own

        @hydra.main(version_base="1.3", config_path="pkg://configs", config_name=name)
        def run(cfg: Any) -> Any:
            logging.getLogger("OpenGL").setLevel(logging.WARNING)
            try:
                obj = to_schema(cfg, schema)
                out = run_dir().absolute()
                if out not in _GUARDED and prepare is not None:  # a multirun job: RunDirGuard did not see it
                    prepare(obj, out)
                claim_run_dir(out, name)
            except AlreadyDone as e:
                print(f"embodied {name}: {e}", file=sys.stderr)
                return None
            except Exception as e:
                message = user_error(e)
                if message is None:
                    raise
                _fail(name, message)
            started.append(True)
            try:
                return fn(obj)
            except Exception as e:
                # Hydra's and OmegaConf's errors from here on are the command's own (bugs); ours,
                # ValueError and FileNotFoundError are bad input: said without a traceback
                message = user_error(e, command_line=False)
                if message is None:
                    raise
                _fail(name, message)

        @functools.wraps(fn)
        def main() -> Any:
            # Hydra reports a bad command line (an unknown option, a typo'd key) itself, over
            # several lines and with exit status 1; HYDRA_FULL_ERROR=1 makes it raise the error
            # here instead, to be said in one line.
            previous = os.environ.get("HYDRA_FULL_ERROR")
            os.environ["HYDRA_FULL_ERROR"] = "1"
            argv = sys.argv
            sys.argv = [argv[0], *_with_hydra_overrides(name, argv[1:])]
            try:
                register_configs()
                return run()
            except KeyboardInterrupt:
                # the command has logged what it kept (collect: the finished episodes; train: a checkpoint)
                print(f"embodied {name}: interrupted", file=sys.stderr)
                sys.exit(INTERRUPTED)
            except BrokenPipeError:  # the reader of stdout went away (`embodied train --help | head`)
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                sys.exit(1)
            except (HydraException, OmegaConfBaseException) as e:
                if started:
                    raise
                _fail(name, describe_error(e))
            finally:
                sys.argv = argv
                if previous is None:
                    os.environ.pop("HYDRA_FULL_ERROR", None)
                else:
                    os.environ["HYDRA_FULL_ERROR"] = previous

        return main

    return deco
