"""Conversation datasets persisted in the database: SqlDatasetStore (the DatasetStore of the
registry, over `conversation_datasets`) and the Arrow IPC (zstd) serialisation of DataFrames that
the store and the proto `Dataset.arrow_ipc` field share. Tables are never pickled."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from services.registry.context import DatasetInfo, DatasetScope
from shared.arrow_ipc import (  # noqa: F401 - re-exported for the tools and tests
    dataframe_to_arrow,
    dataframe_to_ipc,
    ipc_to_dataframe,
    ipc_to_table,
    normalize_frame,
    storable,
    table_to_ipc,
    unique_names,
)
from shared.contract import measure_schema
from shared.db.engine import translate_db_errors
from shared.db.models import ConversationDatasetRow

logger = logging.getLogger(__name__)

MAX_NAME_LENGTH = 128  # conversation_datasets.name is String(128)


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
        frame, table = storable(df)
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
