"""The ``steer`` learner: latent-noise steering (``embodied steer``) of a checkpoint with the learned reward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embodied.core.reward import RewardModel
from rewards.preference.config import PreferConfig, register_learner
from rewards.preference.episodes import HELDOUT_SEED, frame_env, policy_behaviour, rollout
from rewards.preference.model import PreferenceReward
from rewards.preference.segments import Trajectory


class SteerLearner:
    """Latent-noise steering (DSRL; ``embodied steer``) of a demonstration-trained checkpoint, with
    the learned reward and, for comparison, with the ground-truth reward.

    Two stages. ``rollout`` plays the checkpoint's own policy (its sampler's noise varies, so do
    its episodes): queries are cut from what the policy to be improved does. Once the reward is
    learned, ``evaluate`` steers the checkpoint from scratch for ``steer_env_steps`` env steps with
    it (``rewards.preference.model:load_reward``: the reward shifted below zero) and, on the same
    seeds, settings and env steps, with the ground-truth reward (``steer_ground_truth``; or reuses
    the finished run ``steer_reference``). Each is an ordinary ``embodied steer`` run, written under
    the prefer run's ``steer_learned/`` and ``steer_ground_truth/`` (metrics, curve, the steered
    checkpoint). The noise policy trains once, on the final reward, so there is no replay buffer to
    relabel between reward updates (the PEBBLE learner, ``learner=pebble``, relabels).

    Several tasks (``tasks=[...]``, ``suite=NAME``): query episode seed s plays task
    ``tasks[s % len(tasks)]`` (round robin) on its training wordings, recording its task and
    instruction; the learned reward, which reads each env's instruction, steers one noise policy
    across all of them (``SteerRunConfig(tasks=[...])``, suite-wide steering), as does the ground
    truth, and each run's per-task success is kept (``per_task_*``).

    Beside the two, ``steer_control`` steers with the constant reward under the same episode ends
    (time limit only), the control that shows whether the learned reward carries information. The
    learned-reward and control runs never see the simulator's success (``embodied steer`` makes their
    envs with ``end_on_success=False``); each reports ``reward_kind`` and ``episode_end``.

    ``env_steps`` counts the query episodes; the steering runs' own env steps are in ``evaluate``'s
    ``env_steps`` (equal for every reward).
    """

    def __init__(self, cfg: PreferConfig, frames: bool):
        from embodied.runtime.checkpoints import check_trained_task, load_for_eval, policy_env_kwargs

        self.cfg, self.frames = cfg, frames
        self.tasks = cfg.task_names
        self.policy = load_for_eval(cfg.checkpoint, "cpu")
        for task in self.tasks:  # before any label is asked for
            check_trained_task(self.policy, task, cfg.checkpoint)
        kw = policy_env_kwargs(self.policy, self.tasks)
        self.envs = {t: frame_env(t, frames, cfg.render_size, cfg.render_camera, cfg.render_supersample, **kw)
                     for t in self.tasks}
        self.env = self.envs[self.tasks[0]]
        self.onehot = self.policy.unwrapped.config.text_encoder == "onehot"
        self.next_seed, self.env_steps = cfg.seed, 0
        self.out: Path = Path(".")  # set by run_prefer to the run directory
        self.rounds = 0

    def rollout(self, episodes: int) -> list[Trajectory]:
        out = []
        for s in range(self.next_seed, self.next_seed + episodes):
            task = self.tasks[s % len(self.tasks)]
            t, steps = rollout(self.envs[task], s, policy_behaviour(self.policy, task if self.onehot else None),
                               self.frames, {"policy": "checkpoint", "task": task})
            self.env_steps += steps
            out.append(t)
        self.next_seed += episodes
        return out

    def improve(self, reward: RewardModel) -> dict[str, Any]:
        self.rounds += 1  # stage two (steering) runs once, in evaluate, on the final reward
        return {}

    def heldout(self, episodes: int) -> list[Trajectory]:
        """Episodes of held-out seeds played by the checkpoint: the distribution the reward steers
        on (reported as ``policy_*`` beside the candidates' coverage); not counted in env steps."""
        steps, seed = self.env_steps, self.next_seed
        self.next_seed = self.cfg.seed + HELDOUT_SEED
        try:
            return self.rollout(episodes)
        finally:
            self.env_steps, self.next_seed = steps, seed

    def _steer_config(self, reward: str, kwargs: dict[str, Any], episodes: int) -> Any:
        from embodied.runtime.steer import SteerRunConfig
        from policies.steering.config import SteerConfig

        c = self.cfg
        where = {"task": self.tasks[0]} if len(self.tasks) == 1 else {"tasks": list(self.tasks)}
        return SteerRunConfig(checkpoint=c.checkpoint, **where, reward=reward, reward_kwargs=kwargs,
                              env_steps=c.steer_env_steps, eval_every=c.steer_eval_every,
                              eval_episodes=c.steer_eval_episodes, final_episodes=episodes,
                              seed=c.seed, videos=0, progress=False, threads=1,
                              steer=c.steer if isinstance(c.steer, SteerConfig) else SteerConfig(**c.steer))

    def _reference(self, want: Any) -> dict[str, Any] | None:
        """The metrics of ``steer_reference`` if it is a finished run with the same settings."""
        import json

        if not self.cfg.steer_reference:
            return None
        p = Path(self.cfg.steer_reference) / "metrics.json"
        if not p.is_file():
            raise FileNotFoundError(f"steer_reference={self.cfg.steer_reference!r} holds no metrics.json: give the "
                                    "directory of a finished `embodied steer` run")
        m = json.loads(p.read_text())
        mine = {"checkpoint": want.checkpoint, "tasks": list(want.tasks) or [want.task], "reward": want.reward,
                "seed": want.seed, "final_episodes": want.final_episodes}
        theirs = {k: m.get(k) for k in mine}
        theirs["tasks"] = m.get("tasks") or [m.get("task")]  # (a run's metrics name its tasks; older ones its task)
        # a run records the learner's own seed, steer.seed + seed (`embodied steer` adds them)
        steer_cfg = {**vars(want.steer), "seed": want.steer.seed + want.seed, "net_arch": list(want.steer.net_arch)}
        if theirs != mine or m.get("steer") != steer_cfg or abs(m["env_steps"] - want.env_steps) > 2 * 8:
            raise ValueError(f"steer_reference={self.cfg.steer_reference!r} was run with other settings "
                             f"({theirs}, {m['env_steps']} env steps) than this comparison needs ({mine}, "
                             f"{want.env_steps} env steps, steer={steer_cfg})")
        return m

    def evaluate(self, episodes: int, reward: RewardModel) -> dict[str, Any]:
        from embodied.runtime.steer import steer

        path = self.out / "steer_reward.pt"
        if not isinstance(reward, PreferenceReward):
            raise ValueError(f"the steer learner steers with a learned PreferenceReward, got {type(reward).__name__}")
        reward.save(path)
        learned = steer(self._steer_config("rewards.preference.model:load_reward", {"path": str(path)}, episodes),
                        self.out / "steer_learned")
        gt_cfg = self._steer_config(self.cfg.steer_ground_truth, {}, episodes)
        truth = self._reference(gt_cfg) or steer(gt_cfg, self.out / "steer_ground_truth")
        runs = {"learned": learned, "ground_truth": truth}
        if self.cfg.steer_control:
            runs["control"] = steer(self._steer_config("constant", {}, episodes), self.out / "steer_control")
        out: dict[str, Any] = {"tasks": self.tasks, "success_before": learned["success_before"],
                               "heldout_before": learned.get("heldout_before"),
                               "per_task_before": learned.get("per_task_before"), "episodes": episodes,
                               "env_steps": learned["env_steps"], "query_env_steps": self.env_steps,
                               "ground_truth": self.cfg.steer_ground_truth}
        for name, m in runs.items():
            out.update({f"success_{name}": m["success_after"], f"heldout_{name}": m["heldout_after"],
                        f"per_task_{name}": m.get("per_task_after"), f"curve_{name}": m["curve"],
                        f"reward_kind_{name}": m.get("reward_kind"), f"episode_end_{name}": m.get("episode_end"),
                        f"steer_{name}": str(self.out / f"steer_{name}")})
            if name != "learned":
                out[f"env_steps_{name}"] = m["env_steps"]
        if self.cfg.steer_reference:
            out["steer_ground_truth"] = self.cfg.steer_reference
        gt = out["success_ground_truth"]
        out["ratio"] = out["success_learned"] / gt if gt else None
        out.update(gains(out))
        return out


def gains(m: dict[str, Any]) -> dict[str, float | None]:
    """Each steering run's gain over the base on training wordings, and the learned reward's gain as a
    fraction of the ground truth's (``gain_ratio``, the issue's figure: 1 is the oracle's gain);
    ``gain_over_control``: the learned reward's gain minus the constant-reward control's."""
    before = m["success_before"]
    out: dict[str, float | None] = {}
    for name in ("learned", "ground_truth", "control"):
        if m.get(f"success_{name}") is not None and before is not None:
            out[f"gain_{name}"] = m[f"success_{name}"] - before
    g, t = out.get("gain_learned"), out.get("gain_ground_truth")
    out["gain_ratio"] = g / t if g is not None and t else None
    c = out.get("gain_control")
    out["gain_over_control"] = g - c if g is not None and c is not None else None
    return out


@register_learner("steer")
def _steer(cfg: PreferConfig, frames: bool) -> SteerLearner:
    return SteerLearner(cfg, frames)
