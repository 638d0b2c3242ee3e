"""Typed exceptions raised at the boundaries (user input, files, wire)."""

from __future__ import annotations

import difflib


class EmbodiedError(Exception):
    """Base class of every error this project raises on purpose."""


class UnknownNameError(EmbodiedError, KeyError):
    """A name (task, suite, policy, ...) that is not registered."""

    def __init__(self, kind: str, name: str, valid: list[str]):
        close = difflib.get_close_matches(name, valid, n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        self.kind, self.name, self.valid = kind, name, valid
        super().__init__(f"unknown {kind} {name!r}.{hint} Valid {kind}s: {', '.join(sorted(valid))}")

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.args[0]


class SpecMismatchError(EmbodiedError, ValueError):
    """Observation/action spec of a checkpoint or dataset does not fit the task."""


class InvalidActionError(EmbodiedError, ValueError):
    """An action of the wrong shape, or with NaN/inf values."""


class InvalidObservationError(EmbodiedError, ValueError):
    """An observation of the wrong shape, or with NaN/inf values."""


class DatasetError(EmbodiedError, IOError):
    """A dataset on disk that is missing, corrupt or inconsistent."""
