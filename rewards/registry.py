"""Reward models by name: ``make_reward({"name": ..., **settings}) -> RewardModel``.

Each entry is ``"module:function"``, imported on first use; the function takes the settings
(a dict, the ``reward:`` config group) and returns a ``RewardModel``. A new reward (a learned
preference reward, ...) adds a line here and is then usable by every command and wrapper
(``embodied reward eval reward=NAME ...``).
"""

from __future__ import annotations

from typing import Any, Mapping

from embodied.core.errors import UnknownNameError
from embodied.core.registry import load_object
from embodied.core.reward import RewardModel

REWARDS: dict[str, str] = {
    "clip": "rewards.vlm.model:reward_from_settings",
    "prefer": "rewards.preference.model:reward_from_settings",  # a reward learned by `embodied prefer`
}


#: settings of the ``reward:`` group that belong to the loop using the reward, not to the model
LOOP_SETTINGS = ("success_threshold",)


def make_reward(settings: Mapping[str, Any]) -> RewardModel:
    """The reward model ``settings["name"]`` built from the other settings (``LOOP_SETTINGS`` aside)."""
    settings = {k: v for k, v in settings.items() if k not in LOOP_SETTINGS}
    name = settings.get("name")
    if name not in REWARDS:
        raise UnknownNameError("reward model", str(name), list(REWARDS))
    return load_object(REWARDS[name], f"reward {name!r}")(settings)
