"""The wire format: openpi's, so an openpi client or server can talk to ours unchanged.

Transport: one websocket per client. On connect the server sends one binary frame, the
msgpack *metadata* dict. Then the client sends one observation dict per request and the
server answers each with one dict holding ``actions`` (H, Da) (or (B, H, Da)) float32 and
``server_timing`` ``{"infer_ms": float, "prev_total_ms": float}``. A server that fails
sends the error (a traceback, or the reason a request was refused) as one *text* frame
and closes the connection (code 1011, as openpi does); a text frame is never a response.

Values are msgpack; numpy arrays travel as the map ``{"__ndarray__": True, "data": bytes,
"dtype": str, "shape": [int, ...]}`` (``dtype`` is numpy's ``dtype.str``, e.g. ``"<f4"``)
and numpy scalars as ``{"__npgeneric__": True, "data": value, "dtype": str}``. The keys are
sent as msgpack bin (bytes), as openpi's packer does; both bin and str keys are read.
Never pickle: object, void (structured), complex and datetime dtypes are refused both
ways, and ``unpack`` checks every array's byte count against its dtype and shape.

Request keys (all optional except ``state`` and ``instruction``, see ``read_request``):
``state`` float (Ds,) one step, (To, Ds) a history or (B, To, Ds) a batch; ``image``
uint8 (H, W, 3) with the same leading axes (``images``: camera -> such an array);
``instruction`` (or openpi's ``prompt``) str or list of B str; ``task`` str or list;
``noise`` float (H, Da) or (B, H, Da), the initial noise of ``predict_chunk``; ``reset``
bool, forget this connection's history first. openpi's control messages
(``{"__ctrl__": "episode_start" | "episode_end"}``) are acknowledged as openpi does.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import msgpack
import numpy as np

from embodied.core.errors import EmbodiedError

WIRE_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 2**20  # default request size limit; a 2x224x224x3 uint8 request is ~0.3 MiB
ALLOWED_KINDS = "biufUS"  # bool, int, uint, float, fixed-size str/bytes
_MAX_NDIM = 32


class WireError(EmbodiedError, ValueError):
    """A message that is not valid in the wire format (the error names the key, the value and what is allowed)."""


def _check_dtype(dt: np.dtype, where: str) -> None:
    if dt.kind not in ALLOWED_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise WireError(f"{where}: dtype {dt.str!r} (kind {dt.kind!r}) is refused; allowed kinds are bool, int, "
                        "uint, float and fixed-size str/bytes (never object, void/structured, complex or datetime)")


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        _check_dtype(obj.dtype, "array")
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str,
                b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        _check_dtype(obj.dtype, "numpy scalar")
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise WireError(f"cannot send a {type(obj).__name__} on the wire: use dicts, lists, str, bytes, numbers, "
                    "bool, None and numpy arrays")


def pack(obj: Any) -> bytes:
    """Encode ``obj`` (dicts, lists, str, bytes, numbers, bool, None, numpy arrays/scalars)."""
    return msgpack.packb(obj, default=_encode, use_bin_type=True)


def _get(d: Mapping[Any, Any], key: str) -> Any:
    return d[key] if key in d else d.get(key.encode())


def _decode_array(d: Mapping[Any, Any]) -> np.ndarray:
    data, dtype, shape = _get(d, "data"), _get(d, "dtype"), _get(d, "shape")
    if isinstance(dtype, bytes):
        dtype = dtype.decode("ascii", "replace")
    if not isinstance(dtype, str):
        raise WireError(f"__ndarray__: dtype must be a str such as '<f4', got {type(dtype).__name__}")
    try:
        with warnings.catch_warnings():  # numpy warns about deprecated aliases a sender may use
            warnings.simplefilter("ignore")
            dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):
        raise WireError(f"__ndarray__: dtype {dtype[:40]!r} is not a numpy dtype") from None
    _check_dtype(dt, "__ndarray__")
    if not isinstance(shape, (list, tuple)) or len(shape) > _MAX_NDIM or \
            not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise WireError(f"__ndarray__: shape must be a list of at most {_MAX_NDIM} non-negative ints, "
                        f"got {str(shape)[:80]}")
    if not isinstance(data, bytes):
        raise WireError(f"__ndarray__: data must be bytes, got {type(data).__name__}")
    n = 1
    for s in shape:
        n *= s
    if n * dt.itemsize != len(data):
        raise WireError(f"__ndarray__: {len(data)} bytes of data for dtype {dt.str} and shape {tuple(shape)} "
                        f"(expected {n * dt.itemsize})")
    return np.frombuffer(data, dtype=dt).reshape(shape).copy()


def _decode_generic(d: Mapping[Any, Any]) -> np.generic:
    dtype = _get(d, "dtype")
    if isinstance(dtype, bytes):
        dtype = dtype.decode("ascii", "replace")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):
        raise WireError(f"__npgeneric__: dtype {str(dtype)[:40]!r} is not a numpy dtype") from None
    _check_dtype(dt, "__npgeneric__")
    value = _get(d, "data")
    if not isinstance(value, (bool, int, float, str, bytes)):
        raise WireError(f"__npgeneric__: data must be a number, str or bytes, got {type(value).__name__}")
    try:
        return dt.type(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise WireError(f"__npgeneric__: {value!r} is not a {dt.str}: {e}") from None


def _hook(d: dict[Any, Any]) -> Any:
    if _get(d, "__ndarray__") is not None:
        return _decode_array(d)
    if _get(d, "__npgeneric__") is not None:
        return _decode_generic(d)
    return d


def _no_ext(code: int, data: bytes) -> Any:
    raise WireError(f"msgpack extension type {code} is refused")


def unpack(data: bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    """Decode one message; ``WireError`` for anything that is not valid in the wire format."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"a message must be a binary frame, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise WireError(f"message of {len(data)} bytes is over the limit of {max_bytes} bytes")
    try:
        return msgpack.unpackb(bytes(data), object_hook=_hook, ext_hook=_no_ext, raw=False,
                               strict_map_key=False)
    except WireError:
        raise
    except Exception as e:  # msgpack's own errors (truncated, extra data, bad utf-8, too deep...)
        raise WireError(f"not a valid msgpack message: {type(e).__name__}: {e}") from None


