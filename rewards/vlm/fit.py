"""Fitting a CLIP reward in-domain: an open_clip image tower against a locked text side.

The data are rendered frames paired with captions from simulator ground truth
(``CaptionedFrames``): each pair says how far the instruction of a caption group (one goal:
a task with its parameters, in all its training wordings) holds in a frame,

    label = 1/2 progress + 1/2 success        in [0, 1],

with ``progress`` in [0, 1] from simulator ground truth (the task's dense reward, its rise
along the episode, or the elapsed fraction of an episode that succeeds: the caller's choice,
``label_progress`` of ``embodied reward fit``) and ``success`` its success predicate, so every
success frame (>= 1/2) is labelled above every other frame of that goal (<= 1/2), and frames
that are further along rank higher. ``caption_label`` computes it.

Loss (locked-text tuning -- LiT's recipe with the roles swapped: the text side is frozen --
with SigLIP's pairwise sigmoid): for a frame x and K wordings w_1..w_K of its goal drawn at
random, ``BCE(sigmoid(s cos(f(x), T(w_k)) + c), label)`` with f the image tower being
fitted, T the frozen text side, s > 0 and c learnt. The reward
at run time is cos(f(x), T(instruction)), which ranks frames as the fitted probability does;
(s, c) are kept as the calibration of the ``holds`` term. Drawing wordings at random teaches
the tower one image embedding that scores every paraphrase of the goal alike, which is what
lets held-out wordings (never seen here) score well through the text side's own geometry.
Frames are shifted by up to ``shift`` pixels (a random crop of a padded frame); colours
are left alone (they name objects).

Auxiliary state loss (``state_weight`` > 0): when the frames come with the simulator's
privileged state, a linear head on the image embedding regresses the standardised state
(object and robot positions, ...). A scalar label per frame says little about where things
are; the state says it densely, and the tower learns to locate objects much sooner. The
head is dropped after fitting: the reward reads frames only.

Ranking loss (``rank_weight`` > 0): half of each batch are partners, frames of the same
episodes as the other half; for each pair whose labels differ by more than ``rank_margin``,
a logistic (Bradley-Terry) loss on ``s (cos_a - cos_b)`` asks the frame further along to
score higher. The pointwise loss alone tolerates a reward that is flat where progress is
small (early in an approach); value-order correlation does not.

Synthetic wordings (``synthetic_wordings`` > 0): each of the K wording slots of a frame is, with
that probability, a synthetic paraphrase of its goal instead of a training wording: the goal's
training wordings' mean plus a Gaussian draw with the pooled covariance of every goal's training
wordings around their own goal's mean (in the centred text space; ``ParaphraseNoise``). A ranking
pair is scored against the same synthetic paraphrases. Twenty training wordings span few of the
directions a new paraphrase can move the goal embedding in, and the image embedding is free to
vary within an episode along the others, which a held-out wording then reads as disorder; a
synthetic paraphrase moves the goal along every direction training wordings of any goal vary in,
as far as they do, so within-episode variation along those directions costs loss.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from embodied.nn.average import WeightAverage
from rewards.vlm.model import ImagePreprocess

log = logging.getLogger("rewards.vlm.fit")


def caption_label(success: np.ndarray, progress: np.ndarray) -> np.ndarray:
    """How far a goal holds in a frame, in [0, 1]: 1/2 clip(progress, 0, 1) + 1/2 success."""
    return (0.5 * np.clip(np.asarray(progress, np.float32), 0.0, 1.0)
            + 0.5 * np.asarray(success, np.float32)).astype(np.float32)


def goal_wordings(templates: Sequence[str], params: dict[str, Any]) -> list[str]:
    """Every template filled with the episode's parameters (``{color}`` -> ``red``)."""
    out = []
    for t in templates:
        try:
            out.append(t.format(**params))
        except (KeyError, IndexError) as e:
            raise ValueError(f"instruction template {t!r} uses field {e}, which the episode's parameters "
                             f"{sorted(params)} lack") from None
    return out


