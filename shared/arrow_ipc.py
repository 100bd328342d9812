"""DataFrames on the wire and at rest: Arrow IPC streams (zstd-compressed), never pickle. Frames
are normalised first (a named index becomes columns, column names unique strings, mixed-type
object columns stored as strings) so any DataFrame a handler produces can be stored and sent.
Lists of integers with nulls among them are read back as Python lists (`[1, None, 3]`), not the
float arrays pandas makes of them (`[1.0, nan, 3.0]`), so they are stored as integers again.
Lists of uint64 with nulls are the exception (Python ints past int64 cannot be stored again):
ipc_to_dataframe gives them as pandas' floats, so a caller that must keep them exact (the
analysis tools, for files and query results) casts them first with exact_unsigned_lists."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
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


def _is_list(data_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(data_type)
        or pa.types.is_large_list(data_type)
        or pa.types.is_fixed_size_list(data_type)
        or pa.types.is_list_view(data_type)
        or pa.types.is_large_list_view(data_type)
    )


def _integer_lists(data_type: pa.DataType) -> bool:
    """Whether `data_type` is a list (of lists, …) of integers that fit in int64, the type
    Arrow gives the Python ints of such lists when they are stored again."""
    while _is_list(data_type):
        data_type = data_type.value_type
        if pa.types.is_integer(data_type):
            return not pa.types.is_uint64(data_type)
    return False


def _null_integers_inside(column: pa.ChunkedArray) -> bool:
    """Whether a list (of lists, …) column holds null integers among others: pandas turns the
    integer arrays it makes of such lists into floats, with NaN for the nulls. (When every
    integer is null there is none to keep, nor a type to infer from them again.)"""
    values = _flat_values(column)
    return 0 < values.null_count < len(values)


def _flat_values(column: pa.ChunkedArray) -> pa.Array:
    """The innermost values of a list (of lists, …) column, nulls included."""
    values: pa.Array | pa.ChunkedArray = column
    while _is_list(values.type):
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
        if pa.types.is_list_view(values.type) or pa.types.is_large_list_view(values.type):
            values = values.cast(pa.large_list(values.type.value_type))
        values = pc.list_flatten(values)
    assert isinstance(values, pa.Array)
    return values


# The largest value an int64 holds: lists of uint64 up to it are stored as lists of int64.
MAX_INT64 = 2**63 - 1
# Every uint64 fits in a decimal of 20 digits, which Arrow, pandas (as Decimal) and SQL keep exact.
UINT64_AS_DECIMAL = pa.decimal128(20, 0)


def _with_leaf(data_type: pa.DataType, leaf: pa.DataType) -> pa.DataType:
    """`data_type`, a list (of lists, …), with `leaf` for its innermost values; list views as
    large lists (Arrow casts between list views of different values only through those)."""
    if not _is_list(data_type):
        return leaf
    inner = data_type.value_field.with_type(_with_leaf(data_type.value_type, leaf))
    if pa.types.is_fixed_size_list(data_type):
        return pa.list_(inner, data_type.list_size)
    if pa.types.is_list(data_type):
        return pa.list_(inner)
    return pa.large_list(inner)


def _leaf(data_type: pa.DataType) -> pa.DataType:
    while _is_list(data_type):
        data_type = data_type.value_type
    return data_type


def exact_unsigned_lists(table: pa.Table) -> tuple[pa.Table, dict[str, str]]:
    """`table` with each list (of lists, …) of uint64 that has nulls among its values cast to
    a type that survives pandas and storage exactly: lists of int64 when every value fits in
    one (as integer_lists_as_lists then keeps them), else lists of decimal(20, 0). pandas
    makes float arrays of such lists (`[1.8446744073709552e+19, nan]`), exact only up to
    2**53, and their Python ints past int64 could not be stored again. Also returns the new
    type of each column changed, by name. Other columns, and uint64 lists without nulls
    (uint64 arrays to pandas, exact), are left as they are."""
    changed: dict[str, str] = {}
    columns: list[pa.ChunkedArray] = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if (
            _is_list(field.type)
            and pa.types.is_uint64(_leaf(field.type))
            and _null_integers_inside(column)
        ):
            largest = pc.max(_flat_values(column)).as_py()
            leaf = pa.int64() if largest is None or largest <= MAX_INT64 else UINT64_AS_DECIMAL
            try:
                column = column.cast(_with_leaf(field.type, pa.uint64())).cast(
                    _with_leaf(field.type, leaf)
                )
            except pa.ArrowNotImplementedError as exc:  # not expected: a cast Arrow lacks
                logger.warning("cannot cast column %r of %s: %s", field.name, field.type, exc)
            else:
                changed[field.name] = str(column.type)
        columns.append(column)
    if not changed:
        return table, changed
    # Rebuilt from the columns, with the table's metadata (pandas': its index, names).
    rebuilt = pa.Table.from_arrays(columns, names=table.column_names)
    return rebuilt.replace_schema_metadata(table.schema.metadata), changed


def integer_lists_as_lists(table: pa.Table, df: pd.DataFrame) -> pd.DataFrame:
    """`df` (converted from `table`) with each column of lists of integers that has nulls among
    the integers as Python lists of ints and None: pandas makes float arrays of them
    (`[1.0, nan, 3.0]`), which would be stored back as lists of doubles. Other columns, and
    integer lists without nulls (integer arrays already), are left as they are; so are lists
    of uint64, whose values past int64 Arrow could not store again from Python ints (see
    exact_unsigned_lists for those)."""
    positions: dict[str, list[int]] = {}
    for position, name in enumerate(df.columns):
        positions.setdefault(str(name), []).append(position)
    for field, column in zip(table.schema, table.columns, strict=True):
        found = positions.get(field.name, [])
        if len(found) != 1 or not _integer_lists(field.type):
            continue
        if not _null_integers_inside(column):
            continue
        values = np.empty(len(column), dtype=object)
        for i, value in enumerate(column.to_pylist()):
            values[i] = value  # one by one: numpy would make a 2-D array of equal lists
        df.isetitem(found[0], values)
    return df


def arrow_to_dataframe(table: pa.Table) -> pd.DataFrame:
    """An Arrow table as a DataFrame (dtypes restored from pandas metadata when present; lists
    of integers with nulls as Python lists, see integer_lists_as_lists)."""
    return integer_lists_as_lists(table, table.to_pandas())


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
