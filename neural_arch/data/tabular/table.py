"""Tables as ordered ``{column name: 1-D NumPy array}`` dicts, from NumPy, pandas or CSV.

A plain dict of columns is the one shape the rest of ``tabular`` reads, so nothing there
depends on pandas (used only when installed and handed a DataFrame). Missing cells are NaN in
float columns and ``None`` in object columns; a CSV's empty fields and the usual markers
(``NA``, ``N/A``, ``NaN``, ``nan``, ``null``, ``None``) read as missing.
"""
from __future__ import annotations

import csv
import os
from collections import OrderedDict
from typing import Any, Dict, Optional, Sequence

import numpy as np

__all__ = ["MISSING_MARKERS", "Table", "as_table", "column_is_missing", "read_csv", "take_rows"]

Table = Dict[str, np.ndarray]
MISSING_MARKERS = frozenset({"", "NA", "N/A", "NaN", "nan", "null", "None"})


def column_is_missing(values: np.ndarray) -> np.ndarray:
    """Per cell: NaN in a float column; None, NaN or a missing marker in an object column."""
    if values.dtype.kind == "f":
        return np.isnan(values)
    if values.dtype.kind in "iub":
        return np.zeros(values.shape, dtype=bool)
    return np.array([v is None or (isinstance(v, float) and v != v)
                     or (isinstance(v, str) and v.strip() in MISSING_MARKERS)
                     for v in values.tolist()], dtype=bool).reshape(values.shape)


def _column(name: str, values: Any) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"column {name!r} must be 1-D, got shape {array.shape}")
    if array.dtype.kind in "US":  # fixed-width strings: object keeps None-able cells
        array = array.astype(object)
    return array


def as_table(data: Any, columns: Optional[Sequence[str]] = None) -> Table:
    """A table from a dict of columns, a 2-D NumPy array (``columns`` names them, else
    ``x0, x1, ...``), a NumPy structured array or a pandas DataFrame."""
    if isinstance(data, dict):
        if columns is not None:
            raise ValueError("as_table: columns= names the columns of an array; a dict names "
                             "its own")
        table = OrderedDict((str(k), _column(str(k), v)) for k, v in data.items())
    elif _is_dataframe(data):
        table = OrderedDict((str(name), _column(str(name), data[name].to_numpy()))
                            for name in data.columns)
    elif isinstance(data, np.ndarray) and data.dtype.names:
        table = OrderedDict((name, _column(name, data[name])) for name in data.dtype.names)
    elif isinstance(data, np.ndarray):
        if data.ndim != 2:
            raise ValueError(f"as_table: a NumPy array must be 2-D (rows, columns), got shape "
                             f"{data.shape}")
        names = [f"x{i}" for i in range(data.shape[1])] if columns is None else list(columns)
        if len(names) != data.shape[1]:
            raise ValueError(f"as_table: {len(names)} column names for an array of "
                             f"{data.shape[1]} columns")
        table = OrderedDict((str(n), _column(str(n), data[:, i])) for i, n in enumerate(names))
    else:
        raise TypeError(f"as_table: expected a dict of columns, a NumPy array or a pandas "
                        f"DataFrame, got {type(data).__name__}")
    if len(table) == 0:
        raise ValueError("as_table: the table has no columns")
    lengths = {name: len(values) for name, values in table.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"as_table: columns have different lengths: {lengths}")
    return table


def _is_dataframe(data: Any) -> bool:
    # checked by name so that pandas is imported only by whoever created the frame
    return type(data).__name__ == "DataFrame" and hasattr(data, "columns") \
        and hasattr(data, "to_numpy")


def _parse_column(cells: Sequence[str]) -> np.ndarray:
    """Numbers as float64 (missing NaN) when every present cell is a number, else strings
    (missing None)."""
    present = [cell.strip() not in MISSING_MARKERS for cell in cells]
    try:
        return np.array([float(cell) if keep else np.nan for cell, keep in zip(cells, present)],
                        dtype=np.float64)
    except ValueError:
        return np.array([cell if keep else None for cell, keep in zip(cells, present)],
                        dtype=object)


def read_csv(path: "os.PathLike[str] | str", delimiter: str = ",") -> Table:
    """A CSV file with a header row as a table: numeric columns float64, others strings."""
    path = os.fspath(path)
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle, delimiter=delimiter))
    if not rows:
        raise ValueError(f"read_csv: {path} is empty (a header row is needed)")
    header, body = rows[0], rows[1:]
    if len(set(header)) != len(header):
        repeated = sorted({name for name in header if header.count(name) > 1})
        raise ValueError(f"read_csv: {path} repeats the column names {repeated}")
    for line, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ValueError(f"read_csv: {path} line {line} has {len(row)} fields, the header "
                             f"has {len(header)}")
    return OrderedDict((name, _parse_column([row[i] for row in body]))
                       for i, name in enumerate(header))


def take_rows(table: Table, rows: Any) -> Table:
    """The table's rows at the indices (or bool mask) ``rows``, as a new table."""
    index = np.asarray(rows)
    return OrderedDict((name, values[index]) for name, values in table.items())
