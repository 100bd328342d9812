"""SqlDatasetStore keeps conversation datasets as zstd Arrow IPC in the database, on SQLite and
PostgreSQL: dtypes round-trip, saves upsert, scopes are isolated, replicas share datasets."""

from __future__ import annotations

import logging
import pickle
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session, sessionmaker

from services.registry.context import DatasetScope
from services.registry.datasets import (
    SqlDatasetStore,
    dataframe_to_ipc,
    ipc_to_dataframe,
    ipc_to_table,
)
from shared.db.models import ConversationDatasetRow

SCOPE = DatasetScope(tenant_id="t1", conversation_id="c1")


def typed_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "i": [1, 2, 3],
            "nullable_i": pd.array([1, None, 3], dtype="Int64"),
            "f": [1.5, None, 2.0],
            "s": pd.array(["x", None, "é"], dtype="str"),
            "b": [True, False, True],
            "t": pd.to_datetime(pd.Series(["2024-01-01 00:00", None, "2024-02-29 12:30"])),
            "tz": pd.to_datetime(pd.Series(["2024-01-01", None, "2024-02-01"])).dt.tz_localize(
                "UTC"
            ),
        }
    )


@pytest.fixture
def store(sessions: sessionmaker[Session]) -> SqlDatasetStore:
    return SqlDatasetStore(sessions)


def stored_rows(sessions: sessionmaker[Session]) -> list[ConversationDatasetRow]:
    with sessions() as session:
        return list(session.scalars(select(ConversationDatasetRow)))


def test_ipc_round_trip_preserves_ints_floats_strings_bools_timestamps_and_nulls() -> None:
    df = typed_frame()

    back = ipc_to_dataframe(dataframe_to_ipc(df))

    pd.testing.assert_frame_equal(back, df)


def test_ipc_bytes_are_a_zstd_arrow_stream_and_never_a_pickle() -> None:
    df = pd.DataFrame({"x": ["same value"] * 10_000})

    data = dataframe_to_ipc(df)

    assert not data.startswith(b"\x80")  # pickle protocol 2+ header
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(data)
    assert ipc_to_table(data).num_rows == 10_000
    uncompressed = pa.BufferOutputStream()
    table = pa.Table.from_pandas(df, preserve_index=False)
    with ipc.new_stream(uncompressed, table.schema) as writer:
        writer.write_table(table)
    assert len(data) < uncompressed.getvalue().size / 10


def test_ipc_keeps_a_named_index_as_a_column_and_drops_a_default_one() -> None:
    grouped = pd.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]}).groupby("k").sum()

    back = ipc_to_dataframe(dataframe_to_ipc(grouped))

    assert list(back.columns) == ["k", "v"]
    assert back["k"].tolist() == ["a", "b"]


def test_ipc_stores_mixed_object_columns_as_strings_and_dedupes_column_names() -> None:
    df = pd.DataFrame([[1, "a", 2], ["x", None, 3]], columns=["mixed", "v", "v"])

    back = ipc_to_dataframe(dataframe_to_ipc(df))

    assert list(back.columns) == ["mixed", "v", "v_2"]
    assert back["mixed"].tolist() == ["1", "x"]
    assert back["v"].isna().tolist() == [False, True]


def test_an_index_named_like_a_column_is_kept_under_a_unique_name() -> None:
    df = pd.DataFrame({"k": [1, 2]}, index=pd.Index(["a", "b"], name="k"))

    back = ipc_to_dataframe(dataframe_to_ipc(df))

    assert list(back.columns) == ["k", "k_2"]
    assert back["k"].tolist() == ["a", "b"]


def test_ipc_round_trips_an_empty_frame_with_its_dtypes() -> None:
    df = typed_frame().iloc[0:0]

    back = ipc_to_dataframe(dataframe_to_ipc(df))

    assert len(back) == 0
    assert back.dtypes.to_dict() == df.dtypes.to_dict()


def test_saved_dataset_loads_back_equal(store: SqlDatasetStore) -> None:
    df = typed_frame()

    info = store.save(SCOPE, "typed", df, source="test")

    assert info.rows == 3
    assert info.source == "test"
    pd.testing.assert_frame_equal(store.load(SCOPE, "typed"), df)


def test_saved_columns_carry_dtype_null_and_distinct_counts(
    store: SqlDatasetStore, sessions: sessionmaker[Session]
) -> None:
    store.save(SCOPE, "typed", typed_frame())

    (row,) = stored_rows(sessions)
    by_name = {c["name"]: c for c in row.columns}
    assert by_name["f"] == {"name": "f", "dtype": "float64", "null_count": 1, "distinct_count": 2}
    assert by_name["s"]["null_count"] == 1
    assert by_name["i"]["distinct_count"] == 3
    assert row.rows == 3


