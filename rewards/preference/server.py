"""The labelling page: a person compares two clips in a browser; each answer is stored at once.

``LabelServer(store).start()`` serves, on loopback only (standard library ``http.server``):

    GET  /                     the page (``PAGE`` below: no external assets)
    GET  /api/state            {"done", "answered", "total", "query": {"id", "instruction", "left", "right"}}
    POST /api/label            {"query": id, "label": "left|right|equal|skip"} -> {"saved": record, "state"}
    GET  /clip/<id>/<side>.gif the segment's frames as a looping animated GIF

The page shows the next unanswered query (the store's oldest pending one), so it resumes
where it stopped after a restart of the server or the browser. Keys: ← / a / 1 left,
→ / d / 2 right, ↓ / e / = equal, s / space skip (buttons do the same). The page moves on
only after the server has written the label (``LabelStore.add_label`` fsyncs before it
returns); if the server is unreachable the answer is kept in the page and resent until it
is saved, and further keys wait.
"""

from __future__ import annotations

import io
import json
import logging
import re
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence

import numpy as np

from rewards.preference.segments import Query
from rewards.preference.store import LABELS, LabelStore, LabelStoreError
from rewards.preference.teachers import Teacher

log = logging.getLogger("embodied.label")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
_CLIP_RE = re.compile(r"^/clip/(\d+)/(left|right)\.gif$")


def gif_bytes(frames: np.ndarray, size: int = 192, fps: int = 10) -> bytes:
    """Frames (L, H, W, 3) uint8 -> a looping GIF, scaled (nearest) to ``size`` pixels wide."""
    from PIL import Image

    imgs = [Image.fromarray(np.asarray(f, np.uint8)) for f in frames]
    if imgs and imgs[0].width != size:
        h = round(size * imgs[0].height / imgs[0].width)
        imgs = [im.resize((size, h), Image.NEAREST) for im in imgs]
    buf = io.BytesIO()
    imgs[0].save(buf, format="GIF", save_all=True, append_images=imgs[1:], duration=max(1, round(1000 / fps)), loop=0)
    return buf.getvalue()


class LabelServer:
    """Serves the labelling page for ``store`` (see the module docstring)."""

    def __init__(self, store: LabelStore, host: str = "127.0.0.1", port: int = 8765, teacher: str = "human",
                 clip_size: int = 192, fps: int = 10):
        if host not in LOOPBACK:
            raise ValueError(f"the label page serves on loopback only: host must be one of {LOOPBACK}, got {host!r}")
        if not 0 <= int(port) <= 65535:
            raise ValueError(f"port must be in [0, 65535] (0: any free port), got {port}")
        self.store, self.teacher, self.clip_size, self.fps = store, teacher, int(clip_size), int(fps)
        self._gifs: dict[tuple[int, str], bytes] = {}
        self.httpd = ThreadingHTTPServer((host, int(port)), _handler(self))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> "LabelServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="label-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ---------------------------------------------------------------- content
    def state(self) -> dict[str, Any]:
        pending = self.store.pending()
        c = self.store.counts()
        out: dict[str, Any] = {"done": not pending, "answered": c["answered"], "total": c["queries"]}
        if pending:
            q = self.store.query(pending[0])
            out["query"] = {"id": q.id, "instruction": q.left.instruction,
                            "left": f"/clip/{q.id}/left.gif", "right": f"/clip/{q.id}/right.gif"}
        return out

    def clip(self, qid: int, side: str) -> bytes:
        key = (qid, side)
        if key not in self._gifs:
            q = self.store.query(qid, frames=True)
            frames = getattr(q, side).frames
            if frames is None:
                raise LabelStoreError(f"query {qid} was stored without frames: the page cannot show it "
                                      "(record queries with render=true)")
            self._gifs[key] = gif_bytes(frames, self.clip_size, self.fps)
        return self._gifs[key]

    def answer(self, body: bytes) -> dict[str, Any]:
        try:
            msg = json.loads(body)
            qid, label = int(msg["query"]), msg["label"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"POST /api/label wants JSON {{\"query\": id, \"label\": one of {LABELS}}}, "
                             f"got {body[:80]!r}") from None
        rec = self.store.add_label(qid, label, self.teacher)
        log.info("query %d: %s (%d/%d)", qid, label, self.store.counts()["answered"], len(self.store.query_ids))
        return {"saved": rec, "state": self.state()}


def _handler(server: LabelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, obj: Any) -> None:
            self._send(status, json.dumps(obj).encode(), "application/json")

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            try:
                if self.path in ("/", "/index.html"):
                    self._send(HTTPStatus.OK, PAGE.encode(), "text/html; charset=utf-8")
                elif self.path == "/api/state":
                    self._json(HTTPStatus.OK, server.state())
                elif m := _CLIP_RE.match(self.path):
                    self._send(HTTPStatus.OK, server.clip(int(m.group(1)), m.group(2)), "image/gif")
                else:
                    self._json(HTTPStatus.NOT_FOUND, {"error": f"no page {self.path}"})
            except LabelStoreError as e:
                self._json(HTTPStatus.NOT_FOUND, {"error": str(e)})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/api/label":
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no endpoint {self.path}"})
                return
            body = self.rfile.read(min(int(self.headers.get("Content-Length") or 0), 4096))
            try:
                self._json(HTTPStatus.OK, server.answer(body))
            except LabelStoreError as e:
                self._json(HTTPStatus.CONFLICT, {"error": str(e), "state": server.state()})
            except ValueError as e:
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(e)})

    return Handler


