"""Meta-World v3 adapter: the 50 Meta-World tasks under our names, env contract and suites.

Registers every Meta-World v3 task under Meta-World's own name (``reach-v3``, ...), with its
wordings from ``instructions.yaml`` beside this file, and the suites ``metaworld-mt10`` and
``metaworld-mt50`` (Meta-World's MT10/MT50 lists). The env class
(``sim.metaworld.world:MetaWorldEnv``) imports ``metaworld`` only when an env is built, so
registering costs nothing; the static lists are checked against the package by
``tests/test_metaworld.py``.
"""

from pathlib import Path

from embodied.core.registry import SuiteSpec, TaskSpec, register_suite, register_task
from sim.instructions import load_instructions
from sim.metaworld.tasks import ALL_TASKS, DESCRIPTIONS, MT10, MT50

DEFAULT_MAX_EPISODE_STEPS = 200  # Meta-World's own horizon is 500; ours is configurable per env
INSTRUCTIONS = load_instructions(Path(__file__).with_name("instructions.yaml"), tasks=ALL_TASKS)

for _name in ALL_TASKS:
    register_task(TaskSpec(
        name=_name, suite="metaworld", entry_point="sim.metaworld.world:MetaWorldEnv",
        train_instructions=INSTRUCTIONS[_name].train, heldout_instructions=INSTRUCTIONS[_name].heldout,
        max_episode_steps=DEFAULT_MAX_EPISODE_STEPS, description=DESCRIPTIONS[_name],
    ))

# Training recipe: 50 scripted demonstrations and 20 evaluation episodes per task, the protocol of
# the MLP baseline this suite is compared against (see the README), also from pixels; dropout on
# the instruction's words and features. MT50 (training | held-out wordings), batch 128 and 16k
# steps: 96.6% | 81.1% with 14 training wordings and no dropout, 97.3% | 87.5% with 30 and word
# dropout 0.2, 95.7% | 90.9% adding feature dropout 0.2, 96.6% | 92.1%, 95.9% | 90.3% and
# 95.8% | 91.6% (seeds 0, 1 and 2) with feature dropout 0.3. MT10 in 8k steps: 99.0% | 94.5% with
# word dropout, 99.0-100% | 94.5-96.5% (five runs) adding feature dropout 0.2; 0.3 gave
# 99.0% | 96.0% and 100% | 95.5%, 0.4 99.0% | 94.0%.
# Batch 256 for half the steps (lr 1.4e-3) sees as many samples in 16-22% less time (5,600-6,000
# samples/s against 4,700 on two cores) and did as well: MT50 96.6% | 89.2%, 95.1% | 91.8% and
# 95.7% | 92.1% (seeds 0, 1 and 2; at batch 128 96.6% | 92.1%, 95.4% | 89.7% and 95.8% | 91.6%),
# MT10 99.0% | 95.5%. Batch 512 for 2k steps (lr 2e-3) gave MT10 99.0% | 94.0%, so the recipe
# stops at 256. Pixels keep the pixel recipe's batch, steps and lr.
# Grounding unfamiliar wordings in the scene (policies/common/grounding.py; state observations
# only) brought held-out success close to the training figure (same checkpoints, evaluated again):
# MT50 89.2 -> 94.9%, 91.8 -> 94.7% and 92.1 -> 93.8% (seeds 0, 1 and 2), MT10 95.5 -> 99.5%
# (three runs, each 95.5% before); training wordings are acted on as given, so theirs do not move.
MT_TRAIN = {"demos": 50, "eval_episodes": 20, "batch_size": 256, "ground_instructions": True,
            "pixels": {"demos": 50, "policy": {"lr": 1e-3}},
            "policy": {"text_token_dropout": 0.2, "text_feature_dropout": 0.2, "lr": 1.4e-3}}
MT10_SUITE = register_suite(SuiteSpec("metaworld-mt10", MT10, "Meta-World v3 MT10: ten tasks",
                                      {**MT_TRAIN, "steps": 4000}))
MT50_SUITE = register_suite(SuiteSpec("metaworld-mt50", MT50, "Meta-World v3 MT50: all fifty tasks",
                                      {**MT_TRAIN, "steps": 8000,
                                       "policy": {**MT_TRAIN["policy"], "text_feature_dropout": 0.3}}))
