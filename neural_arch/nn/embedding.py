"""``Embedding``: a lookup table of learnable vectors."""
from __future__ import annotations

from typing import Any

from .. import functional as F
from ..core.random import get_rng
from ._dtype import parameter_dtype
from .module import Module
from .parameter import Parameter


class Embedding(Module):
    """Row ``i`` of ``weight`` (num_embeddings, embedding_dim) for each index ``i``.

    Initialised from N(0, 1), as PyTorch.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        if num_embeddings < 1 or embedding_dim < 1:
            raise ValueError(f"Embedding sizes must be positive, got num_embeddings="
                             f"{num_embeddings}, embedding_dim={embedding_dim}")
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        table = get_rng().standard_normal((self.num_embeddings, self.embedding_dim))
        self.weight = Parameter(table.astype(parameter_dtype(dtype)))
        if device is not None:
            self.to(device)

    def forward(self, indices: Any) -> Any:
        return F.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
