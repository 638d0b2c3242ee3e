"""DSRL-NA: latent-noise steering by noise aliasing (Wagenmaker et al. 2025), in one loop.

Three networks on the frozen policy's features f (C,):

    Q^A(f, a)  action critic on the executed part a (Ta x Da) of a chunk, two heads, by TD:
               y = r + gamma (1 - terminated) [min_j Q^A_targ,j(f', a') - alpha log pi(w'|f')]
               a' = decode(f', w'), w' ~ pi^W(f')     (na_target="decode", the paper's target)
               or  Q^W(f', w') in place of Q^A_targ(f', a')   (na_target="noise_critic": no decode)
    Q^W(f, w)  noise critic, regressed onto min_j Q^A,j(f, decode(f, w)) on aliasing pairs
               (f, w, decode(f, w)), w ~ N(0, I) clipped to the bound (decoded while collecting,
               in the env's own batch, so an update decodes nothing), plus the executed pairs
    pi^W(f)    tanh-Gaussian noise actor in [-bound, bound]^Dw, maximising Q^W - alpha log pi,
               alpha tuned to ``cfg.target_entropy`` (as SAC)

Because Q^A lives in action space, any action-space data trains it: ``add_transitions``
takes demonstrations (``expert_transitions`` plays a task's scripted expert chunk by chunk).
The noise critic is what lets the actor improve on actions it could never have sampled.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from policies.steering.config import NA_TARGETS, SteerConfig
from policies.steering.env import ChunkRunner, NoiseVecEnv, make_reward
from policies.steering.noise import NoiseSpace, decode_features, features
from policies.steering.policy import NoiseActor
from policies.steering.progress import Progress

LOG_STD = (-5.0, 2.0)


def mlp(inp: int, arch: tuple[int, ...] | list[int], out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for w in arch:
        layers += [nn.Linear(inp, w), nn.ReLU()]
        inp = w
    return nn.Sequential(*layers, nn.Linear(inp, out))


class Critic(nn.Module):
    """``heads`` Q-networks on (f, x) -> (heads, B)."""

    def __init__(self, inp: int, arch: tuple[int, ...], heads: int = 2):
        super().__init__()
        self.nets = nn.ModuleList([mlp(inp, arch, 1) for _ in range(heads)])

    def forward(self, f: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        z = torch.cat([f, x], dim=-1)
        return torch.stack([n(z).squeeze(-1) for n in self.nets])


def zero_(layer: nn.Linear) -> None:
    """Zero a layer's weights and bias: its output is 0 until an update moves it."""
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.zero_()