def test_stored_columns_describe_the_stored_types(
    store: SqlDatasetStore, sessions: sessionmaker[Session]
) -> None:
    store.save(SCOPE, "mixed", pd.DataFrame({"m": [1, "a", None]}))

    (row,) = stored_rows(sessions)
    assert row.columns[0]["dtype"] == str(store.load(SCOPE, "mixed")["m"].dtype)
    assert row.columns[0]["null_count"] == 1


def test_saving_the_same_name_again_replaces_the_dataset(
    store: SqlDatasetStore, sessions: sessionmaker[Session]
) -> None:
    store.save(SCOPE, "d", pd.DataFrame({"a": [1]}), source="first")
    store.save(SCOPE, "d", pd.DataFrame({"b": ["x", "y"]}), source="second")

    assert store.load(SCOPE, "d")["b"].tolist() == ["x", "y"]
    (row,) = stored_rows(sessions)
    assert (row.rows, row.source) == (2, "second")


def test_loading_a_missing_dataset_raises_key_error(store: SqlDatasetStore) -> None:
    with pytest.raises(KeyError):
        store.load(SCOPE, "nope")


def test_list_returns_metadata_sorted_by_name(store: SqlDatasetStore) -> None:
    store.save(SCOPE, "zeta", pd.DataFrame({"a": [1, 2]}))
    store.save(SCOPE, "alpha", pd.DataFrame({"b": ["x"]}), source="file.csv")

    infos = store.list(SCOPE)

    assert [i.name for i in infos] == ["alpha", "zeta"]
    assert infos[0].rows == 1
    assert infos[0].source == "file.csv"
    assert [c["name"] for c in infos[1].columns] == ["a"]


def test_tenants_conversations_and_namespaces_are_isolated(store: SqlDatasetStore) -> None:
    store.save(SCOPE, "secret", pd.DataFrame({"a": [1]}))

    for other in (
        DatasetScope("t2", "c1"),
        DatasetScope("t1", "c2"),
        DatasetScope("t1", "c1", namespace_id="ns"),
    ):
        assert store.list(other) == []
        with pytest.raises(KeyError):
            store.load(other, "secret")


def test_another_replica_sees_a_saved_dataset(sessions: sessionmaker[Session]) -> None:
    SqlDatasetStore(sessions).save(SCOPE, "shared", pd.DataFrame({"a": [1, 2, 3]}))

    replica = SqlDatasetStore(sessions)

    assert replica.load(SCOPE, "shared")["a"].tolist() == [1, 2, 3]


def test_a_concurrent_insert_of_the_same_key_becomes_an_update(
    store: SqlDatasetStore, sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    replica = SqlDatasetStore(sessions)
    raced: list[bool] = []

    def other_replica_wins_the_insert(session: Session, *_: Any) -> None:
        if not raced:
            raced.append(True)
            replica.save(SCOPE, "race", pd.DataFrame({"who": ["replica"]}))

    event.listen(sessions, "before_flush", other_replica_wins_the_insert)
    try:
        with caplog.at_level(logging.INFO, logger="services.registry.datasets"):
            store.save(SCOPE, "race", pd.DataFrame({"who": ["store"]}))
    finally:
        event.remove(sessions, "before_flush", other_replica_wins_the_insert)

    assert raced
    assert "concurrent insert" in caplog.text  # the IntegrityError path was taken
    assert store.load(SCOPE, "race")["who"].tolist() == ["store"]
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(ConversationDatasetRow)) == 1


def test_unicode_names_and_values_survive(store: SqlDatasetStore) -> None:
    df = pd.DataFrame({"città": ["Zürich", "東京", "🙂"]})

    store.save(SCOPE, "unicode", df)

    pd.testing.assert_frame_equal(store.load(SCOPE, "unicode"), df)


def test_an_empty_dataset_is_saved_and_listed(store: SqlDatasetStore) -> None:
    df = pd.DataFrame({"a": pd.Series([], dtype="int64"), "s": pd.Series([], dtype="str")})

    info = store.save(SCOPE, "empty", df)

    assert info.rows == 0
    loaded = store.load(SCOPE, "empty")
    assert len(loaded) == 0
    assert list(loaded.columns) == ["a", "s"]
    assert [i.rows for i in store.list(SCOPE)] == [0]


def test_an_invalid_name_is_rejected(store: SqlDatasetStore) -> None:
    with pytest.raises(ValueError):
        store.save(SCOPE, "", pd.DataFrame({"a": [1]}))
    with pytest.raises(ValueError):
        store.save(SCOPE, "x" * 129, pd.DataFrame({"a": [1]}))
