"""Several registered tasks behind one gymnasium env: each episode plays one of them.

A learner that must improve one policy across a suite (suite-wide steering) trains on a
vector of ``TaskMixture`` envs: every ``reset`` draws the next episode's task from the
env's own seeded generator and resets that task's env with a seed drawn from the same
generator, so a run is reproducible from its seeds and every task is seen in proportion.

    env = TaskMixture(["reach", "push"], obs_mode="state", instruction_split="train")
    obs, info = env.reset(seed=0)        # info["task"]: the task this episode plays
    env.unwrapped.spec_task.name         # the same, on the task env itself

The tasks must share observation and action spaces (the tasks of one suite do). ``unwrapped``
is the current task's env, so its expert, privileged state and success predicate are the
ones of the episode being played; ``render()`` draws it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from embodied.core.registry import make_env


class TaskMixture(gym.Env):
    """One env per task, one task per episode (see the module docstring).

    Args:
        tasks: registered task names (at least one, no repeats).
        make: builds a task's env from its name (default: ``make_env(task, **env_kwargs)``).
        **env_kwargs: arguments for every task's env (``obs_mode``, ``instruction_split``, ...).
    """

    def __init__(self, tasks: Sequence[str], make: Callable[[str], gym.Env] | None = None, **env_kwargs: Any):
        tasks = list(tasks)
        if not tasks or len(set(tasks)) != len(tasks):
            raise ValueError(f"tasks={tasks} is not allowed: a non-empty list of distinct task names")
        build = make or (lambda t: make_env(t, **env_kwargs))
        self.tasks = tasks
        self.envs: dict[str, gym.Env] = {}
        try:
            for t in tasks:
                self.envs[t] = build(t)
        except Exception:
            self.close()
            raise
        first = self.envs[tasks[0]]
        for t in tasks[1:]:
            env = self.envs[t]
            if env.action_space != first.action_space or env.observation_space != first.observation_space:
                raise ValueError(f"task {t!r} has other observation or action spaces than {tasks[0]!r}: a task "
                                 "mixture needs tasks that share them (the tasks of one suite)")
        self.observation_space, self.action_space = first.observation_space, first.action_space
        self.render_mode = getattr(first, "render_mode", None)
        self.metadata = dict(getattr(first, "metadata", {}))
        self.task = tasks[0]

    @property
    def current(self) -> gym.Env:
        """The env of the task being played."""
        return self.envs[self.task]

    @property
    def unwrapped(self) -> gym.Env:  # type: ignore[override]
        return self.current.unwrapped

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        obs, info = self.current.reset(seed=int(self.np_random.integers(2**31 - 1)), options=options)
        return obs, {**info, "task": self.task}

    def step(self, action: Any):
        return self.current.step(action)

    def render(self) -> np.ndarray | None:
        return self.current.render()

    def close(self) -> None:
        for env in self.envs.values():
            env.close()
