"""Noise-conditioned networks: (noisy chunk (B, H, Da), time (B,), cond (B, C)) -> (B, H, Da).

Both nets condition through FiLM (Perez et al. 2018) on [time embedding || cond], where
cond = [observation features || text features] comes from the policy's encoders.

- ``MLPDenoiser`` (default): the chunk is flattened (H*Da values) and passed through
  residual blocks ``h + W2 mish(W1 (LN(h) * (1 + s) + b))`` with per-block (s, b) from the
  conditioning. Cheap on a CPU: a training step costs far less than the U-Net's.
- ``ConditionalUnet1D``: Diffusion Policy's 1-D temporal conv U-Net (Chi et al. 2023):
  residual conv blocks with GroupNorm and FiLM, downsampling by 2 per level, skip
  connections. Better inductive bias for long, smooth chunks and pixel policies.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from policies.common.config import DenoiserConfig


_LINEAR, _MISH = F.linear, F.mish
_ROWS_LOCK = threading.Lock()
_ROWS_DEPTH = 0
# ATen's bmm/baddbmm takes a plain loop, not the BLAS kernel ``F.linear`` uses, when
# M * K * N < 400 (aten/src/ATen/native/LinearAlgebra.cpp); rows that small go one by one.
_SMALL_BMM = 512
# Vectorised element-wise kernels run 2 vectors (32 floats with AVX-512) per iteration and
# the rest of the tensor in a scalar loop, whose mish differs in the last bit: a row of
# another length would meet the scalar loop at other places alone and among others.
_VEC_FLOATS = 32


def _rowwise_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if x.dim() < 2 or x.shape[0] == 1:
        return _LINEAR(x, weight, bias)
    b, k, n = x.shape[0], x.shape[-1], weight.shape[0]
    rows = x.reshape(b, -1, k)  # (B, M, K): each row's M vectors, as that row alone would hold them
    if rows.shape[1] * k * n < _SMALL_BMM:
        return torch.cat([_LINEAR(x[i: i + 1], weight, bias) for i in range(b)])
    w = weight.t().expand(b, k, n)
    out = torch.bmm(rows, w) if bias is None else torch.baddbmm(bias.expand(b, 1, n), rows, w)
    return out.reshape(*x.shape[:-1], n)


def _rowwise_mish(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    if x.dim() < 2 or x.shape[0] == 1 or (x.is_contiguous() and x[0].numel() % _VEC_FLOATS == 0):
        return _MISH(x, inplace)
    return torch.cat([_MISH(x[i: i + 1]) for i in range(x.shape[0])])


@contextlib.contextmanager
def row_invariant() -> Iterator[None]:
    """Within this block ``nn.Linear`` and mish compute each batch row as they would alone.

    CPU kernels are not bitwise batch-invariant: a matmul over ten rows takes another kernel
    (another summation order) than over one, and an element-wise kernel meets its scalar
    tail at other places, so a row's output moves in its last bits with the rows beside it
    and a closed-loop episode drifts. Here ``F.linear`` on B > 1 rows runs ``torch.baddbmm``
    over the rows with the weight broadcast, which multiplies each row by the kernel a
    batch of one uses, and mish runs row by row when a row's length is not a multiple of
    the vector loop's. Softmax, layer norm and the other element-wise ops used by the
    state models already act row by row. ``tests/test_policies.py`` checks whole policies
    bitwise, rows alone against rows batched. Rows batched this way still cost less than
    one call per row. Used by
    ``TorchPolicy.predict_rows``; it patches ``torch.nn.functional`` for the whole process
    while any such block is open.
    """
    global _ROWS_DEPTH
    with _ROWS_LOCK:
        _ROWS_DEPTH += 1
        F.linear, F.mish = _rowwise_linear, _rowwise_mish
    try:
        yield
    finally:
        with _ROWS_LOCK:
            _ROWS_DEPTH -= 1
            if _ROWS_DEPTH == 0:
                F.linear, F.mish = _LINEAR, _MISH


class SinusoidalPosEmb(nn.Module):
    """(B,) float times -> (B, dim) sin/cos features (Vaswani et al. 2017)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        half = dim // 2
        self.register_buffer("freqs", torch.exp(-math.log(10000.0) * torch.arange(half) / max(half - 1, 1)),
                             persistent=False)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        x = t.float()[:, None] * self.freqs[None]
        return torch.cat([x.sin(), x.cos()], dim=-1)


def time_encoder(dim: int) -> nn.Sequential:
    return nn.Sequential(SinusoidalPosEmb(dim), nn.Linear(dim, 4 * dim), nn.Mish(), nn.Linear(4 * dim, dim))


