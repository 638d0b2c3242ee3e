"""Config of latent-noise steering: the noise action space and the RL algorithm on it.

One dataclass, ``SteerConfig``; Hydra's ``configs/steer/<name>.yaml`` only names the
algorithm and overrides fields (``embodied steer steer=na steer.utd=2``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from policies.common.config import check_choice, check_float, check_int

#: the noise policies: SB3 algorithms on the noise space, or the noise-aliasing loop (``na.py``)
ALGORITHMS = ("sac", "td3", "ppo", "na")
NOISE_MODES = ("full", "shared")
NA_TARGETS = ("decode", "noise_critic")


@dataclass
class SteerConfig:
    """Latent-noise steering settings (DSRL, Wagenmaker et al. 2025).

    Attributes:
        algo: ``"sac"`` (DSRL-SAC, the default), ``"td3"``, ``"ppo"`` (stable-baselines3 on
            the noise space) or ``"na"`` (DSRL-NA: noise aliasing, ``policies.steering.na``).
        noise: ``"full"``: one noise value per (chunk step, action dim) for the first
            ``noise_steps`` steps of the chunk (the rest of the chunk's noise is 0);
            ``"shared"``: one (Da,) noise repeated over every step of the chunk.
        noise_steps: chunk steps the ``full`` noise covers, from Ta to H; 0 means H.
        bound: the noise action space is the box [-bound, bound]^Dw.
        net_arch: hidden widths of the actor and critic MLPs.
        utd: update-to-data ratio, gradient steps per collected noise transition (SB3's
            ``gradient_steps`` = utd x num_envs; ignored by PPO).
        batch_size: minibatch size of every update.
        learning_rate: Adam step size of actor and critics.
        gamma: discount per noise step (one executed chunk).
        tau: target-network averaging rate (SAC, TD3, NA).
        buffer_size: replay capacity in noise transitions.
        learning_starts: noise transitions collected with the base policy's own noise,
            N(0, I) clipped to the bound, before the first update (SAC, TD3, NA).
        ent_coef: SAC's entropy coefficient, ``"auto"`` or ``"auto_0.1"`` (tuned, from an
            initial value; ``"auto"`` starts at 1) or a number; NA's actor uses the same rule.
            Start small: a noise policy has Dw dimensions of entropy, whose bonus at a
            coefficient of 1 outweighs a reward of at most 1 per step.
        target_entropy: the entropy the tuned coefficient aims at, in nats (None: SB3's
            -Dw). DSRL's 0 keeps the noise policy from collapsing onto the bound early.
        reward_offset: subtracted from every noise step's reward before the learner sees it.
            1 turns the sparse success reward into -1 per step until success (DSRL's
            ``reward_offset``); without it, SAC's entropy bonus pays for staying alive and the
            agent learns to avoid the success that ends its episode.
        prior_coef: subtracted from every noise step's reward, times the mean squared noise the
            learner played (SAC, TD3, PPO): a pull towards the prior's mode, the zero noise, which
            the learner leaves only where the reward pays for it. 0 turns it off.
        action_noise: TD3's Gaussian exploration noise, as a fraction of ``bound``.
        n_steps: PPO's rollout length per env; ``n_epochs``: its passes over a rollout.
        na_target: DSRL-NA's bootstrap: ``"decode"`` (the paper's: Q^A of the decoded next
            chunk, one decode of the minibatch per update) or ``"noise_critic"`` (Q^W of the
            next noise, which Q^W is trained to equal; no decode in the update).
        na_alias_samples: DSRL-NA: random noises decoded per collected state (in the same
            batch as the executed one) and kept as (state, noise, action) aliasing pairs for
            distilling the action critic into the noise critic.
        zero_init: zero the actor's output layer (its mean), so that the untrained noise
            policy plays exactly the zero noise, the flow's mode (what the flow recipe's
            policies play on their own), instead of the small noise of a default-initialised
            layer. Exploration (SAC's and NA's spread, TD3's action noise, the warm-up's prior
            noise) is unchanged.
        seed: seed of the noise policy's networks and exploration.
    """

    algo: str = "sac"
    noise: str = "full"
    noise_steps: int = 0
    bound: float = 1.5
    net_arch: tuple[int, ...] = (256, 256)
    utd: int = 4
    batch_size: int = 256
    learning_rate: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    buffer_size: int = 200_000
    learning_starts: int = 500
    ent_coef: str = "auto_0.01"
    target_entropy: Optional[float] = 0.0
    reward_offset: float = 1.0
    prior_coef: float = 0.0
    action_noise: float = 0.1
    n_steps: int = 256
    n_epochs: int = 10
    na_target: str = "decode"
    na_alias_samples: int = 4
    zero_init: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("algo", self.algo, ALGORITHMS)
        check_choice("noise", self.noise, NOISE_MODES)
        check_choice("na_target", self.na_target, NA_TARGETS)
        check_int("noise_steps", self.noise_steps, 0)
        check_float("bound", self.bound, 0.0, low_open=True)
        self.net_arch = tuple(self.net_arch)
        if not self.net_arch or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1
                                        for w in self.net_arch):
            raise ValueError(f"net_arch={self.net_arch!r} is not allowed: must be a non-empty list of ints >= 1")
        for name in ("utd", "batch_size", "buffer_size", "n_steps", "n_epochs"):
            check_int(name, getattr(self, name), 1)
        check_int("learning_starts", self.learning_starts, 0)
        check_int("na_alias_samples", self.na_alias_samples, 1)
        check_int("seed", self.seed, 0)
        if not isinstance(self.zero_init, bool):
            raise ValueError(f"zero_init={self.zero_init!r} is not allowed: must be true or false")
        check_float("learning_rate", self.learning_rate, 0.0, low_open=True)
        check_float("gamma", self.gamma, 0.0, 1.0)
        check_float("tau", self.tau, 0.0, 1.0, low_open=True)
        check_float("action_noise", self.action_noise, 0.0)
        check_float("reward_offset", self.reward_offset, -1e9)
        check_float("prior_coef", self.prior_coef, 0.0)
        if self.prior_coef and self.algo == "na":
            raise ValueError(f"prior_coef={self.prior_coef} is not allowed with algo=na: NA's critic scores "
                             "actions, not noise; use prior_coef=0 or algo=sac|td3|ppo")
        if self.target_entropy is not None:
            check_float("target_entropy", self.target_entropy, -1e9)
        self.ent_coef = str(self.ent_coef)
        if not (self.ent_coef == "auto" or self.ent_coef.startswith("auto_") or _is_number(self.ent_coef)):
            raise ValueError(f"ent_coef={self.ent_coef!r} is not allowed: must be 'auto', 'auto_<initial value>' "
                             "or a number")

    def noise_rows(self, horizon: int, n_action_steps: int) -> int:
        """Chunk steps the noise covers for a policy with these horizons (checks ``noise_steps``)."""
        if self.noise == "shared":
            return horizon
        rows = self.noise_steps or horizon
        if not n_action_steps <= rows <= horizon:
            raise ValueError(f"noise_steps={self.noise_steps} is not allowed for this policy: must be 0 (= H) or "
                             f"from Ta={n_action_steps} to H={horizon}")
        return rows


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
