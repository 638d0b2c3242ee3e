"""MuJoCo worlds behind gymnasium: tasks given by natural-language instructions.

This package must not import torch. Importing it chooses a headless OpenGL backend
(see ``sim.render``) before MuJoCo is loaded.
"""

from sim.render import configure_gl

configure_gl()
