"""The feature tokenizer: every cell of a row becomes one token of ``d_token`` numbers.

A numeric column ``j`` is a learned affine embedding ``x_j * W_j + b_j`` (``W_j``, ``b_j`` of
``d_token`` each); a categorical column is a row of an embedding table plus the column's own
bias. A missing cell (NaN for numbers, code -1 for categories) becomes the column's learned
missing token instead, so "absent" is something the model can learn about rather than a fake
value. All tokens start U(-1/sqrt(d), 1/sqrt(d)), as the FT-Transformer's.
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

import numpy as np

from ...core import Tensor, concatenate
from ...nn import Embedding, Module, Parameter, init
from ...nn._dtype import parameter_dtype

__all__ = ["FeatureTokenizer", "token_init_"]


def token_init_(parameter: Parameter, d_token: int) -> None:
    bound = 1.0 / math.sqrt(d_token)
    init.uniform_(parameter, -bound, bound)


def _host(values: Any) -> np.ndarray:
    data = values.array if isinstance(values, Tensor) else values
    if hasattr(data, "get") and not isinstance(data, np.ndarray):
        data = data.get()
    return np.asarray(data)


def numeric_cells(x_num: Any, n_numerical: int) -> np.ndarray:
    """``x_num`` as a (rows, n_numerical) float64 array, checked; NaN marks a missing cell."""
    values = _host(x_num)
    if values.dtype.kind not in "fiu" or values.dtype == np.bool_:
        raise TypeError(f"TabGPT: x_num must hold numbers (NaN for missing), got dtype "
                        f"{values.dtype}")
    if values.ndim != 2 or values.shape[1] != n_numerical:
        raise ValueError(f"TabGPT: x_num must have shape (rows, {n_numerical}), got "
                         f"{values.shape}")
    return values.astype(np.float64, copy=False)


def category_codes(x_cat: Any, cardinalities: List[int]) -> np.ndarray:
    """``x_cat`` as a (rows, n_categorical) int64 array, checked; -1 marks a missing cell."""
    codes = _host(x_cat)
    if codes.dtype.kind not in "iu":
        raise TypeError(f"TabGPT: x_cat must hold integer category codes (-1 for missing), got "
                        f"dtype {codes.dtype}")
    if codes.ndim != 2 or codes.shape[1] != len(cardinalities):
        raise ValueError(f"TabGPT: x_cat must have shape (rows, {len(cardinalities)}), got "
                         f"{codes.shape}")
    codes = codes.astype(np.int64, copy=False)
    limits = np.asarray(cardinalities, dtype=np.int64)
    bad = (codes < -1) | (codes >= limits)
    if bad.any():
        row, column = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"TabGPT: x_cat[{row}, {column}] = {codes[row, column]} is outside "
                         f"[-1, {limits[column]}) (column {column} has {limits[column]} "
                         f"categories)")
    return codes


class FeatureTokenizer(Module):
    """(rows, n_numerical) numbers and (rows, n_categorical) codes -> (rows, columns, d_token)."""

    def __init__(self, n_numerical: int, cardinalities: List[int], d_token: int,
                 dtype: Any = None) -> None:
        super().__init__()
        self.n_numerical, self.cardinalities = int(n_numerical), [int(c) for c in cardinalities]
        self.d_token = int(d_token)
        dtype = parameter_dtype(dtype)
        n_cat = len(self.cardinalities)
        if self.n_numerical:
            self.numerical_weight = Parameter(np.empty((self.n_numerical, d_token), dtype=dtype))
            self.numerical_bias = Parameter(np.empty((self.n_numerical, d_token), dtype=dtype))
        else:
            self.register_parameter("numerical_weight", None)
            self.register_parameter("numerical_bias", None)
        if n_cat:
            # one table for all columns; column j's rows start at offsets[j]
            self.category_embeddings = Embedding(sum(self.cardinalities), d_token, dtype=dtype)
            self.categorical_bias = Parameter(np.empty((n_cat, d_token), dtype=dtype))
        else:
            self.category_embeddings = None
            self.register_parameter("categorical_bias", None)
        self.category_offsets = np.concatenate([[0], np.cumsum(self.cardinalities)[:-1]]
                                               ).astype(np.int64) if n_cat else None
        self.missing_tokens = Parameter(np.empty((self.n_numerical + n_cat, d_token),
                                                 dtype=dtype))
        for parameter in self.parameters():
            token_init_(parameter, d_token)

    def cells(self, x_num: Any, x_cat: Any) -> Tuple[Optional[np.ndarray], Optional[np.ndarray],
                                                   np.ndarray]:
        """The checked numbers, codes, and the (rows, columns) mask of missing cells."""
        if x_num is None and self.n_numerical:
            raise ValueError(f"TabGPT: x_num is required: the model has {self.n_numerical} "
                             "numeric columns")
        if x_cat is None and self.cardinalities:
            raise ValueError(f"TabGPT: x_cat is required: the model has "
                             f"{len(self.cardinalities)} categorical columns")
        numbers = numeric_cells(x_num, self.n_numerical) if self.n_numerical else None
        codes = category_codes(x_cat, self.cardinalities) if self.cardinalities else None
        missing = [m for m in (None if numbers is None else np.isnan(numbers),
                               None if codes is None else codes < 0) if m is not None]
        if numbers is not None and codes is not None and len(numbers) != len(codes):
            raise ValueError(f"TabGPT: x_num has {len(numbers)} rows but x_cat has {len(codes)}")
        return numbers, codes, np.concatenate(missing, axis=1)

    def forward(self, x_num: Any = None, x_cat: Any = None) -> Tensor:
        numbers, codes, missing = self.cells(x_num, x_cat)
        dtype = self.missing_tokens.dtype
        parts = []
        if numbers is not None:
            filled = np.where(np.isnan(numbers), 0.0, numbers).astype(dtype)
            parts.append(Tensor(filled[:, :, None]) * self.numerical_weight
                         + self.numerical_bias)
        if codes is not None:
            rows = np.where(codes < 0, 0, codes) + self.category_offsets
            parts.append(self.category_embeddings(rows) + self.categorical_bias)
        tokens = parts[0] if len(parts) == 1 else concatenate(parts, axis=1)
        # every cell goes through the same arithmetic, missing or not, so that the graph (and
        # which parameters get a gradient) does not depend on the batch
        absent = missing[:, :, None].astype(dtype)
        return tokens * Tensor(1.0 - absent) + self.missing_tokens * Tensor(absent)

    def extra_repr(self) -> str:
        return f"n_numerical={self.n_numerical}, cardinalities={self.cardinalities}, " \
               f"d_token={self.d_token}"
