"""Hydra plumbing shared by every command: ``hydra_command`` and ``compose``.

Each command module defines a dataclass schema (validated in ``__post_init__``) and a
function ``run(cfg) -> metrics``; ``hydra_command`` turns it into a Hydra app whose
config is ``configs/<name>.yaml`` composed over the schema, and hands ``run`` exactly the
config that ``embodied <name> ... --cfg job --resolve`` prints. The run directory is
``hydra.run.dir``; ``metrics.json`` is written there. The parts:

- ``embodied.commands.schema``: the ConfigStore groups, the schema built from the composed
  config, and the checks on every command's numbers;
- ``embodied.commands.user_errors``: which errors are the user's and the one line said about
  each (``embodied <name>: error: ...``, exit status 2); Ctrl-C ends a command with
  ``embodied <name>: interrupted`` (after the command has said what it kept) and exit status
  130, without a traceback;
- ``embodied.commands.rundir``: run folders are owned (``embodied-run.json``); ``RunDirGuard``
  applies that before Hydra writes anything.

Under torchrun every process runs the command with the same ``hydra.run.dir``; rank 0 alone
writes there (Hydra's ``.hydra/`` files and log, the owner marker): the other ranks get
``hydra.output_subdir=null`` and log to the console only (``embodied.runtime.ddp``).

A command may also pass ``prepare(cfg, run_dir)`` to ``hydra_command``: it runs after the
run-folder checks and before Hydra writes anything, to refuse (a user error) or to end early
(``AlreadyDone``), e.g. a resume that does not fit the run.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from hydra.experimental.callback import Callback

from embodied.commands.rundir import check_owner, claim_run_dir, keep_hydra_files
from embodied.commands.schema import register_configs, to_schema
from embodied.commands.user_errors import describe_error, fail, user_error
from embodied.runtime.ddp import rank_from_env

log = logging.getLogger("embodied")

INTERRUPTED = 130  # exit status after Ctrl-C (128 + SIGINT), as shells report it
# command name -> (schema, prepare): filled by hydra_command, read by RunDirGuard
_COMMANDS: dict[str, tuple[type, Callable[[Any, Path], None] | None]] = {}


class AlreadyDone(Exception):
    """Raised by a command's ``prepare`` when its run folder already holds what was asked:
    the command prints the message and exits with status 0 without writing anything."""


def run_dir() -> Path:
    """The current Hydra run directory (``hydra.run.dir``)."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


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
            if owner == self.command and run.exists() and rank_from_env() == 0:
                keep_hydra_files(run)
            _GUARDED.add(run)
        except AlreadyDone as e:
            print(f"embodied {self.command}: {e}", file=sys.stderr)
            sys.exit(0)
        except Exception as e:
            message = user_error(e)
            if message is None:
                traceback.print_exc()
                sys.exit(1)
            fail(self.command, message)


_GUARDED: set[Path] = set()  # run folders RunDirGuard checked in this process (a multirun's jobs are not)


_VALUED_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir",
                 "-cd", "--experimental-rerun"}  # Hydra's options that take the next word as their value


def _with_hydra_overrides(name: str, args: list[str]) -> list[str]:
    """``args`` (a command line) with what ``hydra_command`` adds to it: the job name (so the log
    is ``<name>.log``) and the run-folder guard. They go just before the user's first override,
    since Hydra reads the overrides as one run of words, and so the user's own win."""
    ours = [f"hydra.job.name={name}",
            f"+hydra.callbacks.embodied_run_dir={{_target_:{__name__}.RunDirGuard,command:{name}}}"]
    if rank_from_env() != 0:  # a torchrun rank but 0: rank 0 alone writes the run folder
        ours += ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
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
                if rank_from_env() == 0:
                    claim_run_dir(out, name)
                else:
                    check_owner(out, name)
            except AlreadyDone as e:
                print(f"embodied {name}: {e}", file=sys.stderr)
                return None
            except Exception as e:
                message = user_error(e)
                if message is None:
                    raise
                fail(name, message)
            started.append(True)
            try:
                return fn(obj)
            except Exception as e:
                # Hydra's and OmegaConf's errors from here on are the command's own (bugs); ours,
                # ValueError and FileNotFoundError are bad input: said without a traceback
                message = user_error(e, command_line=False)
                if message is None:
                    raise
                fail(name, message)

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
                fail(name, describe_error(e))
            finally:
                sys.argv = argv
                if previous is None:
                    os.environ.pop("HYDRA_FULL_ERROR", None)
                else:
                    os.environ["HYDRA_FULL_ERROR"] = previous

        return main

    return deco
