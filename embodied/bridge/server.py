"""``PolicyServer``: any ``Policy`` behind a websocket, in openpi's wire format (see ``wire``).

One thread per connection; calls into the policy are serialised by one lock (a policy is
not assumed thread-safe, and its determinism must not depend on how many clients share
it). A client that sends a bad message gets the error as a text frame and its
connection is closed; the others are not affected. ``GET /healthz`` answers 200 without
a handshake; with ``api_key`` set, a handshake without ``Authorization: Api-Key KEY`` is
answered 401.
"""

from __future__ import annotations

import http
import logging
import threading
import time
import traceback
from collections import deque
from typing import Any, Mapping

import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Request, Response, ServerConnection, serve

from embodied.bridge import wire
from embodied.core.policy import Policy, check_chunk, stack_history

log = logging.getLogger("embodied.bridge.server")
REQUIRED_META = ("n_obs_steps", "horizon", "n_action_steps", "state_dim", "action_dim")


def policy_metadata(policy: Policy, **extra: Any) -> dict[str, Any]:
    """The metadata frame for ``policy``: horizons, specs, noise shape, seed (what a client needs).

    Specs come from ``policy.unwrapped.obs_spec`` / ``action_spec`` when the policy has them;
    otherwise pass ``state_dim``, ``action_dim`` (and ``cameras``, ``image_size``) in ``extra``.
    """
    inner = policy.unwrapped
    meta: dict[str, Any] = {"server": "embodied", "wire_version": wire.WIRE_VERSION,
                            "n_obs_steps": int(policy.n_obs_steps), "horizon": int(policy.horizon),
                            "n_action_steps": int(policy.n_action_steps), "policy": type(inner).__name__}
    obs_spec, act_spec = getattr(inner, "obs_spec", None), getattr(inner, "action_spec", None)
    config = getattr(inner, "config", None)
    obs_mode = getattr(config, "obs_mode", "state")
    if obs_spec is not None:
        pixels = obs_mode != "state"
        meta.update(state_dim=obs_spec.state_dim, cameras=list(obs_spec.cameras) if pixels else [],
                    image_size=obs_spec.image_size if pixels else 0)
    if act_spec is not None:
        meta.update(action_dim=act_spec.dim, action_low=float(act_spec.low), action_high=float(act_spec.high))
    meta.update(obs_mode=obs_mode, seed=int(getattr(config, "seed", 0)),
                generative=bool(getattr(inner, "generative", True)),
                tasks=list(getattr(inner, "task_names", []) or []))
    meta.update(extra)
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise ValueError(f"metadata lacks {missing}: the policy has no obs_spec/action_spec, pass them as extra")
    meta.setdefault("cameras", [])
    meta.setdefault("image_size", 0)
    meta["noise_shape"] = [meta["horizon"], meta["action_dim"]] if meta["generative"] else None
    return meta


