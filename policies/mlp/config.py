"""Config of the MLP behaviour-cloning baseline (the floor every other policy must beat)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.common.config import PolicyConfig, check_int


@dataclass
class MLPConfig(PolicyConfig):
    """Plain MLP regression of the whole chunk (plus every ``PolicyConfig`` field).

    By default it sees no language: ``text_encoder="onehot"`` encodes ``obs["task"]`` over
    the policy's ``task_names``, so batches and observations must carry ``task``.

    Attributes:
        hidden: width of the head MLP.
        n_layers: hidden layers of the head MLP.
    """

    text_encoder: str = "onehot"
    hidden: int = 512
    n_layers: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("hidden", self.hidden, 1)
        check_int("n_layers", self.n_layers, 1)