@dataclass
class CaptionedFrames:
    """Frames and ground-truth captions. Pairs (P,) link a frame to a caption group with a label.

    Attributes:
        frames: uint8 (N, S, S, 3).
        frame: int (P,) frame of each pair.
        group: int (P,) caption group of each pair, an index into ``groups``.
        label: float32 (P,) in [0, 1], how far the group's goal holds in the frame.
        groups: the wordings of each group (one goal, several training wordings).
        states: optional float32 (N, Ds), the privileged state of each frame (auxiliary loss).
        episode: optional int (N,), the episode of each frame (frames of an episode are
            consecutive rows); needed by the ranking loss.
        hindsight: optional bool (P,), pairs that are hindsight captions: another goal the
            frame's scene could have been given, labelled from ground truth (``fit_image_tower``
            scores every frame of a batch against all of them at once); the other pairs (a
            frame's own episode's goal) are what batches are drawn from. Each frame has at
            most one pair per group.
    """

    frames: np.ndarray
    frame: np.ndarray
    group: np.ndarray
    label: np.ndarray
    groups: list[list[str]]
    states: np.ndarray | None = None
    episode: np.ndarray | None = None
    hindsight: np.ndarray | None = None

    def __post_init__(self) -> None:
        p = len(self.frame)
        if not (len(self.group) == len(self.label) == p) or p == 0:
            raise ValueError(f"frame, group and label must be equal, non-empty (P,) arrays, got "
                             f"{len(self.frame)}, {len(self.group)}, {len(self.label)}")
        if self.frames.ndim != 4 or self.frames.shape[-1] != 3 or self.frames.dtype != np.uint8:
            raise ValueError(f"frames must be uint8 (N, S, S, 3), got {self.frames.dtype} {self.frames.shape}")
        if any(not g for g in self.groups):
            raise ValueError("every caption group needs at least one wording")
        if self.states is not None and (self.states.ndim != 2 or len(self.states) != len(self.frames)):
            raise ValueError(f"states must be (N, Ds) with N = {len(self.frames)} frames, got {self.states.shape}")
        if self.episode is not None:
            if self.episode.shape != (len(self.frames),):
                raise ValueError(f"episode must be (N,) with N = {len(self.frames)}, got {self.episode.shape}")
            runs = 1 + int(np.count_nonzero(self.episode[1:] != self.episode[:-1])) if len(self.episode) else 0
            if runs != len(np.unique(self.episode)):
                raise ValueError("the frames of each episode must be consecutive rows")
        if self.hindsight is not None:
            if self.hindsight.shape != (p,) or self.hindsight.dtype != bool:
                raise ValueError(f"hindsight must be a bool (P,) array with P = {p} pairs, got "
                                 f"{self.hindsight.dtype} {self.hindsight.shape}")
            if bool(self.hindsight.all()):
                raise ValueError("hindsight captions need pairs of the frames' own goals too (all pairs are hindsight)")

    def primary(self) -> np.ndarray:
        """Indices of the pairs that are not hindsight captions (a frame's own goal)."""
        return np.arange(len(self.frame)) if self.hindsight is None else np.flatnonzero(~self.hindsight)

    def hindsight_matrix(self) -> np.ndarray | None:
        """float32 (N, G): the hindsight label of each frame for each group, NaN where none; None without any."""
        if self.hindsight is None or not bool(self.hindsight.any()):
            return None
        out = np.full((len(self.frames), len(self.groups)), np.nan, np.float32)
        h = self.hindsight
        out[self.frame[h], self.group[h]] = self.label[h]
        return out


