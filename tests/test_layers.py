"""The layering of docs/architecture.md, enforced: import-linter's contracts (pyproject.toml) hold,
they break on a deliberate violation, and no module imports itself round a cycle (function-level
imports included)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("embodied", "sim", "policies", "rewards")


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """Run import-linter on the packages under ``tree`` (its own pyproject.toml), uncached."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = "from importlinter.cli import lint_imports_command; lint_imports_command(['--no-cache'])"
    return subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=120)


def copy_tree(dst: Path) -> Path:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


def test_import_contracts_hold():
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_a_sideways_import_breaks_the_layers(tmp_path):
    tree = copy_tree(tmp_path)
    render = tree / "sim" / "render.py"
    # a function-level import counts as much as one at the top
    render.write_text(render.read_text() + "\n\ndef _violation():\n    import policies.common.base  # noqa\n")
    r = lint_imports(tree)
    assert r.returncode == 1
    assert "BROKEN" in r.stdout and "sim.render -> policies.common.base" in r.stdout


def test_an_upward_import_breaks_the_layers(tmp_path):
    tree = copy_tree(tmp_path)
    specs = tree / "embodied" / "core" / "specs.py"
    specs.write_text(specs.read_text() + "\n\ndef _violation():\n    from embodied.runtime import evaluate  # noqa\n")
    r = lint_imports(tree)
    assert r.returncode == 1 and "embodied.core.specs -> embodied.runtime.evaluate" in r.stdout


def test_the_contracts_import_no_torch(tmp_path):
    tree = copy_tree(tmp_path)
    policy = tree / "embodied" / "core" / "policy.py"
    policy.write_text(policy.read_text() + "\n\ndef _violation():\n    import torch  # noqa\n")
    r = lint_imports(tree)
    assert r.returncode == 1 and "embodied.core.policy -> torch" in r.stdout


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in graph.modules or w.split(".")[0] not in PACKAGES:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for m in sorted(graph.modules):
        if m.split(".")[0] in PACKAGES and m not in index:
            visit(m)
    return sorted(found)


def package_edges_removed(graph: grimp.ImportGraph) -> grimp.ImportGraph:
    """A package's ``__init__`` importing its own submodules is how packages re-export, not a cycle."""
    for m in list(graph.modules):
        for w in list(graph.find_modules_directly_imported_by(m)):
            if w.startswith(m + "."):
                graph.remove_import(importer=m, imported=w)
    return graph


def test_no_import_cycles():
    graph = package_edges_removed(grimp.build_graph(*PACKAGES, cache_dir=None))
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    graph = package_edges_removed(grimp.build_graph(*PACKAGES, cache_dir=None))
    graph.add_import(importer="embodied.core.specs", imported="embodied.core.registry")
    graph.add_import(importer="embodied.core.registry", imported="embodied.core.specs")
    assert ["embodied.core.registry", "embodied.core.specs"] in cycles(graph)


def test_the_robot_side_bridge_imports_no_policy_code(tmp_path):
    tree = copy_tree(tmp_path)
    loop = tree / "embodied" / "bridge" / "loop.py"
    loop.write_text(loop.read_text() + "\n\ndef _violation():\n    import policies  # noqa\n")
    r = lint_imports(tree)
    assert r.returncode == 1 and "embodied.bridge.loop -> policies" in r.stdout
