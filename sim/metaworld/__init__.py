"""Meta-World v3 adapter: the 50 Meta-World tasks under our names, env contract and suites.

Registers every Meta-World v3 task under Meta-World's own name (``reach-v3``, ...) and the
suites ``metaworld-mt10`` and ``metaworld-mt50`` (Meta-World's MT10/MT50 lists). The env
class (``sim.metaworld.world:MetaWorldEnv``) imports ``metaworld`` only when an env is
built, so registering costs nothing; the static lists are checked against the package by
``tests/test_metaworld.py``.
"""

from embodied.core.registry import SuiteSpec, TaskSpec, register_suite, register_task
from sim.metaworld.instructions import INSTRUCTIONS
from sim.metaworld.tasks import ALL_TASKS, DESCRIPTIONS, MT10, MT50

DEFAULT_MAX_EPISODE_STEPS = 200  # Meta-World's own horizon is 500; ours is configurable per env

for _name in ALL_TASKS:
    _train, _heldout = INSTRUCTIONS[_name]
    register_task(TaskSpec(
        name=_name, suite="metaworld", entry_point="sim.metaworld.world:MetaWorldEnv",
        train_instructions=_train, heldout_instructions=_heldout,
        max_episode_steps=DEFAULT_MAX_EPISODE_STEPS, description=DESCRIPTIONS[_name],
    ))

MT10_SUITE = register_suite(SuiteSpec("metaworld-mt10", MT10, "Meta-World v3 MT10: ten tasks"))
MT50_SUITE = register_suite(SuiteSpec("metaworld-mt50", MT50, "Meta-World v3 MT50: all fifty tasks"))
