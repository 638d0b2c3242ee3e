"""Run ``embodied`` commands from the tests in processes forked from a warm interpreter.

``python -m embodied.cli ...`` spends most of a tiny test command importing torch, torch's
compiler stack (the first optimizer loads it), matplotlib, Hydra and MuJoCo. ``run_cli`` runs the
same entry point, ``embodied.cli.main(argv)``, in a process forked from a server that imported
those libraries once: the command's own code, its config parsing, errors, exit code, stdout and
stderr are exactly those of the console command. The server is one process per pytest worker;
it never runs a command itself, makes no GL context and starts no torch thread, so each forked
command begins as a fresh process would, minus the imports.

What the fork cannot show (the interpreter's start-up: the GL backend chosen before MuJoCo is
imported, a missing install) stays with tests that start ``python -m embodied.cli`` themselves:
the usage and unknown-command test, the config fuzzer's command lines, every ``serve``,
``label`` and Ctrl-C test and the torchrun launches. ``EMBODIED_TEST_CLI=subprocess`` sends every
``run_cli`` call through ``python -m embodied.cli`` too.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the server: pre-imports, then forks one child per request line (JSON) read from stdin
_SERVER = r"""
import atexit, json, os, signal, sys, traceback
GL_VARS = ("MUJOCO_GL", "PYOPENGL_PLATFORM")
import sim.render
sim.render.configure_gl()
import torch, torch._dynamo, torch.optim  # noqa: F401
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: F401
import hydra, omegaconf, gymnasium, mujoco  # noqa: F401
import embodied.cli
for _module, _ in embodied.cli.COMMANDS.values():
    __import__(_module)
out = os.fdopen(int(sys.argv[1]), "w", buffering=1)
out.write(json.dumps({k: os.environ.get(k) for k in GL_VARS}) + "\n")
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(req["env"])
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
                f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(f, fd)
                os.close(f)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            sys.argv = ["embodied", *req["argv"]]
            try:
                exec(req.get("prelude", ""), {"__name__": "__prelude__"})
                embodied.cli.main(req["argv"])
                code = 0
            except SystemExit as e:
                if e.code is None:
                    code = 0
                elif isinstance(e.code, int):
                    code = e.code
                else:
                    print(e.code, file=sys.stderr)
                    code = 1
            except KeyboardInterrupt:
                traceback.print_exc()
                code = 130
            except BaseException:
                traceback.print_exc()
                code = 1
            atexit._run_exitfuncs()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    out.write(json.dumps({"pid": pid}) + "\n")
    _, status = os.waitpid(pid, 0)
    out.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
"""

_lock = threading.Lock()
_server: dict[str, object] = {}


def _start() -> tuple[subprocess.Popen, object, dict]:
    read_fd, write_fd = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(write_fd)], stdin=subprocess.PIPE, text=True,
                            pass_fds=(write_fd,), env=env, cwd=ROOT)
    os.close(write_fd)
    replies = os.fdopen(read_fd, "r")
    line = replies.readline()
    if not line:
        raise RuntimeError(f"the warm CLI server did not start (exit code {proc.wait()})")
    atexit.register(_stop, proc)
    return proc, replies, json.loads(line)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait(timeout=30)


def run_cli(args, cwd, env: dict | None = None, timeout: float = 900, prelude: str = ""
            ) -> subprocess.CompletedProcess:
    """``python -m embodied.cli *args`` in ``cwd`` with ``env``, as a ``CompletedProcess`` (text output).

    ``prelude``: Python code run in the command's process just before ``embodied.cli.main`` (a test
    that replaces a function to see what the command hands it)."""
    argv = [str(a) for a in args]
    cmd = [sys.executable, "-m", "embodied.cli", *argv]
    if prelude:
        cmd = [sys.executable, "-c", prelude + "\nimport sys\nfrom embodied.cli import main\nmain(sys.argv[1:])\n",
               *argv]
    env = dict(os.environ if env is None else env)
    with _lock:
        cold = os.environ.get("EMBODIED_TEST_CLI") == "subprocess"
        if not cold:
            if "proc" not in _server or _server["proc"].poll() is not None:
                _server["proc"], _server["replies"], _server["gl"] = _start()
            gl = {k: v for k, v in _server["gl"].items() if v is not None}
            # MuJoCo reads its GL backend when it is imported: a command that asks for another one starts afresh
            cold = any(env.get(k, v) != v for k, v in gl.items())
        if cold:
            return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        return _run_warm(cmd, argv, cwd, {**gl, **env}, timeout, prelude)


def _run_warm(cmd: list[str], argv: list[str], cwd, env: dict, timeout: float, prelude: str
              ) -> subprocess.CompletedProcess:
    """``argv`` run by a fork of the warm server; ``cmd`` names the console command in the result."""
    proc, replies = _server["proc"], _server["replies"]
    with tempfile.TemporaryDirectory(prefix="embodied-cli-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc.stdin.write(json.dumps({"argv": argv, "cwd": str(cwd), "env": env, "stdout": str(out),
                                     "stderr": str(err), "prelude": prelude}) + "\n")
        proc.stdin.flush()
        pid = json.loads(replies.readline())["pid"]
        killed = []

        def kill() -> None:
            killed.append(True)
            try:
                os.killpg(pid, 9)  # the command and whatever it started (it leads its own session)
            except ProcessLookupError:  # it ended just now
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            line = replies.readline()
        finally:
            timer.cancel()
        if not line:
            raise RuntimeError("the warm CLI server stopped while a command ran")
        rc = json.loads(line)["rc"]
        if killed:
            raise subprocess.TimeoutExpired(cmd, timeout, out.read_bytes(), err.read_bytes())
        return subprocess.CompletedProcess(cmd, rc, out.read_text(errors="replace"), err.read_text(errors="replace"))
