"""Can a DSRL-SAC critic tell good noise from bad? (docs/results/steering.md, "Why single-task steering stalls")

Evaluates a steered checkpoint (``embodied steer`` with ``steer=sac``) on the held-out seeds the
steer command's final evaluation uses, four ways:

- ``actor``: the deterministic noise actor, as deployed;
- ``prior-K``: per chunk, K noises from the base's prior N(0, I) clipped to the bound, the one
  with the highest min(Q1, Q2) of the saved critics;
- ``actor-K``: K samples of the stochastic actor (the first is its mean), ranked the same way;
- ``random-K``: one of the K prior noises at random (the base's own noise, the control).

    python3 docs/results/scripts/critic_rank.py RUN/checkpoint reach 8 200

Prints each row's success (training, held-out wordings) and writes them to RUN/critic_rank.json.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from embodied.runtime.checkpoints import load_for_eval
from embodied.runtime.evaluate import evaluate
from policies.steering.policy import SteeredPolicy


class RankedNoise:
    """A noise actor choosing, per row, the best of ``k`` candidates by the SAC critics' min(Q1, Q2)."""

    def __init__(self, actor, bound: float, k: int, source: str, rank: bool = True, seed: int = 0):
        self.policy, self.bound, self.k, self.source, self.rank = actor.policy, bound, k, source, rank
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, feats: np.ndarray) -> np.ndarray:
        pol, k = self.policy, self.k
        obs = torch.as_tensor(np.asarray(feats, np.float32))
        b = obs.shape[0]
        with torch.no_grad():
            obs_k = obs.repeat_interleave(k, 0)
            if self.source == "prior":
                w = torch.randn(b * k, pol.action_space.shape[0], generator=self.gen)
                scaled = torch.clamp(w, -self.bound, self.bound) / self.bound  # SB3's [-1, 1] action scale
            else:
                mean, log_std, _ = pol.actor.get_action_dist_params(obs_k)
                eps = torch.randn(mean.shape, generator=self.gen)
                eps[::k] = 0.0
                scaled = torch.tanh(mean + log_std.exp() * eps)
            if self.rank:
                q = torch.cat(pol.critic(obs_k, scaled), dim=1).min(dim=1).values.view(b, k)
                best = q.argmax(1)
            else:
                best = torch.randint(k, (b,), generator=self.gen)
            pick = scaled.view(b, k, -1)[torch.arange(b), best]
        return pol.unscale_action(pick.numpy())


def steered_part(policy):
    while not isinstance(policy, SteeredPolicy):
        policy = policy.policy
    return policy


def main(checkpoint: str, task: str, k: int, episodes: int) -> None:
    torch.set_num_threads(1)
    out = {}
    for name, source, rank in [("actor", None, True), (f"prior-{k}", "prior", True), (f"actor-{k}", "actor", True),
                               (f"random-{k}", "prior", False)]:
        policy = load_for_eval(checkpoint, device="cpu")
        steered = steered_part(policy)
        if source is not None:
            steered.actor = RankedNoise(steered.actor, steered.space.bound, k, source, rank)
        m, _ = evaluate(policy, [task], episodes=episodes, progress=False)
        row = m["per_task"][task]
        out[name] = [row["success_rate"], row["heldout"]["success_rate"]]
        print(f"{name:10s} training wordings {out[name][0]:.1%}  held-out wordings {out[name][1]:.1%}", flush=True)
    (Path(checkpoint).parent / "critic_rank.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
