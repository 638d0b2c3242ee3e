"""Preference-based reward learning: a person (or a model of one) says which of two clips is better.

Read top to bottom:

- ``segments``: trajectories, the fixed-length segments cut from them, query pairs;
- ``model``: the Bradley–Terry ensemble reward (state, state+action or image input), a ``RewardModel``;
- ``queries``: which pairs to ask about (uniform, disagreement, entropy) and a label schedule;
- ``store``: the append-only, crash-safe label store reused across runs (``labels=PATH``);
- ``teachers``: B-Pref's simulated teachers and a teacher from any frame-reading ``RewardModel``;
- ``server``: the labelling page for a person, and the human teacher that waits on it;
- ``config``: the schema of ``embodied prefer`` (``PreferConfig``), the ``Learner`` contract and its registry;
- ``episodes``: playing an episode into a ``Trajectory`` (padded to the time limit), behaviours;
- ``ranking``, ``pebble``: learners (best-of-K selection; PEBBLE on SB3 SAC), each registered where
  it is defined;
- ``loop``: the round loop (``run_prefer``, read it top to bottom), held-out reward quality and
  ``evaluate_reward``;
- ``labels``: ``embodied label``, recording queries and serving the labelling page;
- ``report``: the figure comparing runs.

Held-out preference accuracy and calibration (ECE) are in the shared ``rewards.quality``. The
``steer`` learner, which steers a policy checkpoint (another room), is wired in
``embodied.runtime.prefer``, which imports every learner.
"""
