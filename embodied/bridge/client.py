"""``RemotePolicy``: a policy served over the wire, with the ``Policy`` interface.

A remote policy and a local one are interchangeable: ``act``, ``predict_chunk`` and the
horizons behave the same (the horizons and specs come from the server's metadata frame).
The connection is re-opened when it drops (a server restart, a refused request), so a
call after a restart succeeds once the server is back. Requests carry the whole
observation history, never rely on the server remembering one, so re-sending a request
on a new connection is safe.

Servers: ours (``PolicyServer``, batched requests) or any openpi server (one request per
row with the last observation step; ``key_map`` renames our keys to the ones its policy
reads, e.g. ``{"state": "observation/state", "instruction": "prompt"}``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.protocol import State
from websockets.sync.client import ClientConnection

from embodied.bridge import wire
from embodied.core.errors import EmbodiedError, SpecMismatchError
from embodied.core.policy import Policy, batch_row
from embodied.core.specs import ActionSpec, ObservationSpec, check_compatible

log = logging.getLogger("embodied.bridge.client")


class ServerUnavailable(EmbodiedError, ConnectionError):
    """The policy server could not be reached (or stopped answering) in time."""


class ServerError(EmbodiedError, RuntimeError):
    """The policy server refused a request; the message holds its error frame."""


@dataclass(frozen=True)
class RemoteConfig:
    """What the server's metadata says about the policy (read by evaluation like a checkpoint's config)."""

    obs_mode: str = "state"
    seed: int = 0
    text_encoder: str = ""


class RemotePolicy(Policy):
    """The policy behind ``url`` (``ws://HOST:PORT``).

    Args:
        url: the server.
        api_key: sent as ``Authorization: Api-Key <api_key>``.
        timeout_s: how long one request may take (connecting included) before
            ``ServerUnavailable``; the connection is then dropped, so a late answer can
            never be taken for the next one.
        connect_timeout_s: how long the constructor waits for the server to come up.
        key_map: our observation keys -> the keys an openpi server's policy reads.
    """

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 30.0,
                 connect_timeout_s: float = 30.0, key_map: Mapping[str, str] | None = None):
        if not url.startswith(("ws://", "wss://")):
            raise ValueError(f"url must start with ws:// or wss://, got {url!r}")
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError(f"timeout_s and connect_timeout_s must be > 0, got {timeout_s}, {connect_timeout_s}")
        self.url, self.api_key, self.timeout_s = url, api_key, float(timeout_s)
        self.key_map = dict(key_map or {})
        self._conn: ClientConnection | None = None
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.last_timing: dict[str, float] = {}
        self.reconnects = -1  # the first connection is not a reconnection
        self.metadata = self._connect(connect_timeout_s)
        m = self.metadata
        try:
            self.n_obs_steps, self.horizon = int(m["n_obs_steps"]), int(m["horizon"])
            self.n_action_steps = int(m.get("n_action_steps", self.horizon))
            self.action_dim = int(m["action_dim"])
        except (KeyError, TypeError, ValueError) as e:
            raise ServerError(f"server at {url} sent metadata without horizons/action_dim ({e}); "
                              f"metadata: {str(m)[:300]}") from None
        super().__init__()
        self.ours = m.get("server") == "embodied"
        self.obs_spec = ObservationSpec(int(m.get("state_dim", 0)), tuple(m.get("cameras") or ()),
                                        int(m.get("image_size") or 0))
        self.action_spec = ActionSpec(self.action_dim, float(m.get("action_low", -1.0)),
                                      float(m.get("action_high", 1.0)))
        self.config = RemoteConfig(str(m.get("obs_mode", "state")), int(m.get("seed", 0)))
        self.generative = bool(m.get("generative", True))
        self.task_names = [str(t) for t in m.get("tasks") or []]

    # ------------------------------------------------------------------ connection
    @property
    def noise_shape(self) -> tuple[int, int]:
        """(H, Da): one row's initial noise."""
        return (self.horizon, self.action_dim)

    @property
    def connected(self) -> bool:
        """Whether the connection is open now (a dead server shows here as soon as its socket closes)."""
        conn = self._conn
        return conn is not None and conn.state is State.OPEN

    def _open(self, timeout: float) -> dict[str, Any]:
        headers = {"Authorization": f"Api-Key {self.api_key}"} if self.api_key else None
        conn = wire.ws_connect(self.url, compression=None, max_size=None, additional_headers=headers, proxy=None,
                       open_timeout=timeout, ping_interval=None, close_timeout=1)
        try:
            frame = conn.recv(timeout=timeout)
            if isinstance(frame, str):
                raise ServerError(f"server at {self.url} sent an error instead of its metadata:\n{frame}")
            meta = wire.unpack(frame)
            if not isinstance(meta, Mapping):
                raise ServerError(f"server at {self.url} sent metadata that is not a map: {type(meta).__name__}")
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self.reconnects += 1
        return {k.decode() if isinstance(k, bytes) else k: v for k, v in meta.items()}

    def _connect(self, timeout: float) -> dict[str, Any]:
        """Open a connection, retrying until ``timeout``; returns the metadata frame."""
        deadline, delay, last = time.monotonic() + timeout, 0.05, None
        while True:
            left = deadline - time.monotonic()
            try:
                return self._open(max(0.1, left))
            except InvalidStatus as e:
                status = e.response.status_code
                hint = " (wrong or missing api_key)" if status == 401 else ""
                raise ServerError(f"server at {self.url} refused the connection: HTTP {status}{hint}") from None
            except (OSError, TimeoutError, WebSocketException, wire.WireError) as e:
                last = e
            if time.monotonic() + delay > deadline:
                raise ServerUnavailable(f"no policy server at {self.url} within {timeout:.1f} s "
                                        f"({type(last).__name__}: {last})")
            time.sleep(delay)
            delay = min(1.0, delay * 2)

    def close(self) -> None:
        """Close the connection (and the worker thread of ``submit``)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "RemotePolicy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ requests
    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def infer(self, request: Mapping[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """One raw round trip (openpi's ``infer``): send ``request``, return the response dict.

        Reconnects (and re-sends) when the connection is found closed; raises
        ``ServerUnavailable`` after ``timeout_s`` and ``ServerError`` for an error frame.
        """
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        deadline = time.monotonic() + timeout
        data = wire.pack(dict(request))
        with self._lock:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServerUnavailable(f"policy server at {self.url} did not answer within {timeout:.2f} s")
                try:
                    if not self.connected:
                        self._drop()
                        self._connect(left)
                        left = max(0.01, deadline - time.monotonic())
                    assert self._conn is not None
                    self._conn.send(data)
                    reply = self._conn.recv(timeout=left)
                except TimeoutError:
                    self._drop()  # a late answer must not be read as the next one's
                    raise ServerUnavailable(f"policy server at {self.url} did not answer within {timeout:.2f} s") \
                        from None
                except (ConnectionClosed, OSError):
                    self._drop()
                    continue
                if isinstance(reply, str):
                    self._drop()
                    raise ServerError(f"policy server at {self.url} refused the request:\n{reply}")
                out = wire.unpack(reply)
                if not isinstance(out, Mapping):
                    raise ServerError(f"policy server sent a response that is not a map: {type(out).__name__}")
                out = {k.decode() if isinstance(k, bytes) else k: v for k, v in out.items()}
                self.last_timing = dict(out.get("server_timing") or {})
                return out

    def _request(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None) -> dict[str, Any]:
        req: dict[str, Any] = {"state": np.asarray(obs_batch["state"], np.float32),
                               "instruction": [str(s) for s in obs_batch["instruction"]]}
        for key in ("image", "images", "task"):
            if key in obs_batch:
                value = obs_batch[key]
                req[key] = {k: np.asarray(v) for k, v in value.items()} if key == "images" else \
                    (list(value) if key == "task" else np.asarray(value))
        if noise is not None:
            req["noise"] = np.asarray(noise, np.float32)
        return req

    def predict_chunk(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None,
                      timeout_s: float | None = None) -> np.ndarray:
        """(B, H, Da) float32 from the server; same observation and noise -> same chunk (the server's promise)."""
        b = len(obs_batch["instruction"])
        if noise is not None and np.shape(noise) != (b, *self.noise_shape):
            raise ValueError(f"noise must have shape {(b, *self.noise_shape)}, got {np.shape(noise)}")
        if self.ours:
            out = self.infer(self._request(obs_batch, noise), timeout_s)
            return wire.check_actions(out.get("actions"), (b, self.horizon, self.action_dim))
        rows = []
        for i in range(b):
            row = self._request(batch_row(obs_batch, i), None if noise is None else np.asarray(noise)[i: i + 1])
            single = {"state": row["state"][0, -1], "instruction": row["instruction"][0]}
            if "image" in row:
                single["image"] = row["image"][0, -1]
            if "images" in row:
                single["images"] = {k: v[0, -1] for k, v in row["images"].items()}
            if "noise" in row:
                single["noise"] = row["noise"][0]
            out = self.infer({self.key_map.get(k, k): v for k, v in single.items()}, timeout_s)
            rows.append(wire.check_actions(out.get("actions"), (self.horizon, self.action_dim)))
        return np.stack(rows)

    def submit(self, obs_batch: Mapping[str, Any], noise: np.ndarray | None = None,
               timeout_s: float | None = None) -> concurrent.futures.Future:
        """``predict_chunk`` on a worker thread; returns its Future (the control loop's asynchronous request)."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="remote-policy")
        return self._pool.submit(self.predict_chunk, obs_batch, noise, timeout_s)

    def check_spec(self, obs_spec: ObservationSpec, action_spec: ActionSpec, tasks: Any = None) -> None:
        """Raise SpecMismatchError naming what differs between the served policy and a task."""
        if not self.obs_spec.state_dim:
            return  # an openpi server that does not say
        pixels = self.config.obs_mode != "state"
        check_compatible("remote policy's observation spec", self.obs_spec, obs_spec, check_cameras=pixels)
        check_compatible("remote policy's action spec", self.action_spec, action_spec)
        if tasks is not None and self.task_names and self.metadata.get("text_encoder") == "onehot":
            unknown = [t for t in tasks if t not in self.task_names]
            if unknown:
                raise SpecMismatchError(f"remote policy (one-hot task ids) does not know tasks {unknown}")
