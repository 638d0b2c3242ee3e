"""``embodied prefer`` and ``embodied label`` wired to the preference room (``rewards.preference``),
with the learner that needs another room: ``steering`` (the ``steer`` learner, latent-noise
steering of a policy checkpoint with the learned reward; ``policies.steering`` through
``embodied steer``).

    embodied prefer task=press-button teacher=oracle                   # simulated teacher (B-Pref presets)
    embodied prefer task=press-button teacher=mistake labels=labels/pb  # reuse and extend a label store
    embodied prefer task=press-button teacher=human budget=40           # a person, on the label page
    embodied prefer task=press-button teacher=vlm vlm_reward=clip +vlm_settings.checkpoint=RUN/reward abstain=0.02
    embodied prefer task=reach learner=steer checkpoint=RUN/checkpoints/step_0000400 steer_env_steps=10000
    embodied prefer task=press-button learner=pebble pebble_unsup_steps=1000       # PEBBLE on SB3 SAC
    embodied prefer eval task=press-button reward_path=outputs/prefer/.../reward.pt
    embodied prefer plot runs=[outputs/prefer/a,outputs/prefer/b] out=curve.png

Learners (``LEARNERS``): ``ranking`` selects the best of K scripted candidate trajectories by the
learned reward (no policy is trained; ``rewards.preference.ranking``); ``pebble`` is PEBBLE on SAC
in raw action space (``rewards.preference.pebble``); ``steer`` trains a policy by latent-noise
steering of a checkpoint (``SteerLearner``, here). The loop, its schema and the labelling page are
the room's (``rewards.preference.loop``, ``.config``, ``.labels``).

What the commands call is re-exported here; importing the package registers every learner.
"""

from embodied.runtime.prefer.steering import SteerLearner
from rewards.preference import pebble, ranking  # noqa: F401  (importing a learner's module registers it)
from rewards.preference.config import ACTIONS, LEARNERS, PreferConfig
from rewards.preference.labels import LabelConfig, serve_labels
from rewards.preference.loop import evaluate_reward, run_prefer
from rewards.preference.report import plot_runs

__all__ = ["ACTIONS", "LEARNERS", "LabelConfig", "PreferConfig", "SteerLearner", "evaluate_reward", "plot_runs",
           "run_prefer", "serve_labels"]
