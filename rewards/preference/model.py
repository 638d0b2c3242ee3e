"""The Bradley–Terry reward model: an ensemble of per-step reward nets trained on preferences.

Each member maps one step (a state, a state and action, or a frame; plus the instruction's
features, ``RewardConfig.text``) to a reward r̂ in (-1, 1) (tanh, as in PEBBLE). The instruction
is read as hashed bag-of-words features (``hash``, one task's runs) or as the frozen MiniLM
sentence embedding the policies use (``minilm``: one reward for several tasks, where the
instruction is what tells them apart, and paraphrases land close together). A segment's
predicted return is Σ_t r̂; member m's probability that the right segment σ¹ is preferred is

    P_m[σ¹ ≻ σ⁰] = exp Σr̂_m(σ¹) / (exp Σr̂_m(σ⁰) + exp Σr̂_m(σ¹)) = sigmoid(R̂_m(σ¹) − R̂_m(σ⁰)).

Training minimises the cross-entropy between P_m and the label's target (1: right, 0: left,
0.5: "equally good"), with label smoothing (target ← (1 − α)·target + α/2), each member from
its own initialisation and minibatch order. The ensemble's reward is the members' mean; their
standard deviation is returned as the ``ensemble_std`` term (the disagreement used to pick
queries). Implements ``embodied.core.reward.RewardModel``.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from embodied.core.reward import RewardInputError, RewardModel, RewardOutput
from embodied.nn.minilm import MINILM_DIM
from rewards.preference.segments import Query, stack

INPUTS = ("state", "state_action", "image")
#: instruction features: auto (``embodied prefer`` picks: hash for one task, minilm for several),
#: hash (bag of words, ``text_dim`` wide), minilm (the frozen sentence embedding, 384-d)
TEXTS = ("auto", "hash", "minilm")


@dataclass
class RewardConfig:
    """Architecture and training of the ensemble."""

    input: str = "state"  # state | state_action | image (frames)
    ensemble: int = 3  # members (PEBBLE: 3)
    hidden: int = 128
    text: str = "auto"  # instruction features (TEXTS); a model built with "auto" reads hash features
    text_dim: int = 32  # text=hash: hashed bag-of-words instruction features; 0 ignores the instruction
    image_size: int = 32  # frames are average-pooled to this side for the image net
    lr: float = 3e-4
    weight_decay: float = 1e-4
    epochs: int = 20  # passes over the labelled pairs per training call (the loop trains on, round after round)
    batch_size: int = 64
    smoothing: float = 0.05  # label smoothing α

    def __post_init__(self) -> None:
        if self.input not in INPUTS:
            raise ValueError(f"reward input must be one of {INPUTS}, got {self.input!r}")
        if self.text not in TEXTS:
            raise ValueError(f"reward text must be one of {TEXTS}, got {self.text!r}")
        for name in ("ensemble", "hidden", "epochs", "batch_size", "image_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"reward {name} must be >= 1, got {getattr(self, name)}")
        if self.text_dim < 0:
            raise ValueError(f"reward text_dim must be >= 0 (0: ignore the instruction), got {self.text_dim}")
        if not 0.0 <= self.smoothing < 1.0:
            raise ValueError(f"label smoothing must be in [0, 1), got {self.smoothing}")
        if self.lr <= 0:
            raise ValueError(f"reward lr must be > 0, got {self.lr}")


def text_features(instruction: str, dim: int) -> np.ndarray:
    """Hashed bag of lower-cased words (dim,) float32, unit norm: deterministic and offline."""
    v = np.zeros(dim, np.float32)
    if dim == 0:
        return v
    for w in instruction.lower().replace(",", " ").replace(".", " ").split():
        v[zlib.crc32(w.encode()) % dim] += 1.0
    n = np.linalg.norm(v)
    return v / n if n > 0 else v


def bt_loss(ret_left: torch.Tensor, ret_right: torch.Tensor, target: torch.Tensor,
            smoothing: float = 0.0) -> torch.Tensor:
    """Bradley–Terry cross-entropy: logit = R̂(σ¹) − R̂(σ⁰); target = P[σ¹ ≻ σ⁰] (0, 0.5 or 1)."""
    target = (1.0 - smoothing) * target + 0.5 * smoothing
    return nn.functional.binary_cross_entropy_with_logits(ret_right - ret_left, target)


class _StepNet(nn.Module):
    """One member: (step features, text features) -> r̂ in (-1, 1)."""

    def __init__(self, cfg: RewardConfig, in_dim: int, text_dim: int):
        super().__init__()
        self.image = cfg.input == "image"
        if self.image:
            self.conv = nn.Sequential(
                nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU(),
                nn.AdaptiveAvgPool2d(1), nn.Flatten())
            in_dim = 32
        h = cfg.hidden
        self.mlp = nn.Sequential(nn.Linear(in_dim + text_dim, h), nn.LeakyReLU(),
                                 nn.Linear(h, h), nn.LeakyReLU(), nn.Linear(h, 1), nn.Tanh())

    def forward(self, x: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """x: (N, D) or images (N, 3, S, S) in [0, 1]; text (N, text_dim) -> (N,)."""
        if self.image:
            x = self.conv(x)
        return self.mlp(torch.cat([x, text], -1)).squeeze(-1)


def minilm_features(texts: Sequence[str]) -> np.ndarray:
    """The frozen all-MiniLM-L6-v2 sentence embeddings (N, 384) float32, unit norm (``embodied.nn.minilm``:
    the weights bundled with its package, offline; the model the policies' text encoder loads)."""
    from embodied.nn.minilm import load_minilm

    with torch.inference_mode():
        v = load_minilm().encode(list(texts), batch_size=64, normalize_embeddings=True, show_progress_bar=False,
                                 convert_to_numpy=True)
    return np.asarray(v, np.float32)


class PreferenceReward(RewardModel):
    """A Bradley–Terry ensemble over steps (see the module docstring).

    ``score`` reads ``states`` (B, Ds) for ``input="state"``, ``states`` (B, Ds + Da) —
    each row a state followed by the action taken in it — for ``"state_action"``, and
    ``frames`` (B, H, W, 3) uint8 for ``"image"``; and the instruction of each row, which with
    ``text="minilm"`` tells the tasks of one reward apart (a steering run across a suite gives
    each env's own instruction).
    """

    reward_range = (-1.0, 1.0)

    def __init__(self, cfg: RewardConfig, state_dim: int, action_dim: int = 0, seed: int = 0):
        self.cfg, self.state_dim, self.action_dim = cfg, int(state_dim), int(action_dim)
        if cfg.input == "state_action" and self.action_dim < 1:
            raise ValueError("input='state_action' needs the action dimension (action_dim >= 1)")
        self.inputs = frozenset({"frames"} if cfg.input == "image" else {"states"})
        self.in_dim = self.state_dim + (self.action_dim if cfg.input == "state_action" else 0)
        self.text_dim = MINILM_DIM if cfg.text == "minilm" else cfg.text_dim
        torch.manual_seed(seed)
        self.members = nn.ModuleList([_StepNet(cfg, self.in_dim, self.text_dim) for _ in range(cfg.ensemble)])
        self.mean = torch.zeros(self.in_dim)
        self.std = torch.ones(self.in_dim)
        # text=minilm: sentence embeddings of one suite share a large common part, so they are
        # centred on the labelled instructions' mean and scaled by their spread (fit_normaliser)
        self.text_mean = torch.zeros(self.text_dim)
        self.text_scale = torch.ones(())
        self._text_cache: dict[str, np.ndarray] = {}
        self.rng = np.random.default_rng(seed)
        self.labels_seen = 0
        self.shift = 0.0  # subtracted from every reward (``load_reward``); preferences are blind to it

    # ------------------------------------------------------------------ inputs
    def _steps(self, queries: Sequence[Query], side: str) -> np.ndarray:
        """The model's per-step inputs of one side: (N, L, D) float32 or (N, L, H, W, 3) uint8."""
        segs = [getattr(q, side) for q in queries]
        if self.cfg.input == "image":
            return stack(segs, "frames")
        x = stack(segs, "states")
        if self.cfg.input == "state_action":
            x = np.concatenate([x, stack(segs, "actions")], -1)
        return x.astype(np.float32)

    def _prep(self, x: np.ndarray) -> torch.Tensor:
        """Flat steps -> net input: normalised states, or frames pooled to image_size in [0, 1]."""
        t = torch.as_tensor(x)
        if self.cfg.input != "image":
            return (t.float() - self.mean) / self.std
        img = t.permute(0, 3, 1, 2).float() / 255.0
        if img.shape[-1] != self.cfg.image_size:
            img = nn.functional.adaptive_avg_pool2d(img, self.cfg.image_size)
        return img

    def _raw_text(self, instructions: Sequence[str]) -> np.ndarray:
        """Instruction features before normalisation (N, text_dim), each string encoded once."""
        if self.cfg.text != "minilm":
            return np.stack([text_features(s, self.text_dim) for s in instructions])
        missing = sorted({s for s in instructions if s not in self._text_cache})
        if missing:
            self._text_cache.update(zip(missing, minilm_features(missing)))
        return np.stack([self._text_cache[s] for s in instructions])

    def _text(self, instructions: Sequence[str]) -> torch.Tensor:
        t = torch.as_tensor(self._raw_text(instructions))
        return (t - self.text_mean) / self.text_scale if self.cfg.text == "minilm" else t

    def fit_normaliser(self, queries: Sequence[Query]) -> None:
        """Per-feature mean and std of the labelled steps (state inputs only); with ``text="minilm"``
        the mean of the labelled instructions' embeddings and their RMS distance from it."""
        if not queries:
            return
        if self.cfg.text == "minilm":
            texts = sorted({seg.instruction for q in queries for seg in (q.left, q.right)})
            z = self._raw_text(texts)
            centred = z - z.mean(0)
            self.text_mean = torch.as_tensor(z.mean(0))
            self.text_scale = torch.as_tensor(max(float(np.sqrt((centred ** 2).sum(1).mean())), 1e-3))
        if self.cfg.input == "image":
            return
        x = np.concatenate([self._steps(queries, s).reshape(-1, self.in_dim) for s in ("left", "right")])
        self.mean = torch.as_tensor(x.mean(0))
        self.std = torch.as_tensor(x.std(0) + 1e-3)

    # --------------------------------------------------------------- forward
    def _returns(self, steps: np.ndarray, text: torch.Tensor, members: Sequence[int] | None = None
                 ) -> torch.Tensor:
        """Predicted segment returns (M, N) from steps (N, L, ...) and text (N, text_dim)."""
        n, length = steps.shape[:2]
        x = self._prep(steps.reshape(n * length, *steps.shape[2:]))
        tx = text.repeat_interleave(length, 0)
        ids = range(len(self.members)) if members is None else members
        return torch.stack([self.members[m](x, tx).view(n, length).sum(1) for m in ids])

    @torch.no_grad()
    def predict(self, queries: Sequence[Query], batch: int = 256) -> np.ndarray:
        """P_m[right ≻ left] for each member and query: (M, N) float32."""
        out = []
        for i in range(0, len(queries), batch):
            qs = queries[i:i + batch]
            tl, tr = self._text([q.left.instruction for q in qs]), self._text([q.right.instruction for q in qs])
            rl, rr = self._returns(self._steps(qs, "left"), tl), self._returns(self._steps(qs, "right"), tr)
            out.append(torch.sigmoid(rr - rl).numpy())
        return np.concatenate(out, 1) if out else np.zeros((len(self.members), 0), np.float32)

    def score(self, frames: np.ndarray | None, states: np.ndarray | None,
              instruction: str | Sequence[str]) -> RewardOutput:
        x = frames if self.cfg.input == "image" else states
        if self.cfg.input != "image" and np.asarray(x).shape[1] != self.in_dim:
            layout = "state then action" if self.cfg.input == "state_action" else "state"
            raise RewardInputError(f"this reward reads rows of {self.in_dim} values ({layout}), "
                                   f"got states of shape {np.asarray(x).shape}")
        b = len(x)
        texts = [instruction] * b if isinstance(instruction, str) else list(instruction)
        with torch.no_grad():
            xt, tt = self._prep(np.asarray(x)), self._text(texts)
            r = torch.stack([m(xt, tt) for m in self.members]).numpy()
        return RewardOutput(r.mean(0) - self.shift, {"ensemble_std": r.std(0)})

    # ---------------------------------------------------------------- training
    def train(self, queries: Sequence[Query], targets: Sequence[float], epochs: int | None = None
              ) -> dict[str, float]:
        """Fit every member on labelled queries; targets are P[right ≻ left] in {0, 0.5, 1}.

        Returns the final epoch's mean loss and the training accuracy on strict labels.
        """
        y = np.asarray(targets, np.float32)
        if len(queries) != len(y) or len(y) == 0:
            raise ValueError(f"give one target per query (got {len(queries)} queries, {len(y)} targets)")
        if not np.all(np.isin(y, (0.0, 0.5, 1.0))):
            raise ValueError(f"targets must be 0 (left), 0.5 (equal) or 1 (right), got {sorted(set(y.tolist()))}")
        self.fit_normaliser(queries)
        xl, xr = self._steps(queries, "left"), self._steps(queries, "right")
        tl, tr = self._text([q.left.instruction for q in queries]), self._text([q.right.instruction for q in queries])
        yt = torch.as_tensor(y)
        opt = [torch.optim.AdamW(m.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
               for m in self.members]
        bs, losses = self.cfg.batch_size, []
        for _ in range(epochs if epochs is not None else self.cfg.epochs):
            losses = []
            for m, o in enumerate(opt):
                order = self.rng.permutation(len(y))
                for i in range(0, len(y), bs):
                    idx = order[i:i + bs]
                    loss = bt_loss(self._returns(xl[idx], tl[idx], [m])[0], self._returns(xr[idx], tr[idx], [m])[0],
                                   yt[idx], self.cfg.smoothing)
                    o.zero_grad()
                    loss.backward()
                    o.step()
                    losses.append(loss.item())
        self.labels_seen = len(y)
        p = self.predict(queries).mean(0)
        strict = y != 0.5
        acc = float(np.mean((p[strict] > 0.5) == (y[strict] > 0.5))) if strict.any() else float("nan")
        return {"loss": float(np.mean(losses)), "train_accuracy": acc}

    # --------------------------------------------------------------- save/load
    def save(self, path: str | os.PathLike) -> None:
        """Write ``path`` (torch weights) and ``path.json`` (config, dims), each atomically."""
        path = Path(path)
        meta = {"config": asdict(self.cfg), "state_dim": self.state_dim, "action_dim": self.action_dim,
                "labels_seen": self.labels_seen}
        for target, write in ((path, lambda f: torch.save(self._state_dict(), f)),
                              (path.with_suffix(path.suffix + ".json"),
                               lambda f: f.write(json.dumps(meta, indent=2).encode()))):
            tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)

    def _state_dict(self) -> dict[str, Any]:
        return {"members": self.members.state_dict(), "mean": self.mean, "std": self.std,
                "text_mean": self.text_mean, "text_scale": self.text_scale}

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PreferenceReward":
        """Load a reward written by ``save``; a missing or damaged file raises naming it."""
        path = Path(path)
        side = path.with_suffix(path.suffix + ".json")
        for p in (path, side):
            if not p.is_file():
                raise FileNotFoundError(f"learned reward file {p} does not exist (written by `embodied prefer`)")
        try:
            meta = json.loads(side.read_text())
            model = cls(RewardConfig(**meta["config"]), meta["state_dim"], meta["action_dim"])
            sd = torch.load(path, map_location="cpu", weights_only=True)
            model.members.load_state_dict(sd["members"])
        except Exception as e:  # noqa: BLE001 - a foreign file fails in many ways; each is named the same
            raise ValueError(f"learned reward {path} is damaged or of another format: {e}") from None
        model.mean, model.std, model.labels_seen = sd["mean"], sd["std"], int(meta.get("labels_seen", 0))
        model.text_mean = sd.get("text_mean", model.text_mean)  # (rewards saved before text=minilm: none)
        model.text_scale = sd.get("text_scale", model.text_scale)
        return model


SHIFTS = ("none", "max")


def load_reward(path: str | os.PathLike = "", shift: str = "max") -> PreferenceReward:
    """A learned reward for a policy learner: ``embodied steer reward=rewards.preference.model:load_reward
    reward_kwargs={path:RUN/reward.pt}`` (or the run directory of `embodied prefer`).

    ``shift="max"`` (default) subtracts the reward's upper bound (tanh: 1), so every step's
    reward is in (-2, 0): preferences fix a per-step reward only up to a constant, and with a
    non-positive one an episode that ends on success (the tasks terminate there; value 0
    afterwards) is never worse than going on — the loop's segments treat success as an
    absorbing final state, and a positive reward would instead pay the learner to hover
    near the goal without reaching it. ``shift="none"`` keeps the raw (-1, 1) reward.
    """
    if shift not in SHIFTS:
        raise ValueError(f"shift={shift!r} is not allowed: must be one of {SHIFTS}")
    if not str(path):
        raise ValueError("load_reward needs path=PATH: the reward.pt written by `embodied prefer` (or its run "
                         "directory)")
    p = Path(path)
    if p.is_dir():
        if not (p / "reward.pt").is_file():
            raise FileNotFoundError(f"{p} holds no reward.pt: give the run directory of `embodied prefer` or its "
                                    "reward.pt")
        p = p / "reward.pt"
    model = PreferenceReward.load(p)
    if shift == "max":
        model.shift = float(model.reward_range[1])
        model.reward_range = (model.reward_range[0] - model.shift, 0.0)
    return model


def reward_from_settings(settings: dict[str, Any]) -> PreferenceReward:
    """``rewards.registry`` entry ``prefer``: ``embodied reward eval reward=prefer reward.path=RUN/reward.pt``."""
    known = {"path", "shift"}
    bad = sorted(set(settings) - known - {"name"})
    if bad:
        raise ValueError(f"reward=prefer: unknown setting(s) {bad}; allowed: {sorted(known)}")
    return load_reward(settings.get("path", ""), settings.get("shift", "none"))
