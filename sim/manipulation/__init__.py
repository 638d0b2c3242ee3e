"""Manipulation suite: eight tabletop tasks in one scene, chosen by instruction."""

from pathlib import Path

from embodied.core.registry import SuiteSpec, TaskSpec, register_suite, register_task
from sim.instructions import load_instructions
from sim.manipulation.tasks import TASKS

INSTRUCTIONS = load_instructions(Path(__file__).with_name("instructions.yaml"), tasks=TASKS)

for _t in TASKS.values():
    register_task(TaskSpec(
        name=_t.name, suite="manipulation", entry_point="sim.manipulation.world:ManipulationEnv",
        train_instructions=INSTRUCTIONS[_t.name].train, heldout_instructions=INSTRUCTIONS[_t.name].heldout,
        max_episode_steps=_t.max_steps, description=_t.description,
    ))

SUITE = register_suite(SuiteSpec("manipulation", tuple(TASKS),
                                 "tabletop: reach, push, pick, place, stack, drawer, button",
                                 hindsight="sim.manipulation.tasks:hindsight_labels"))
