"""The job of ``embodied serve``: a checkpoint's policy behind a websocket, in openpi's wire format.

    embodied serve checkpoint=outputs/train/.../checkpoint port=8000
    embodied serve checkpoint=... host=0.0.0.0 api_key=SECRET      # reachable from the robot computer
    embodied serve checkpoint=... duration_s=60                     # stop by itself (smoke tests)

The server (``embodied.bridge.server.PolicyServer``) sends the metadata frame on connect
and answers each observation with ``actions`` (H, Da) and ``server_timing``. A request
without ``noise`` gets the noise ``embodied eval`` would use for the same observation
(``RowwisePolicy``: drawn from a hash of the observation), so served, evaluated and
local actions agree. Writes ``server.json`` (the URL, once listening) and, on exit,
``metrics.json`` (connections, requests, errors) to ``hydra.run.dir``.
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
    ground_instructions: Optional[bool] = None  # null: the checkpoint's setting
    max_message_mb: float = 64.0  # larger requests get an error frame
    rowwise_noise: bool = True  # requests without noise: embodied eval's per-observation noise
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
        if self.api_key_env and self.api_key_env not in os.environ:
            raise ValueError(f"api_key_env={self.api_key_env!r}: no such environment variable")


def serve_checkpoint(cfg: ServeConfig, out: Any) -> dict[str, Any]:
    from embodied.bridge.server import PolicyServer, policy_metadata
    from embodied.runtime.checkpoints import load_for_eval
    from embodied.runtime.evaluate import RowwisePolicy

    policy = load_for_eval(cfg.checkpoint, cfg.device, cfg.num_inference_steps, cfg.ground_instructions)
    served = RowwisePolicy(policy) if cfg.rowwise_noise else policy
    meta = policy_metadata(policy, checkpoint=cfg.checkpoint,
                           text_encoder=str(getattr(policy.unwrapped.config, "text_encoder", "")))
    _warm_up(served, meta)
    api_key = os.environ[cfg.api_key_env] if cfg.api_key_env else cfg.api_key
    server = PolicyServer(served, cfg.host, cfg.port, metadata=meta, api_key=api_key or None,
                          max_message_bytes=int(cfg.max_message_mb * 2**20), key_map=cfg.key_map)
    (out / "server.json").write_text(json.dumps({"url": server.url, "pid": os.getpid(), "metadata": meta}))
    print(f"serving {cfg.checkpoint} on {server.url}", flush=True)
    log.info("serving %s on %s (H=%d, Ta=%d, To=%d)%s", cfg.checkpoint, server.url, meta["horizon"],
             meta["n_action_steps"], meta["n_obs_steps"], " with an API key" if api_key else "")
    t0 = time.monotonic()
    if cfg.duration_s:
        threading.Timer(cfg.duration_s, server.stop).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("stopped by Ctrl-C")
    finally:
        server.stop()
    metrics = {"url": server.url, "checkpoint": cfg.checkpoint, **server.stats,
               "wall_time_s": time.monotonic() - t0}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
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
