"""``SyntheticTable``: a large mixed-type table whose rows are computed from their index.

Row ``i`` is a pure function of ``(seed, i)`` (a counter-based hash, SplitMix64), so a table of
a million rows or a billion costs no memory, every process reads the same row ``i`` without
sharing anything, and a batch is generated only when read. The columns are already encoded as
``TabularPreprocessor`` writes them: ``x_num`` float32 standardised (NaN for a missing cell),
``x_cat`` int64 codes (-1 for a missing cell), ``y`` an int64 class. They share structure, so
there is something to learn: two hidden standard normals per row drive every numeric column
(a fixed linear mix plus noise) and every categorical one (the same, cut into ``cardinality``
bins of about equal mass), and the class says whether their sum is positive.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

from ..dataset import Dataset

__all__ = ["SyntheticTable"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(keys: np.ndarray) -> np.ndarray:
    """SplitMix64's output for each uint64 key (wrapping arithmetic, as the generator's)."""
    z = keys + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX_1
    z = (z ^ (z >> np.uint64(27))) * _MIX_2
    return z ^ (z >> np.uint64(31))


class SyntheticTable(Dataset):
    """``rows`` generated rows of ``n_numerical`` numeric and ``len(cardinalities)``
    categorical columns; items ``(x_num, x_cat, y)`` as ``TabularDataset``'s, and
    ``rows_at(indices)`` for a whole batch at once."""

    LATENT = 2  # hidden normals per row

    def __init__(self, rows: int = 1_000_000, n_numerical: int = 8,
                 cardinalities: Sequence[int] = (10, 5, 20, 3), missing_fraction: float = 0.05,
                 noise: float = 0.5, seed: int = 0) -> None:
        if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
            raise ValueError(f"SyntheticTable: rows must be a positive int, got {rows!r}")
        if n_numerical < 0 or any(int(c) < 1 for c in cardinalities):
            raise ValueError(f"SyntheticTable: n_numerical must be >= 0 and cardinalities >= 1, "
                             f"got {n_numerical} and {list(cardinalities)}")
        if n_numerical + len(cardinalities) < 1:
            raise ValueError("SyntheticTable needs at least one column")
        if not 0.0 <= missing_fraction < 1.0:
            raise ValueError(f"SyntheticTable: missing_fraction must be in [0, 1), got "
                             f"{missing_fraction}")
        self.rows, self.n_numerical = int(rows), int(n_numerical)
        self.cardinalities = [int(c) for c in cardinalities]
        self.missing_fraction, self.noise, self.seed = float(missing_fraction), float(noise), seed
        columns = self.n_numerical + len(self.cardinalities)
        mix = np.random.default_rng(seed).standard_normal((columns, self.LATENT))
        self.mix = mix / np.linalg.norm(mix, axis=1, keepdims=True)  # unit rows: unit variance
        self.spread = float(np.sqrt(1.0 + self.noise ** 2))  # each column's std before scaling

    @property
    def n_features(self) -> int:
        return self.n_numerical + len(self.cardinalities)

    def model_config(self) -> dict:
        """The ``TabGPTConfig`` fields for these columns."""
        return dict(n_numerical=self.n_numerical, categorical_cardinalities=self.cardinalities)

    def __len__(self) -> int:
        return self.rows

    def _uniforms(self, indices: np.ndarray, streams: int) -> np.ndarray:
        """(len(indices), streams) uniforms in (0, 1), one hash per (row, stream)."""
        offset = np.uint64((int(self.seed) * 0xD1B54A32D192ED03) % (1 << 64))  # the seed's stream
        keys = (offset + indices.astype(np.uint64)[:, None] * np.uint64(streams)
                + np.arange(streams, dtype=np.uint64)[None, :])
        return ((_splitmix64(keys) >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53

    def rows_at(self, indices: "np.ndarray | Sequence[int]") -> Tuple[np.ndarray, np.ndarray,
                                                                      np.ndarray]:
        """``(x_num, x_cat, y)`` of the rows ``indices``."""
        indices = np.asarray(indices)
        if indices.ndim != 1 or indices.dtype.kind not in "iu":
            raise ValueError(f"SyntheticTable.rows_at: indices must be a 1-D integer array, got "
                             f"{indices.dtype} {indices.shape}")
        outside = indices[(indices < 0) | (indices >= self.rows)]
        if outside.size:
            raise IndexError(f"SyntheticTable: row {int(outside[0])} is outside "
                             f"[0, {self.rows})")
        columns = self.n_features
        u = self._uniforms(indices, 2 * (self.LATENT + columns) + columns)
        normals = np.sqrt(-2.0 * np.log(u[:, 0::2][:, :self.LATENT + columns])) \
            * np.cos(2.0 * np.pi * u[:, 1::2][:, :self.LATENT + columns])  # Box-Muller
        latent, noise = normals[:, :self.LATENT], normals[:, self.LATENT:]
        values = (latent @ self.mix.T + self.noise * noise) / self.spread  # about N(0, 1)
        gone = u[:, -columns:] < self.missing_fraction
        x_num = values[:, :self.n_numerical].astype(np.float32)
        x_num[gone[:, :self.n_numerical]] = np.nan
        # a category is the bin of the value's normal probability: bins of about equal mass
        v = values[:, self.n_numerical:]
        share = 0.5 * (1.0 + np.tanh(0.7978845608 * (v + 0.044715 * v ** 3)))  # about Phi(v)
        limits = np.asarray(self.cardinalities, dtype=np.int64)
        x_cat = np.minimum((share * limits).astype(np.int64), limits - 1)
        x_cat[gone[:, self.n_numerical:]] = -1
        y = (latent.sum(axis=1) > 0).astype(np.int64)
        return x_num, x_cat, y

    def __getitem__(self, index: int) -> Tuple[np.ndarray, np.ndarray, np.int64]:
        x_num, x_cat, y = self.rows_at(np.array([int(index)]))
        return x_num[0], x_cat[0], y[0]

    def _fetch_batch(self, indices: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.rows_at(indices)
