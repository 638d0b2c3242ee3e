"""The contracts: specs, errors, the task registry, ``Policy``, ``Robot``, the env protocol and
``RewardModel``. The bottom layer: it imports nothing else of this project, nor torch or mujoco."""