class GaussianActor(nn.Module):
    """Features (B, C) -> tanh-squashed Gaussian noise in [-bound, bound]^Dw."""

    def __init__(self, feature_dim: int, dim: int, arch: tuple[int, ...], bound: float):
        super().__init__()
        self.trunk = mlp(feature_dim, arch[:-1], arch[-1])
        self.mu, self.log_std = nn.Linear(arch[-1], dim), nn.Linear(arch[-1], dim)
        self.bound = float(bound)

    def forward(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.trunk(f))
        return self.mu(h), self.log_std(h).clamp(*LOG_STD)

    def sample(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised sample (B, Dw) and its log-probability (B,)."""
        mu, log_std = self(f)
        u = mu + log_std.exp() * torch.randn_like(mu)
        logp = torch.distributions.Normal(mu, log_std.exp()).log_prob(u).sum(-1)
        logp = logp - (2 * (np.log(2.0) - u - nn.functional.softplus(-2 * u))).sum(-1)  # tanh's Jacobian
        return self.bound * torch.tanh(u), logp - mu.shape[-1] * np.log(self.bound)

    def mean(self, f: torch.Tensor) -> torch.Tensor:
        return self.bound * torch.tanh(self(f)[0])


class MLPActor(NoiseActor):
    """The deterministic action (tanh of the mean) of a ``GaussianActor`` as a noise actor."""

    kind = "mlp"

    def __init__(self, net: GaussianActor, net_arch: tuple[int, ...]):
        self.net, self.net_arch = net, tuple(net_arch)

    @torch.no_grad()
    def __call__(self, feats: np.ndarray) -> np.ndarray:
        p = next(self.net.parameters())
        return self.net.mean(torch.as_tensor(np.asarray(feats, np.float32), device=p.device)).cpu().numpy()

    def describe(self) -> dict[str, Any]:
        return {"net_arch": list(self.net_arch)}

    def tensors(self) -> dict[str, Any]:
        return dict(self.net.state_dict())

    def load_tensors(self, tensors: Mapping[str, Any]) -> None:
        self.net.load_state_dict(dict(tensors), strict=True)

    @classmethod
    def restore(cls, meta: Mapping[str, Any], tensors: Mapping[str, Any], space: NoiseSpace,
                feature_dim: int) -> "MLPActor":
        arch = tuple(int(w) for w in meta.get("net_arch", ()))
        if not arch:
            raise ValueError("steering actor 'mlp' needs its net_arch in steering.json")
        net = GaussianActor(feature_dim, space.dim, arch, space.bound)
        try:
            net.load_state_dict(dict(tensors), strict=True)
        except RuntimeError as e:
            raise ValueError(f"the saved mlp steering weights do not fit net_arch={list(arch)}: {e}") from None
        return cls(net.eval(), arch)


class Replay:
    """A ring buffer of named float32 arrays, one row per item."""

    def __init__(self, capacity: int, shapes: Mapping[str, tuple[int, ...]]):
        self.data = {k: np.zeros((capacity, *s), np.float32) for k, s in shapes.items()}
        self.capacity, self.size, self.pos = capacity, 0, 0

    def add(self, **rows: np.ndarray) -> None:
        n = len(next(iter(rows.values())))
        idx = (self.pos + np.arange(n)) % self.capacity
        for k, v in rows.items():
            self.data[k][idx] = v
        self.pos, self.size = (self.pos + n) % self.capacity, min(self.capacity, self.size + n)

    def sample(self, n: int, rng: np.random.Generator, device: torch.device) -> dict[str, torch.Tensor]:
        idx = rng.integers(0, self.size, n)
        return {k: torch.as_tensor(v[idx], device=device) for k, v in self.data.items()}


def polyak(target: nn.Module, source: nn.Module, tau: float) -> None:
    with torch.no_grad():
        for t, s in zip(target.parameters(), source.parameters()):
            t.mul_(1 - tau).add_(s, alpha=tau)


class NoiseAliasing:
    """DSRL-NA on a ``NoiseVecEnv`` built with ``alias_samples = cfg.na_alias_samples``.

    Args:
        env: the noise env (its policy is the frozen one decoded through).
        cfg: steering config (``net_arch``, ``utd``, ``batch_size``, ``learning_rate``,
            ``gamma``, ``tau``, ``buffer_size``, ``learning_starts``, ``ent_coef``, ``na_target``, ``seed``).
        log: optional ``log(name, value, step)`` for TensorBoard scalars.
    """

    def __init__(self, env: NoiseVecEnv, cfg: SteerConfig, log: Any = None):
        target = cfg.na_target
        if target not in NA_TARGETS:
            raise ValueError(f"na_target={target!r} is not allowed: must be one of {NA_TARGETS}")
        if env.alias_samples < 1:
            raise ValueError("DSRL-NA needs a NoiseVecEnv with alias_samples >= 1 (cfg.na_alias_samples)")
        self.env, self.cfg, self.target, self.log = env, cfg, target, log
        self.space: NoiseSpace = env.space
        self.policy = env.policy
        torch.manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.device = torch.device("cpu")
        c = int(env.observation_space.shape[0])
        self.ta, self.da = env.policy.n_action_steps, self.space.action_dim
        adim, wdim, arch = self.ta * self.da, self.space.dim, tuple(cfg.net_arch)
        self.qa, self.qw = Critic(c + adim, arch), Critic(c + wdim, arch, heads=1)
        self.qa_targ = copy.deepcopy(self.qa).requires_grad_(False)
        self.actor = GaussianActor(c, wdim, arch, self.space.bound)
        if cfg.zero_init:
            zero_(self.actor.mu)
        lr = cfg.learning_rate
        self.opt_qa = torch.optim.Adam(self.qa.parameters(), lr)
        self.opt_qw = torch.optim.Adam(self.qw.parameters(), lr)
        self.opt_pi = torch.optim.Adam(self.actor.parameters(), lr)
        init = float(cfg.ent_coef.split("_")[1]) if cfg.ent_coef.startswith("auto_") else \
            (1.0 if cfg.ent_coef == "auto" else float(cfg.ent_coef))
        self.log_alpha = torch.tensor(np.log(init), dtype=torch.float32, requires_grad=cfg.ent_coef.startswith("auto"))
        self.opt_alpha = torch.optim.Adam([self.log_alpha], lr)
        self.target_entropy = -float(wdim) if cfg.target_entropy is None else float(cfg.target_entropy)
        self.replay = Replay(cfg.buffer_size, {"f": (c,), "a": (adim,), "r": (), "f2": (c,), "term": ()})
        self.alias = Replay(cfg.buffer_size * (env.alias_samples + 1), {"f": (c,), "w": (wdim,), "a": (adim,)})
        self.updates, self.collected = 0, 0

    # ---- data -----------------------------------------------------------------------------
    def add_transitions(self, f: np.ndarray, a: np.ndarray, r: np.ndarray, f2: np.ndarray, term: np.ndarray) -> None:
        """Action-space transitions (demonstrations, other policies' data) for Q^A: features
        (N, C), executed actions (N, Ta, Da) or (N, Ta*Da), rewards (N,), next features (N, C),
        terminated (N,) (a truncated episode is not terminated); ``cfg.reward_offset`` is
        subtracted from the rewards here."""
        n = len(f)
        r = np.asarray(r, np.float32) - self.cfg.reward_offset
        self.replay.add(f=f, a=np.asarray(a, np.float32).reshape(n, -1), r=r, f2=f2, term=np.asarray(term, np.float32))

    def _store(self, f: np.ndarray, w: np.ndarray, r: np.ndarray, f2: np.ndarray, dones: np.ndarray,
               infos: list[dict[str, Any]]) -> None:
        real_f2 = np.stack([i["terminal_observation"] if d else f2[j] for j, (d, i) in enumerate(zip(dones, infos))])
        term = np.array([d and not i.get("TimeLimit.truncated", False) for d, i in zip(dones, infos)], np.float32)
        chunk = np.stack([i["chunk"] for i in infos])
        self.add_transitions(f, chunk, r, real_f2, term)
        k = self.env.alias_samples
        wa = np.concatenate([w[:, None], np.stack([i["alias_noise"] for i in infos])], axis=1)
        aa = np.concatenate([chunk[:, None], np.stack([i["alias_chunk"] for i in infos])], axis=1)
        self.alias.add(f=np.repeat(f, k + 1, axis=0), w=wa.reshape(-1, wa.shape[-1]),
                       a=aa.reshape(len(f) * (k + 1), -1))

    # ---- updates ----------------------------------------------------------------------------
    def _next_value(self, f2: torch.Tensor) -> torch.Tensor:
        """min_j Q^A_targ(f', decode(f', w')) - alpha log pi(w'|f') (or Q^W in place of Q^A), (B,)."""
        w2, logp2 = self.actor.sample(f2)
        if self.target == "decode":
            noise = torch.as_tensor(self.space.to_chunk(w2.cpu().numpy()))
            a2 = decode_features(self.policy, f2, noise)[:, : self.ta].reshape(len(f2), -1).to(self.device)
            q = self.qa_targ(f2, a2).min(0).values
        else:
            q = self.qw(f2, w2)[0]
        return q - self.log_alpha.exp() * logp2

    def update(self) -> dict[str, float]:
        cfg, b = self.cfg, self.replay.sample(self.cfg.batch_size, self.rng, self.device)
        with torch.no_grad():
            y = b["r"] + cfg.gamma * (1 - b["term"]) * self._next_value(b["f2"])
        loss_qa = ((self.qa(b["f"], b["a"]) - y) ** 2).mean(1).sum()
        self.opt_qa.zero_grad()
        loss_qa.backward()
        self.opt_qa.step()

        al = self.alias.sample(cfg.batch_size, self.rng, self.device)
        with torch.no_grad():
            yw = self.qa(al["f"], al["a"]).min(0).values
        loss_qw = ((self.qw(al["f"], al["w"])[0] - yw) ** 2).mean()
        self.opt_qw.zero_grad()
        loss_qw.backward()
        self.opt_qw.step()

        w, logp = self.actor.sample(b["f"])
        alpha = self.log_alpha.exp().detach()
        loss_pi = (alpha * logp - self.qw(b["f"], w)[0]).mean()
        self.opt_pi.zero_grad()
        loss_pi.backward()
        self.opt_pi.step()
        if self.log_alpha.requires_grad:
            loss_alpha = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
            self.opt_alpha.zero_grad()
            loss_alpha.backward()
            self.opt_alpha.step()
        polyak(self.qa_targ, self.qa, cfg.tau)
        self.updates += 1
        return {"loss_qa": loss_qa.item(), "loss_qw": loss_qw.item(), "loss_pi": loss_pi.item(),
                "alpha": float(alpha), "q": float(yw.mean())}

    # ---- the loop -----------------------------------------------------------------------------
    def learn(self, progress: Progress) -> "NoiseAliasing":
        """Collect and update until ``progress`` says the env-step budget is spent."""
        cfg, n = self.cfg, self.env.num_envs
        self.env.seed(cfg.seed)
        f = self.env.reset()
        while True:
            if self.collected < cfg.learning_starts:  # the base policy's own noise, N(0, I) clipped
                w = np.clip(self.rng.standard_normal((n, self.space.dim)), -self.space.bound,
                            self.space.bound).astype(np.float32)
            else:
                with torch.no_grad():
                    w = self.actor.sample(torch.as_tensor(f, device=self.device))[0].cpu().numpy()
                w = np.clip(w, -self.space.bound, self.space.bound)
            f2, r, dones, infos = self.env.step(w)
            self._store(f, w, r, f2, dones, infos)
            self.collected += n
            f = f2
            logs: dict[str, float] = {}
            if self.collected >= cfg.learning_starts:
                for _ in range(cfg.utd * n):
                    logs = self.update()
            if self.log is not None and logs and self.updates % 100 < cfg.utd * n:
                for k, v in logs.items():
                    self.log(f"na/{k}", v, progress.env_steps)
            if not progress.update(infos):
                return self

    def noise_actor(self) -> MLPActor:
        return MLPActor(self.actor, tuple(self.cfg.net_arch))


def expert_transitions(env: Any, policy: Any, reward: Any, episodes: int, seed: int,
                       task: str | None = None) -> tuple[dict[str, np.ndarray], int, float]:
    """Play a task's scripted expert (``env.unwrapped.expert_action()``) chunk by chunk.

    Returns the transitions for ``NoiseAliasing.add_transitions`` (``f``, ``a``, ``r``,
    ``f2``, ``term``), the env steps they took and the expert's success rate. Features are
    the frozen policy's, from the same history a ``NoiseVecEnv`` keeps.
    """
    runner = ChunkRunner(env, policy, make_reward(reward))
    rows: dict[str, list[Any]] = {k: [] for k in ("f", "a", "r", "f2", "term")}
    steps, wins = 0, 0

    def feats() -> np.ndarray:
        b = runner.batch()
        if task is not None:
            b["task"] = [task]
        return features(policy, b)[0]

    for k in range(episodes):
        runner.reset(seed=seed + k)
        f, done = feats(), False
        while not done:
            r, term, trunc, info = runner.execute(lambda: np.asarray(env.unwrapped.expert_action(), np.float32))
            f2 = feats()
            for key, v in zip(rows, (f, info["executed"], r, f2, float(term))):
                rows[key].append(v)
            steps += info["env_steps"]
            f, done = f2, term or trunc
        wins += bool(info.get("success", False))
    return {k: np.asarray(v, np.float32) for k, v in rows.items()}, steps, wins / max(1, episodes)
