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
    # 800 demonstrations with strong action noise (the expert replans, so its labels show how
    # to recover): 93.0% / 91.5% held-out, against 87.0% / 85.0% with 400 at noise 0.1
    train_defaults={"demos": 800, "demo_noise": 0.3}))
