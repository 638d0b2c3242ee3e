"""The navigation suite: a differential-drive robot in four rooms, told where to go.

Importing this package registers its tasks (see ``tasks.py``) and the ``navigation``
suite. The world (``world.NavigationEnv``) is imported lazily, by the gymnasium entry
point, so listing tasks does not load MuJoCo.

Tasks: ``goto-landmark``, ``goto-room``, ``goto-between``, ``approach-avoid``.
"""

from embodied.core.registry import SuiteSpec, register_suite
from sim.navigation.tasks import GOALS

SUITE = register_suite(SuiteSpec(
    "navigation", tasks=tuple(GOALS),
    description="instruction-following navigation in a four-room arena with coloured balls",
    hindsight="sim.navigation.tasks:hindsight_labels", state_features="sim.navigation.tasks:relational_state"))
