"""Counting environment steps across a steering run: the budget, a progress bar, periodic evaluation.

The budget is in *environment* steps (executed actions), the unit the issue and the
baselines are compared in; a noise step executes up to Ta of them. Every learner (the
SB3 callback in ``sb3.py``, the DSRL-NA loop in ``na.py``) calls ``update(infos)`` once
per vector step with the sub-envs' ``info`` dicts (``info["env_steps"]``: actions
executed, 1 when absent) and stops when it returns False.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

#: evaluate(env_steps) -> scalars to show, e.g. {"success": 0.8}
Evaluate = Callable[[int], Mapping[str, float]]


class Progress:
    """Environment-step budget with a tqdm bar and an evaluation every ``eval_every`` env steps.

    Args:
        budget: environment steps to run (the run stops at the first vector step past it).
        evaluate: called with the env steps so far each time another ``eval_every`` have run.
        eval_every: env steps between evaluations (0: none).
        desc: the bar's label; ``show``: draw the bar.
    """

    def __init__(self, budget: int, evaluate: Evaluate | None = None, eval_every: int = 0, desc: str = "steer",
                 show: bool = True):
        if budget < 1:
            raise ValueError(f"env_steps budget={budget} is not allowed: must be >= 1")
        if eval_every < 0:
            raise ValueError(f"eval_every={eval_every} is not allowed: must be >= 0 (0: no periodic evaluation)")
        self.budget, self.evaluate, self.eval_every = int(budget), evaluate, int(eval_every)
        self.env_steps = self.episodes = self.successes = 0
        self.next_eval = self.eval_every or None
        self.last: Mapping[str, float] = {}
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.budget, desc=desc, unit="step", disable=not show, leave=False)

    def update(self, infos: Sequence[Mapping[str, Any]]) -> bool:
        """Count one vector step; run a due evaluation; False once the budget is spent."""
        steps = sum(int(i.get("env_steps", 1)) for i in infos)
        self.env_steps += steps
        for i in infos:
            if "episode" in i:
                self.episodes += 1
                self.successes += bool(i.get("is_success", i.get("success", False)))
        self.bar.update(min(steps, max(0, self.budget - self.bar.n)))
        due = self.next_eval is not None and self.env_steps >= self.next_eval
        if due and self.evaluate is not None and self.env_steps < self.budget:  # the caller evaluates the end
            self.last = dict(self.evaluate(self.env_steps))
            self.bar.set_postfix({k: f"{v:.2f}" for k, v in self.last.items()}, refresh=False)
        while due and self.next_eval <= self.env_steps:
            self.next_eval += self.eval_every
        return self.env_steps < self.budget

    @property
    def train_success(self) -> float | None:
        """Success rate of the training episodes finished so far (None before the first)."""
        return self.successes / self.episodes if self.episodes else None

    def close(self) -> None:
        self.bar.close()
