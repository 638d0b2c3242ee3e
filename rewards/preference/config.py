"""The schema of ``embodied prefer`` (``PreferConfig``), and the contract every learner meets
(``Learner``), registered by name in ``LEARNERS`` (``learner=NAME`` picks one; the learners'
modules register themselves, ``embodied.runtime.prefer`` imports them all)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

from embodied.core.reward import RewardModel
from rewards.preference.model import RewardConfig
from rewards.preference.queries import SCHEDULES, SELECTIONS, check_choice
from rewards.preference.segments import Trajectory
from rewards.preference.store import ON_MALFORMED
from rewards.preference.teachers import PRESETS

ACTIONS = ("run", "eval", "plot")
TEACHERS = (*PRESETS, "vlm", "human")
STEER_DEFAULTS = {"utd": 2}  # learner=steer: the SteerConfig fields it sets unless told otherwise
DEFAULT_TASK = "press-button"  # the task when none of task=, tasks=, suite= is given (the figures' recipe)


@dataclass
class PreferConfig:
    """Schema of ``configs/prefer.yaml``."""

    action: str = "run"  # run | eval | plot
    # the tasks, one of: task=NAME (default press-button), tasks=[A,B,...] or suite=NAME (all its tasks).
    # Several tasks learn one reward for all of them, the instruction in its input (reward.text)
    task: str = ""
    tasks: list[str] = field(default_factory=list)
    suite: str = ""
    teacher: str = "oracle"  # a B-Pref preset (oracle, stochastic, mistake, skip, equal, myopic), vlm or human
    beta: Optional[float] = None  # override the preset's rationality (B-Pref β)
    gamma: Optional[float] = None  # ... its myopic discount
    eps: Optional[float] = None  # ... its mistake probability
    skip: Optional[float] = None  # ... its skip threshold (fraction of the segment-return margin)
    equal: Optional[float] = None  # ... its equal threshold (fraction of the margin)
    vlm_reward: str = ""  # teacher=vlm: a rewards.registry name (clip) or "module:factory" of a frame RewardModel
    vlm_settings: dict[str, Any] = field(default_factory=dict)  # teacher=vlm: +vlm_settings.checkpoint=DIR
    abstain: float = 0.0  # teacher=vlm: skip when the two clips' scores differ by less than this
    labels: str = ""  # label store directory (reused and extended); default <run dir>/labels
    labels_on_malformed: str = "raise"  # raise (name each bad line) | quarantine (move them aside)
    budget: int = 300  # labels asked in this run
    rounds: int = 6
    schedule: str = "constant"  # constant | hyperbolic | inverse_quadratic
    selection: str = "disagreement"  # uniform | disagreement | entropy
    oversample: int = 10  # candidate pairs per label asked
    segment_length: int = 25  # steps per segment
    episodes_per_round: int = 3  # learner episodes per round (the ranking learner plays each with every candidate)
    reward: RewardConfig = field(default_factory=RewardConfig)
    learner: str = "ranking"  # ranking (best-of-K selection) | steer (latent-noise steering of a checkpoint)
    candidates: int = 8  # ranking learner: behaviours per episode
    checkpoint: str = ""  # learner=steer: the flow/diffusion checkpoint of `embodied train` to steer
    steer_env_steps: int = 10_000  # learner=steer: env steps of steering, with the learned and the ground-truth reward
    steer_ground_truth: str = "sparse"  # learner=steer: the ground-truth reward it is compared with (sparse | dense)
    steer_reference: str = ""  # learner=steer: a finished ground-truth `embodied steer` run to reuse (same settings)
    # learner=steer: also steer with the constant reward under the same episode ends (time limit
    # only), the control a learned-reward result stands beside
    steer_control: bool = True
    steer_eval_every: int = 2500  # learner=steer: env steps between evaluations of the curve
    steer_eval_episodes: int = 20  # learner=steer: episodes per task and wording split at each curve point
    # learner=steer: the noise policy's SteerConfig fields (`embodied prefer` types it as SteerConfig)
    steer: dict[str, Any] = field(default_factory=lambda: dict(STEER_DEFAULTS))
    pebble_unsup_steps: int = 1000  # learner=pebble: env steps of unsupervised pre-training (state entropy)
    pebble_knn: int = 5  # learner=pebble: k of the k-NN particle entropy estimate
    pebble_ground_truth: str = "dense"  # learner=pebble: the reward of the SAC it is compared with (dense | sparse)
    pebble_learning_starts: int = 500  # learner=pebble: SAC's random-action steps before its first update
    heldout_episodes: int = 10
    heldout_pairs: int = 400
    eval_episodes: int = 30
    render: bool = False  # record frames (forced on for the vlm and human teachers and image rewards)
    render_size: int = 64  # side of recorded frames (teacher=vlm: the reward's own, when it says)
    render_camera: str = ""  # camera of recorded frames (default: the task's; teacher=vlm: the reward's own)
    # anti-aliasing of recorded frames (make_env's supersample; teacher=vlm: the reward's own). It
    # draws every frame of the env, a pixel policy's observation images too
    render_supersample: int = 1
    port: int = 8765  # teacher=human: the label page's port (loopback)
    seed: int = 0
    reward_path: str = ""  # action=eval: a reward written by `embodied prefer` (reward.pt)
    runs: list[str] = field(default_factory=list)  # action=plot: run directories
    out: str = ""  # action=plot: the figure's path; default <run dir>/curve.png

    def __post_init__(self) -> None:
        given = [k for k in ("task", "tasks", "suite") if getattr(self, k)]
        if len(given) > 1:
            raise ValueError("give one of task=NAME, tasks=[A,B,...] or suite=NAME (the tasks to learn a reward "
                             f"for), got {' and '.join(given)}")
        if not given:
            self.task = DEFAULT_TASK
        self.tasks = list(self.tasks)
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks={self.tasks} names a task twice: give each task once")
        check_choice("action", self.action, ACTIONS)
        check_choice("teacher", self.teacher, TEACHERS)
        check_choice("learner", self.learner, tuple(LEARNERS))
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("selection", self.selection, SELECTIONS)
        check_choice("labels_on_malformed", self.labels_on_malformed, ON_MALFORMED)
        self._at_least(1, "rounds", "oversample", "segment_length", "episodes_per_round", "candidates",
                       "heldout_episodes", "heldout_pairs", "eval_episodes")
        if self.budget < 0 or self.seed < 0:
            raise ValueError(f"budget and seed must be >= 0, got budget={self.budget}, seed={self.seed}")
        if self.teacher == "vlm" and not self.vlm_reward:
            from rewards.registry import REWARDS

            raise ValueError(f"teacher=vlm needs vlm_reward=NAME (one of {sorted(REWARDS)}, with vlm_settings="
                             "{checkpoint:DIR}) or vlm_reward=module:factory (a callable returning a frame "
                             "RewardModel)")
        if self.action == "eval" and not self.reward_path:
            raise ValueError("`embodied prefer eval` needs reward_path=PATH (the reward.pt of a prefer run)")
        if self.action == "plot" and not self.runs:
            raise ValueError("`embodied prefer plot` needs runs=[DIR,...] (prefer run directories)")
        if isinstance(self.reward, dict):
            self.reward = RewardConfig(**self.reward)
        if self.learner == "steer":
            if not self.checkpoint:
                raise ValueError("learner=steer needs checkpoint=RUN/checkpoint (a flow or diffusion policy of "
                                 "`embodied train`)")
            check_choice("steer_ground_truth", self.steer_ground_truth, ("sparse", "dense"))
            self._at_least(1, "steer_env_steps", "steer_eval_episodes")
            self._at_least(0, "steer_eval_every")
        if self.learner == "pebble":
            if len(self.tasks) > 1 or self.suite:
                raise ValueError("learner=pebble trains SAC in one task's action space: give task=NAME (several "
                                 "tasks learn one reward with learner=steer or learner=ranking)")
            check_choice("pebble_ground_truth", self.pebble_ground_truth, ("sparse", "dense"))
            self._at_least(0, "pebble_unsup_steps", "pebble_learning_starts")
            self._at_least(1, "pebble_knn")
        if self.learner in ("steer", "pebble"):
            if self.reward.input != "state":
                raise ValueError(f"learner={self.learner} learns with a state reward (the privileged state of each "
                                 f"step): reward.input must be 'state', got {self.reward.input!r}")

    def _at_least(self, low: int, *names: str) -> None:
        """Refuse any of the options ``names`` below ``low``, naming each one and its value."""
        bad = [f"{n} must be >= {low}, got {getattr(self, n)}" for n in names if int(getattr(self, n)) < low]
        if bad:
            raise ValueError("; ".join(bad))

    @property
    def task_names(self) -> list[str]:
        """The run's tasks: ``[task]``, ``tasks`` or the suite's (each checked against the registry)."""
        from embodied.core.registry import resolve_tasks

        return resolve_tasks(self.suite or None, self.tasks or ([self.task] if self.task else None))

    @property
    def task_label(self) -> str:
        """The tasks as one label for metrics and figures: the task, the suite or ``a,b,...``."""
        return self.task or self.suite or ",".join(self.tasks)

    @property
    def needs_frames(self) -> bool:
        return self.render or self.teacher in ("vlm", "human") or self.reward.input == "image"


class Learner(Protocol):
    """What improves a policy with a reward, registered by name in ``LEARNERS``.

    ``rollout`` plays the learner's policy and returns its episodes (privileged states, actions,
    ground-truth rewards, frames when asked); ``improve`` updates it with ``reward`` (any
    ``RewardModel``, read through the contract only); ``evaluate`` compares the policy improved
    with the learned reward to one improved with the ground-truth reward for the same number of
    env steps. ``evaluate`` returns at least ``success_learned``, ``success_ground_truth``,
    ``success_before``, ``episodes`` and ``env_steps``. A learner with an ``out`` attribute gets
    the run directory there (for what it writes).
    """

    env_steps: int  # environment steps taken so far (the x-axis of a fair comparison)

    def rollout(self, episodes: int) -> list[Trajectory]:
        """Play ``episodes`` new episodes with the current policy: the data queries are drawn from."""

    def improve(self, reward: RewardModel) -> dict[str, Any]:
        """Update the policy with the (new) reward; return what to log."""

    def evaluate(self, episodes: int, reward: RewardModel) -> dict[str, Any]:
        """Success of the policy improved with ``reward``, of the same with the ground-truth reward,
        and of the policy before improvement, on the same held-out seeds and env steps."""


LearnerFactory = Callable[[PreferConfig, bool], Learner]  # (cfg, record frames) -> Learner
#: learners by name; ``learner=NAME`` picks one (each learner's module registers it)
LEARNERS: dict[str, LearnerFactory] = {}


def register_learner(name: str) -> Callable[[LearnerFactory], LearnerFactory]:
    def add(factory: LearnerFactory) -> LearnerFactory:
        LEARNERS[name] = factory
        return factory

    return add
