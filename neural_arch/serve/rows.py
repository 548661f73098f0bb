"""The request format of ``POST /predict``: JSON rows checked and turned into a table.

A body is a JSON list of rows, or an object ``{"rows": [...]}``. The rows are either all
objects keyed by column name (every feature column named once; ``null`` for a missing value)
or all lists of values in the model's column order (its numeric columns, then its categorical
ones, as ``GET /health`` lists them). A numeric cell is a number or ``null``; a categorical cell
a string, number, boolean or ``null``. Anything else is a ``RequestError`` naming the row, the
column and the value, which the server answers with HTTP 400 (413 for too many rows).
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

__all__ = ["RequestError", "parse_rows"]

_PREVIEW_CHARS = 60  # how much of an offending value a message quotes


class RequestError(ValueError):
    """A request the server refuses; ``status`` is its HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _preview(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= _PREVIEW_CHARS else text[:_PREVIEW_CHARS] + "..."


def _refuse_constant(name: str) -> None:
    # Python's json reads NaN and Infinity, which JSON does not have: an infinity would reach
    # the model as a number, so both are refused (null is the missing value)
    raise RequestError(f"the body holds {name}, which is not JSON; send null for a missing "
                       f"value")


def _load(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise RequestError(f"the body is not UTF-8 text: {exc}") from None
    except json.JSONDecodeError as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from None


def _row_list(payload: Any, max_rows: int) -> List[Any]:
    if isinstance(payload, dict):
        if set(payload) != {"rows"}:
            raise RequestError(f"a JSON object body must be {{\"rows\": [...]}}, got the keys "
                               f"{sorted(payload)}")
        payload = payload["rows"]
    if not isinstance(payload, list) or not payload:
        raise RequestError(f"the rows must be a non-empty JSON list, got "
                           f"{_preview(payload) if not isinstance(payload, list) else '[]'}")
    if len(payload) > max_rows:
        raise RequestError(f"{len(payload)} rows in one request; at most {max_rows}", status=413)
    return payload


def _cells_by_column(rows: List[Any], columns: Sequence[str], target: Optional[str]
                     ) -> Dict[str, List[Any]]:
    kinds = {type(row) for row in rows}
    if kinds == {dict}:
        known = set(columns)
        for i, row in enumerate(rows):
            unknown = [name for name in row if name not in known]
            if unknown:
                why = " (the target, which the model predicts)" if unknown[0] == target else ""
                raise RequestError(f"row {i}: unknown column {unknown[0]!r}{why}; the model's "
                                   f"columns are {list(columns)}")
            absent = [name for name in columns if name not in row]
            if absent:
                raise RequestError(f"row {i} lacks column {absent[0]!r} (send null for a "
                                   f"missing value)")
        return {name: [row[name] for row in rows] for name in columns}
    if kinds == {list}:
        for i, row in enumerate(rows):
            if len(row) != len(columns):
                raise RequestError(f"row {i} has {len(row)} values; the model has "
                                   f"{len(columns)} columns, in this order: {list(columns)}")
        return {name: [row[j] for row in rows] for j, name in enumerate(columns)}
    first = type(rows[0]) if isinstance(rows[0], (dict, list)) else None
    bad = next(i for i, row in enumerate(rows) if first is None or type(row) is not first)
    raise RequestError(f"rows must be all objects keyed by column name or all lists in the "
                       f"column order; row {bad} is {_preview(rows[bad])}")


def _numeric_column(name: str, cells: List[Any]) -> np.ndarray:
    out = np.empty(len(cells), dtype=np.float64)
    for i, value in enumerate(cells):
        if value is None:
            out[i] = np.nan
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[i] = float(value)
        else:
            raise RequestError(f"row {i}, column {name!r}: {_preview(value)} is not a number "
                               f"(a numeric column takes numbers, or null for missing)")
    return out


def _categorical_column(name: str, cells: List[Any]) -> np.ndarray:
    for i, value in enumerate(cells):
        if value is not None and not isinstance(value, (str, int, float)):
            raise RequestError(f"row {i}, column {name!r}: {_preview(value)} is not a category "
                               f"(a categorical column takes a string, number, boolean or "
                               f"null)")
    out = np.empty(len(cells), dtype=object)
    out[:] = cells
    return out


def parse_rows(body: bytes, numerical: Sequence[str], categorical: Sequence[str],
               target: Optional[str] = None, max_rows: int = 65536) -> Dict[str, np.ndarray]:
    """The body's rows as a table (a dict of columns) for ``TabularPreprocessor.transform``;
    ``RequestError`` on anything else."""
    rows = _row_list(_load(body), max_rows)
    cells = _cells_by_column(rows, list(numerical) + list(categorical), target)
    table = {name: _numeric_column(name, cells[name]) for name in numerical}
    table.update({name: _categorical_column(name, cells[name]) for name in categorical})
    return table
