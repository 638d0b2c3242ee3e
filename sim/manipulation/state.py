"""The manipulation state vector and action scale, shared by the world and the tasks.

State (27,) float32, metres, the same layout for every task:
    0:3   end-effector position (x, y, z)
    3     finger opening (sum of both fingers' gaps)
    4:13  red, green, blue block positions (x, y, z each)
    13:15 bin centre (x, y)
    15:17 yellow zone centre (x, y)
    17    drawer opening (0 closed .. 0.2 fully open)
    18:21 drawer handle position
    21:27 red, blue button cap positions (z drops when pressed)

``world.py`` writes this vector; ``tasks.py`` reads it (success, reward terms, experts).
Both import this module, so neither imports the other's internals.
"""

from __future__ import annotations

from sim.manipulation.scene import BLOCK_COLORS, BUTTON_COLORS

STATE_DIM = 27
PROPRIO_DIMS = 4  # entries 0:4, kept in pixel mode
STEP_M = 0.02  # metres of end-effector displacement per unit action per control step


def block_index(color: str) -> slice:
    """State entries (3,) of the named block's position, e.g. ``slice(4, 7)`` for red."""
    i = list(BLOCK_COLORS).index(color)
    return slice(4 + 3 * i, 7 + 3 * i)


def button_index(color: str) -> slice:
    """State entries (3,) of the named button cap's position."""
    i = list(BUTTON_COLORS).index(color)
    return slice(21 + 3 * i, 24 + 3 * i)