@dataclass
class FitSettings:
    """Optimisation settings of ``fit_image_tower``."""

    steps: int = 6000
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup: int = 100
    wordings_per_frame: int = 4
    pos_fraction: float = 0.25  # share of each batch drawn from pairs whose goal holds (label >= 1/2)
    shift: int = 3  # augmentation: random translation in pixels
    state_weight: float = 1.0  # weight of the auxiliary state regression (0: none)
    rank_weight: float = 1.0  # weight of the within-episode ranking loss (0: none)
    rank_margin: float = 0.02  # label difference below which a pair is not ranked
    # share of wording slots filled with a synthetic paraphrase (ParaphraseNoise). Default 0 (none):
    # 0.5 lifted pick's held-out-wording VOC on manipulation but lowered stack's AUROC and the
    # validation bank's VOC (docs/results.md, issue 16 fifth round)
    synthetic_wordings: float = 0.0
    # weight of the hindsight-caption loss (data.hindsight): every frame of a batch against every
    # other goal its scene could have been given, pointwise and, with rank_weight, ranked within
    # episodes; each group read in one wording drawn per step
    hindsight_weight: float = 1.0
    # share of frames shown turned by a random multiple of 90 degrees and/or mirrored (one of the
    # seven other symmetries of the square, ``dihedral_transform``), for views whose labels do not
    # change under them (a top-down view of a symmetric arena); such frames leave the state loss out
    dihedral: float = 0.0
    # decay of an exponential moving average of the image tower's weights (BatchNorm statistics and
    # the calibration included), kept after every step and returned as the fitted tower; 0 keeps the
    # last step's weights. An average over the last ~1/(1 - ema) steps
    ema: float = 0.0
    seed: int = 0
    log_every: int = 200

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "wordings_per_frame"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.pos_fraction <= 1.0:
            raise ValueError(f"pos_fraction must be in [0, 1], got {self.pos_fraction}")
        if not 0.0 <= self.dihedral <= 1.0:
            raise ValueError(f"dihedral must be in [0, 1], got {self.dihedral}")
        if not 0.0 <= self.ema < 1.0:
            raise ValueError(f"ema must be in [0, 1) (0: no weight average), got {self.ema}")
        if not 0.0 <= self.synthetic_wordings <= 1.0:
            raise ValueError(f"synthetic_wordings must be in [0, 1], got {self.synthetic_wordings}")
        if self.lr <= 0 or self.shift < 0 or self.warmup < 0 or self.state_weight < 0 or self.rank_weight < 0 \
                or self.hindsight_weight < 0:
            raise ValueError(f"lr must be > 0 and shift, warmup, state_weight, rank_weight, hindsight_weight >= 0; "
                             f"got {self.lr}, {self.shift}, {self.warmup}, {self.state_weight}, {self.rank_weight}, "
                             f"{self.hindsight_weight}")


