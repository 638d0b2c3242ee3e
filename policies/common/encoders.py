"""Observation encoders: state MLP and a small CNN with spatial softmax for images.

``ObsEncoder`` maps a normalised state history (B, To, Ds) and, in pixel mode, uint8
camera frames (B, To, H, W, 3) per camera to one feature vector (B, obs_dim). The image
encoder follows Diffusion Policy / robomimic: a conv trunk with GroupNorm (EMA-safe),
spatial-softmax keypoints (Levine et al. 2016) and random-shift augmentation in training
(DrQ, Kostrikov et al. 2020).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def mlp(in_dim: int, hidden: int, out_dim: int, n_hidden: int = 1) -> nn.Sequential:
    """Linear-Mish stack with ``n_hidden`` hidden layers and a linear output."""
    layers: list[nn.Module] = []
    d = in_dim
    for _ in range(n_hidden):
        layers += [nn.Linear(d, hidden), nn.Mish()]
        d = hidden
    layers.append(nn.Linear(d, out_dim))
    return nn.Sequential(*layers)


def random_shift(images: torch.Tensor, pad: int) -> torch.Tensor:
    """Shift each (N, C, H, W) image by up to ``pad`` pixels (replicate padding)."""
    n, _, h, w = images.shape
    padded = F.pad(images, (pad, pad, pad, pad), mode="replicate")
    # one integer offset per image, applied through an affine grid (no Python loop)
    eps = 1.0 / (h + 2 * pad)
    base_y = torch.linspace(-1 + eps, 1 - eps, h + 2 * pad, device=images.device)[:h]
    base_x = torch.linspace(-1 + eps, 1 - eps, w + 2 * pad, device=images.device)[:w]
    grid = torch.stack(torch.meshgrid(base_x, base_y, indexing="xy"), dim=-1)[None].expand(n, h, w, 2)
    shift = torch.randint(0, 2 * pad + 1, (n, 1, 1, 2), device=images.device).float() * 2.0 * eps
    return F.grid_sample(padded, grid + shift, mode="nearest", padding_mode="zeros", align_corners=False)


class SpatialSoftmax(nn.Module):
    """(N, C, H, W) feature maps -> (N, 2K) expected (x, y) keypoint coordinates."""

    def __init__(self, in_channels: int, keypoints: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, keypoints, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        n, k, h, w = x.shape
        attn = torch.softmax(x.flatten(2), dim=-1).view(n, k, h, w)
        ys = torch.linspace(-1, 1, h, device=x.device, dtype=x.dtype)
        xs = torch.linspace(-1, 1, w, device=x.device, dtype=x.dtype)
        ex = (attn.sum(2) * xs).sum(-1)
        ey = (attn.sum(3) * ys).sum(-1)
        return torch.cat([ex, ey], dim=-1)


class ImageEncoder(nn.Module):
    """uint8 (N, H, W, 3) frames -> (N, 2 * keypoints) features.

    Four 3x3 conv layers (stride 2, 1, 2, 1) with GroupNorm and ``activation`` (SiLU by default):
    a quarter of the input resolution is left for the keypoints (16x16 for 64x64 images).
    """

    def __init__(self, keypoints: int = 32, crop_pad: int = 4, channels: int = 32, activation: str = "silu") -> None:
        super().__init__()
        acts = {"silu": nn.SiLU, "relu": nn.ReLU, "mish": nn.Mish}
        if activation not in acts:
            raise ValueError(f"activation={activation!r} is not allowed: must be one of {', '.join(map(repr, acts))}")
        self.crop_pad = crop_pad
        c = channels

        def block(cin: int, cout: int, stride: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, stride, 1), nn.GroupNorm(8, cout), acts[activation]()]

        self.trunk = nn.Sequential(*block(3, c, 2), *block(c, c, 1), *block(c, 2 * c, 2), *block(2 * c, 2 * c, 1))
        self.keypoints = SpatialSoftmax(2 * c, keypoints)
        self.out_dim = 2 * keypoints

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = frames.permute(0, 3, 1, 2).float().div_(255.0).sub_(0.5)
        if self.training and self.crop_pad > 0:
            x = random_shift(x, self.crop_pad)
        return self.keypoints(self.trunk(x))


class TextPool(nn.Module):
    """Frozen instruction embeddings -> (B, out_dim) text features.

    ``pool="mean"``: ``mish(W e)`` of the pooled sentence vector e. ``pool="attention"``:
    also ``queries`` learned queries attend over the layer-normed contextual token vectors
    (masked softmax), and the attended values join e before the projection. The tokens keep
    who-does-what ("the red block on the green block") that mean pooling blurs.
    ``token_dropout``: in training, each token but the first is hidden from the attention
    with this probability, so that no single word carries the instruction (word dropout).
    ``feature_dropout``: dropout on the output features in training.
    """

    def __init__(self, in_dim: int, out_dim: int, pool: str = "attention", queries: int = 4,
                 key_dim: int = 64, token_dropout: float = 0.0, feature_dropout: float = 0.0) -> None:
        super().__init__()
        self.pool = pool
        self.token_dropout = token_dropout
        self.feature_dropout = nn.Dropout(feature_dropout)
        extra = 0
        if pool == "attention":
            self.norm = nn.LayerNorm(in_dim)
            self.key = nn.Linear(in_dim, key_dim)
            self.value = nn.Linear(in_dim, key_dim)
            self.queries = nn.Parameter(torch.randn(queries, key_dim) / key_dim ** 0.5)
            extra = queries * key_dim
        self.proj = nn.Linear(in_dim + extra, out_dim)

    def forward(self, pooled: torch.Tensor, tokens: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """pooled (B, D); tokens (B, L, D) and mask (B, L) bool (needed for attention)."""
        feats = [pooled]
        if self.pool == "attention":
            if tokens is None or mask is None:
                raise ValueError("attention pooling needs the instruction's token vectors and mask")
            if self.training and self.token_dropout > 0:  # hide random words; [CLS] (first) stays
                keep = torch.rand(mask.shape, device=mask.device) >= self.token_dropout
                keep[:, 0] = True
                mask = mask & keep
            feats.append(self._attend(tokens, mask))
        return self.feature_dropout(F.mish(self.proj(torch.cat(feats, dim=-1))))

    def _attend(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Attention of the queries over ``value(norm(tokens))`` with keys ``key(norm(tokens))``.

        Computed in the token space, the same function for far less work. With n the tokens
        normalised without the affine (frozen inputs: no gradient) and g, b the norm's scale and
        shift, the logit ``q . key(g n + b) = ((W_k^T q) * g) . n + c_q``, where the constant c_q
        cancels in the softmax; and since the weights a sum to one, ``sum_t a_t value(g n_t + b) =
        value(g (sum_t a_t n_t) + b)``. So the L tokens meet Q query vectors rather than two D x
        key_dim matrices. The parameters, and so checkpoints, are those of the direct form;
        ``tests/test_policies.py`` checks that both agree.
        """
        n = F.layer_norm(tokens, tokens.shape[-1:], eps=self.norm.eps)  # (B, L, D)
        qk = (self.queries @ self.key.weight) * self.norm.weight  # (Q, D)
        logits = torch.matmul(n, qk.t()).transpose(1, 2) / self.key.out_features ** 0.5  # (B, Q, L)
        logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
        pooled = torch.bmm(torch.softmax(logits, dim=-1), n)  # (B, Q, D)
        return self.value(pooled * self.norm.weight + self.norm.bias).flatten(1)


