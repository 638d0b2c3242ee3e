"""Meta-World v3 adapter: the 50 Meta-World tasks under our names, env contract and suites.

Registers every Meta-World v3 task under Meta-World's own name (``reach-v3``, ...), with its
wordings from ``instructions.yaml`` beside this file, and the suites ``metaworld-mt10`` and
``metaworld-mt50`` (Meta-World's MT10/MT50 lists). The env class
(``sim.metaworld.world:MetaWorldEnv``) imports ``metaworld`` only when an env is built, so
registering costs nothing; the static lists are checked against the package by
``tests/test_metaworld.py``.
"""

from pathlib import Path

from embodied.core.registry import SuiteSpec, TaskSpec, register_suite, register_task
from sim.instructions import load_instructions
from sim.metaworld.tasks import ALL_TASKS, DESCRIPTIONS, MT10, MT50

DEFAULT_MAX_EPISODE_STEPS = 200  # Meta-World's own horizon is 500; ours is configurable per env
INSTRUCTIONS = load_instructions(Path(__file__).with_name("instructions.yaml"), tasks=ALL_TASKS)

for _name in ALL_TASKS:
    register_task(TaskSpec(
        name=_name, suite="metaworld", entry_point="sim.metaworld.world:MetaWorldEnv",
        train_instructions=INSTRUCTIONS[_name].train, heldout_instructions=INSTRUCTIONS[_name].heldout,
        max_episode_steps=DEFAULT_MAX_EPISODE_STEPS, description=DESCRIPTIONS[_name],
    ))

MT10_SUITE = register_suite(SuiteSpec("metaworld-mt10", MT10, "Meta-World v3 MT10: ten tasks"))
MT50_SUITE = register_suite(SuiteSpec("metaworld-mt50", MT50, "Meta-World v3 MT50: all fifty tasks"))
