"""Registry of tasks and suites, looked up by name.

Suites are plugins: each is a module named in the ``embodied.suites`` entry-point group
(see pyproject.toml) that calls ``register_task``/``register_suite`` when imported. This
module imports them lazily, on the first look-up, and never names a task itself.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Callable

from embodied.core.errors import UnknownNameError

ENTRY_POINT_GROUP = "embodied.suites"


@dataclass(frozen=True)
class TaskSpec:
    """A task: a world class plus its instructions.

    Attributes:
        name: unique name, e.g. ``"pick"``.
        suite: the suite it belongs to, e.g. ``"manipulation"``.
        entry_point: ``"module:Class"`` of a gymnasium env accepting ``task=TaskSpec``.
        train_instructions: templates used for training (``{color}``-style fields are
            filled from the episode's parameters).
        heldout_instructions: templates never used for training (paraphrase split).
        max_episode_steps: time limit (the env truncates).
        kwargs: extra constructor arguments for the env.
        description: one line for listings.
    """

    name: str
    suite: str
    entry_point: str
    train_instructions: tuple[str, ...]
    heldout_instructions: tuple[str, ...]
    max_episode_steps: int
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def __post_init__(self) -> None:
        if len(self.train_instructions) < 1 or len(self.heldout_instructions) < 1:
            raise ValueError(f"task {self.name!r} needs training and held-out instructions")
        overlap = set(self.train_instructions) & set(self.heldout_instructions)
        if overlap:
            raise ValueError(f"task {self.name!r}: held-out paraphrases also in training: {sorted(overlap)}")

    def instructions(self, split: str) -> tuple[str, ...]:
        if split == "train":
            return self.train_instructions
        if split == "heldout":
            return self.heldout_instructions
        raise ValueError(f"instruction split must be 'train' or 'heldout', got {split!r}")


@dataclass(frozen=True)
class SuiteSpec:
    """A named, ordered set of tasks evaluated together (its training recipe: ``configs/suite/<name>.yaml``)."""

    name: str
    tasks: tuple[str, ...]
    description: str = ""
    # "module:function" of the suite's hindsight labeller, or "" for none: a function
    # (states (T, Ds) of one episode's frames, tasks) -> [(task, fields, success (T,) bool,
    # reward (T,) float), ...], the ground truth of every goal the tasks can pose in that
    # episode's scene (rewards fitted with hindsight captions read it; see ``hindsight_labeller``)
    hindsight: str = ""
    # "module:function" of the suite's relational state features, or "" for none: a function
    # (states (N, Ds)) -> float (N, Df), extra targets of a reward fit's auxiliary state loss
    # (``state_features`` of ``embodied reward fit``)
    state_features: str = ""


_TASKS: dict[str, TaskSpec] = {}
_SUITES: dict[str, SuiteSpec] = {}
_LOADED: set[str] = set()


def register_task(spec: TaskSpec) -> TaskSpec:
    """Register a task (idempotent for an identical spec) and its gymnasium id."""
    old = _TASKS.get(spec.name)
    if old is not None and old != spec:
        raise ValueError(f"task {spec.name!r} is already registered with a different spec")
    _TASKS[spec.name] = spec
    _register_gymnasium(spec)
    return spec


def register_suite(spec: SuiteSpec) -> SuiteSpec:
    missing = [t for t in spec.tasks if t not in _TASKS]
    if missing:
        raise ValueError(f"suite {spec.name!r} names unregistered tasks: {missing}")
    _SUITES[spec.name] = spec
    return spec


def gym_id(task: str) -> str:
    """The gymnasium id of a task, e.g. ``embodied/pick-v0``."""
    return f"embodied/{task}-v0"


def _register_gymnasium(spec: TaskSpec) -> None:
    import gymnasium as gym

    if gym_id(spec.name) in gym.registry:
        return
    gym.register(id=gym_id(spec.name), entry_point=spec.entry_point,
                 kwargs={"task": spec.name}, disable_env_checker=True)


def _plugins() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_plugins(names: list[str] | None = None) -> None:
    """Import suite modules (all of them, or those named) so they register."""
    plugins = _plugins()
    for name in names if names is not None else list(plugins):
        if name in _LOADED:
            continue
        if name not in plugins:
            raise UnknownNameError("suite", name, sorted(set(plugins) | set(_SUITES)))
        importlib.import_module(plugins[name])
        _LOADED.add(name)


def _check_name(kind: str, name: Any) -> None:
    if not isinstance(name, str):  # e.g. a nested list from tasks=[[a]]
        raise ValueError(f"a {kind} is named by a string, got {name!r} ({type(name).__name__})")


def get_suite(name: str) -> SuiteSpec:
    _check_name("suite", name)
    if name not in _SUITES:
        plugins = _plugins()
        if name in plugins:
            load_plugins([name])
        else:
            load_plugins()
    if name not in _SUITES:
        raise UnknownNameError("suite", name, sorted(set(_SUITES) | set(_plugins())))
    return _SUITES[name]


def get_task(name: str) -> TaskSpec:
    _check_name("task", name)
    if name not in _TASKS:
        load_plugins()
    if name not in _TASKS:
        raise UnknownNameError("task", name, list(_TASKS))
    return _TASKS[name]


def list_suites() -> list[str]:
    load_plugins()
    return sorted(_SUITES)


def list_tasks(suite: str | None = None) -> list[str]:
    if suite is not None:
        return list(get_suite(suite).tasks)
    load_plugins()
    return sorted(_TASKS)


def resolve_tasks(suite: str | None = None, tasks: list[str] | str | None = None) -> list[str]:
    """Tasks named directly, or all tasks of a suite (a task name is accepted as suite)."""
    if tasks:
        names = [tasks] if isinstance(tasks, str) else list(tasks)
        for t in names:
            get_task(t)
        return names
    if suite is None:
        raise ValueError("give a suite (suite=NAME) or tasks (tasks=[...])")
    try:
        return list(get_suite(suite).tasks)
    except UnknownNameError:
        if suite in _TASKS or (load_plugins() is None and suite in _TASKS):
            return [suite]
        raise


def load_object(spec: str, what: str = "object") -> Any:
    """The attribute named by ``"package.module:attr"``, its module imported now (lazily).

    The one resolver of "module:attr" strings (entry points, plugin tables, user-given
    factories). ``what`` names the setting in the error: a malformed spec, a module that does
    not import or a missing attribute is a ``ValueError`` that says which.
    """
    module, sep, attr = str(spec).partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{what}={spec!r} is not allowed: must be 'package.module:attribute'")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{what}={spec!r}: cannot import module {module!r} ({e})") from e
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ValueError(f"{what}={spec!r}: module {module!r} has no attribute {attr!r}") from None


def suite_hook(suite: str, name: str) -> Callable[..., Any] | None:
    """The function a suite registered under ``name`` (a "module:function" field of ``SuiteSpec``:
    ``hindsight``, ``state_features``), imported lazily; None if none (also for the suite a task
    names that is no registered suite, as Meta-World's tasks name ``metaworld``)."""
    try:
        entry = getattr(get_suite(suite), name)
    except UnknownNameError:
        return None
    if not entry:
        return None
    return load_object(entry, f"{suite}.{name}")


def hindsight_labeller(suite: str) -> Callable[..., Any] | None:
    """The hindsight labeller a suite registered (``SuiteSpec.hindsight``); None if none."""
    return suite_hook(suite, "hindsight")


def env_class(task: str) -> Callable[..., Any]:
    spec = get_task(task)
    return load_object(spec.entry_point, f"{task}.entry_point")


def make_env(task: str, **kwargs: Any):
    """Create the gymnasium env of a registered task.

    Keyword arguments go to the env (e.g. ``obs_mode="pixels"``, ``image_size=64``,
    ``instruction_split="heldout"``, ``instructions=[...]``, ``render_mode="rgb_array"``).
    """
    spec = get_task(task)
    return env_class(task)(task=spec.name, **{**spec.kwargs, **kwargs})
