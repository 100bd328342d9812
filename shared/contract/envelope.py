"""The typed envelope: Ok (measured data), Hint (a recoverable correction) and Err (a failure the
model cannot fix by re-calling), plus HintException, which handlers raise to return a Hint."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

HintKind = Literal["schema", "fetch", "ambiguous"]
HINT_KINDS: tuple[HintKind, ...] = ("schema", "fetch", "ambiguous")
EnvelopeKind = Literal["ok", "hint", "err"]
ENVELOPE_KINDS: tuple[EnvelopeKind, ...] = ("ok", "hint", "err")


@dataclass(frozen=True)
class ColumnSpec:
    """One measured column. `dtype_provenance` is "inferred" only for single-row dict scalars."""

    name: str
    dtype: str
    null_count: int | None = None
    distinct_count: int | None = None
    dtype_provenance: Literal["measured", "inferred"] = "measured"


@dataclass(frozen=True)
class Warning:
    """An in-band advisory that rides on an Ok without discarding its data."""

    kind: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Effects:
    """Side-effect channels the orchestrator consumes: cards, datasets, exports, cost."""

    cards: list[dict[str, Any]] = field(default_factory=list)
    datasets: dict[str, pd.DataFrame] = field(default_factory=dict)
    exports: dict[str, dict[str, Any]] = field(default_factory=dict)
    cost: float = 0.0


@dataclass
class Ok:
    """Success. `data` is a DataFrame, text, or a JSON-able value."""

    rows: int = 0
    schema: list[ColumnSpec] = field(default_factory=list)
    data: Any = None
    warnings: list[Warning] = field(default_factory=list)
    effects: Effects = field(default_factory=Effects)


@dataclass(frozen=True)
class Alternative:
    """A ranked candidate of a Hint."""

    label: str
    score: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Hint:
    """A recoverable correction; not a platform failure."""

    hint_kind: HintKind
    message: str
    alternatives: list[Alternative] = field(default_factory=list)


@dataclass
class Err:
    """A failure: `err_kind` is the exception class name or a stable kind."""

    message: str
    err_kind: str


Envelope = Ok | Hint | Err


def envelope_kind(envelope: Envelope) -> EnvelopeKind:
    """ "ok", "hint" or "err"."""
    if isinstance(envelope, Ok):
        return "ok"
    if isinstance(envelope, Hint):
        return "hint"
    return "err"


class HintException(Exception):
    """Raised by a handler to answer with a Hint instead of a failure."""

    def __init__(
        self,
        hint_kind: HintKind,
        message: str,
        alternatives: list[Alternative] | list[dict[str, Any]] | None = None,
    ) -> None:
        if hint_kind not in HINT_KINDS:
            raise ValueError(f"hint_kind must be one of {HINT_KINDS}, not {hint_kind!r}")
        super().__init__(message)
        self.hint_kind: HintKind = hint_kind
        self.message = message
        self.alternatives = [
            a
            if isinstance(a, Alternative)
            else Alternative(
                label=str(a["label"]),
                score=float(a.get("score", 0.0)),
                details={k: v for k, v in a.items() if k not in ("label", "score")},
            )
            for a in (alternatives or [])
        ]

    def to_hint(self) -> Hint:
        return Hint(self.hint_kind, self.message, list(self.alternatives))


def is_scalar_record(value: Any) -> bool:
    """A non-empty dict whose values are all scalars (one row of a table)."""
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(v is None or pd.api.types.is_scalar(v) for v in value.values())
    )


def infer_schema(record: Mapping[str, Any]) -> list[ColumnSpec]:
    """The schema of a single-row dict of scalars: dtypes inferred from the Python values
    (`dtype_provenance="inferred"`), since one value cannot be measured like a column."""
    return [
        ColumnSpec(
            name=str(key),
            dtype="null" if value is None else pd.api.types.infer_dtype([value], skipna=False),
            null_count=int(value is None),
            distinct_count=None if value is None else 1,
            dtype_provenance="inferred",
        )
        for key, value in record.items()
    ]


# What an object column holds, named for the model (`date`, not `object`): pandas' own name
# of the values' kind, as infer_dtype gives it, and ours.
_OBJECT_KINDS = {
    "date": "date",
    "time": "time",
    "decimal": "decimal",
    "boolean": "bool",
    "bytes": "bytes",
    "string": "str",
}


def shown_dtype(col: pd.Series) -> str:
    """The column's dtype as the schema shows it: pandas' name, except that an object column
    is named by what it holds when that is one kind (date, time, decimal, bool, bytes, str,
    list or struct), else `object`."""
    if col.dtype != object:
        return str(col.dtype)
    values = col.dropna()
    if values.empty:
        return "object"
    kind = _OBJECT_KINDS.get(pd.api.types.infer_dtype(values, skipna=False))
    if kind is not None:
        return kind
    first = values.iloc[0]
    if isinstance(first, (list, tuple, np.ndarray)) and all(
        isinstance(v, (list, tuple, np.ndarray)) for v in values.head(SHOWN_DTYPE_SAMPLE)
    ):
        return "list"
    if isinstance(first, dict) and all(
        isinstance(v, dict) for v in values.head(SHOWN_DTYPE_SAMPLE)
    ):
        return "struct"
    return "object"


SHOWN_DTYPE_SAMPLE = 100


def measure_schema(df: pd.DataFrame) -> list[ColumnSpec]:
    """Measure a DataFrame's schema: dtype, nulls and distinct values per column."""
    specs: list[ColumnSpec] = []
    for name in df.columns:
        col = df[name]
        try:
            distinct = int(col.nunique(dropna=True))
        except TypeError:  # unhashable cells (lists, dicts)
            distinct = None
        specs.append(
            ColumnSpec(
                name=str(name),
                dtype=shown_dtype(col),
                null_count=int(col.isna().sum()),
                distinct_count=distinct,
            )
        )
    return specs