class ObsEncoder(nn.Module):
    """Observation history (+ text features) -> (B, out_dim) features.

    The state MLP is FiLM-modulated by the text features (Perez et al. 2018): each hidden
    layer is ``mish(h * (1 + s) + b)`` with (s, b) a linear function of the text. This lets
    the instruction select which parts of the state matter (e.g. *which* block to reach)
    before the features reach the head, rather than leaving that gating to the head's
    concatenated input.

    Args:
        state_dim: Ds.
        n_obs_steps: To.
        hidden: state-MLP width.
        out_dim: feature size.
        n_layers: hidden layers of the state MLP.
        text_dim: size of the text features (0: no FiLM).
        n_cameras: cameras encoded (0 for state-only policies); one CNN is shared by all.
        keypoints, crop_pad, image_channels, image_activation: image-encoder settings.
        aux_dim: size of the privileged state predicted from the current step's image
            features by ``self.aux`` (an MLP; 0: none). Its loss is added in training only.
    """

    def __init__(self, state_dim: int, n_obs_steps: int, hidden: int, out_dim: int, n_layers: int = 2,
                 text_dim: int = 0, n_cameras: int = 0, keypoints: int = 32, crop_pad: int = 4,
                 image_channels: int = 16, aux_dim: int = 0, image_activation: str = "silu") -> None:
        super().__init__()
        self.image = ImageEncoder(keypoints, crop_pad, image_channels, image_activation) if n_cameras else None
        self.aux = (mlp(n_cameras * self.image.out_dim, 256, aux_dim)
                    if aux_dim and self.image is not None else None)
        per_step = state_dim + (n_cameras * self.image.out_dim if self.image is not None else 0)
        dims = [n_obs_steps * per_step] + [hidden] * n_layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.out = nn.Linear(hidden, out_dim)
        self.film = nn.Linear(text_dim, 2 * hidden * n_layers) if text_dim else None
        if self.film is not None:
            nn.init.zeros_(self.film.weight), nn.init.zeros_(self.film.bias)
        self.out_dim = out_dim

    def forward(self, state: torch.Tensor, images: list[torch.Tensor] | None = None,
                text: torch.Tensor | None = None, aux: bool = False
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """state (B, To, Ds) normalised; images: per camera uint8 (B, To, H, W, 3); text (B, text_dim).

        ``aux=True`` also returns the predicted (normalised) privileged state (B, aux_dim).
        """
        feats = [state]
        if self.image is not None:
            if not images:
                raise ValueError("this policy encodes camera images but the batch has none")
            for frames in images:
                b, to = frames.shape[:2]
                feats.append(self.image(frames.reshape(b * to, *frames.shape[2:])).view(b, to, -1))
        aux_pred = None
        if aux:
            if self.aux is None:
                raise ValueError("this encoder has no auxiliary state head (aux_dim=0 or no cameras)")
            aux_pred = self.aux(torch.cat([f[:, -1] for f in feats[1:]], dim=-1))
        h = torch.cat(feats, dim=-1).flatten(1)
        film = self.film(text).chunk(2 * len(self.layers), dim=-1) if self.film is not None else None
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if film is not None:
                h = h * (1 + film[2 * i]) + film[2 * i + 1]
            h = F.mish(h)
        out = self.out(h)
        return (out, aux_pred) if aux else out