def standardized_states(states: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
    """(z-scored states (N, K), indices of the K dims kept): dims that barely vary are dropped."""
    std = states.std(0)
    keep = np.flatnonzero(std > 1e-4)
    z = (states[:, keep] - states[:, keep].mean(0)) / std[keep]
    return torch.from_numpy(z.astype(np.float32)), keep


def random_shift(x: torch.Tensor, pad: int, gen: torch.Generator) -> torch.Tensor:
    """Translate each image of (B, C, S, S) by up to ``pad`` pixels (edge pixels repeat)."""
    if pad == 0:
        return x
    s = x.shape[-1]
    padded = F.pad(x, (pad, pad, pad, pad), mode="replicate")
    off = torch.randint(0, 2 * pad + 1, (x.shape[0], 2), generator=gen).tolist()
    return torch.stack([padded[i, :, oy:oy + s, ox:ox + s] for i, (oy, ox) in enumerate(off)])


def dihedral_transform(x: torch.Tensor, k: np.ndarray) -> torch.Tensor:
    """Each image of (B, C, S, S) under element ``k[i]`` in 0..7 of the square's symmetry group:
    turned by ``k % 4`` quarter turns counter-clockwise, then mirrored left-right when ``k >= 4``
    (0 leaves it as it is)."""
    out = x.clone()
    for e in np.unique(k):
        if e == 0:
            continue
        rows = torch.from_numpy(np.flatnonzero(k == e))
        y = torch.rot90(x[rows], int(e) % 4, dims=(-2, -1))
        out[rows] = torch.flip(y, dims=(-1,)) if e >= 4 else y
    return out


class EpisodePartners:
    """Draws, for pairs of ``data``, partner pairs: another frame of the same episode (uniformly),
    paired with its own episode's goal (never a hindsight pair). A frame without an own-goal pair
    is its own partner."""

    def __init__(self, data: CaptionedFrames):
        if data.episode is None:
            raise ValueError("ranking pairs need data.episode")
        ep, n = data.episode, len(data.frames)
        first = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
        run = np.searchsorted(first, np.arange(n), side="right") - 1
        self.start, self.length = first[run], np.diff(np.r_[first, n])[run]
        self.pair_of_frame = np.full(n, -1, np.int64)
        own = data.primary()
        self.pair_of_frame[data.frame[own]] = own
        self.frame = data.frame

    def draw(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        f = self.frame[idx]
        partner = self.pair_of_frame[self.start[f] + (rng.random(len(f)) * self.length[f]).astype(int)]
        return np.where(partner >= 0, partner, idx)


class ParaphraseNoise:
    """Synthetic paraphrases of goals: unit vectors ``normalize(mean_g + eps)``, with ``mean_g`` the
    mean of goal g's training wordings' embeddings and ``eps ~ N(0, C)``, C the pooled covariance of
    every goal's wordings around their own goal's mean (goals with one wording add nothing to C).

    Args:
        table: (W, D) the training wordings' embeddings, the wordings of each goal consecutive rows.
        starts, sizes: (G,) each goal's first row in ``table`` and its number of wordings.
        seed: seed of the draws.
    """

    def __init__(self, table: torch.Tensor, starts: np.ndarray, sizes: np.ndarray, seed: int):
        rows = [table[a:a + n] for a, n in zip(starts, sizes)]
        dev = [r - r.mean(0) for r in rows if len(r) >= 2]
        if not dev:
            raise ValueError("synthetic wordings need a goal with at least two training wordings")
        d = torch.cat(dev)
        dof = len(d) - len(dev)  # one mean estimated per goal
        self.means = torch.stack([r.mean(0) for r in rows])
        # C = d^T d / dof = V diag(S^2 / dof) V^T, so eps = z diag(S / sqrt(dof)) V^T with z ~ N(0, I)
        _, sv, vt = torch.linalg.svd(d, full_matrices=False)
        self.factor = sv[:, None] / math.sqrt(dof) * vt
        self.gen = torch.Generator().manual_seed(seed)

    def draw(self, group: np.ndarray) -> torch.Tensor:
        """One synthetic paraphrase (D,) of each goal in ``group`` (n,): (n, D) unit vectors."""
        z = torch.randn(len(group), self.factor.shape[0], generator=self.gen)
        return F.normalize(self.means[torch.from_numpy(np.asarray(group))] + z @ self.factor, dim=-1)


def ranking_loss(logit_a: torch.Tensor, logit_b: torch.Tensor, dy: torch.Tensor, margin: float) -> torch.Tensor | None:
    """Bradley-Terry loss of pairs (a, b): ``softplus(-sign(dy) (logit_a - logit_b))`` averaged over
    the pairs whose label difference ``dy = label_a - label_b`` exceeds ``margin`` in size; None
    when no pair does. It is small when the frame further along has the larger logit."""
    ranked = dy.abs() > margin
    if not bool(ranked.any()):
        return None
    return F.softplus(-torch.sign(dy[ranked]) * (logit_a - logit_b)[ranked]).mean()


def hindsight_losses(z: torch.Tensor, table: torch.Tensor, starts: np.ndarray, sizes: np.ndarray, labels: np.ndarray,
                     scale: torch.Tensor, bias: torch.Tensor, n_anchor: int, margin: float,
                     rng: np.random.Generator) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(pointwise, ranking) losses of a batch against every caption group's hindsight labels.

    Args:
        z: (B, D) unit image embeddings of the batch.
        table, starts, sizes: the wordings' embeddings (W, D) and each group's rows in it (G,).
        labels: float32 (B, G), the hindsight label of each frame for each group, NaN where none.
        scale, bias: the calibration (s, c) of the caption loss.
        n_anchor: with ranking partners, rows [0, n_anchor) are anchors and rows
            [n_anchor, 2 n_anchor) their partners (frames of the same episodes); 0: no ranking.
        margin: label difference below which a pair is not ranked.
        rng: draws one wording per group.

    Returns:
        the mean BCE of ``sigmoid(s cos + c)`` against every label there is, and the ranking
        loss (``ranking_loss``) of every (anchor, partner, group) with labels on both; None for
        a loss with nothing to score.
    """
    w = starts + (rng.random(len(sizes)) * sizes).astype(int)
    logit = scale * (z @ table[torch.from_numpy(w)].T) + bias  # (B, G)
    y = torch.from_numpy(labels)
    have = ~torch.isnan(y)
    point = F.binary_cross_entropy_with_logits(logit[have], y[have]) if bool(have.any()) else None
    rank = None
    if n_anchor > 0:
        dy = y[:n_anchor] - y[n_anchor:2 * n_anchor]
        both = ~torch.isnan(dy)
        if bool(both.any()):
            rank = ranking_loss(logit[:n_anchor][both], logit[n_anchor:2 * n_anchor][both], dy[both], margin)
    return point, rank


def fit_image_tower(model: torch.nn.Module, text: Any, preprocess: ImagePreprocess, data: CaptionedFrames,
                    settings: FitSettings, progress: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """Fit ``model.visual`` in place so that cos(image, goal text) predicts the labels of ``data``.

    Only the image tower (and the calibration s, c) learn; the text side is locked.
    Returns the record kept in the checkpoint: calibration, loss history, wall time.
    """
    s = settings
    gen = torch.Generator().manual_seed(s.seed)
    rng = np.random.default_rng(s.seed)
    wordings = [w for g in data.groups for w in g]
    table = text.encode(wordings)  # (W, D), fixed
    sizes = np.array([len(g) for g in data.groups])
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    ranking = s.rank_weight > 0 and data.episode is not None
    n_anchor = s.batch_size // 2 if ranking else s.batch_size
    own = data.primary()  # batches are drawn from the frames' own goals
    pos = own[data.label[own] >= 0.5]
    n_pos = int(round(n_anchor * s.pos_fraction)) if len(pos) else 0
    partners = EpisodePartners(data) if ranking else None
    # synthetic paraphrases draw from their own streams: the rest of the fit sees the same batches
    paraphrase = ParaphraseNoise(table, starts, sizes, s.seed + 1) if s.synthetic_wordings > 0 else None
    slot_rng = np.random.default_rng([s.seed, 1])
    hind = data.hindsight_matrix() if s.hindsight_weight > 0 else None
    hind_rng = np.random.default_rng([s.seed, 2])  # its own stream: the rest of the fit sees the same batches
    sym_rng = np.random.default_rng([s.seed, 3])

    for p in model.parameters():
        p.requires_grad_(False)
    visual = model.visual.to(memory_format=torch.channels_last)  # the layout ImagePreprocess gives
    for p in visual.parameters():
        p.requires_grad_(True)
    # calibration: cos 0 starts at the mean label; it learns faster than the tower (10x the lr)
    mean = float(np.clip(data.label[own].mean(), 0.01, 0.99))
    log_scale = torch.nn.Parameter(torch.tensor(math.log(10.0)))
    bias = torch.nn.Parameter(torch.tensor(math.log(mean / (1 - mean))))
    head, targets = None, None
    if s.state_weight > 0 and data.states is not None:
        targets, _ = standardized_states(data.states)
        with torch.no_grad():
            dim = model.encode_image(preprocess(data.frames[:1])).shape[-1]
        head = torch.nn.Linear(dim, targets.shape[1])
    decay = [p for p in visual.parameters() if p.ndim >= 2] + ([head.weight] if head is not None else [])
    no_decay = [p for p in visual.parameters() if p.ndim < 2] + ([head.bias] if head is not None else [])
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay, "lr_scale": 1.0},
                             {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0},
                             {"params": [log_scale, bias], "weight_decay": 0.0, "lr_scale": 10.0}], lr=s.lr)

    def lr_at(step: int) -> float:
        if step < s.warmup:
            return s.lr * (step + 1) / s.warmup
        t = (step - s.warmup) / max(1, s.steps - s.warmup)
        return s.lr * 0.5 * (1.0 + math.cos(math.pi * t))

    average = WeightAverage(list(visual.state_dict().values()) + [log_scale, bias], s.ema) if s.ema > 0 else None
    history, running, running_state, running_rank, running_hind = [], 0.0, 0.0, 0.0, 0.0
    t0 = time.perf_counter()
    visual.train()
    for step in range(s.steps):
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step) * gr["lr_scale"]
        idx = np.concatenate([rng.choice(pos, n_pos), rng.choice(own, n_anchor - n_pos)])
        if partners is not None:
            idx = np.concatenate([idx, partners.draw(idx, rng)])
        g = data.group[idx]
        w = starts[g][:, None] + (rng.random((len(idx), s.wordings_per_frame)) * sizes[g][:, None]).astype(int)
        x = random_shift(preprocess(data.frames[data.frame[idx]]), s.shift, gen)
        sym = np.zeros(len(idx), np.int64)
        if s.dihedral > 0:
            turned = sym_rng.random(len(idx)) < s.dihedral
            sym[turned] = sym_rng.integers(1, 8, int(turned.sum()))
            x = dihedral_transform(x, sym).contiguous(memory_format=torch.channels_last)
        goals = table[torch.from_numpy(w)]  # (B, K, D)
        if paraphrase is not None:  # slots of the anchors; a ranking partner takes its anchor's
            synthetic = slot_rng.random((n_anchor, s.wordings_per_frame)) < s.synthetic_wordings
            a, k = np.nonzero(synthetic)
            drawn = paraphrase.draw(g[a])
            goals[a, k] = drawn
            if partners is not None:
                goals[a + n_anchor, k] = drawn
        emb = model.encode_image(x)
        z = F.normalize(emb, dim=-1)
        cos = torch.einsum("bd,bkd->bk", z, goals)
        y = torch.from_numpy(data.label[idx])[:, None].expand_as(cos)
        caption_loss = F.binary_cross_entropy_with_logits(log_scale.exp() * cos + bias, y)
        loss = caption_loss
        if partners is not None:
            dy = torch.from_numpy(data.label[idx[:n_anchor]] - data.label[idx[n_anchor:]])
            logit = log_scale.exp() * cos.mean(1)
            rank_loss = ranking_loss(logit[:n_anchor], logit[n_anchor:], dy, s.rank_margin)
            if rank_loss is not None:
                loss = loss + s.rank_weight * rank_loss
                running_rank += float(rank_loss.detach())
        if hind is not None:
            h_loss, h_rank = hindsight_losses(z, table, starts, sizes, hind[data.frame[idx]], log_scale.exp(), bias,
                                              n_anchor if partners is not None else 0, s.rank_margin, hind_rng)
            if h_loss is not None:
                loss = loss + s.hindsight_weight * h_loss
                running_hind += float(h_loss.detach())
            if h_rank is not None:
                loss = loss + s.hindsight_weight * s.rank_weight * h_rank
        if head is not None:
            plain = torch.from_numpy(sym == 0)  # the state is where things are in the frame as rendered
            state_loss = F.mse_loss(head(emb[plain]), targets[torch.from_numpy(data.frame[idx][sym == 0])]) \
                if bool(plain.any()) else emb.sum() * 0.0
            loss = loss + s.state_weight * state_loss
            running_state += float(state_loss.detach())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups[:2] for p in g["params"]], 1.0)
        opt.step()
        if average is not None:
            average.update()
        running += float(caption_loss.detach())
        if (step + 1) % s.log_every == 0 or step + 1 == s.steps:
            n = (step % s.log_every) + 1
            history.append({"step": step + 1, "loss": running / n, "state_loss": running_state / n,
                            "rank_loss": running_rank / n, "hindsight_loss": running_hind / n,
                            "wall_s": time.perf_counter() - t0})
            log.info("fit step %d/%d  caption loss %.4f  state loss %.3f  rank loss %.3f%s  scale %.1f  bias %.2f",
                     step + 1, s.steps, running / n, running_state / n, running_rank / n,
                     f"  hindsight loss {running_hind / n:.3f}" if hind is not None else "", log_scale.exp().item(),
                     bias.item())
            if progress is not None:
                progress(step + 1, running / n)
            running = running_state = running_rank = running_hind = 0.0
    if average is not None:
        average.copy_to_live()
    visual.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return {"calibration": [log_scale.exp().item(), bias.item()], "history": history,
            "train_time_s": time.perf_counter() - t0, "pairs": int(len(data.label)), "frames": int(len(data.frames)),
            "groups": len(data.groups), "wordings": len(wordings),
            "state_targets": 0 if targets is None else int(targets.shape[1])}
