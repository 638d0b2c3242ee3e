"""Test set-up: choose the headless GL backend (and load triton) before anything else."""

import os

import sim  # noqa: F401  (configures MUJOCO_GL before mujoco is imported)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_report_header(config):
    return f"MUJOCO_GL={os.environ.get('MUJOCO_GL')}  EMBODIED_SLOW_BUDGET={os.environ.get('EMBODIED_SLOW_BUDGET', 'full')}"
