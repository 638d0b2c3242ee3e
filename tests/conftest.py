"""Test set-up: choose the headless GL backend (and load triton) before anything else.

Under pytest-xdist (``-n``, set in pyproject.toml) each worker process, and every command a test
starts from it, runs torch and OpenMP on one thread: two workers that each used every core would
make each other's torch threads wait (OMP_NUM_THREADS is what ``embodied train threads=0`` then
follows, see ``embodied.runtime.train.default_threads``).
"""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"

import sim  # noqa: F401  (configures MUJOCO_GL before mujoco is imported)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_report_header(config):
    return f"MUJOCO_GL={os.environ.get('MUJOCO_GL')}  EMBODIED_SLOW_BUDGET={os.environ.get('EMBODIED_SLOW_BUDGET', 'full')}"


def pytest_collection_modifyitems(config, items):
    """The end-to-end runs (``slow``) first: under xdist a long test that starts last keeps one worker busy
    while the other has nothing left to take. The order within each group is kept."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
