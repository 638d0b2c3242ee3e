"""ONNX Runtime sessions for graphs exported from torch, set up alike wherever they run (the reward's
image tower, a served policy's chunk): in memory, on the CPU, ``threads`` intra-op threads, no spinning
while idle, errors only in the log."""

from __future__ import annotations

from typing import Any


def cpu_session(graph: bytes, threads: int) -> Any:
    """An ``onnxruntime.InferenceSession`` of the serialised ONNX ``graph`` on ``threads`` CPU threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