class FiLMResBlock(nn.Module):
    """Residual MLP block modulated by the conditioning vector."""

    def __init__(self, hidden: int, cond_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False)
        self.film = nn.Linear(cond_dim, 2 * hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        nn.init.zeros_(self.film.weight), nn.init.zeros_(self.film.bias)

    def forward(self, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        scale, shift = self.film(c).chunk(2, dim=-1)
        y = self.norm(h) * (1 + scale) + shift
        return h + self.fc2(nn.functional.mish(self.fc1(y)))


class MLPDenoiser(nn.Module):
    """FiLM residual MLP over the flattened chunk."""

    def __init__(self, action_dim: int, horizon: int, cond_dim: int, hidden: int = 512, n_layers: int = 3,
                 time_emb_dim: int = 64) -> None:
        super().__init__()
        self.horizon, self.action_dim = horizon, action_dim
        self.time = time_encoder(time_emb_dim)
        self.cond = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim + cond_dim, hidden), nn.Mish())
        self.inp = nn.Linear(horizon * action_dim + hidden, hidden)
        self.blocks = nn.ModuleList(FiLMResBlock(hidden, hidden) for _ in range(n_layers))
        self.out = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, horizon * action_dim))

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        c = self.cond(torch.cat([self.time(t), cond], dim=-1))
        h = self.inp(torch.cat([x.flatten(1), c], dim=-1))
        for block in self.blocks:
            h = block(h, c)
        return self.out(h).view(-1, self.horizon, self.action_dim)


class Conv1dBlock(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int, n_groups: int) -> None:
        super().__init__(nn.Conv1d(cin, cout, kernel, padding=kernel // 2), nn.GroupNorm(n_groups, cout), nn.Mish())


class CondResBlock1D(nn.Module):
    """Two conv blocks; FiLM (scale, bias per channel) between them; 1x1 residual."""

    def __init__(self, cin: int, cout: int, cond_dim: int, kernel: int, n_groups: int) -> None:
        super().__init__()
        self.block1, self.block2 = Conv1dBlock(cin, cout, kernel, n_groups), Conv1dBlock(cout, cout, kernel, n_groups)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * cout))
        self.residual = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        scale, bias = self.film(c).unsqueeze(-1).chunk(2, dim=1)
        return self.block2(self.block1(x) * scale + bias) + self.residual(x)


class ConditionalUnet1D(nn.Module):
    """Temporal U-Net over (B, H, Da) chunks; H must divide by 2**(len(down_dims)-1)."""

    def __init__(self, action_dim: int, cond_dim: int, down_dims: tuple[int, ...] = (64, 128, 256),
                 kernel_size: int = 5, n_groups: int = 8, time_emb_dim: int = 64) -> None:
        super().__init__()
        self.time = time_encoder(time_emb_dim)
        cd = time_emb_dim + cond_dim
        dims = [action_dim, *down_dims]
        n = len(down_dims)

        def res(a: int, b: int) -> CondResBlock1D:
            return CondResBlock1D(a, b, cd, kernel_size, n_groups)

        self.down = nn.ModuleList()
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            last = i == n - 1
            self.down.append(nn.ModuleList([res(a, b), res(b, b),
                                            nn.Conv1d(b, b, 3, 2, 1) if not last else nn.Identity()]))
        self.mid = nn.ModuleList([res(dims[-1], dims[-1]), res(dims[-1], dims[-1])])
        self.up = nn.ModuleList()
        for i, (a, b) in enumerate(reversed(list(zip(dims[1:-1], dims[2:])))):
            self.up.append(nn.ModuleList([res(2 * b, a), res(a, a), nn.ConvTranspose1d(a, a, 4, 2, 1)]))
        self.final = nn.Sequential(Conv1dBlock(down_dims[0], down_dims[0], kernel_size, n_groups),
                                   nn.Conv1d(down_dims[0], action_dim, 1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        c = torch.cat([self.time(t), cond], dim=-1)
        h = x.transpose(1, 2)  # (B, Da, H)
        skips = []
        for r1, r2, down in self.down:
            h = r2(r1(h, c), c)
            skips.append(h)
            h = down(h)
        for r in self.mid:
            h = r(h, c)
        for r1, r2, up in self.up:  # as in Diffusion Policy, the first level's skip is unused
            h = r2(r1(torch.cat([h, skips.pop()], dim=1), c), c)
            h = up(h)
        return self.final(h).transpose(1, 2)


def make_denoiser(config: DenoiserConfig, action_dim: int, cond_dim: int) -> nn.Module:
    """The network named by ``config.net``."""
    if config.net == "mlp":
        return MLPDenoiser(action_dim, config.horizon, cond_dim, config.hidden, config.n_layers, config.time_emb_dim)
    return ConditionalUnet1D(action_dim, cond_dim, config.down_dims, config.kernel_size, config.n_groups,
                             config.time_emb_dim)
