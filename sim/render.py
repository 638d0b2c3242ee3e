"""Headless rendering that works without configuration, with fast visual settings.

``configure_gl()`` must run before ``mujoco`` is imported: MuJoCo picks its OpenGL
backend at import time from ``MUJOCO_GL``. We keep a user's choice; otherwise we probe
EGL in a short subprocess (so a broken driver cannot take this process down) and fall
back to OSMesa. Both ``MUJOCO_GL`` and ``PYOPENGL_PLATFORM`` are set, so child
processes (vector envs, Ray workers) inherit the choice without probing again.

A known clash: torch ships triton, whose bundled LLVM conflicts with the LLVM that Mesa
(OSMesa/llvmpipe) loads; a process that creates a GL context first and later imports
triton segfaults. Importing ``triton`` (not torch) before any GL library is loaded
avoids it, so we do that here when triton is installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Any

_PROBE = (
    "import mujoco;"
    "c = mujoco.GLContext(16, 16); c.make_current(); c.free()"
)
_configured = False


def _probe(backend: str) -> bool:
    env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def configure_gl() -> str:
    """Choose the OpenGL backend once per process tree; return its name."""
    global _configured
    if not _configured:
        if "triton" not in sys.modules and importlib.util.find_spec("triton") is not None:
            import triton  # noqa: F401  (see the module docstring: LLVM clash)
        backend = os.environ.get("MUJOCO_GL", "").lower()
        if not backend:
            if "mujoco" in sys.modules:
                backend = "egl"  # too late to choose; mujoco already picked its default
            elif sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):
                backend = "egl" if _probe("egl") else "osmesa"
            else:
                backend = "glfw"
            os.environ["MUJOCO_GL"] = backend
        if backend in ("egl", "osmesa"):
            os.environ.setdefault("PYOPENGL_PLATFORM", backend)
        _configured = True
    return os.environ["MUJOCO_GL"]


def fast_visuals(model: Any, max_size: int = 512) -> None:
    """Light visual settings, much cheaper to render on a CPU than MuJoCo's defaults.

    A 512 shadow map, no multisampling, and an offscreen buffer of ``max_size``.
    Shadows and reflections are switched off per renderer in ``make_renderer``.
    """
    model.vis.quality.shadowsize = 512
    model.vis.quality.offsamples = 0
    model.vis.global_.offwidth = max(int(model.vis.global_.offwidth), max_size)
    model.vis.global_.offheight = max(int(model.vis.global_.offheight), max_size)


def make_renderer(model: Any, height: int, width: int) -> Any:
    """A ``mujoco.Renderer`` with shadows and reflections off."""
    import mujoco

    fast_visuals(model, max(height, width))
    r = mujoco.Renderer(model, height, width)
    r.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
    r.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
    r.scene.flags[mujoco.mjtRndFlag.mjRND_SKYBOX] = False
    return r
