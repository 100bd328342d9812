"""Plain-text tables for the model-facing preview: cells formatted per column (nulls as `null`,
control characters escaped, long cells cut with `…`), aligned by terminal display width (wide
CJK characters count two, combining marks zero) rather than by code points."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

import numpy as np
import pandas as pd
from wcwidth import wcswidth, wcwidth

# One encoder for every nested cell (json.dumps with options builds one per call).
_CELL_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)

CELL_WIDTH = 40  # display columns of one cell before it is cut
COLUMN_GAP = "  "
NULL = "null"
ELLIPSIS = "…"
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# A cell is measured after cutting it to this many characters, so a megabyte of text costs
# nothing; a character is never narrower than zero columns, so this keeps every visible one.
_MEASURE_CHARS = CELL_WIDTH * 4


def display_width(text: str) -> int:
    """Columns `text` takes in a terminal (code points when it holds unprintable ones)."""
    width = wcswidth(text)
    return width if width >= 0 else len(text)


def _char_width(char: str) -> int:
    return max(0, wcwidth(char))


def escape_controls(text: str) -> str:
    """Newlines, tabs and other control characters as visible escapes, so a cell is one line."""
    return _CONTROL_RE.sub(lambda m: _ESCAPES.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def fit(text: str, width: int = CELL_WIDTH) -> str:
    """`text` as one line of at most `width` display columns, cut with `…` when longer."""
    cut = len(text) > _MEASURE_CHARS
    text = escape_controls(text[:_MEASURE_CHARS])
    if not cut and display_width(text) <= width:
        return text
    kept: list[str] = []
    used = 0
    for char in text:
        w = _char_width(char)
        if used + w > width - 1:
            break
        kept.append(char)
        used += w
    return "".join(kept) + ELLIPSIS


def pad(text: str, width: int, *, right: bool) -> str:
    """`text` padded with spaces to `width` display columns."""
    fill = " " * max(0, width - display_width(text))
    return fill + text if right else text + fill


def _is_null(value: Any) -> bool:
    if value is None or value is pd.NaT or value is pd.NA:
        return True
    if isinstance(value, float | np.floating):
        return math.isnan(value)
    if isinstance(value, np.datetime64 | np.timedelta64):
        return bool(np.isnat(value))
    return False


def _format_float(value: float) -> str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(float(value))


def format_value(value: Any, *, dates_only: bool = False) -> str:
    """One cell's text: JSON-like literals for nulls and booleans, the shortest exact form of a
    float, ISO dates, compact JSON for lists and dicts."""
    if _is_null(value):
        return NULL
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return _format_float(float(value))
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, pd.Timestamp | datetime):
        stamp = pd.Timestamp(value)
        return stamp.date().isoformat() if dates_only else stamp.isoformat(sep=" ")
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, pd.Timedelta | timedelta):
        return str(pd.Timedelta(value))
    if isinstance(value, bytes):
        return repr(value)
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list | tuple | dict):
        return _CELL_JSON.encode(value)
    return str(value)


def _dates_only(col: pd.Series) -> bool:
    """A datetime column whose every value is midnight (without a time zone) shows as dates."""
    if not pd.api.types.is_datetime64_dtype(col.dtype):
        return False
    values = col.dropna()
    return not values.empty and bool((values == values.dt.normalize()).all())


def _right_aligned(col: pd.Series) -> bool:
    dtype = col.dtype
    return pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)


@dataclass(frozen=True)
class FormattedColumn:
    """One column ready to print: header, cells, width and alignment."""

    header: str
    cells: list[str]
    right: bool

    @property
    def width(self) -> int:
        return max([display_width(self.header), *(display_width(c) for c in self.cells)])


def format_columns(df: pd.DataFrame, limit: int | None = None) -> list[FormattedColumn]:
    """The first `limit` columns (all when None) of `df` as formatted columns."""
    count = df.shape[1] if limit is None else min(limit, df.shape[1])
    columns: list[FormattedColumn] = []
    for position in range(count):
        col = df.iloc[:, position]
        dates_only = _dates_only(col)
        cells = [fit(format_value(v, dates_only=dates_only)) for v in col.tolist()]
        columns.append(
            FormattedColumn(
                header=fit(str(df.columns[position])), cells=cells, right=_right_aligned(col)
            )
        )
    return columns


def lay_out(columns: Sequence[FormattedColumn], rows: int) -> list[str]:
    """Header line and `rows` cell lines, columns aligned and separated by two spaces."""
    widths = [c.width for c in columns]
    lines = [
        COLUMN_GAP.join(
            pad(c.header, w, right=c.right) for c, w in zip(columns, widths, strict=True)
        ).rstrip()
    ]
    for row in range(rows):
        lines.append(
            COLUMN_GAP.join(
                pad(c.cells[row], w, right=c.right) for c, w in zip(columns, widths, strict=True)
            ).rstrip()
        )
    return lines
