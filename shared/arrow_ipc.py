"""DataFrames on the wire and at rest: Arrow IPC streams (zstd-compressed), never pickle. Frames
are normalised first (a named index becomes columns, column names unique strings, mixed-type
object columns stored as strings) so any DataFrame a handler produces can be stored and sent."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.ipc as ipc

logger = logging.getLogger(__name__)

IPC_COMPRESSION = "zstd"

_ARROW_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)


def unique_names(names: Sequence[object], *, fold_case: bool = False) -> list[str]:
    """Column names as strings, duplicates suffixed `_2`, `_3`, … (Arrow needs unique names);
    with `fold_case`, names that differ only in case count as duplicates (SQL folds case)."""
    seen: set[str] = set()
    out: list[str] = []
    for raw in names:
        base = str(raw)
        name, n = base, 1
        while (name.lower() if fold_case else name) in seen:
            n += 1
            name = f"{base}_{n}"
        seen.add(name.lower() if fold_case else name)
        out.append(name)
    return out


def normalize_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The frame as it is stored: a named index becomes columns, a default one is dropped, and
    column names are unique strings. Returns `df` itself when nothing needs changing."""
    if any(name is not None for name in df.index.names):
        df = df.reset_index(allow_duplicates=True)
    names = unique_names(list(df.columns))
    if names != list(df.columns):
        logger.debug("renaming columns for storage: %s -> %s", list(df.columns), names)
        df = df.copy(deep=False)
        df.columns = pd.Index(names)
    return df


def _text_or_none(value: object) -> str | None:
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return None
    return str(value)


def _coerce_unconvertible(df: pd.DataFrame) -> pd.DataFrame:
    """Object columns Arrow cannot type (mixed ints and strings, arbitrary objects) as strings,
    keeping nulls; every other column untouched."""
    out = df.copy(deep=False)
    for name in out.columns:
        col = out[name]
        if col.dtype != object:
            continue
        try:
            pa.array(col, from_pandas=True)
        except _ARROW_CONVERSION_ERRORS:
            logger.info("column %r has mixed types; storing it as strings", name)
            out[name] = pd.array([_text_or_none(v) for v in col], dtype="str")
    return out


def storable(df: pd.DataFrame) -> tuple[pd.DataFrame, pa.Table]:
    """The frame as stored (normalised, unconvertible object columns as strings) and its Arrow
    table (pandas metadata kept so dtypes round-trip)."""
    df = normalize_frame(df)
    try:
        return df, pa.Table.from_pandas(df, preserve_index=False)
    except _ARROW_CONVERSION_ERRORS:
        df = _coerce_unconvertible(df)
        return df, pa.Table.from_pandas(df, preserve_index=False)


def dataframe_to_arrow(df: pd.DataFrame) -> pa.Table:
    """A DataFrame as an Arrow table (pandas metadata kept so dtypes round-trip). Columns of
    mixed Python objects that Arrow cannot type are stored as strings."""
    return storable(df)[1]


def arrow_to_dataframe(table: pa.Table) -> pd.DataFrame:
    """An Arrow table as a DataFrame (dtypes restored from pandas metadata when present)."""
    return table.to_pandas()


def table_to_ipc(table: pa.Table) -> bytes:
    """An Arrow table as Arrow IPC stream bytes, zstd-compressed."""
    sink = pa.BufferOutputStream()
    options = ipc.IpcWriteOptions(compression=IPC_COMPRESSION)
    with ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def ipc_to_table(data: bytes) -> pa.Table:
    """Arrow IPC stream bytes as an Arrow table."""
    with ipc.open_stream(pa.py_buffer(data)) as reader:
        return reader.read_all()


def dataframe_to_ipc(df: pd.DataFrame) -> bytes:
    """A DataFrame as Arrow IPC stream bytes (zstd). See dataframe_to_arrow for normalisation."""
    return table_to_ipc(dataframe_to_arrow(df))


def ipc_to_dataframe(data: bytes) -> pd.DataFrame:
    """Arrow IPC stream bytes (from dataframe_to_ipc or any Arrow writer) as a DataFrame."""
    return arrow_to_dataframe(ipc_to_table(data))
