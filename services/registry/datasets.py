"""Conversation datasets persisted in the database: SqlDatasetStore (the DatasetStore of the
registry, over `conversation_datasets`) and the Arrow IPC (zstd) serialisation of DataFrames that
the store and the proto `Dataset.arrow_ipc` field share. Tables are never pickled."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.ipc as ipc
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from services.registry.context import DatasetInfo, DatasetScope
from shared.contract import measure_schema
from shared.db.engine import translate_db_errors
from shared.db.models import ConversationDatasetRow

logger = logging.getLogger(__name__)

IPC_COMPRESSION = "zstd"
MAX_NAME_LENGTH = 128  # conversation_datasets.name is String(128)

_ARROW_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)


def unique_names(names: Sequence[object]) -> list[str]:
    """Column names as strings, duplicates suffixed `_2`, `_3`, … (Arrow needs unique names)."""
    seen: set[str] = set()
    out: list[str] = []
    for raw in names:
        base = str(raw)
        name, n = base, 1
        while name in seen:
            n += 1
            name = f"{base}_{n}"
        seen.add(name)
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


def _storable(df: pd.DataFrame) -> tuple[pd.DataFrame, pa.Table]:
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
    return _storable(df)[1]


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


def column_summaries(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The `columns` JSON of a stored dataset: name, dtype, null_count, distinct_count."""
    return [
        {
            "name": spec.name,
            "dtype": spec.dtype,
            "null_count": spec.null_count,
            "distinct_count": spec.distinct_count,
        }
        for spec in measure_schema(df)
    ]


class SqlDatasetStore:
    """The DatasetStore over `conversation_datasets`: any replica sharing the database sees the
    datasets another replica saved. Blocking; call from worker threads."""

    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self._session_factory = session_factory

    def save(
        self, scope: DatasetScope, name: str, df: pd.DataFrame, source: str = ""
    ) -> DatasetInfo:
        """Insert or replace the dataset `name` of the scope's conversation."""
        if not name or len(name) > MAX_NAME_LENGTH:
            raise ValueError(f"dataset name must be 1..{MAX_NAME_LENGTH} characters: {name!r}")
        frame, table = _storable(df)
        payload = table_to_ipc(table)
        columns = column_summaries(frame)
        rows = len(frame)
        with translate_db_errors():
            try:
                self._upsert(scope, name, payload, rows, columns, source)
            except IntegrityError:
                # Another replica inserted the same key between our select and insert: the row
                # exists now, so a second attempt updates it.
                logger.info(
                    "concurrent insert of dataset %r in %s/%s; updating instead",
                    name,
                    scope.tenant_id,
                    scope.conversation_id,
                )
                self._upsert(scope, name, payload, rows, columns, source)
        logger.debug(
            "saved dataset %r (%d rows, %d bytes) for %s/%s",
            name,
            rows,
            len(payload),
            scope.tenant_id,
            scope.conversation_id,
        )
        return DatasetInfo(name=name, rows=rows, columns=columns, source=source)

    def _upsert(
        self,
        scope: DatasetScope,
        name: str,
        payload: bytes,
        rows: int,
        columns: list[dict[str, Any]],
        source: str,
    ) -> None:
        with self._session_factory.begin() as session:
            row = session.scalars(
                select(ConversationDatasetRow).where(*self._key(scope, name))
            ).one_or_none()
            if row is None:
                session.add(
                    ConversationDatasetRow(
                        tenant_id=scope.tenant_id,
                        conversation_id=scope.conversation_id,
                        namespace_id=scope.namespace_id,
                        name=name,
                        arrow_ipc=payload,
                        rows=rows,
                        columns=columns,
                        source=source,
                    )
                )
            else:
                row.arrow_ipc = payload
                row.rows = rows
                row.columns = columns
                row.source = source

    def load(self, scope: DatasetScope, name: str) -> pd.DataFrame:
        """The dataset as a DataFrame; KeyError when the conversation has none of that name."""
        with translate_db_errors(), self._session_factory() as session:
            payload = session.scalars(
                select(ConversationDatasetRow.arrow_ipc).where(*self._key(scope, name))
            ).one_or_none()
        if payload is None:
            raise KeyError(name)
        return ipc_to_dataframe(payload)

    def list(self, scope: DatasetScope) -> list[DatasetInfo]:
        """Metadata of every dataset of the conversation, sorted by name (no table bytes read)."""
        stmt = (
            select(
                ConversationDatasetRow.name,
                ConversationDatasetRow.rows,
                ConversationDatasetRow.columns,
                ConversationDatasetRow.source,
            )
            .where(
                ConversationDatasetRow.tenant_id == scope.tenant_id,
                ConversationDatasetRow.conversation_id == scope.conversation_id,
                ConversationDatasetRow.namespace_id == scope.namespace_id,
            )
            .order_by(ConversationDatasetRow.name)
        )
        with translate_db_errors(), self._session_factory() as session:
            result = session.execute(stmt).all()
        return [
            DatasetInfo(name=r.name, rows=r.rows, columns=list(r.columns or []), source=r.source)
            for r in result
        ]

    @staticmethod
    def _key(scope: DatasetScope, name: str) -> tuple[Any, ...]:
        return (
            ConversationDatasetRow.tenant_id == scope.tenant_id,
            ConversationDatasetRow.conversation_id == scope.conversation_id,
            ConversationDatasetRow.namespace_id == scope.namespace_id,
            ConversationDatasetRow.name == name,
        )
