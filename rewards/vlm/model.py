"""CLIP rewards: rendered frames + an instruction -> a reward per frame, from open_clip towers.

With x the unit image embedding of a frame, g the unit embedding of the instruction (the
goal) and b the unit mean embedding of the baseline prompts:

- ``similarity`` = cos(x, g), the plain CLIP reward (ARP, VLM-RMs with alpha = 0).
- ``goal`` = 1 - 1/2 ||(x - g) P||^2 with P = alpha d d^T/||d||^2 + (1 - alpha) I, d = g - b:
  VLM-RMs' goal-baseline regularisation (Rocamonde et al.). alpha = 0 gives ``similarity``;
  alpha = 1 keeps only the component of x - g along the baseline->goal direction.
  P is a contraction, so ``goal`` lies in [-1, 1].
- ``negative`` = mean cos(x, n_k) over the negative prompts (described failure states,
  VLM-RL's contrasting goals), when there are any.
- ``holds``: sigma(s cos(x, g) + c), the calibrated probability that the instruction holds in
  the frame, for a model fitted in-domain (it learnt s and c); absent otherwise.

``reward = goal - negative_weight * negative``, in [-1 - w, 1 + w] (w = 0 without negatives).
With ``reference`` image embeddings (a fitted checkpoint keeps those of frames of its fitting
bank) and ``standardize``, the reward is that value as a z-score per instruction: minus its mean
over the reference frames, over its standard deviation there. Each wording then has the same
scale and zero point, so frames scored with different wordings (or different goals) compare;
within one instruction the order of frames is unchanged. The range is then unbounded
(``reward_range`` = (-inf, inf)); ``bounds(instruction)`` gives the finite range of one
instruction, ((-1 - w - mean) / sd, (1 + w - mean) / sd).
Smoothing over the last k frames is a property of a stream of frames, not of one batch:
``smoothing`` is read by the wrappers and the evaluation (``causal_mean``).

Text embeddings are cached per string; images are embedded in batches of ``batch_size``.
For inference the image tower runs as one graph (``rewards.vlm.export.inference_encoder``:
ONNX Runtime on a CPU, else TorchScript), checked against the eager tower when it is built.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from embodied.core.reward import RewardInputError, RewardModel, RewardOutput
from rewards.vlm.export import inference_encoder

log = logging.getLogger("embodied.reward")


def projected_reward(x: torch.Tensor, g: torch.Tensor, b: torch.Tensor, alpha: float) -> torch.Tensor:
    """VLM-RMs reward 1 - 1/2 ||(x - g) P||^2 for rows x (B, D), goals g (B, D), baseline b (D,).

    Computed without forming P: with v = x - g and u the unit baseline->goal direction,
    ||v P||^2 = (1 - alpha)^2 ||v||^2 + (2 alpha - alpha^2) (v . u)^2.
    """
    v = x - g
    sq = (v * v).sum(-1)
    if alpha == 0.0:
        return 1.0 - 0.5 * sq
    d = g - b[None, :]
    norm = d.norm(dim=-1, keepdim=True)
    if bool((norm < 1e-6).any()):
        raise RewardInputError("an instruction embeds like the baseline prompts (goal - baseline = 0), so the "
                               "goal-baseline projection is undefined: change the baselines or use alpha=0")
    along = (v * (d / norm)).sum(-1)
    return 1.0 - 0.5 * ((1.0 - alpha) ** 2 * sq + (2.0 * alpha - alpha * alpha) * along * along)


def causal_mean(rewards: np.ndarray, k: int) -> np.ndarray:
    """Mean of the last ``k`` rewards at each step of one episode (T,) (fewer at the start)."""
    r = np.asarray(rewards, np.float64)
    if k <= 1 or len(r) == 0:
        return r.astype(np.float32)
    c = np.cumsum(np.r_[0.0, r])
    t = np.arange(1, len(r) + 1)
    lo = np.maximum(0, t - k)
    return ((c[t] - c[lo]) / (t - lo)).astype(np.float32)


class ImagePreprocess:
    """uint8 frames (B, H, W, 3) -> normalised float (B, 3, S, S) for an open_clip image tower."""

    def __init__(self, size: int, mean: Sequence[float], std: Sequence[float]):
        self.size = int(size)
        std_t = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
        self.scale = 1.0 / (255.0 * std_t)
        self.shift = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1) / std_t
        self.neg_shift = -self.shift

    def __call__(self, frames: np.ndarray | torch.Tensor) -> torch.Tensor:
        # (B, H, W, 3) viewed as (B, 3, H, W) is channels-last memory, which conv towers prefer
        x = torch.as_tensor(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
        if x.shape[-2:] != (self.size, self.size):
            x = F.interpolate(x.float(), size=(self.size, self.size), mode="bilinear", antialias=True,
                              align_corners=False)
        return torch.addcmul(self.neg_shift, x, self.scale)  # x * scale - shift, in one pass


class ClipReward(RewardModel):
    """A CLIP reward over rendered frames and an instruction (see the module docstring).

    Args:
        model: an open_clip model; its image tower ``model.visual`` embeds the frames.
        text: the text side (``rewards.vlm.text``): ``encode(list[str]) -> (N, D)`` unit vectors.
        preprocess: frames -> image-tower input.
        alpha: goal-baseline projection strength in [0, 1].
        baselines: baseline prompts (their mean embedding is b); needed when alpha > 0.
        negatives: negative prompts (failure states); empty for none.
        negative_weight: weight of the ``negative`` term.
        smoothing: frames averaged by the wrappers and the evaluation (1: none).
        batch_size: frames per forward pass of the image tower.
        suite, image_size, camera, supersample: what the model was fitted for (see ``RewardModel``).
        calibration: (s, c) of the ``holds`` term, for a model fitted in-domain.
        meta: the checkpoint's record (``describe`` returns it).
        optimize: embed frames with an inference graph of the image tower (``inference_encoder``:
            ONNX Runtime, else TorchScript; built on first use from the model's weights at that
            time); False: the eager tower.
        reference: unit image embeddings (N, D) of reference frames (see the module docstring).
        standardize: z-score each instruction's reward against ``reference`` (when given).
    """

    inputs = frozenset({"frames"})

    def __init__(self, model: torch.nn.Module, text: Any, preprocess: ImagePreprocess, *, alpha: float = 0.0,
                 baselines: Sequence[str] = (), negatives: Sequence[str] = (), negative_weight: float = 1.0,
                 smoothing: int = 1, batch_size: int = 64, suite: str | None = None,
                 image_size: int | None = None, camera: str | None = None, supersample: int = 1,
                 calibration: tuple[float, float] | None = None, meta: dict[str, Any] | None = None,
                 cache_text: bool = True, optimize: bool = True, reference: torch.Tensor | None = None,
                 standardize: bool = True):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if alpha > 0 and not baselines:
            raise ValueError(f"alpha={alpha} projects onto the baseline->goal direction: give baseline prompts")
        if negative_weight < 0:
            raise ValueError(f"negative_weight must be >= 0, got {negative_weight}")
        if smoothing < 1 or batch_size < 1:
            raise ValueError(f"smoothing and batch_size must be >= 1, got {smoothing} and {batch_size}")
        for what, prompts in (("baselines", baselines), ("negatives", negatives)):
            if any(not isinstance(p, str) or not p.strip() for p in prompts):
                raise ValueError(f"{what} must be non-empty strings, got {list(prompts)}")
        self.model, self.text, self.preprocess = model.eval(), text, preprocess
        self.model.visual.to(memory_format=torch.channels_last)  # the layout frames arrive in
        self.alpha, self.baselines, self.negatives = float(alpha), list(baselines), list(negatives)
        self.negative_weight, self.smoothing, self.batch_size = float(negative_weight), int(smoothing), int(batch_size)
        self.suite, self.image_size, self.camera, self.calibration = suite, image_size, camera or None, calibration
        self.supersample = int(supersample)
        self.meta = dict(meta or {})
        self.cache_text, self.optimize = cache_text, bool(optimize)
        self._text_cache: dict[str, torch.Tensor] = {}
        self._encoders: dict[bool, tuple[Callable, bool]] = {}  # optimize -> inference_encoder's answer
        if reference is not None and (reference.ndim != 2 or len(reference) < 2):
            raise ValueError(f"reference must be image embeddings (N >= 2, D), got shape {tuple(reference.shape)}")
        self.reference, self.standardize = reference, bool(standardize)
        self._ref_stats: dict[str, tuple[float, float]] = {}  # instruction -> (mean, sd) over the reference
        self._last_rows: tuple[tuple, torch.Tensor, torch.Tensor | None] | None = None  # see _rows
        w = self.negative_weight if self.negatives else 0.0
        self._raw_range = (-1.0 - w, 1.0 + w)
        self.reward_range = (-np.inf, np.inf) if self.standardized else self._raw_range

    @property
    def standardized(self) -> bool:
        """Whether rewards are z-scored per instruction (``standardize`` with a ``reference``)."""
        return self.standardize and self.reference is not None

    def with_options(self, **changes: Any) -> "ClipReward":
        """A copy with other scoring options (alpha, baselines, negatives, ...), sharing the
        towers and the text cache."""
        names = ("alpha", "baselines", "negatives", "negative_weight", "smoothing", "batch_size", "optimize",
                 "standardize")
        bad = sorted(set(changes) - set(names))
        if bad:
            raise ValueError(f"with_options: unknown option(s) {bad}; allowed: {list(names)}")
        kw = {n: changes.get(n, getattr(self, n)) for n in names}
        other = ClipReward(self.model, self.text, self.preprocess, suite=self.suite, image_size=self.image_size,
                           camera=self.camera, supersample=self.supersample, calibration=self.calibration,
                           meta=self.meta, reference=self.reference,
                           cache_text=self.cache_text, **kw)
        other._text_cache, other._encoders = self._text_cache, self._encoders
        return other

    def __getstate__(self) -> dict[str, Any]:
        # inference graphs do not pickle: a copy (e.g. in a vector-env worker) rebuilds its own
        state = dict(self.__dict__)
        state["_encoders"] = {}
        return state

    # ------------------------------------------------------------- embeddings
    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """Unit text embeddings (N, D), from the cache when ``cache_text``."""
        if not self.cache_text:
            return self.text.encode(list(texts))
        missing = sorted({t for t in texts if t not in self._text_cache})
        if missing:
            for t, v in zip(missing, self.text.encode(missing)):
                self._text_cache[t] = v
        return torch.stack([self._text_cache[t] for t in texts])

    def encoder(self) -> tuple[Callable, bool]:
        """(the image encoder in use, whether it is the optimised one): see ``optimize``."""
        if self.optimize not in self._encoders:
            self._encoders[self.optimize] = (inference_encoder(self.model, self.preprocess.size) if self.optimize
                                             else (self.model.encode_image, False))
        return self._encoders[self.optimize]

    @property
    def runtime(self) -> str:
        """What embeds the frames: ``"onnxruntime"``, ``"torchscript"`` or ``"eager"`` (builds
        the encoder if it is not built yet)."""
        encode, optimised = self.encoder()
        if not optimised:
            return "eager"
        return getattr(encode, "runtime", "torchscript")

    def embed_images(self, frames: np.ndarray) -> torch.Tensor:
        """Unit image embeddings (B, D) of uint8 frames (B, H, W, 3), ``batch_size`` at a time."""
        out = []
        encode = self.encoder()[0]
        with torch.inference_mode():
            for i in range(0, len(frames), self.batch_size):
                z = encode(self.preprocess(frames[i:i + self.batch_size]))
                out.append(F.normalize(z.float(), dim=-1))
        return torch.cat(out) if out else torch.zeros(0, self.text.dim)

    # ------------------------------------------------------------------ reward
    def score_embeddings(self, x: torch.Tensor, instruction: str | Sequence[str]) -> RewardOutput:
        """The reward of unit image embeddings x (B, D) (see the module docstring)."""
        texts = [instruction] * x.shape[0] if isinstance(instruction, str) else list(instruction)
        with torch.inference_mode():
            goals, stats = self._rows(texts)
            reward, terms = self._score(x, goals)
            if stats is not None:  # (reward - mean) / sd
                reward = torch.addcmul(stats[0], reward, stats[1])
            values = torch.stack([reward, *terms.values()]).float().numpy()  # one conversion for all
        return RewardOutput(values[0], dict(zip(terms, values[1:])))

    def _rows(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(goal embeddings (B, D), when standardised (-mean / sd, 1 / sd) (2, B) of the
        reference statistics), one row (column) per text. The last batch's rows are kept (with
        ``cache_text``): a vector env's instructions change only when one of its episodes ends,
        so most steps reuse them."""
        key = (self.standardized, *texts)
        last = self._last_rows
        if self.cache_text and last is not None and last[0] == key:
            return last[1], last[2]
        goals = self._goals(texts)
        stats = None
        if self.standardized:
            mean, sd = torch.tensor([self.reference_stats(t) for t in texts], dtype=torch.float64).reshape(-1, 2).T
            stats = torch.stack([-mean / sd, 1.0 / sd]).to(goals.dtype)
        if self.cache_text:
            self._last_rows = (key, goals, stats)
        return goals, stats

    def _goals(self, texts: list[str]) -> torch.Tensor:
        """Goal embeddings (B, D), one row per text (each distinct text embedded once)."""
        uniq = sorted(set(texts))
        table = self.embed_texts(uniq)
        return table[[uniq.index(t) for t in texts]] if len(uniq) > 1 else table.expand(len(texts), -1)

    def reference_stats(self, instruction: str) -> tuple[float, float]:
        """(mean, sd) of the unstandardised reward of ``instruction`` over the reference frames."""
        if self.reference is None:
            raise ValueError("this reward has no reference frames to standardise against")
        if instruction not in self._ref_stats:
            r = self._score(self.reference, self._goals([instruction] * len(self.reference)))[0].double()
            self._ref_stats[instruction] = (float(r.mean()), max(float(r.std()), 1e-4))
        return self._ref_stats[instruction]

    def bounds(self, instruction: str) -> tuple[float, float]:
        """The finite (low, high) range of ``instruction``'s reward (see the module docstring)."""
        lo, hi = self._raw_range
        if not self.standardized:
            return lo, hi
        mean, sd = self.reference_stats(instruction)
        return (lo - mean) / sd, (hi - mean) / sd

    def _score(self, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(unstandardised reward (B,), terms) of unit image embeddings x (B, D) against goal
        embeddings g (B, D), row by row."""
        if x.shape[-1] != g.shape[-1]:
            raise RewardInputError(f"image embeddings are {x.shape[-1]}-d but the text side gives "
                                   f"{g.shape[-1]}-d: the towers do not belong together")
        sim = (x * g).sum(-1)
        if self.alpha > 0:
            base = F.normalize(self.embed_texts(self.baselines).mean(0), dim=-1)
            goal = projected_reward(x, g, base, self.alpha)
        else:
            goal = sim
        terms = {"similarity": sim, "goal": goal}
        reward = goal
        if self.negatives:
            neg = (x @ self.embed_texts(self.negatives).T).mean(-1)
            terms["negative"] = neg
            reward = goal - self.negative_weight * neg
        if self.calibration is not None:
            s, c = self.calibration
            terms["holds"] = torch.sigmoid(s * sim + c)
        return reward, terms

    def score(self, frames: np.ndarray | None, states: np.ndarray | None,
              instruction: str | Sequence[str]) -> RewardOutput:
        return self.score_embeddings(self.embed_images(np.asarray(frames)), instruction)

    def describe(self) -> dict[str, Any]:
        """What the evaluation records about this reward."""
        return {"name": "clip", "alpha": self.alpha, "baselines": self.baselines, "negatives": self.negatives,
                "negative_weight": self.negative_weight, "smoothing": self.smoothing, "suite": self.suite,
                "image_size": self.image_size, "camera": self.camera, "supersample": self.supersample,
                "standardized": self.standardized,
                "text": self.text.describe(),
                **{k: self.meta[k] for k in ("arch", "checkpoint", "fitted") if k in self.meta}}


@dataclasses.dataclass
class ClipRewardConfig:
    """Settings of a CLIP reward (``configs/reward/clip.yaml``).

    ``checkpoint`` is a reward folder written by ``embodied reward fit`` (reward.json +
    model.safetensors), or a local open_clip weights file together with ``arch`` (an open_clip
    architecture name such as ViT-B-32; ``arch_overrides`` replace entries of its config, e.g.
    ``{"vision_cfg": {"image_size": 64}}``). Nothing is downloaded.
    """

    name: str = "clip"
    checkpoint: str = ""
    arch: str = ""
    arch_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # open_clip config entries
    camera: str = ""  # for a weights file: read this camera's observation images ("": env.render())
    # for a weights file: anti-aliasing of the frames it reads (make_env's supersample); 0: the
    # checkpoint's own for a fitted reward folder, 1 (none) for a weights file
    supersample: int = 0
    alpha: float = 0.0
    baselines: list[str] = dataclasses.field(default_factory=lambda: ["a robot and the objects around it"])
    negatives: list[str] = dataclasses.field(default_factory=list)
    negative_weight: float = 1.0
    smoothing: int = 3  # mean over the last k frames (configs/reward/clip.yaml); 1: none
    batch_size: int = 64  # frames per forward pass (mid-sized batches run fastest on a CPU core)
    optimize: bool = True  # embed with an inference graph of the image tower (same output; false: eager)
    # z-score each instruction's reward against the checkpoint's reference frames (a fitted reward
    # folder with reference.safetensors; others have none and are not standardised)
    standardize: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"reward.alpha must be in [0, 1], got {self.alpha}")
        if self.alpha > 0 and not self.baselines:
            raise ValueError(f"reward.alpha={self.alpha} needs reward.baselines=[...] (prompts describing the "
                             "scene without the goal)")
        if self.smoothing < 1:
            raise ValueError(f"reward.smoothing must be >= 1 (frames averaged; 1 = none), got {self.smoothing}")
        if self.batch_size < 1:
            raise ValueError(f"reward.batch_size must be >= 1, got {self.batch_size}")
        if self.negative_weight < 0:
            raise ValueError(f"reward.negative_weight must be >= 0, got {self.negative_weight}")
        if not 0 <= self.supersample <= 4:
            raise ValueError(f"reward.supersample must be in [0, 4] (0: the checkpoint's own), got {self.supersample}")
        if not str(self.checkpoint).strip():
            raise ValueError("reward.checkpoint is empty: give a reward folder from `embodied reward fit "
                             "suite=...` (the offline default), or a local open_clip weights file with "
                             "reward.arch=NAME. No pretrained CLIP weights ship with the package and nothing "
                             "is downloaded.")


def load_clip_reward(cfg: ClipRewardConfig) -> ClipReward:
    """The CLIP reward ``cfg`` describes, its weights read from ``cfg.checkpoint``."""
    from pathlib import Path

    from rewards.vlm.text import CenteredText, ClauseText, MiniLMText, OpenClipText, ProjectedText
    from rewards.vlm.towers import (OPENAI_MEAN, OPENAI_STD, RewardCheckpointError, image_size_of,
                                    is_reward_checkpoint, load_open_clip, read_reference, read_reward_checkpoint)

    path = Path(cfg.checkpoint)
    options = dict(alpha=cfg.alpha, baselines=cfg.baselines, negatives=cfg.negatives,
                   negative_weight=cfg.negative_weight, smoothing=cfg.smoothing, batch_size=cfg.batch_size,
                   optimize=cfg.optimize, standardize=cfg.standardize)
    if is_reward_checkpoint(path):
        meta, model = read_reward_checkpoint(path)
        if cfg.camera and cfg.camera != (meta.get("camera") or ""):
            raise ValueError(f"reward.camera={cfg.camera!r}, but {cfg.checkpoint!r} was fitted on "
                             f"{meta.get('camera') or 'env.render()'} frames; leave reward.camera empty")
        fitted_ss = int(meta.get("supersample", 1))
        if cfg.supersample and cfg.supersample != fitted_ss:
            raise ValueError(f"reward.supersample={cfg.supersample}, but {cfg.checkpoint!r} was fitted on frames drawn "
                             f"with supersample={fitted_ss}; leave reward.supersample at 0 (the checkpoint's own)")
        text = MiniLMText() if meta["text"]["name"] == "minilm" else OpenClipText(model, meta["arch"])
        if meta.get("text_clauses"):
            text = ClauseText(text, meta.get("clause_head") or "clause")  # (checkpoints before clause_head: "clause")
        if meta.get("text_center") is not None:
            text = CenteredText(text, torch.tensor(meta["text_center"]))
        if meta.get("text_basis") is not None:
            text = ProjectedText(text, torch.tensor(meta["text_basis"]))
        size = int(meta["image_size"])  # the frames it reads; the tower may take another size
        pre = ImagePreprocess(image_size_of(model), meta.get("mean", OPENAI_MEAN), meta.get("std", OPENAI_STD))
        cal = meta.get("calibration")
        reference = read_reference(path, text.dim)
        return ClipReward(model, text, pre, suite=meta["suite"], image_size=size, camera=meta.get("camera"),
                          supersample=fitted_ss, reference=reference,
                          calibration=(float(cal[0]), float(cal[1])) if cal else None,
                          meta={**meta, "checkpoint": str(path)}, **options)
    if path.is_dir():
        raise RewardCheckpointError(f"reward.checkpoint {cfg.checkpoint!r} is a folder without reward.json: give a "
                                    "folder written by `embodied reward fit`, or an open_clip weights file")
    if not cfg.arch:
        if not path.exists():
            raise FileNotFoundError(f"reward.checkpoint {cfg.checkpoint!r} does not exist: give a folder written by "
                                    "`embodied reward fit`, or a local open_clip weights file with reward.arch=NAME")
        raise ValueError(f"reward.checkpoint {cfg.checkpoint!r} is a weights file: say its open_clip architecture "
                         "with reward.arch=NAME (e.g. ViT-B-32)")
    model = load_open_clip(cfg.arch, path, cfg.arch_overrides)
    import open_clip

    pre_cfg = open_clip.get_model_preprocess_cfg(model)
    pre = ImagePreprocess(image_size_of(model), pre_cfg.get("mean", OPENAI_MEAN), pre_cfg.get("std", OPENAI_STD))
    return ClipReward(model, OpenClipText(model, cfg.arch), pre, camera=cfg.camera or None,
                      supersample=cfg.supersample or 1, meta={"arch": cfg.arch, "checkpoint": str(path)}, **options)


def reward_from_settings(settings: dict[str, Any]) -> ClipReward:
    """``rewards.registry`` entry: a ``ClipReward`` from the ``reward:`` config group."""
    known = {f.name for f in dataclasses.fields(ClipRewardConfig)}
    bad = sorted(set(settings) - known)
    if bad:
        raise ValueError(f"reward=clip: unknown setting(s) {bad}; allowed: {sorted(known)}")
    return load_clip_reward(ClipRewardConfig(**settings))
