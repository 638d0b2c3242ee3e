"""Meta-World's wordings as ``INSTRUCTIONS[task] = (train, heldout)`` tuples.

The wordings are data: ``instructions.yaml`` beside this file (its header says how they were
written), read once by ``sim.instructions.load_instructions`` when ``sim.metaworld`` is
imported. This module only offers the tuple view for callers that index it that way.
"""

from __future__ import annotations

from sim.metaworld import INSTRUCTIONS as _TABLE

INSTRUCTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    task: (p.train, p.heldout) for task, p in _TABLE.items()}
