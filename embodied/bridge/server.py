"""``PolicyServer``: any ``Policy`` behind a websocket, in openpi's wire format (see ``wire``).

One thread per connection, and one ``ClientSession`` each: the connection's own observation
history (for clients that send one step at a time), its own noise stream (``noise_seed``)
and episode count, so what one client sends never reaches another's chunks.

``max_batch=1``: calls into the policy are serialised by one lock, one request per forward
pass (openpi's server does the same). ``max_batch > 1``: concurrent requests are batched
into one forward pass by ``embodied.bridge.batching.Batcher``, within ``max_wait_ms`` of the
oldest one; a row's chunk is what it would be alone (``predict_rows``).

A client that sends a bad message gets the error as a text frame and its connection is
closed; the others are not affected. A client that stops reading is disconnected once a
reply has waited ``send_timeout_s`` to be written, and one that sends half a message only
holds its own thread. ``GET /healthz`` answers 200 without a handshake; with ``api_key``
set, a handshake without ``Authorization: Api-Key KEY`` is answered 401.
"""

from __future__ import annotations

import http
import logging
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State
from websockets.sync.server import Request, Response, ServerConnection, serve

from embodied.bridge import wire
from embodied.bridge.batching import Batcher, ClientGone, Job, ServerStopping, check_batching
from embodied.core.policy import Policy, check_chunk, stack_history

log = logging.getLogger("embodied.bridge.server")
OPEN_TIMEOUT_S = 5.0  # a connection that has not finished its handshake by then is dropped
CLOSE_TIMEOUT_S = 2.0  # closing waits this long for a client's answer (stop() waits for every connection)
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
    # the factor on the N(0, I) noise drawn for a request that sends none (policy.noise_scale)
    meta.setdefault("noise_scale", float(getattr(inner, "noise_scale", 1.0)) if meta["generative"] else None)
    return meta


@dataclass
class ClientSession:
    """What the server keeps for one connection, and for no other.

    ``history``: the last To single-step observations (openpi clients send one step at a
    time); ``rng``: the connection's own noise stream (with ``noise_seed``: rows sent without
    noise get theirs from it, so a client's noise never depends on other clients' requests);
    ``episodes``: episode starts seen (``reset`` or openpi's ``episode_start``).
    """

    id: int
    remote: str
    history: deque = field(default_factory=deque)
    rng: np.random.Generator | None = None
    episodes: int = 0
    requests: int = 0
    prev_total_ms: float | None = None

    def start_episode(self) -> None:
        self.history.clear()
        self.episodes += 1