class PolicyServer:
    """Serve ``policy`` on ``ws://host:port`` (port 0: the OS picks one; see ``url``).

    Args:
        policy: any ``Policy``; ``predict_chunk`` gets (B, To, ...) batches and the request's noise.
        metadata: the metadata frame (default ``policy_metadata(policy)``).
        api_key: when set, handshakes must carry ``Authorization: Api-Key <api_key>``.
        max_message_bytes: requests over this size get an error frame; over twice it the
            websocket layer itself closes the connection (code 1009) without reading it.
        key_map: request keys a client sends -> ours, for openpi clients written for another
            policy, e.g. ``{"observation/state": "state", "prompt": "instruction"}``.
    """

    def __init__(self, policy: Policy, host: str = "127.0.0.1", port: int = 0,
                 metadata: Mapping[str, Any] | None = None, api_key: str | None = None,
                 max_message_bytes: int = wire.MAX_MESSAGE_BYTES, key_map: Mapping[str, str] | None = None):
        if max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be >= 1024, got {max_message_bytes}")
        self.policy = policy
        self.metadata = dict(metadata if metadata is not None else policy_metadata(policy))
        self.metadata["max_message_bytes"] = int(max_message_bytes)
        self.api_key = api_key or None
        self.max_message_bytes = int(max_message_bytes)
        self.key_map = dict(key_map or {})
        self._lock = threading.Lock()
        self._server = serve(self._handle, host, port, compression=None, max_size=2 * self.max_message_bytes,
                             process_request=self._process_request, ping_interval=None)
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.stats = {"connections": 0, "requests": 0, "errors": 0}

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        return int(self._server.socket.getsockname()[1])

    @property
    def url(self) -> str:
        host = self._server.socket.getsockname()[0]
        return f"ws://{host}:{self.port}"

    def start(self) -> "PolicyServer":
        """Serve in a background thread; returns self."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="policy-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        """Stop listening and close every connection (again: nothing)."""
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown()
        for conn in list(getattr(self._server, "connections", ())):
            conn.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "PolicyServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ HTTP
    def _process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        if request.path == "/healthz":
            return conn.respond(http.HTTPStatus.OK, "OK\n")
        if self.api_key is not None and request.headers.get("Authorization") != f"Api-Key {self.api_key}":
            return conn.respond(http.HTTPStatus.UNAUTHORIZED, "missing or wrong 'Authorization: Api-Key ...' header\n")
        return None

    # ------------------------------------------------------------------ websocket
    def _handle(self, conn: ServerConnection) -> None:
        self.stats["connections"] += 1
        history: deque[dict[str, Any]] = deque(maxlen=int(self.metadata["n_obs_steps"]))
        conn.send(wire.pack(self.metadata))
        prev_total_ms: float | None = None
        while True:
            try:
                data = conn.recv()
            except ConnectionClosed:
                return
            t0 = time.monotonic()
            try:
                reply = self._reply(data, history)
            except Exception:
                self.stats["errors"] += 1
                text = traceback.format_exc()
                log.warning("request from %s refused: %s", conn.remote_address, text.strip().splitlines()[-1])
                try:
                    conn.send(text)
                    conn.close(code=1011, reason="request failed; the error is in the previous frame")
                except ConnectionClosed:
                    pass
                return
            if "actions" in reply:
                timing = reply["server_timing"]
                if prev_total_ms is not None:
                    timing["prev_total_ms"] = prev_total_ms
            try:
                conn.send(wire.pack(reply))
            except ConnectionClosed:
                return
            prev_total_ms = (time.monotonic() - t0) * 1000

    def _reply(self, data: Any, history: deque[dict[str, Any]]) -> dict[str, Any]:
        if isinstance(data, str):
            raise wire.WireError("requests must be binary msgpack frames, got a text frame")
        msg = wire.unpack(data, self.max_message_bytes)
        if isinstance(msg, Mapping) and ("__ctrl__" in msg or b"__ctrl__" in msg):
            ctrl = msg.get("__ctrl__", msg.get(b"__ctrl__"))
            if ctrl == "episode_start":
                history.clear()
            return {"__ack__": ctrl if ctrl in ("episode_start", "episode_end") else "ignored"}
        if self.key_map and isinstance(msg, Mapping):
            msg = {self.key_map.get(k.decode() if isinstance(k, bytes) else k, k): v for k, v in msg.items()}
        req = wire.read_request(msg, self.metadata)
        if req.reset:
            history.clear()
        if req.single_step is not None:
            if not history:
                for _ in range(history.maxlen - 1):  # type: ignore[operator]
                    history.append(req.single_step)
            history.append(req.single_step)
            req.batch = stack_history(list(history))
        b = len(req.batch["instruction"])
        t_wait = time.monotonic()
        with self._lock:
            t_infer = time.monotonic()
            chunk = self.policy.predict_chunk(req.batch, req.noise)
            infer_ms = (time.monotonic() - t_infer) * 1000
        chunk = check_chunk(chunk, b).astype(np.float32)
        self.stats["requests"] += 1
        return {"actions": chunk if req.batched else chunk[0],
                "server_timing": {"infer_ms": infer_ms, "queue_ms": (t_infer - t_wait) * 1000}}