def ws_connect(url: str, **kwargs: Any) -> Any:
    """A websocket client connection (``websockets.sync.client.connect``) used without a ``with`` block.

    websockets 17 warns about that unless ``legacy=True`` is given, a keyword older
    versions do not have; the connection object is the same either way.
    """
    from websockets.sync.client import connect

    if "legacy" in inspect.signature(connect).parameters:
        kwargs["legacy"] = True
    return connect(url, **kwargs)


# ------------------------------------------------------------------------ requests
@dataclass
class Request:
    """One decoded observation request, shaped for ``Policy.predict_chunk``.

    ``batch``: ``state`` (B, To, Ds) float32, ``image`` (B, To, H, W, 3) uint8 or ``images``,
    ``instruction`` list of B str, ``task`` (optional) list of B str. ``single_step``: the
    client sent one step (Ds,) and the server supplies the history. ``batched``: the client
    sent B rows and gets (B, H, Da) back; otherwise (H, Da).
    """

    batch: dict[str, Any]
    noise: np.ndarray | None = None
    single_step: dict[str, Any] | None = None
    batched: bool = False
    reset: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _str_key(d: Mapping[Any, Any]) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(k, bytes):
            k = k.decode("utf-8", "replace")
        if not isinstance(k, str):
            raise WireError(f"observation keys must be str, got {type(k).__name__} {k!r:.40}")
        out[k] = v
    return out


def _float_array(value: Any, key: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise WireError(f"{key!r} must be a numpy array (__ndarray__), got {type(value).__name__}")
    if value.dtype.kind != "f":
        raise WireError(f"{key!r} must be a float array, got dtype {value.dtype.str}")
    if not np.all(np.isfinite(value)):
        raise WireError(f"{key!r} contains NaN or inf")
    return value.astype(np.float32)


def _strings(value: Any, key: str, b: int | None) -> list[str]:
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, np.ndarray) and value.dtype.kind == "U":
        value = [str(v) for v in value.reshape(-1)]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WireError(f"{key!r} must be a str or a list of str, got {type(value).__name__}")
    if b is not None and len(value) != b:
        raise WireError(f"{key!r} has {len(value)} entries for a batch of {b}")
    return value