class PolicyServer:
    """Serve ``policy`` on ``ws://host:port`` (port 0: the OS picks one; see ``url``).

    Args:
        policy: any ``Policy``; ``predict_chunk`` gets (B, To, ...) batches and the request's noise
            (``predict_rows`` the merged batches, when ``max_batch > 1`` and the policy has it).
        metadata: the metadata frame (default ``policy_metadata(policy)``).
        api_key: when set, handshakes must carry ``Authorization: Api-Key <api_key>``.
        max_message_bytes: requests over this size get an error frame; over twice it the
            websocket layer itself closes the connection (code 1009) without reading it.
        key_map: request keys a client sends -> ours, for openpi clients written for another
            policy, e.g. ``{"observation/state": "state", "prompt": "instruction"}``.
        max_batch: most observation rows in one forward pass; 1: one request at a time.
        max_wait_ms: how long the oldest waiting request may wait for others to join its pass.
        noise_seed: None: a request without noise gets what the policy draws (``RowwisePolicy``:
            from the row itself); an int: from its connection's own generator seeded with it.
        send_timeout_s: a client that has not taken a reply within this long is disconnected.
    """

    def __init__(self, policy: Policy, host: str = "127.0.0.1", port: int = 0,
                 metadata: Mapping[str, Any] | None = None, api_key: str | None = None,
                 max_message_bytes: int = wire.MAX_MESSAGE_BYTES, key_map: Mapping[str, str] | None = None,
                 max_batch: int = 1, max_wait_ms: float = 2.0, noise_seed: int | None = None,
                 send_timeout_s: float = 10.0):
        if max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be >= 1024, got {max_message_bytes}")
        self.max_batch, self.max_wait_ms = check_batching(max_batch, max_wait_ms)
        if not send_timeout_s > 0:
            raise ValueError(f"send_timeout_s must be > 0, got {send_timeout_s}")
        self.policy = policy
        self.metadata = dict(metadata if metadata is not None else policy_metadata(policy))
        self.metadata.update(max_message_bytes=int(max_message_bytes), max_batch=self.max_batch)
        self.api_key = api_key or None
        self.max_message_bytes = int(max_message_bytes)
        self.key_map = dict(key_map or {})
        self.noise_seed = None if noise_seed is None else int(noise_seed)
        self.send_timeout_s = float(send_timeout_s)
        shape = self.metadata.get("noise_shape")
        self._noise_shape = tuple(shape) if self.metadata.get("generative", True) and shape else None
        scale = self.metadata.get("noise_scale")
        self._noise_scale = 1.0 if scale is None else float(scale)
        self._lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._ids = 0
        self._server = serve(self._handle, host, port, compression=None, max_size=2 * self.max_message_bytes,
                             process_request=self._process_request, ping_interval=None,
                             open_timeout=OPEN_TIMEOUT_S, close_timeout=CLOSE_TIMEOUT_S)
        self.url = "ws://%s:%d" % self._server.socket.getsockname()[:2]
        self._batcher = Batcher(policy, self.max_batch, self.max_wait_ms) if self.max_batch > 1 else None
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.stats = {"connections": 0, "requests": 0, "errors": 0}

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def batch_stats(self) -> dict[str, int]:
        """Forward passes, rows and requests run by the batcher (empty with ``max_batch=1``)."""
        return dict(self._batcher.stats) if self._batcher is not None else {}

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
        if self._batcher is not None:
            self._batcher.close()
        for conn in list(getattr(self._server, "connections", ())):
            conn.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "PolicyServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _count(self, key: str) -> None:
        with self._stats_lock:
            self.stats[key] += 1

    # ------------------------------------------------------------------ HTTP
    def _process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        if request.path == "/healthz":
            return conn.respond(http.HTTPStatus.OK, "OK\n")
        if self.api_key is not None and request.headers.get("Authorization") != f"Api-Key {self.api_key}":
            return conn.respond(http.HTTPStatus.UNAUTHORIZED, "missing or wrong 'Authorization: Api-Key ...' header\n")
        return None

    # ------------------------------------------------------------------ websocket
    def _session(self, conn: ServerConnection) -> ClientSession:
        with self._stats_lock:
            self._ids += 1
            self.stats["connections"] += 1
            sid = self._ids
        rng = np.random.default_rng(self.noise_seed) if self.noise_seed is not None else None
        return ClientSession(sid, str(conn.remote_address), deque(maxlen=int(self.metadata["n_obs_steps"])), rng)

    def _handle(self, conn: ServerConnection) -> None:
        session = self._session(conn)
        conn.socket.settimeout(self.send_timeout_s)  # a blocked write fails (and closes) after this long
        if self._batcher is not None:
            self._batcher.client_joined()
        try:
            conn.send(wire.pack(self.metadata))
            while self._serve_one(conn, session):
                pass
        except ConnectionClosed:
            pass
        finally:
            if self._batcher is not None:
                self._batcher.client_left()

    def _serve_one(self, conn: ServerConnection, session: ClientSession) -> bool:
        """Read one request and answer it; False when the connection is over."""
        data = conn.recv()
        t0 = time.monotonic()
        try:
            reply = self._reply(data, session, conn)
        except (ClientGone, ServerStopping):
            return False
        except Exception:
            self._count("errors")
            text = traceback.format_exc()
            log.warning("request from %s refused: %s", session.remote, text.strip().splitlines()[-1])
            conn.send(text)
            conn.close(code=1011, reason="request failed; the error is in the previous frame")
            return False
        if "actions" in reply and session.prev_total_ms is not None:
            reply["server_timing"]["prev_total_ms"] = session.prev_total_ms
        conn.send(wire.pack(reply))
        session.prev_total_ms = (time.monotonic() - t0) * 1000
        return True

    def _reply(self, data: Any, session: ClientSession, conn: ServerConnection) -> dict[str, Any]:
        if isinstance(data, str):
            raise wire.WireError("requests must be binary msgpack frames, got a text frame")
        msg = wire.unpack(data, self.max_message_bytes)
        if isinstance(msg, Mapping) and ("__ctrl__" in msg or b"__ctrl__" in msg):
            ctrl = msg.get("__ctrl__", msg.get(b"__ctrl__"))
            if ctrl == "episode_start":
                session.start_episode()
            return {"__ack__": ctrl if ctrl in ("episode_start", "episode_end") else "ignored"}
        if self.key_map and isinstance(msg, Mapping):
            msg = {self.key_map.get(k.decode() if isinstance(k, bytes) else k, k): v for k, v in msg.items()}
        req = wire.read_request(msg, self.metadata)
        if req.reset:
            session.start_episode()
        if req.single_step is not None:
            history = session.history
            if not history:
                for _ in range(history.maxlen - 1):  # type: ignore[operator]
                    history.append(req.single_step)
            history.append(req.single_step)
            req.batch = stack_history(list(history))
        b = len(req.batch["instruction"])
        noise = req.noise
        if noise is None and session.rng is not None and self._noise_shape is not None:
            noise = (session.rng.standard_normal((b, *self._noise_shape)) * self._noise_scale).astype(np.float32)
        chunk, timing = self._infer(req.batch, noise, b, conn)
        session.requests += 1
        self._count("requests")
        return {"actions": chunk if req.batched else chunk[0], "server_timing": timing}

    def _infer(self, batch: dict[str, Any], noise: np.ndarray | None, b: int,
               conn: ServerConnection) -> tuple[np.ndarray, dict[str, float]]:
        """(b, H, Da) float32 and the server's timing: alone under the lock, or through the batcher."""
        if self._batcher is None:
            t_wait = time.monotonic()
            with self._lock:
                t_infer = time.monotonic()
                chunk = self.policy.predict_chunk(batch, noise)
                infer_ms = (time.monotonic() - t_infer) * 1000
            chunk = check_chunk(chunk, b).astype(np.float32)
            return chunk, {"infer_ms": infer_ms, "queue_ms": (t_infer - t_wait) * 1000}
        job = self._batcher.submit(Job(batch, noise, b, alive=lambda: conn.state is State.OPEN))
        while not job.wait(0.5):
            if conn.state is not State.OPEN:
                raise ClientGone("the client disconnected while its request was queued")
        if job.error is not None:
            raise job.error
        assert job.chunk is not None
        return job.chunk, job.timing
