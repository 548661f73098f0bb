"""Character-level language-modelling data: every ``block_size`` window of a text."""
from __future__ import annotations

import os
from typing import Dict, List, Sequence, Tuple, Union

import numpy as np

from ..core import Tensor
from .dataset import Dataset


class CharDataset(Dataset):
    """Item ``i`` is ``(x, y)``: int64 character ids of ``text[i:i+block_size]`` and of the same
    window shifted by one. ``text_or_path`` is the text itself or the path of a UTF-8 file."""

    def __init__(self, text_or_path: Union[str, "os.PathLike[str]"], block_size: int) -> None:
        if isinstance(text_or_path, os.PathLike) or (
                isinstance(text_or_path, str) and os.path.isfile(text_or_path)):
            with open(text_or_path, encoding="utf-8") as handle:
                text = handle.read()
        elif isinstance(text_or_path, str):
            text = text_or_path
        else:
            raise TypeError(f"CharDataset needs a str or a path, got {type(text_or_path).__name__}")
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) \
                or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        if len(text) <= block_size:
            raise ValueError(f"text of {len(text)} characters is too short for block_size "
                             f"{block_size} (needs at least {block_size + 1})")
        self.block_size = int(block_size)
        self.chars: List[str] = sorted(set(text))
        self.stoi: Dict[str, int] = {ch: i for i, ch in enumerate(self.chars)}
        self.itos: Dict[int, str] = dict(enumerate(self.chars))
        self.data = self.encode(text)
        self._window = np.arange(self.block_size + 1, dtype=np.int64)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """Character ids (int64) of ``text``; unknown characters raise ``ValueError``."""
        try:
            return np.fromiter((self.stoi[ch] for ch in text), dtype=np.int64, count=len(text))
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: Sequence[int]) -> str:
        """The text of a sequence of ids (a list, an array or a ``Tensor``)."""
        values = ids.numpy() if isinstance(ids, Tensor) else np.asarray(ids)
        values = values.reshape(-1)
        try:
            return "".join(self.itos[int(i)] for i in values)
        except KeyError as exc:
            raise ValueError(f"id {exc.args[0]} is outside the vocabulary of "
                             f"{self.vocab_size}") from None

    def __len__(self) -> int:
        return len(self.data) - self.block_size

    def __getitem__(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} windows")
        index %= len(self)
        chunk = self.data[index:index + self.block_size + 1]
        return chunk[:-1], chunk[1:]

    def _fetch_batch(self, indices: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        chunks = self.data[np.asarray(indices)[:, None] + self._window]
        return np.ascontiguousarray(chunks[:, :-1]), np.ascontiguousarray(chunks[:, 1:])

    def __repr__(self) -> str:
        return f"CharDataset(chars={len(self.data)}, vocab_size={self.vocab_size}, " \
               f"block_size={self.block_size})"