class HumanTeacher(Teacher):
    """A person answering on the label page; ``label`` waits until each query is answered.

    The queries must already be in the server's store (``LabelStore.add_query``); the page
    writes the labels, so ``records_labels`` is True.
    """

    name = "human"
    records_labels = True

    def __init__(self, server: LabelServer, poll_s: float = 0.5):
        self.server, self.poll_s = server, poll_s

    def label(self, queries: Sequence[Query]) -> list[str]:
        ids = [q.id for q in queries]
        if any(i < 0 for i in ids):
            raise ValueError("add the queries to the store before asking a person about them")
        log.info("waiting for %d answer(s) at %s", len(ids), self.server.url)
        while any(i not in self.server.store.by_query for i in ids):
            time.sleep(self.poll_s)
        return [self.server.store.by_query[i]["label"] for i in ids]


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>embodied · which clip is better?</title>
<style>
 body{font-family:system-ui,sans-serif;margin:2em;background:#fafafa;color:#222}
 #instruction{font-size:1.4em;margin:.4em 0 1em}
 .clips{display:flex;gap:2em} .clip{text-align:center} .clip img{border:1px solid #999;image-rendering:pixelated}
 button{font-size:1.1em;margin:.6em .3em;padding:.4em 1em} #status{margin-top:1em;min-height:1.4em}
 #status.error{color:#b00} #progress{color:#555}
</style></head><body>
<h1>Which clip does the instruction better?</h1>
<div id="progress">loading…</div>
<div id="instruction"></div>
<div id="task">
 <div class="clips">
  <div class="clip"><img id="left" alt="left clip"><br><button id="btn-left">← left better</button></div>
  <div class="clip"><img id="right" alt="right clip"><br><button id="btn-right">right better →</button></div>
 </div>
 <button id="btn-equal">↓ equally good</button> <button id="btn-skip">skip (s)</button>
 <div>query <span id="query-id">–</span> · keys: ← a 1 · → d 2 · ↓ e = · s space</div>
</div>
<div id="done" hidden>All queries are answered. Thank you — new ones appear here when they are posed.</div>
<div id="status"></div>
<script>
"use strict";
let current = null, busy = false, outbox = null;
const $ = (id) => document.getElementById(id);
function status(text, error) { $("status").textContent = text; $("status").className = error ? "error" : ""; }
function show(s) {
  $("progress").textContent = s.answered + " / " + s.total + " answered";
  document.body.dataset.answered = s.answered;
  if (s.done) {
    current = null; $("task").hidden = true; $("done").hidden = false; document.body.dataset.query = "done";
    setTimeout(refresh, 2000);  // a running `embodied prefer` may pose more queries
    return;
  }
  $("task").hidden = false; $("done").hidden = true;
  if (!current || current.id !== s.query.id) {
    current = s.query;
    $("query-id").textContent = current.id; document.body.dataset.query = current.id;
    $("instruction").textContent = current.instruction;
    $("left").src = current.left; $("right").src = current.right;
  }
}
async function refresh() {
  try { const r = await fetch("/api/state"); show(await r.json()); if (!outbox) status(""); }
  catch (e) { status("Server unreachable — retrying…", true); setTimeout(refresh, 1000); }
}
async function send() {
  try {
    const r = await fetch("/api/label", {method: "POST", headers: {"Content-Type": "application/json"},
                                         body: JSON.stringify(outbox)});
    const m = await r.json();
    if (r.ok) {
      status("saved: query " + outbox.query + " → " + outbox.label); outbox = null; busy = false; show(m.state); return;
    }
    outbox = null; busy = false; status(m.error || ("error " + r.status), true); if (m.state) show(m.state);
  } catch (e) {
    status("Server unreachable — your answer for query " + outbox.query + " is not saved yet; retrying…", true);
    setTimeout(send, 1000);
  }
}
function answer(label) {
  if (!current || busy) return;
  busy = true; outbox = {query: current.id, label: label}; status("saving…"); send();
}
const KEYS = {ArrowLeft: "left", a: "left", "1": "left", ArrowRight: "right", d: "right", "2": "right",
              ArrowDown: "equal", e: "equal", "=": "equal", s: "skip", " ": "skip"};
document.addEventListener("keydown", (ev) => { const l = KEYS[ev.key]; if (l) { ev.preventDefault(); answer(l); } });
for (const l of ["left", "right", "equal", "skip"]) $("btn-" + l).addEventListener("click", () => answer(l));
refresh();
</script></body></html>
"""
