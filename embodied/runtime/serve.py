"""The job of ``embodied serve``: a checkpoint's policy behind a websocket, in openpi's wire format.

    embodied serve checkpoint=outputs/train/.../checkpoint port=8000
    embodied serve checkpoint=... host=0.0.0.0 api_key=SECRET      # reachable from the robot computer
    embodied serve checkpoint=... duration_s=60                     # stop by itself (smoke tests)
    embodied serve checkpoint=... max_batch=16 max_wait_ms=5         # many robots, one forward pass
    embodied serve checkpoint=... max_batch=1                        # one request at a time (openpi's way)
    embodied serve checkpoint=... runtime=onnxruntime                # a lone robot's chunk in ONNX Runtime

The server (``embodied.bridge.server.PolicyServer``) sends the metadata frame on connect
and answers each observation with ``actions`` (H, Da) and ``server_timing``. Concurrent
requests from several clients are batched into one forward pass (up to ``max_batch``
rows, waiting at most ``max_wait_ms`` for company); each row's chunk is bitwise what it
would be alone on a CPU state policy (``RowwisePolicy`` -> ``predict_rows``), so a robot's
actions never depend on which other robots asked at the same moment. A request without
``noise`` gets the noise ``embodied eval`` would use for the same observation
(``RowwisePolicy``: drawn from a hash of the observation), so served, evaluated and
local actions agree; with ``rowwise_noise=false`` it comes from the connection's own
generator (seeded with the checkpoint's seed) instead. Writes ``server.json`` (the URL,
once listening) and, on exit, ``metrics.json`` (connections, requests, errors, forward
passes and rows) to ``hydra.run.dir``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

log = logging.getLogger("embodied.serve")


@dataclass
class ServeConfig:
    """Schema of ``configs/serve.yaml``."""

    checkpoint: str = ""  # the output of `embodied train` (RUN/checkpoint)
    host: str = "127.0.0.1"  # 0.0.0.0 to accept connections from other machines
    port: int = 8000  # 0: the OS picks a free port (see server.json)
    api_key: str = ""  # "" : no key; else clients must send `Authorization: Api-Key <api_key>`
    api_key_env: str = ""  # name of an environment variable holding the key (keeps it off the command line)
    device: str = "auto"
    num_inference_steps: int = 0  # 0: the checkpoint's setting
    noise_scale: Optional[float] = None  # factor on the initial noise drawn per request (null: the checkpoint's)
    ground_instructions: Optional[bool] = None  # null: the checkpoint's setting
    max_message_mb: float = 64.0  # larger requests get an error frame
    rowwise_noise: bool = True  # requests without noise: embodied eval's per-observation noise; false: the
    #                             connection's own generator (seeded with the checkpoint's seed)
    max_batch: int = 8  # most observation rows in one forward pass; 1: one request at a time (openpi's way)
    max_wait_ms: float = 2.0  # how long the oldest request waits for others to join its pass (CPU: ~1/5 of a pass)
    # what runs a lone robot's chunk (flow policies, state observations, CPU): torchscript (a frozen graph, bitwise
    # what `embodied eval` computes) or onnxruntime (the same graph in ONNX Runtime: faster, equal to ~1e-6)
    runtime: str = "torchscript"
    duration_s: float = 0.0  # > 0: stop after this long; 0: serve until Ctrl-C
    key_map: dict[str, str] = field(default_factory=dict)  # a client's keys -> ours, e.g. {prompt: instruction}

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("give checkpoint=PATH (the output of `embodied train`)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535 (0: any free port), got {self.port}")
        if not 0.001 <= self.max_message_mb <= 4096:
            raise ValueError(f"max_message_mb must be in [0.001, 4096], got {self.max_message_mb}")
        if self.duration_s < 0:
            raise ValueError(f"duration_s must be >= 0 (0: until Ctrl-C), got {self.duration_s}")
        from embodied.bridge.batching import check_batching

        check_batching(self.max_batch, self.max_wait_ms)
        from policies.common.base import FROZEN_RUNTIMES
        from policies.common.config import check_noise_scale

        if self.noise_scale is not None:
            check_noise_scale(self.noise_scale)

        if self.runtime not in FROZEN_RUNTIMES:
            raise ValueError(f"runtime must be one of {FROZEN_RUNTIMES}, got {self.runtime!r}")
        if self.api_key_env and self.api_key_env not in os.environ:
            raise ValueError(f"api_key_env={self.api_key_env!r}: no such environment variable")


def load_served(checkpoint: str, device: str = "auto", num_inference_steps: int = 0,
                ground_instructions: bool | None = None, runtime: str = "torchscript",
                noise_scale: float | None = None) -> tuple[Any, dict[str, Any]]:
    """(the policy as served, its metadata frame), warmed up: ``RowwisePolicy`` over the checkpoint's
    policy, so each request's rows are computed as if alone, batched with others or not. ``runtime``
    runs one-row chunks (``TorchPolicy.freeze_for_inference``); ``onnxruntime`` is refused for a
    policy it cannot run. ``noise_scale`` (None: the checkpoint's) scales the initial noise drawn
    for requests that send none."""
    from embodied.bridge.server import policy_metadata
    from embodied.runtime.checkpoints import load_for_eval
    from embodied.runtime.evaluate import RowwisePolicy

    import torch

    torch.set_num_threads(1)  # rows run on one thread (RowwisePolicy): switching per request costs more than it saves
    policy = load_for_eval(checkpoint, device, num_inference_steps, ground_instructions)
    if noise_scale is not None:
        policy.unwrapped.noise_scale = noise_scale  # refused for a policy that draws no noise
    if runtime != "torchscript":
        freeze = getattr(policy.unwrapped, "freeze_for_inference", None)
        if freeze is None or not freeze(runtime):
            raise ValueError(f"runtime={runtime} runs flow policies with state observations on a CPU; {checkpoint} "
                             "is not one (runtime=torchscript serves it)")
    served = RowwisePolicy(policy)
    meta = policy_metadata(policy, checkpoint=checkpoint,
                           text_encoder=str(getattr(policy.unwrapped.config, "text_encoder", "")))
    _warm_up(served, meta)
    import gc

    gc.collect()
    gc.freeze()  # what is loaded stays: the collector no longer walks it (no long pauses between requests)
    return served, meta


def serve_checkpoint(cfg: ServeConfig, out: Any) -> dict[str, Any]:
    from embodied.bridge.server import PolicyServer
    from embodied.core.files import write_json

    served, meta = load_served(cfg.checkpoint, cfg.device, cfg.num_inference_steps, cfg.ground_instructions,
                               cfg.runtime, cfg.noise_scale)
    api_key = os.environ[cfg.api_key_env] if cfg.api_key_env else cfg.api_key
    server = PolicyServer(served, cfg.host, cfg.port, metadata=meta, api_key=api_key or None,
                          max_message_bytes=int(cfg.max_message_mb * 2**20), key_map=cfg.key_map,
                          max_batch=cfg.max_batch, max_wait_ms=cfg.max_wait_ms,
                          noise_seed=None if cfg.rowwise_noise else int(meta["seed"]))
    # whole or absent (written aside, then renamed): a client polls for it while the server starts
    write_json(out / "server.json", {"url": server.url, "pid": os.getpid(), "metadata": server.metadata})
    print(f"serving {cfg.checkpoint} on {server.url}", flush=True)
    log.info("serving %s on %s (H=%d, Ta=%d, To=%d; max_batch %d, max_wait_ms %g)%s", cfg.checkpoint, server.url,
             meta["horizon"], meta["n_action_steps"], meta["n_obs_steps"], cfg.max_batch, cfg.max_wait_ms,
             " with an API key" if api_key else "")
    t0 = time.monotonic()
    if cfg.duration_s:
        threading.Timer(cfg.duration_s, server.stop).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("stopped by Ctrl-C")
    finally:
        server.stop()
    metrics = {"url": server.url, "checkpoint": cfg.checkpoint, **server.stats, "batching": server.batch_stats,
               "max_batch": cfg.max_batch, "max_wait_ms": cfg.max_wait_ms, "wall_time_s": time.monotonic() - t0}
    write_json(out / "metrics.json", metrics)
    return metrics


def _warm_up(policy: Any, meta: dict[str, Any]) -> None:
    """One chunk from a blank observation before listening: the first request then costs what later ones do
    (the text encoder and the kernels are loaded by now)."""
    import numpy as np

    to, size = meta["n_obs_steps"], meta["image_size"]
    batch: dict[str, Any] = {"state": np.zeros((1, to, meta["state_dim"]), np.float32), "instruction": ["warm up"]}
    if meta["tasks"]:
        batch["task"] = [meta["tasks"][0]]
    cams = meta["cameras"]
    if size and cams:
        blank = np.zeros((1, to, size, size, 3), np.uint8)
        batch.update({"image": blank} if len(cams) == 1 else {"images": {c: blank for c in cams}})
    t = time.monotonic()
    policy.predict_chunk(batch)
    log.info("warm-up chunk in %.0f ms", (time.monotonic() - t) * 1000)


def serve_settings(checkpoint: str, device: str, settings: list[tuple[int, float]], state_dim: int = 39,
                   action_dim: int = 7, horizon: int = 8) -> None:
    """One policy behind one ``PolicyServer`` per (max_batch, max_wait_ms) setting, in this process;
    prints their URLs and the metadata as one JSON line, then serves until killed.

    The server process of ``embodied robot bench clients=N``: the settings share the loaded
    policy (and its warm-up), so what differs between them is the batching alone.
    ``checkpoint=""`` serves ``ConstantPolicy`` (no inference cost: the bridge alone).
    """
    from embodied.bridge.latency import ConstantPolicy
    from embodied.bridge.server import PolicyServer, policy_metadata

    if checkpoint:
        served, meta = load_served(checkpoint, device)
    else:
        served = ConstantPolicy(horizon, max(1, horizon // 2), action_dim, n_obs_steps=1)
        meta = policy_metadata(served, state_dim=state_dim, action_dim=action_dim, generative=False)
    servers = [PolicyServer(served, metadata=meta, max_batch=b, max_wait_ms=w).start() for b, w in settings]
    print(json.dumps({"urls": [s.url for s in servers], "metadata": meta}), flush=True)
    threading.Event().wait()


if __name__ == "__main__":  # python -m embodied.runtime.serve CHECKPOINT DEVICE STATE_DIM ACTION_DIM HORIZON B:MS...
    import sys

    serve_settings(sys.argv[1], sys.argv[2], [(int(b), float(w)) for b, w in (a.split(":") for a in sys.argv[6:])],
                   int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
