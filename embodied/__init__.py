"""embodied: the contracts, datasets, loops, CLI and robot bridge of the stack.

This package knows no particular task, network or reward. Worlds live in ``sim``,
policies in ``policies``, rewards in ``rewards``; they meet through the contracts here.
"""

from embodied.core.errors import EmbodiedError, SpecMismatchError, UnknownNameError
from embodied.core.policy import Policy
from embodied.core.registry import (
    get_suite,
    get_task,
    list_suites,
    list_tasks,
    make_env,
)
from embodied.core.robot import Robot, SimRobot
from embodied.core.specs import ActionSpec, ObservationSpec

__all__ = [
    "ActionSpec",
    "EmbodiedError",
    "ObservationSpec",
    "Policy",
    "Robot",
    "SimRobot",
    "SpecMismatchError",
    "UnknownNameError",
    "get_suite",
    "get_task",
    "list_suites",
    "list_tasks",
    "make_env",
]
__version__ = "0.1.0"
