"""Robot drivers behind the ``Robot`` contract, looked up by name and imported lazily.

    sim        a registered task's simulator in this process (``SimRobot``)
    remote     a robot served over the network by ``python -m embodied.bridge.drivers.sim``
               (``NetworkRobot``; the simulated robot as a separate process, with injectable
               latency, jitter and drops)
    rosbridge  a ROS 2 robot through rosbridge's JSON websocket protocol (``RosbridgeRobot``)
"""

from __future__ import annotations

import inspect
from typing import Any

from embodied.core.errors import UnknownNameError
from embodied.core.registry import load_object
from embodied.core.robot import Robot

DRIVERS = {
    "sim": "embodied.bridge.drivers.sim:make_sim_robot",
    "remote": "embodied.bridge.drivers.sim:NetworkRobot",
    "rosbridge": "embodied.bridge.drivers.rosbridge:RosbridgeRobot",
}


def make_robot(kind: str, **kwargs: Any) -> Robot:
    """The driver ``kind`` (a key of ``DRIVERS``) built with ``kwargs``."""
    if kind not in DRIVERS:
        raise UnknownNameError("robot driver", kind, list(DRIVERS))
    factory = load_object(DRIVERS[kind], f"robot driver {kind!r}")
    params = inspect.signature(factory).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            raise ValueError(f"robot driver {kind!r} does not take {unknown}; it takes {sorted(params)}")
    return factory(**kwargs)
