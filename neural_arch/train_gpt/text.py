"""Text as training data for a language model: a character- or byte-level tokenizer and the
dataset of consecutive ``block_size`` windows of the token stream.

The tokenizer is saved with the run (``tokenizer.json``), so ``--sample`` decodes with the
vocabulary the model was trained on."""
from __future__ import annotations

import json
from typing import Any, Dict, Sequence, Tuple

import numpy as np

from ..data import Dataset


class Tokenizer:
    """``kind`` "byte": the 256 byte values of the UTF-8 encoding (any text, fixed vocabulary);
    "char": the distinct characters of the training text, sorted."""

    def __init__(self, kind: str, chars: Sequence[str] = ()) -> None:
        if kind not in ("char", "byte"):
            raise ValueError(f"tokenizer must be 'char' or 'byte', got {kind!r}")
        self.kind, self.chars = kind, list(chars)
        self._index = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, kind: str, text: str) -> "Tokenizer":
        return cls(kind, sorted(set(text)) if kind == "char" else ())

    @property
    def vocab_size(self) -> int:
        return 256 if self.kind == "byte" else len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        if self.kind == "byte":
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
        missing = sorted(set(text) - set(self._index))
        if missing:
            raise ValueError(f"characters {missing[:5]!r} are not in the vocabulary of "
                             f"{self.vocab_size}")
        return np.fromiter((self._index[c] for c in text), dtype=np.int64, count=len(text))

    def decode(self, ids: Sequence[int]) -> str:
        if self.kind == "byte":
            return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")
        # ids past the text's characters exist when --vocab-size padded the vocabulary
        return "".join(self.chars[int(i)] if int(i) < len(self.chars) else "?" for i in ids)

    def state_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "chars": self.chars}

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(self.state_dict(), handle)

    @classmethod
    def load(cls, path: str) -> "Tokenizer":
        """The tokenizer saved in ``path``; ValueError naming the file and its damage."""
        try:
            with open(path, encoding="utf-8") as handle:
                state = json.load(handle)
        except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError too
            raise ValueError(f"{path} is damaged ({exc})") from None
        chars = state.get("chars") if isinstance(state, dict) else None
        if not isinstance(chars, list) or state.get("kind") not in ("char", "byte") \
                or not all(isinstance(c, str) and len(c) == 1 for c in chars) \
                or len(set(chars)) != len(chars):
            raise ValueError(f"{path} is damaged (not a tokenizer: it needs \"kind\" char or "
                             f"byte and \"chars\", a list of distinct characters)")
        return cls(state["kind"], chars)


class TokenWindows(Dataset):
    """Item ``i``: tokens ``[i*block, (i+1)*block)`` and the same shifted by one, so one epoch
    reads the stream once, without overlap."""

    def __init__(self, tokens: np.ndarray, block_size: int) -> None:
        self.tokens, self.block_size = np.asarray(tokens, dtype=np.int64), int(block_size)
        self.count = (len(self.tokens) - 1) // self.block_size
        self._window = np.arange(self.block_size + 1, dtype=np.int64)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        x, y = self._fetch_batch(np.array([index]))
        return x[0], y[0]

    def _fetch_batch(self, indices: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        chunks = self.tokens[np.asarray(indices)[:, None] * self.block_size + self._window]
        return np.ascontiguousarray(chunks[:, :-1]), np.ascontiguousarray(chunks[:, 1:])


def read_text(path: str) -> str:
    """The UTF-8 text in ``path``. ValueError (the caller names the file) when it is empty,
    not UTF-8, or holds a NUL byte (a binary file): training on it would learn garbage."""
    with open(path, "rb") as handle:
        data = handle.read()
    if not data:
        raise ValueError("is empty: there is no text to train on")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start} ({exc.reason}); convert it to UTF-8") from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise ValueError(f"holds a NUL byte at offset {nul}: a binary file, not text")
    return text


def split_windows(tokens: np.ndarray, block_size: int,
                  val_fraction: float) -> Tuple[TokenWindows, TokenWindows]:
    """Training windows from the start of the stream, validation windows from its last
    ``val_fraction`` (at least one window each, or ValueError naming the sizes)."""
    cut = int(len(tokens) * (1.0 - val_fraction))
    train, val = TokenWindows(tokens[:cut], block_size), TokenWindows(tokens[cut:], block_size)
    if len(train) < 1 or (val_fraction > 0 and len(val) < 1):
        raise ValueError(f"the text has {len(tokens)} tokens: too short for windows of "
                         f"{block_size} (+1) with {val_fraction:.0%} held out for validation; "
                         f"use a longer text or a smaller --max-seq-length")
    return train, val
