"""Test set-up: choose the headless GL backend (and load triton) before anything else.

Each pytest-xdist worker (``-n``, set in pyproject.toml), and every command a test starts from it,
runs torch and OpenMP on one thread: two workers that each used every core would make each other's
torch threads wait (OMP_NUM_THREADS is what ``embodied train threads=0`` then follows, see
``embodied.runtime.train.default_threads``). ``-n 0`` runs the same way, so that the tests that
compare a run in this process with one in worker processes bit for bit see the same thread count.
"""

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import sim  # noqa: F401  (configures MUJOCO_GL before mujoco is imported)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_report_header(config):
    return f"MUJOCO_GL={os.environ.get('MUJOCO_GL')}  EMBODIED_SLOW_BUDGET={os.environ.get('EMBODIED_SLOW_BUDGET', 'full')}"


def pytest_collection_modifyitems(config, items):
    """The tests with wall-clock bounds (``timed``) first, in a worker that has run nothing else yet
    (one that has run hundreds of tests stalled them for hundreds of milliseconds); then the end-to-end
    runs (``slow``): under xdist a long test that starts last keeps one worker busy while the other has
    nothing left to take. The order within each group is kept."""
    items.sort(key=lambda item: (item.get_closest_marker("timed") is None, item.get_closest_marker("slow") is None))


def built_once(tmp_path_factory, name: str, build):
    """``build(folder) -> dict`` (JSON) run once per test session, whichever xdist worker asks first.

    A module-scoped fixture runs once in each worker that takes one of its module's tests; for a
    fixture that launches training runs, the second worker would repeat minutes of work. Here the
    first worker builds into a folder shared by all workers (under a file lock) and the others
    wait for it and read what it returned.
    """
    import json

    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    folder, done = root / f"built-{name}", root / f"built-{name}.json"
    with FileLock(str(root / f"built-{name}.lock")):
        if not done.exists():
            folder.mkdir(exist_ok=True)
            done.write_text(json.dumps(build(folder)))
    return folder, json.loads(done.read_text())
