"""Meta-World v3 task names and benchmark lists, kept static so registration is cheap.

Importing ``metaworld`` is slow (it builds every environment class), and the
registry imports suite plugins on look-ups of unrelated names, so these lists are copied
here and ``tests/test_metaworld.py`` checks them against the installed package
(``metaworld.env_dict.ALL_V3_ENVIRONMENTS``, ``MT10_V3``, ``MT50_V3`` and
``metaworld.policies.ENV_POLICY_MAP``). Order follows the package.
"""

from __future__ import annotations

METAWORLD_VERSION = "3.1.1"  # the version these lists were checked against (pyproject pins it)

# metaworld.env_dict.ALL_V3_ENVIRONMENTS (== MT50_V3), in the package's order.
ALL_TASKS: tuple[str, ...] = (
    "assembly-v3", "basketball-v3", "bin-picking-v3", "box-close-v3",
    "button-press-topdown-v3", "button-press-topdown-wall-v3", "button-press-v3",
    "button-press-wall-v3", "coffee-button-v3", "coffee-pull-v3", "coffee-push-v3",
    "dial-turn-v3", "disassemble-v3", "door-close-v3", "door-lock-v3", "door-open-v3",
    "door-unlock-v3", "hand-insert-v3", "drawer-close-v3", "drawer-open-v3",
    "faucet-open-v3", "faucet-close-v3", "hammer-v3", "handle-press-side-v3",
    "handle-press-v3", "handle-pull-side-v3", "handle-pull-v3", "lever-pull-v3",
    "pick-place-wall-v3", "pick-out-of-hole-v3", "pick-place-v3", "plate-slide-v3",
    "plate-slide-side-v3", "plate-slide-back-v3", "plate-slide-back-side-v3",
    "peg-insert-side-v3", "peg-unplug-side-v3", "soccer-v3", "stick-push-v3",
    "stick-pull-v3", "push-v3", "push-wall-v3", "push-back-v3", "reach-v3",
    "reach-wall-v3", "shelf-place-v3", "sweep-into-v3", "sweep-v3", "window-open-v3",
    "window-close-v3",
)

# metaworld.env_dict.MT10_V3, in the package's order.
MT10: tuple[str, ...] = (
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3",
    "drawer-close-v3", "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3",
    "window-close-v3",
)

# metaworld.env_dict.MT50_V3 is ALL_V3_ENVIRONMENTS.
MT50: tuple[str, ...] = ALL_TASKS

# One line per task, after Meta-World's docs (docs/benchmark/task_descriptions.md), corrected
# where v3 differs from the prose (lever-pull raises the lever; push-back moves the puck toward
# the robot).
DESCRIPTIONS: dict[str, str] = {
    "assembly-v3": "pick up the nut by its handle and place it onto the peg",
    "basketball-v3": "pick up the ball and dunk it into the basket",
    "bin-picking-v3": "move the cube from one bin into the other bin",
    "box-close-v3": "pick up the lid and close the box with it",
    "button-press-topdown-v3": "press a button from the top",
    "button-press-topdown-wall-v3": "reach past a wall and press a button from the top",
    "button-press-v3": "press a button that faces the robot",
    "button-press-wall-v3": "reach past a wall and press a button that faces the robot",
    "coffee-button-v3": "press the button on the coffee machine",
    "coffee-pull-v3": "pull the mug out from under the coffee machine to a goal",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "rotate a dial",
    "disassemble-v3": "lift the nut off the peg",
    "door-close-v3": "swing a hinged door closed",
    "door-lock-v3": "lock the door by turning the lock down",
    "door-open-v3": "swing a hinged door open by its handle",
    "door-unlock-v3": "unlock the door by turning the lock",
    "hand-insert-v3": "insert the gripper into a hole in the table",
    "drawer-close-v3": "push a drawer closed",
    "drawer-open-v3": "pull a drawer open",
    "faucet-open-v3": "turn the faucet handle counter-clockwise",
    "faucet-close-v3": "turn the faucet handle clockwise",
    "hammer-v3": "pick up the hammer and drive the nail into the box",
    "handle-press-side-v3": "press a handle down, approached from the side",
    "handle-press-v3": "press a handle down",
    "handle-pull-side-v3": "pull a handle up, approached from the side",
    "handle-pull-v3": "pull a handle up",
    "lever-pull-v3": "rotate a lever up",
    "pick-place-wall-v3": "pick up a puck, lift it over a wall and place it at the goal",
    "pick-out-of-hole-v3": "pick a puck out of a hole and lift it to the goal",
    "pick-place-v3": "pick up a puck and place it at the goal",
    "plate-slide-v3": "slide a plate into the goal net",
    "plate-slide-side-v3": "slide a plate sideways into the goal net",
    "plate-slide-back-v3": "slide a plate out of the goal net back toward the robot",
    "plate-slide-back-side-v3": "slide a plate sideways out of the goal net",
    "peg-insert-side-v3": "pick up a peg and insert it sideways into a hole",
    "peg-unplug-side-v3": "pull a peg sideways out of its socket",
    "soccer-v3": "push a ball into the goal net",
    "stick-push-v3": "grasp a stick and push the thermos to the goal with it",
    "stick-pull-v3": "grasp a stick and pull the thermos to the goal with it",
    "push-v3": "push a puck to the goal",
    "push-wall-v3": "push a puck around a wall to the goal",
    "push-back-v3": "move a puck back toward the robot to the goal",
    "reach-v3": "move the gripper to the goal position",
    "reach-wall-v3": "move the gripper past a wall to the goal position",
    "shelf-place-v3": "pick up a puck and place it on the shelf",
    "sweep-into-v3": "sweep a puck into a hole in the table",
    "sweep-v3": "sweep a puck off the edge of the table",
    "window-open-v3": "slide a window open",
    "window-close-v3": "slide a window closed",
}
