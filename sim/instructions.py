"""Instructions as data: one YAML file per suite, read by this one loader.

Each suite keeps its wordings in ``sim/<suite>/instructions.yaml``::

    pick:                                # task name, as registered
      train:                             # templates used for training, in order
        - "pick up the {color} block"
        - "lift the {color} block"
      heldout:                           # paraphrases never trained on (the held-out split)
        - "hoist the {color} block"

Order is part of the data: an env draws a template by index from the episode's seed, so
reordering a list changes which wording a seed gets. A template's ``{field}`` names a
parameter the task samples per episode (e.g. ``color``); the env fills it in with
``str.format``. Texts use only ``INSTRUCTION_CHARSET`` and at most
``MAX_INSTRUCTION_CHARS`` characters (the gymnasium ``Text`` space of the observation).

A file that breaks any of these rules raises ``InstructionFileError`` naming the file,
the line and what is wrong, at import of the suite, before any env is built.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

from embodied.core.errors import EmbodiedError

INSTRUCTION_CHARSET = string.ascii_letters + string.digits + " .,;:'!?-()/"
MAX_INSTRUCTION_CHARS = 256
SPLITS = ("train", "heldout")
_STR = "tag:yaml.org,2002:str"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, when PyYAML was built with it


class InstructionFileError(EmbodiedError, ValueError):
    """An instruction file that is missing, not valid YAML, or breaks the format above."""


@dataclass(frozen=True)
class Paraphrases:
    """The wordings of one task.

    Attributes:
        train: templates for training, in file order.
        heldout: templates never used for training, in file order; disjoint from ``train``.
    """

    train: tuple[str, ...]
    heldout: tuple[str, ...]


class InstructionTable(dict):
    """Task name -> ``Paraphrases``, in file order; a missing task is an error naming the file."""

    def __init__(self, path: Path, items: dict[str, Paraphrases]):
        super().__init__(items)
        self.path = path

    def __missing__(self, task: str) -> Paraphrases:
        raise InstructionFileError(f"{self.path}: no instructions for task {task!r}; "
                                   f"the file has {', '.join(self) or 'none'}")


def template_fields(template: str) -> set[str]:
    """The ``{field}`` names a template uses, e.g. ``{"color", "base"}``.

    Raises:
        ValueError: unbalanced braces (``str.format`` could not fill it in).
    """
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def _fail(path: Path, node: Any, what: str) -> InstructionFileError:
    mark = node.start_mark
    return InstructionFileError(f"{path}:{mark.line + 1}:{mark.column + 1}: {what}")


def _compose(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InstructionFileError(f"cannot read instruction file {path}: {e}") from None
    try:
        return yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        context = f" ({e.context} at line {e.context_mark.line + 1})" if e.context and e.context_mark else ""
        raise InstructionFileError(f"{where}: not valid YAML: {e.problem or e.context}{context}") from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow
        line = text.count("\n", 0, e.position) + 1
        ch = chr(e.character) if isinstance(e.character, int) else e.character
        raise InstructionFileError(f"{path}:{line}: not valid YAML: character {ch!r}: {e.reason}") from None
    except yaml.YAMLError as e:
        raise InstructionFileError(f"{path}: not valid YAML: {e}") from None


def _template(path: Path, task: str, node: Any) -> str:
    if not isinstance(node, yaml.ScalarNode) or node.tag != _STR:
        raise _fail(path, node, f"task {task!r}: each wording must be a string (quote it), got {node.value!r}")
    s = node.value
    try:
        parts = list(string.Formatter().parse(s))
    except ValueError as e:
        raise _fail(path, node, f"task {task!r}: wording {s!r} is not a template: {e}") from None
    bad = sorted({c for literal, _, _, _ in parts for c in literal} - set(INSTRUCTION_CHARSET))
    if not s or len(s) > MAX_INSTRUCTION_CHARS or bad:
        raise _fail(path, node, f"task {task!r}: wording {s!r} must have 1 to {MAX_INSTRUCTION_CHARS} characters "
                                f"from {INSTRUCTION_CHARSET!r} besides its {{fields}}; it has {len(s)}"
                    + (f" and {bad}" if bad else ""))
    odd = [f for _, f, spec, conv in parts if f is not None and (not f.isidentifier() or spec or conv)]
    if odd:
        raise _fail(path, node, f"task {task!r}: wording {s!r} uses fields {odd!r}; a field is a plain name "
                                "such as {color}, without index, format spec or conversion")
    return s


def _split(path: Path, task: str, split: str, node: Any) -> tuple[str, ...]:
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise _fail(path, node, f"task {task!r}: {split!r} must be a non-empty list of wordings")
    out: list[str] = []
    for item in node.value:
        s = _template(path, task, item)
        if s in out:
            raise _fail(path, item, f"task {task!r}: wording {s!r} appears twice in {split!r}")
        out.append(s)
    return tuple(out)


def _task(path: Path, task: str, node: Any) -> Paraphrases:
    if not isinstance(node, yaml.MappingNode):
        raise _fail(path, node, f"task {task!r} must map 'train' and 'heldout' to lists of wordings")
    splits: dict[str, tuple[str, ...]] = {}
    nodes: dict[str, Any] = {}
    for key, value in node.value:
        if key.value not in SPLITS or key.value in splits:
            raise _fail(path, key, f"task {task!r}: key {key.value!r} is "
                                   f"{'repeated' if key.value in splits else 'not allowed'}; keys: {', '.join(SPLITS)}")
        splits[key.value], nodes[key.value] = _split(path, task, key.value, value), value
    missing = [s for s in SPLITS if s not in splits]
    if missing:
        raise _fail(path, node, f"task {task!r} lacks {', '.join(missing)}")
    for item in nodes["heldout"].value:
        if item.value in splits["train"]:
            raise _fail(path, item, f"task {task!r}: held-out wording {item.value!r} is also a training wording")
    return Paraphrases(splits["train"], splits["heldout"])


def load_instructions(path: str | Path, tasks: Iterable[str] | None = None) -> InstructionTable:
    """Read one suite's instruction file.

    Args:
        path: the YAML file (format in the module docstring).
        tasks: when given, the file must hold exactly these tasks.

    Returns:
        Task name -> ``Paraphrases``, in file order.

    Raises:
        InstructionFileError: the file cannot be read or breaks the format; the message
            names the file and the line.
    """
    path = Path(path)
    root = _compose(path)
    if root is None:
        raise InstructionFileError(f"{path}: the instruction file is empty")
    if not isinstance(root, yaml.MappingNode):
        raise _fail(path, root, "the file must map task names to their wordings")
    table: dict[str, Paraphrases] = {}
    for key, value in root.value:
        if not isinstance(key, yaml.ScalarNode) or key.value in table:
            raise _fail(path, key, f"task {key.value!r} appears twice" if key.value in table else "bad task name")
        table[key.value] = _task(path, key.value, value)
    if tasks is not None:
        want = list(tasks)
        missing, extra = [t for t in want if t not in table], [t for t in table if t not in want]
        if extra:
            node = next(k for k, _ in root.value if k.value == extra[0])
            raise _fail(path, node, f"task {extra[0]!r} is not a task of this suite; tasks: {', '.join(want)}")
        if missing:
            raise InstructionFileError(f"{path}: no instructions for task(s) {', '.join(missing)}")
    return InstructionTable(path, table)
