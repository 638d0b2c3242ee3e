"""The image tower as one inference graph instead of a Python call per layer
(``inference_encoder``), for the small batches (one frame per env) a training loop scores.

The tower is exported to ONNX and run by ONNX Runtime on a CPU (``OnnxTower``), else traced
and frozen by TorchScript (BatchNorm folded into the convolutions). A CLIP ResNet's attention pool is
computed for the one token it returns (``FirstTokenAttentionPool``). The graph is checked
against the eager tower when it is built, and the eager tower is kept if none matches.
"""

from __future__ import annotations

import io
import logging
import warnings
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

log = logging.getLogger("embodied.reward")


class _EncodeImage(torch.nn.Module):
    """``model.encode_image`` as a module (what ``inference_encoder`` traces)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(x)


class FirstTokenAttentionPool(torch.nn.Module):
    """open_clip's ``AttentionPool2d`` (a CLIP ResNet's head), computing only what it returns.

    The pool attends from every one of its H*W + 1 tokens (the mean token, then the feature
    map's) and keeps the output of the first. Only that token's query and output projection
    are needed, so they are computed for it alone; keys and values come from one matrix
    product. Same function, fewer operations: with one head per 8 channels the query and the
    output projection were most of the pool's cost. Holds copies of the pool's weights.
    """

    def __init__(self, pool: torch.nn.Module):
        super().__init__()
        self.heads = int(pool.num_heads)
        with torch.no_grad():  # copies, outside autograd
            self.register_buffer("pos", pool.positional_embedding.clone())
            self.register_buffer("q_w", pool.q_proj.weight.clone())
            self.register_buffer("q_b", pool.q_proj.bias.clone())
            self.register_buffer("kv_w", torch.cat([pool.k_proj.weight, pool.v_proj.weight]))
            self.register_buffer("kv_b", torch.cat([pool.k_proj.bias, pool.v_proj.bias]))
            self.register_buffer("out_w", pool.c_proj.weight.clone())
            self.register_buffer("out_b", pool.c_proj.bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, output_dim)
        b, c = x.shape[0], x.shape[1]
        d = c // self.heads
        x = x.flatten(2).transpose(1, 2)  # (B, HW, C)
        x = torch.cat([x.mean(1, keepdim=True), x], 1) + self.pos  # (B, HW + 1, C)
        q = F.linear(x[:, 0], self.q_w, self.q_b).view(b, self.heads, 1, d)
        k, v = F.linear(x, self.kv_w, self.kv_b).chunk(2, dim=-1)
        k = k.reshape(b, -1, self.heads, d).transpose(1, 2)
        v = v.reshape(b, -1, self.heads, d).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v).reshape(b, c)
        return F.linear(o, self.out_w, self.out_b)


class _ResNetImage(torch.nn.Module):
    """A CLIP ResNet image tower (open_clip's ``ModifiedResNet``) for inference: its stem and
    stages as they are, its attention pool as ``FirstTokenAttentionPool``."""

    def __init__(self, visual: torch.nn.Module):
        super().__init__()
        self.visual = visual
        self.pool = FirstTokenAttentionPool(visual.attnpool)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.visual
        return self.pool(v.layer4(v.layer3(v.layer2(v.layer1(v.stem(x))))))


def _candidates(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The graphs ``inference_encoder`` tries, fastest first."""
    out = []
    visual = getattr(model, "visual", None)
    pool = getattr(visual, "attnpool", None)
    if (all(hasattr(visual, n) for n in ("stem", "layer1", "layer2", "layer3", "layer4"))
            and all(hasattr(pool, n) for n in ("num_heads", "positional_embedding", "q_proj", "k_proj", "v_proj",
                                                "c_proj"))):
        out.append(("CLIP ResNet, first-token attention pool", _ResNetImage(visual)))
    return out + [("encode_image", _EncodeImage(model))]


class _ChannelsLastInput(torch.nn.Module):
    """``module`` taking (B, S, S, 3) images: a channels-last batch (B, 3, S, S) is that array
    without a copy, so it crosses into ONNX Runtime as it is."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x.permute(0, 3, 1, 2))


class OnnxTower:
    """An image tower run by ONNX Runtime on the CPU: ``module`` exported to ONNX in memory
    (TorchScript-based exporter), the batch dimension symbolic.

    Calls take and return torch tensors like the module: (B, 3, S, S) images, channels-last
    preferred, -> (B, D). The session uses ``torch.get_num_threads()`` threads (as many as
    torch at the time it is built) and does not spin while idle.
    """

    runtime = "onnxruntime"

    def __init__(self, module: torch.nn.Module, size: int, name: str):
        import onnxruntime  # noqa: F401  (missing: fail before the export)

        from embodied.nn.onnx import cpu_session

        self.name = name
        buffer = io.BytesIO()
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)  # attention as exportable ops, not one fused kernel
        try:
            torch.onnx.export(_ChannelsLastInput(module).eval(), (torch.zeros(2, size, size, 3),), buffer,
                              input_names=["image"], output_names=["embedding"],
                              dynamic_axes={"image": {0: "batch"}, "embedding": {0: "batch"}},
                              dynamo=False, opset_version=17)
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)
        self.session = cpu_session(buffer.getvalue(), torch.get_num_threads())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        image = x.detach().permute(0, 2, 3, 1).contiguous().float().numpy()
        return torch.from_numpy(self.session.run(None, {"image": image})[0])

    def __repr__(self) -> str:
        return f"OnnxTower({self.name!r})"


def _torchscript(module: torch.nn.Module, example: torch.Tensor) -> torch.jit.ScriptModule:
    """``module`` traced on ``example`` and frozen (weights inlined, BatchNorm folded)."""
    return torch.jit.freeze(torch.jit.trace(module.eval(), example, check_trace=False))


RUNTIMES = ("onnxruntime", "torchscript")  # what inference_encoder tries, fastest first


def _runtime(name: str, device: torch.device) -> Callable[[torch.nn.Module, torch.Tensor, str], Callable] | None:
    """A builder of ``name``'s graph of a module (module, example input, label) -> encode, or
    None when that runtime cannot run here (ONNX Runtime: CPU only, and its packages must import)."""
    if name == "torchscript":
        return lambda module, example, label: _torchscript(module, example)
    if name != "onnxruntime":
        raise ValueError(f"unknown inference runtime {name!r}; choose from {list(RUNTIMES)}")
    if device.type != "cpu":
        return None
    try:
        import onnx  # noqa: F401  (the exporter writes with it)
        import onnxruntime  # noqa: F401
    except ImportError as e:
        log.info("image tower: ONNX Runtime unavailable (%s); TorchScript instead", e)
        return None
    return lambda module, example, label: OnnxTower(module, example.shape[-1], label)


def inference_encoder(model: torch.nn.Module, size: int, rtol: float = 1e-4,
                      runtimes: Sequence[str] = RUNTIMES) -> tuple[Callable, bool]:
    """``(encode, optimised)``: ``model.encode_image`` as an inference graph, or the eager
    method when no graph can be built or none gives the eager tower's output on a probe batch
    (within ``rtol`` of the embedding's scale).

    The graphs, tried in order: a CLIP ResNet tower with its attention pool computed for the
    one token it returns (``FirstTokenAttentionPool``), then the whole ``encode_image`` (for
    other towers, or a model whose ``encode_image`` does more than run the tower); each by the
    first of ``runtimes`` that builds it and matches: ``"onnxruntime"`` (``OnnxTower``, on the
    CPU) and ``"torchscript"`` (traced and frozen, BatchNorm folded into the convolutions). A
    graph holds the weights as they are now (later changes to ``model`` are not seen). Batch
    sizes other than the traced one are fine: the batch dimension stays symbolic.
    """
    eager = model.encode_image
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(0)
    device = next(iter(model.parameters()), torch.zeros(0)).device
    example, probe = (torch.randn(n, 3, size, size, generator=gen).to(device).contiguous(
        memory_format=torch.channels_last) for n in (2, 3))
    try:
        with torch.no_grad():
            want = eager(probe).float()
        builders = [(r, _runtime(r, device)) for r in runtimes]
        for name, module in _candidates(model):
            module = module.to(device).eval()
            for runtime, build in builders:
                if build is None:
                    continue
                try:
                    with torch.no_grad(), warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # the exporters' deprecation notices
                        encode = build(module, example, name)
                        got = encode(probe).float()
                        encode(probe[:1])  # another batch size once before use
                except Exception as e:  # a graph this runtime cannot build or run: try the next
                    log.info("image tower: %s could not run %s (%s)", runtime, name,
                             str(e).splitlines()[0] if str(e) else type(e).__name__)
                    continue
                err = float((got - want).abs().max())
                scale = float(want.abs().max()) + 1e-6
                if got.shape == want.shape and err <= rtol * scale:
                    log.debug("image tower: %s runs %s", runtime, name)
                    return encode, True
                log.info("image tower: %s's graph of %s differs by %.2g (scale %.2g)", runtime, name, err, scale)
    finally:
        model.train(was_training)
    log.warning("image tower kept eager: no inference graph of it matches the eager tower")
    return eager, False
