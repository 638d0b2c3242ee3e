"""Preference-based reward learning: a person (or a model of one) says which of two clips is better.

Read top to bottom:

- ``segments``: trajectories, the fixed-length segments cut from them, query pairs;
- ``model``: the Bradley–Terry ensemble reward (state, state+action or image input), a ``RewardModel``;
- ``queries``: which pairs to ask about (uniform, disagreement, entropy) and a label schedule;
- ``store``: the append-only, crash-safe label store reused across runs (``labels=PATH``);
- ``teachers``: B-Pref's simulated teachers and a teacher from any frame-reading ``RewardModel``;
- ``server``: the labelling page for a person, and the human teacher that waits on it;
- held-out preference accuracy and calibration (ECE) are in the shared ``rewards.quality``.

The loop that ties them to an environment and a learner is ``embodied.runtime.prefer``.
"""