def read_request(msg: Any, meta: Mapping[str, Any]) -> Request:
    """Check an observation request against the server's metadata and shape it as a batch.

    ``meta`` needs ``state_dim``, ``n_obs_steps``, ``horizon``, ``action_dim``, ``cameras``
    and ``image_size`` (``image_size`` 0 or no cameras: the policy reads no images).
    """
    if not isinstance(msg, Mapping):
        raise WireError(f"a request must be a map (dict), got {type(msg).__name__}")
    msg = _str_key(msg)
    to, ds = int(meta["n_obs_steps"]), int(meta["state_dim"])
    if "state" not in msg:
        raise WireError(f"request has no 'state' (float (Ds,), (To, Ds) or (B, To, Ds)); keys: {sorted(msg)}")
    state = _float_array(msg["state"], "state")
    if state.ndim not in (1, 2, 3) or state.shape[-1] != ds or (state.ndim > 1 and state.shape[-2] != to):
        raise WireError(f"'state' must be ({ds},), ({to}, {ds}) or (B, {to}, {ds}), got {state.shape}")
    single = state.ndim == 1
    batched = state.ndim == 3
    b = state.shape[0] if batched else 1
    if b < 1:
        raise WireError("'state' has an empty batch (B = 0)")
    lead = state.shape[:-1]  # (), (To,) or (B, To)
    instr = msg.get("instruction", msg.get("prompt"))
    if instr is None:
        raise WireError(f"request has no 'instruction' (or 'prompt'); keys: {sorted(msg)}")
    out: dict[str, Any] = {"instruction": _strings(instr, "instruction", b if batched else None)}
    if not batched and len(out["instruction"]) != 1:
        raise WireError(f"'instruction' must be one str for an unbatched request, got {len(out['instruction'])}")
    if "task" in msg:
        out["task"] = _strings(msg["task"], "task", b if batched else 1)
    cams, size = list(meta.get("cameras") or []), int(meta.get("image_size") or 0)
    images = {}
    if size and cams:
        if "image" in msg and len(cams) == 1:
            images[cams[0]] = msg["image"]
        elif isinstance(msg.get("images"), Mapping):
            given = _str_key(msg["images"])
            missing = [c for c in cams if c not in given]
            if missing:
                raise WireError(f"'images' lacks cameras {missing}; the policy reads {cams}")
            images = {c: given[c] for c in cams}
        else:
            raise WireError(f"the policy reads images from cameras {cams}: send 'image' (one camera) or 'images'")
        for cam, img in images.items():
            if not isinstance(img, np.ndarray) or img.dtype != np.uint8:
                raise WireError(f"image of camera {cam!r} must be a uint8 array, got "
                                f"{getattr(img, 'dtype', type(img).__name__)}")
            if img.shape != (*lead, size, size, 3):
                raise WireError(f"image of camera {cam!r} must have shape {(*lead, size, size, 3)}, got {img.shape}")
    noise = None
    if msg.get("noise") is not None:
        noise = _float_array(msg["noise"], "noise")
        want = (b, int(meta["horizon"]), int(meta["action_dim"]))
        if noise.shape == want[1:] and not batched:
            noise = noise[None]
        if noise.shape != want:
            raise WireError(f"'noise' must have shape {want[1:] if not batched else want}, got {noise.shape}")
    reset = msg.get("reset", False)
    if not isinstance(reset, bool):
        raise WireError(f"'reset' must be a bool, got {type(reset).__name__}")
    req = Request(batch={}, noise=noise, batched=batched, reset=reset)
    if single:
        step = {"state": state, "instruction": out["instruction"][0]}
        if "task" in out:
            step["task"] = out["task"][0]
        if len(images) == 1:
            step["image"] = next(iter(images.values()))
        elif images:
            step["images"] = images
        req.single_step = step
        return req
    out["state"] = state if batched else state[None]
    for cam, img in images.items():
        out.setdefault("images", {})[cam] = img if batched else img[None]
    if len(cams) == 1 and "images" in out:
        out["image"] = out.pop("images")[cams[0]]
    req.batch = out
    return req


def check_actions(actions: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A response's ``actions`` as float32 of ``shape``; WireError for another shape/dtype or NaN/inf."""
    if not isinstance(actions, np.ndarray) or actions.dtype.kind != "f":
        raise WireError(f"response 'actions' must be a float array, got {getattr(actions, 'dtype', type(actions))}")
    if actions.shape != tuple(shape):
        raise WireError(f"response 'actions' must have shape {tuple(shape)}, got {actions.shape}")
    if not np.all(np.isfinite(actions)):
        raise WireError("response 'actions' contains NaN or inf")
    return actions.astype(np.float32)
