"""Which errors are the user's, and the one line a command says about each.

A user error (a value the schema refuses, an unknown option or field, a run folder that is not
this command's) ends the command with one line on stderr, ``embodied <name>: error: ...``, and
exit status 2 (``fail``); any other error is a bug and keeps its traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from typing import Any

from embodied.commands.rundir import RunDirError

QUOTING = ("Hydra reads key=value with its override grammar: text holding a comma, an apostrophe or quote, "
           "brackets or braces must reach it quoted, e.g. \"instruction='lift it, then hold it'\" or "
           "instruction=\"\\\"don't drop it\\\"\" in a shell (see the command's --help), or come from a file "
           "(embodied play instruction_file=PATH, embodied eval instructions_file=PATH)")


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


def fail(name: str, message: str) -> None:
    """Say ``message`` as ``embodied <name>: error: ...`` on stderr and exit with status 2."""
    print(f"embodied {name}: error: {message}", file=sys.stderr)
    sys.exit(2)
