"""``embodied prefer``: learn a reward from preferences with any teacher, and improve a policy with it.

    embodied prefer task=press-button teacher=oracle                   # simulated teacher (B-Pref presets)
    embodied prefer task=press-button teacher=mistake labels=labels/pb  # reuse and extend a label store
    embodied prefer task=press-button teacher=human budget=40           # a person, on the label page
    embodied prefer task=press-button teacher=vlm vlm_reward=clip +vlm_settings.checkpoint=RUN/reward abstain=0.02
    embodied prefer task=reach learner=steer checkpoint=RUN/checkpoints/step_0000400 steer_env_steps=10000
    embodied prefer task=press-button learner=pebble pebble_unsup_steps=1000       # PEBBLE on SB3 SAC
    embodied prefer eval task=press-button reward_path=outputs/prefer/.../reward.pt
    embodied prefer plot runs=[outputs/prefer/a,outputs/prefer/b] out=curve.png

Learners (``LEARNERS``): ``ranking`` selects the best of K scripted candidate trajectories by the
learned reward (no policy is trained); ``steer`` trains a policy by latent-noise steering of a
checkpoint (``SteerLearner``); ``pebble`` is PEBBLE on SAC in raw action space (``PebbleLearner``).

One module per part, each importing only the ones above it:

- ``config``: the run's schema (``PreferConfig``), the ``Learner`` contract and its registry;
- ``episodes``: playing an episode into a ``Trajectory`` (padded to the time limit), behaviours;
- ``ranking``, ``steer_learner``, ``pebble``: the learners, each registered where it is defined;
- ``quality``: held-out reward quality and the figure of several runs;
- ``loop``: the round loop (``run_prefer``, read it top to bottom) and ``evaluate_reward``;
- ``labels``: ``embodied label``, the labelling page for a person.

Everything public is re-exported here; importing the package registers every learner.
"""

from embodied.runtime.prefer.config import (ACTIONS, LEARNERS, TEACHERS, Learner, LearnerFactory, PreferConfig,
                                            register_learner)
from embodied.runtime.prefer.episodes import (HELDOUT_SEED, candidate_behaviour, frame_env, policy_behaviour,
                                              rollout, trajectory_return)
from embodied.runtime.prefer.ranking import RankingLearner
from embodied.runtime.prefer.steer_learner import SteerLearner
from embodied.runtime.prefer.pebble import PebbleLearner, StateRewardEnv, knn_entropy_reward
from embodied.runtime.prefer.quality import oracle_targets, plot_runs, reward_quality
from embodied.runtime.prefer.loop import evaluate_reward, load_vlm, make_teacher, run_prefer
from embodied.runtime.prefer.labels import LabelConfig, record_queries, serve_labels

__all__ = ["ACTIONS", "HELDOUT_SEED", "LEARNERS", "TEACHERS", "LabelConfig", "Learner", "LearnerFactory",
           "PebbleLearner", "PreferConfig", "RankingLearner", "StateRewardEnv", "SteerLearner", "candidate_behaviour",
           "evaluate_reward", "frame_env", "knn_entropy_reward", "load_vlm", "make_teacher", "oracle_targets",
           "plot_runs", "policy_behaviour", "record_queries", "register_learner", "reward_quality", "rollout",
           "run_prefer", "serve_labels", "trajectory_return"]
