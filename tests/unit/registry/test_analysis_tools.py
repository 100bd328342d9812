"""The analysis tools: load_dataset reads only inside the data roots, preview_data and
describe_entry measure stored datasets, query runs read-only DuckDB SQL with hints that name the
closest tables and columns — all scoped to one tenant's conversation."""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from services.registry.context import ToolContext
from services.registry.datasets import SqlDatasetStore
from services.registry.schemas.analysis import TOOLS
from services.registry.tools.analysis import (
    PathOutsideDataRoots,
    QueryPermissionDenied,
    QueryTimeout,
    _compared_literals,
    describe_entry,
    load_dataset,
    preview_data,
    query,
)
from shared.contract import Hint, HintException, Ok
from shared.contract.result import exception_to_envelope

from .analysis_support import make_context, ok_of


@pytest.fixture
def loaded(ctx: ToolContext) -> ToolContext:
    load_dataset({"path": "people.csv"}, ctx)
    load_dataset({"path": "orders.csv"}, ctx)
    return ctx


def hint_of(excinfo: pytest.ExceptionInfo[HintException]) -> HintException:
    return excinfo.value


def forbid_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("the file must not be read")

    monkeypatch.setattr(pd, "read_csv", refuse)
    monkeypatch.setattr(pq, "read_table", refuse)


# --------------------------------------------------------------------------------------------
# schemas


def test_the_schemas_list_the_four_tools_in_order_with_strict_inputs() -> None:
    assert [tool["name"] for tool in TOOLS] == [
        "load_dataset",
        "preview_data",
        "describe_entry",
        "query",
    ]
    for tool in TOOLS:
        assert tool["category"] == "analysis"
        assert tool["description"] and tool["status_message"]
        assert isinstance(tool["large_output"], bool)
        schema = tool["input_schema"]
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["additionalProperties"] is False
        assert set(schema["required"]) <= set(schema["properties"])
        assert all(prop.get("description") for prop in schema["properties"].values())


def test_every_handler_path_points_to_its_handler() -> None:
    for tool in TOOLS:
        module_name, _, func_name = tool["handler_path"].rpartition(".")
        handler = getattr(importlib.import_module(module_name), func_name)
        assert callable(handler)
        assert func_name == tool["name"]


# --------------------------------------------------------------------------------------------
# load_dataset


def test_loading_a_csv_saves_it_under_the_file_stem_and_reports_its_schema(
    ctx: ToolContext,
) -> None:
    result = load_dataset({"path": "people.csv"}, ctx)

    ok = ok_of(result)
    assert ok.rows == 5
    assert result.content.startswith("✓ ok. 5 row(s).")
    schema = {c.name: c for c in ok.schema}
    assert schema["age"].null_count == 2
    assert schema["joined"].dtype.startswith("datetime64")
    assert result.datasets == {}  # the table is stored, not shipped in effects
    assert [(i.name, i.rows) for i in ctx.list_datasets()] == [("people", 5)]
    assert ctx.list_datasets()[0].source.endswith("people.csv")


def test_loading_a_parquet_file_keeps_its_types(ctx: ToolContext, files: Path) -> None:
    table = pa.table(
        {
            "k": pa.array([1, 2, None], type=pa.int64()),
            "flag": [True, False, True],
            "at": pa.array([0, 1, 2], type=pa.timestamp("ms")),
        }
    )
    pq.write_table(table, files / "events.parquet")

    ok = ok_of(load_dataset({"path": "events.parquet", "name": "ev"}, ctx))

    assert ok.rows == 3
    loaded = ctx.load_dataset("ev")
    assert loaded["flag"].dtype == bool
    assert str(loaded["at"].dtype).startswith("datetime64")
    assert loaded["k"].isna().sum() == 1


def test_a_tsv_is_split_on_tabs_and_an_explicit_delimiter_is_honoured(
    ctx: ToolContext, files: Path
) -> None:
    (files / "t.tsv").write_text("a\tb\n1\t2\n", encoding="utf-8")
    (files / "semi.csv").write_text("a;b\n1;2\n", encoding="utf-8")

    assert [c.name for c in ok_of(load_dataset({"path": "t.tsv"}, ctx)).schema] == ["a", "b"]
    ok = ok_of(load_dataset({"path": "semi.csv", "delimiter": ";"}, ctx))
    assert [c.name for c in ok.schema] == ["a", "b"]


def test_a_file_name_that_is_not_an_identifier_is_sanitised_with_a_warning(
    ctx: ToolContext, files: Path
) -> None:
    (files / "Sales Data 2024.csv").write_text("x\n1\n", encoding="utf-8")

    ok = ok_of(load_dataset({"path": "Sales Data 2024.csv"}, ctx))

    assert [i.name for i in ctx.list_datasets()] == ["sales_data_2024"]
    assert [w.kind for w in ok.warnings] == ["renamed"]


def test_an_explicit_name_that_is_not_an_identifier_is_a_schema_hint(ctx: ToolContext) -> None:
    with pytest.raises(HintException) as excinfo:
        load_dataset({"path": "people.csv", "name": "My People"}, ctx)

    hint = hint_of(excinfo)
    assert hint.hint_kind == "schema"
    assert hint.alternatives[0].label == "my_people"
    assert ctx.list_datasets() == []


def test_loading_again_under_the_same_name_replaces_with_a_warning(ctx: ToolContext) -> None:
    load_dataset({"path": "people.csv", "name": "data"}, ctx)

    ok = ok_of(load_dataset({"path": "orders.csv", "name": "data"}, ctx))

    assert [w.kind for w in ok.warnings] == ["replaced"]
    assert ctx.list_datasets()[0].rows == 4


def test_a_dot_dot_escape_is_refused_without_reading(
    ctx: ToolContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "secret.csv").write_text("a\n1\n", encoding="utf-8")
    forbid_reading(monkeypatch)

    with pytest.raises(PathOutsideDataRoots) as excinfo:
        load_dataset({"path": "../secret.csv"}, ctx)

    assert str(tmp_path / "files") in str(excinfo.value)  # names the allowed roots
    assert exception_to_envelope(excinfo.value).err_kind == "PathOutsideDataRoots"  # type: ignore[union-attr]


def test_an_absolute_path_outside_the_roots_is_refused_without_reading(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    forbid_reading(monkeypatch)

    with pytest.raises(PathOutsideDataRoots):
        load_dataset({"path": "/etc/passwd", "format": "csv"}, ctx)
    with pytest.raises(PathOutsideDataRoots):
        load_dataset({"path": "/nonexistent/x.csv"}, ctx)


def test_an_absolute_path_inside_a_root_is_allowed(ctx: ToolContext, files: Path) -> None:
    ok = ok_of(load_dataset({"path": str(files / "orders.csv")}, ctx))

    assert ok.rows == 4


def test_a_symlink_pointing_outside_the_roots_is_refused(
    ctx: ToolContext, files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.csv").write_text("a\n1\n", encoding="utf-8")
    (files / "innocent.csv").symlink_to(outside / "secret.csv")
    (files / "linked_dir").symlink_to(outside, target_is_directory=True)
    forbid_reading(monkeypatch)

    with pytest.raises(PathOutsideDataRoots):
        load_dataset({"path": "innocent.csv"}, ctx)
    with pytest.raises(PathOutsideDataRoots):
        load_dataset({"path": "linked_dir/secret.csv"}, ctx)


def test_a_symlink_to_a_file_inside_the_roots_is_followed(ctx: ToolContext, files: Path) -> None:
    (files / "alias.csv").symlink_to(files / "orders.csv")

    assert ok_of(load_dataset({"path": "alias.csv"}, ctx)).rows == 4


def test_a_missing_file_is_a_schema_hint_with_the_closest_file_names(
    ctx: ToolContext, files: Path, tmp_path: Path
) -> None:
    (files / "sub").mkdir()
    (files / "sub" / "peoples_2023.csv").write_text("a\n1\n", encoding="utf-8")
    (tmp_path / "pepole_outside.csv").write_text("a\n1\n", encoding="utf-8")
    (files / "pepole.csv").symlink_to(tmp_path / "pepole_outside.csv")

    with pytest.raises(HintException) as excinfo:
        load_dataset({"path": "peple.csv"}, ctx)

    hint = hint_of(excinfo)
    assert hint.hint_kind == "schema"
    labels = [a.label for a in hint.alternatives]
    assert labels[0] == "people.csv"
    assert "sub/peoples_2023.csv" in labels
    assert "pepole.csv" not in labels  # a link leading outside is never suggested
    assert [a.score for a in hint.alternatives] == sorted(
        (a.score for a in hint.alternatives), reverse=True
    )


def test_a_directory_is_a_schema_hint(ctx: ToolContext, files: Path) -> None:
    (files / "folder").mkdir()

    with pytest.raises(HintException) as excinfo:
        load_dataset({"path": "folder"}, ctx)

    assert hint_of(excinfo).hint_kind == "schema"


def test_an_unsupported_extension_is_a_hint_suggesting_a_format(
    ctx: ToolContext, files: Path
) -> None:
    # (A format load_dataset knows it does not read, .xlsx or .json, is a schema Hint naming
    # the ones it does: test_analysis_published.py.)
    (files / "book.dat").write_bytes(b"a|b\n1|2\n")

    with pytest.raises(HintException) as excinfo:
        load_dataset({"path": "book.dat"}, ctx)

    hint = hint_of(excinfo)
    assert hint.hint_kind == "fetch"
    assert any("csv" in a.label for a in hint.alternatives)


def test_a_malformed_csv_is_a_schema_hint(ctx: ToolContext, files: Path) -> None:
    (files / "bad.csv").write_text("a,b\n1,2\n3,4,5,6\n", encoding="utf-8")

    with pytest.raises(HintException) as excinfo:
        load_dataset({"path": "bad.csv"}, ctx)

    assert hint_of(excinfo).hint_kind == "schema"
    assert ctx.list_datasets() == []


def test_an_empty_file_is_a_schema_hint(ctx: ToolContext, files: Path) -> None:
    (files / "nothing.csv").write_text("", encoding="utf-8")

    with pytest.raises(HintException) as excinfo:
        load_dataset({"path": "nothing.csv"}, ctx)

    assert hint_of(excinfo).hint_kind == "schema"


def test_a_non_parquet_file_read_as_parquet_is_a_schema_hint(ctx: ToolContext) -> None:
    with pytest.raises(HintException) as excinfo:
        load_dataset({"path": "people.csv", "format": "parquet"}, ctx)

    assert hint_of(excinfo).hint_kind == "schema"


def test_a_latin1_file_is_read_with_an_encoding_warning(ctx: ToolContext, files: Path) -> None:
    (files / "legacy.csv").write_bytes("city\nZürich\n".encode("latin-1"))

    ok = ok_of(load_dataset({"path": "legacy.csv"}, ctx))

    assert [w.kind for w in ok.warnings] == ["encoding"]
    assert ctx.load_dataset("legacy")["city"].tolist() == ["Zürich"]


def test_duplicate_csv_headers_are_renamed_with_a_warning(ctx: ToolContext, files: Path) -> None:
    (files / "dup.csv").write_text("a,a\n1,2\n", encoding="utf-8")

    ok = ok_of(load_dataset({"path": "dup.csv"}, ctx))

    assert [w.kind for w in ok.warnings] == ["duplicate_columns"]
    assert len({c.name for c in ok.schema}) == 2


def test_unicode_data_survives_loading_and_querying(ctx: ToolContext, files: Path) -> None:
    (files / "cities.csv").write_text("ville,pays\nZürich,CH\n東京,JP\nSão Paulo,BR\n", "utf-8")
    load_dataset({"path": "cities.csv"}, ctx)

    ok = ok_of(query({"sql": "SELECT ville FROM cities WHERE pays = 'JP'"}, ctx))

    assert ok.data["ville"].tolist() == ["東京"]


# --------------------------------------------------------------------------------------------
# preview_data and describe_entry


def test_preview_shows_the_window_with_the_true_row_count(ctx: ToolContext, files: Path) -> None:
    (files / "numbers.csv").write_text(
        "n,maybe\n" + "".join(f"{i},{'' if i % 5 == 0 else i}\n" for i in range(25)),
        encoding="utf-8",
    )
    load_dataset({"path": "numbers.csv"}, ctx)

    result = preview_data({"name": "numbers", "limit": 5, "offset": 10}, ctx)

    ok = ok_of(result)
    assert ok.rows == 25
    assert ok.data["n"].tolist() == [10, 11, 12, 13, 14]
    assert {c.name: c.null_count for c in ok.schema}["maybe"] == 5  # of the whole dataset
    assert result.content.startswith("✓ ok. 25 row(s).")


def test_preview_past_the_end_is_a_fetch_hint(loaded: ToolContext) -> None:
    with pytest.raises(HintException) as excinfo:
        preview_data({"name": "people", "offset": 50}, loaded)

    assert hint_of(excinfo).hint_kind == "fetch"


def test_preview_limit_above_the_maximum_is_capped_with_a_warning(loaded: ToolContext) -> None:
    ok = ok_of(preview_data({"name": "people", "limit": 5000}, loaded))

    assert [w.kind for w in ok.warnings] == ["capped"]


def test_an_unknown_dataset_is_a_schema_hint_naming_the_closest(loaded: ToolContext) -> None:
    # preview_data is spec-only (it raises; the registry's wrapper makes the Hint);
    # describe_entry is source-decorated (it returns the Hint itself).
    with pytest.raises(HintException) as excinfo:
        preview_data({"name": "peeple"}, loaded)
    described = describe_entry({"name": "peeple"}, loaded)

    assert isinstance(described, Hint)
    for hint in (hint_of(excinfo).to_hint(), described):
        assert hint.hint_kind == "schema"
        assert hint.alternatives[0].label == "people"
        assert {a.label for a in hint.alternatives} == {"people", "orders"}


def test_an_unknown_dataset_with_none_loaded_points_to_load_dataset(ctx: ToolContext) -> None:
    with pytest.raises(HintException) as excinfo:
        preview_data({"name": "people"}, ctx)

    hint = hint_of(excinfo)
    assert hint.hint_kind == "schema"
    assert hint.alternatives == []
    assert "load_dataset" in hint.message


def test_a_dataset_name_matches_case_insensitively(loaded: ToolContext) -> None:
    assert ok_of(preview_data({"name": "People"}, loaded)).rows == 5


def test_describe_counts_nulls_and_distincts_with_numeric_and_date_ranges(
    loaded: ToolContext,
) -> None:
    ok = ok_of(describe_entry({"name": "people"}, loaded))

    assert ok.rows == 5  # one row per column
    assert [c.name for c in ok.schema] == ["id", "name", "city", "age", "joined"]
    rows = ok.data.set_index("column")
    assert list(ok.data.columns) == [
        "column",
        "dtype",
        "null_count",
        "distinct_count",
        "min",
        "max",
        "top_values",
    ]
    assert rows.loc["age", "null_count"] == 2
    assert rows.loc["age", "distinct_count"] == 3
    assert (rows.loc["id", "min"], rows.loc["id", "max"]) == ("1", "5")
    assert rows.loc["joined", "min"].startswith("2019-07-04")
    assert pd.isna(rows.loc["name", "min"])
    assert pd.isna(rows.loc["age", "top_values"])  # numbers have min/max instead


def test_describe_shows_how_the_values_of_text_columns_are_spelt(loaded: ToolContext) -> None:
    """The most frequent values, with counts, of text, boolean and categorical columns: a
    model filters on 'Zürich' as it is written, not on a guess."""
    orders = ok_of(describe_entry({"name": "orders"}, loaded)).data.set_index("column")
    statuses = ok_of(
        query({"sql": "SELECT status, count(*) n FROM orders GROUP BY status"}, loaded)
    )
    counts = dict(zip(statuses.data["status"], statuses.data["n"], strict=True))
    top = max(counts, key=lambda status: (counts[status], status))
    assert orders.loc["status", "top_values"].startswith(f"{top} ×{counts[top]}")
    people = ok_of(describe_entry({"name": "people"}, loaded)).data.set_index("column")
    # Every city once: the first three, as spelt, without counting a column of unique values.
    assert people.loc["city", "top_values"] == "London ×1, Arlington ×1, Helsinki ×1"
    odd = pd.DataFrame(
        {
            "flag": [True, True, False, None],
            "kind": pd.Categorical(["a", "b", "a", "a"]),
            "long": ["x" * 100] * 2 + [None, None],
            "nested": [[1], [2], None, None],  # lists: described without failing
            "empty": pd.Series([None] * 4, dtype="str"),
        }
    )
    loaded.save_dataset("odd", odd, "test")
    described = ok_of(describe_entry({"name": "odd"}, loaded)).data.set_index("column")
    assert described.loc["flag", "top_values"] == "True ×2, False ×1"
    assert described.loc["kind", "top_values"] == "a ×3, b ×1"
    assert described.loc["long", "top_values"] == "x" * 39 + "… ×2"
    assert described.loc["nested", "dtype"] and described.loc["nested", "null_count"] == 2
    assert pd.isna(described.loc["empty", "top_values"])


# --------------------------------------------------------------------------------------------
# query


def test_query_joins_two_datasets(loaded: ToolContext) -> None:
    result = query(
        {
            "sql": "SELECT p.name, sum(o.amount) AS total FROM orders o "
            "JOIN people p ON p.id = o.person_id WHERE o.status = 'paid' "
            "GROUP BY p.name ORDER BY total DESC"
        },
        loaded,
    )

    ok = ok_of(result)
    assert ok.rows == 2
    assert ok.data.to_dict("records") == [
        {"name": "Ada", "total": 19.75},
        {"name": "Linus", "total": 3.1},
    ]
    assert [c.name for c in ok.schema] == ["name", "total"]


def no_matches(ok: Ok) -> list[dict[str, Any]]:
    return [w.details for w in ok.warnings if w.kind == "no_match"]


def test_an_empty_result_names_the_compared_values_no_row_holds(loaded: ToolContext) -> None:
    """Filtering on a value as the model guessed it ('Zurich', 'london', 'payed') returns no
    row; the result says which value no row holds and what the column holds like it."""
    zurich = ok_of(query({"sql": "SELECT * FROM people WHERE city = 'Zurich'"}, loaded))
    assert zurich.rows == 0
    assert no_matches(zurich) == [
        {"dataset": "people", "column": "city", "value": "Zurich", "suggestions": ["Zürich"]}
    ]
    (warning,) = [w for w in zurich.warnings if w.kind == "no_match"]
    assert warning.message == "no row of 'people' has city = 'Zurich'; did you mean 'Zürich'?"

    listed = ok_of(
        query(
            {
                "sql": "SELECT p.name FROM people p -- where city = 'Oslo'\n"
                "WHERE p.\"city\" IN ('london', 'Paris') AND 'Lynus' = name",
            },
            loaded,
        )
    )
    assert listed.rows == 0
    found = {(m["column"], m["value"]): m["suggestions"] for m in no_matches(listed)}
    assert found == {
        ("city", "london"): ["London"],
        ("city", "Paris"): [],  # nothing like it: named, with no suggestion
        ("name", "Lynus"): ["Linus"],
    }  # and the commented-out Oslo is not read

    joined = ok_of(
        query(
            {
                "sql": "SELECT * FROM orders o JOIN people p ON p.id = o.person_id "
                "WHERE o.status = 'payed' AND p.name = 'Ada'"
            },
            loaded,
        )
    )
    assert [(m["dataset"], m["value"], m["suggestions"]) for m in no_matches(joined)] == [
        ("orders", "payed", ["paid"])  # 'Ada' is held: not named
    ]
    # A result with rows, or a number compared, says nothing of the kind.
    for sql in (
        "SELECT * FROM people WHERE city = 'London'",
        "SELECT * FROM people WHERE id = '42'",
    ):
        assert no_matches(ok_of(query({"sql": sql}, loaded))) == []
    # Column names that differ only in case (renamed when registered): advice or none, no error.
    loaded.save_dataset("twins", pd.DataFrame({"City": ["Oslo"], "city": ["Rome"]}), "test")
    twins = ok_of(query({"sql": "SELECT * FROM twins WHERE city = 'oslo'"}, loaded))
    assert twins.rows == 0


def test_the_compared_texts_are_read_off_the_sql_in_every_form() -> None:
    sql = (
        "SELECT * FROM t WHERE a = 'it''s' AND b IN ('x', 'y''z') AND 'q' = \"C\" "
        "AND s.t.\"D\" = 'w' AND e == 'no' AND f != 'no' AND g <> 'no' -- h = 'no'\n"
        "AND /* i = 'no' */ 'v' = x.y AND j IN ('open'"
    )
    assert _compared_literals(sql) == [
        ("a", "it's"),
        ("b", "x"),
        ("b", "y'z"),
        ("C", "q"),
        ("D", "w"),
        ("y", "v"),
    ]


@pytest.mark.parametrize(
    "hostile",
    ["a IN (" + "'" * 64_000, "a = '" + "''" * 32_000, "a IN (" + "'', " * 16_000, "/*" * 32_000],
)
def test_reading_the_compared_texts_of_hostile_sql_does_not_hang(hostile: str) -> None:
    """A regex scan of these took 24 s (quadratic); the tokeniser reads each once."""
    started = time.monotonic()
    _compared_literals(hostile)
    assert time.monotonic() - started < 10


def test_integer_sums_come_back_as_numbers_not_decimals(loaded: ToolContext) -> None:
    ok = ok_of(query({"sql": "SELECT sum(id) AS s FROM people"}, loaded))

    assert ok.data["s"].dtype == "int64"
    assert ok.data["s"].tolist() == [15]


def test_show_describe_and_summarize_are_allowed(loaded: ToolContext) -> None:
    tables = ok_of(query({"sql": "SHOW TABLES"}, loaded)).data
    assert sorted(tables.iloc[:, 0]) == ["orders", "people"]
    assert ok_of(query({"sql": "DESCRIBE people"}, loaded)).rows == 5
    assert ok_of(query({"sql": "SUMMARIZE orders"}, loaded)).rows == 4
    assert ok_of(query({"sql": "FROM orders LIMIT 1"}, loaded)).rows == 1
    assert ok_of(query({"sql": "VALUES (1), (2)"}, loaded)).rows == 2


def test_an_unknown_table_is_a_schema_hint_with_the_closest_dataset(loaded: ToolContext) -> None:
    with pytest.raises(HintException) as excinfo:
        query({"sql": "SELECT * FROM peeple"}, loaded)

    hint = hint_of(excinfo)
    assert hint.hint_kind == "schema"
    assert hint.alternatives[0].label == "people"


def test_an_unknown_column_is_a_schema_hint_with_the_closest_table_column(
    loaded: ToolContext,
) -> None:
    for sql in ("SELECT citty FROM people", "SELECT p.citty FROM people p"):
        with pytest.raises(HintException) as excinfo:
            query({"sql": sql}, loaded)

        hint = hint_of(excinfo)
        assert hint.hint_kind == "schema"
        assert hint.alternatives[0].label == "people.city"


def test_a_syntax_error_is_a_schema_hint(loaded: ToolContext) -> None:
    with pytest.raises(HintException) as excinfo:
        query({"sql": "SELEC * FROM people"}, loaded)

    assert hint_of(excinfo).hint_kind == "schema"


def test_a_type_error_is_a_schema_hint(loaded: ToolContext) -> None:
    with pytest.raises(HintException) as excinfo:
        query({"sql": "SELECT CAST(name AS INTEGER) FROM people"}, loaded)

    assert hint_of(excinfo).hint_kind == "schema"


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE x AS SELECT 1",
        "INSERT INTO people VALUES (9, 'x', 'y', 1, '2020-01-01')",
        "DROP TABLE people",
        "COPY people TO '/tmp/out.csv'",
        "ATTACH '/tmp/other.db' AS other",
        "INSTALL httpfs",
        "LOAD httpfs",
        "PRAGMA version",
        "SET threads = 8",
        "SELECT 1; SELECT 2",
        "SELECT 1; DROP TABLE people",
    ],
)
def test_statements_other_than_a_single_read_are_refused(loaded: ToolContext, sql: str) -> None:
    with pytest.raises(HintException) as excinfo:
        query({"sql": sql}, loaded)

    assert hint_of(excinfo).hint_kind == "fetch"
    assert sorted(i.name for i in loaded.list_datasets()) == ["orders", "people"]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM read_parquet('/tmp/x.parquet')",
    ],
)
def test_file_access_from_sql_is_an_error(loaded: ToolContext, sql: str) -> None:
    with pytest.raises(QueryPermissionDenied):
        query({"sql": sql}, loaded)


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("INSTALL httpfs", "INSTALL statements"),
        ("force install httpfs", "FORCE INSTALL statements"),
        ("USE memory", "USE statements"),
        ("CHECKPOINT", "CHECKPOINT statements"),
        ("WITH x AS (SELECT 1) DELETE FROM people", "DELETE statements"),
    ],
)
def test_a_refused_statement_is_named_as_written(loaded: ToolContext, sql: str, named: str) -> None:
    with pytest.raises(HintException) as excinfo:
        query({"sql": sql}, loaded)

    assert hint_of(excinfo).message.startswith(f"{named} are not allowed"), hint_of(excinfo)


def test_a_bare_file_path_as_a_table_is_not_read(loaded: ToolContext) -> None:
    with pytest.raises(HintException) as excinfo:
        query({"sql": "SELECT * FROM '/etc/passwd'"}, loaded)

    assert hint_of(excinfo).hint_kind == "schema"


def test_a_result_over_the_limit_is_truncated_with_the_true_count(loaded: ToolContext) -> None:
    result = query({"sql": "SELECT * FROM range(2500) t(n)", "limit": 3}, loaded)

    ok = ok_of(result)
    assert ok.rows == 2500
    assert ok.data["n"].tolist() == [0, 1, 2]
    (warning,) = ok.warnings
    assert warning.kind == "truncated"
    assert warning.details["total_rows"] == 2500


def test_a_limit_over_the_hard_cap_is_capped(loaded: ToolContext) -> None:
    ok = ok_of(query({"sql": "SELECT * FROM range(20000) t(n)", "limit": 50_000}, loaded))

    assert len(ok.data) == 10_000
    assert ok.rows == 20_000
    assert {w.kind for w in ok.warnings} == {"capped", "truncated"}


def test_save_as_persists_the_full_result_for_another_replica(
    loaded: ToolContext, tmp_path: Path, make_store: Callable[[], SqlDatasetStore]
) -> None:
    ok = ok_of(
        query(
            {"sql": "SELECT * FROM orders WHERE status = 'paid'", "save_as": "paid", "limit": 1},
            loaded,
        )
    )
    assert len(ok.data) == 1

    replica = make_context(tmp_path, make_store())
    assert len(replica.load_dataset("paid")) == 3
    assert ok_of(query({"sql": "SELECT count(*) AS n FROM paid"}, replica)).data["n"][0] == 3


def test_save_as_must_be_an_identifier(loaded: ToolContext) -> None:
    with pytest.raises(HintException) as excinfo:
        query({"sql": "SELECT 1", "save_as": "Bad Name"}, loaded)

    assert hint_of(excinfo).hint_kind == "schema"


def test_another_tenant_cannot_see_the_datasets(
    loaded: ToolContext, tmp_path: Path, store: SqlDatasetStore
) -> None:
    other = make_context(tmp_path, store, tenant_id="t2")

    assert other.list_datasets() == []
    with pytest.raises(HintException):
        preview_data({"name": "people"}, other)
    with pytest.raises(HintException) as excinfo:
        query({"sql": "SELECT * FROM people"}, other)
    assert hint_of(excinfo).alternatives == []


def test_another_conversation_cannot_see_the_datasets(
    loaded: ToolContext, tmp_path: Path, store: SqlDatasetStore
) -> None:
    other = make_context(tmp_path, store, conversation_id="c2")

    assert isinstance(describe_entry({"name": "people"}, other), Hint)


def test_a_query_running_past_the_timeout_is_cancelled(
    tmp_path: Path, files: Path, store: SqlDatasetStore
) -> None:
    ctx = make_context(tmp_path, store, tool_timeout_s=0.3)

    with pytest.raises(QueryTimeout):
        query({"sql": "SELECT count(*) FROM range(1000000000000)"}, ctx)


def test_an_empty_dataset_works_in_every_tool(ctx: ToolContext, files: Path) -> None:
    (files / "empty.csv").write_text("a,b\n", encoding="utf-8")

    loaded = ok_of(load_dataset({"path": "empty.csv"}, ctx))
    preview = ok_of(preview_data({"name": "empty"}, ctx))
    described = ok_of(describe_entry({"name": "empty"}, ctx))
    queried = ok_of(query({"sql": "SELECT * FROM empty", "save_as": "empty_copy"}, ctx))

    assert (loaded.rows, preview.rows, queried.rows) == (0, 0, 0)
    assert len(preview.data) == 0
    assert described.data["null_count"].tolist() == [0, 0]
    assert [c.name for c in queried.schema] == ["a", "b"]
    assert [(i.name, i.rows) for i in ctx.list_datasets()] == [("empty", 0), ("empty_copy", 0)]


def test_a_relative_path_is_also_looked_up_in_later_roots(
    tmp_path: Path, files: Path, store: SqlDatasetStore
) -> None:
    second = tmp_path / "more"
    second.mkdir()
    (second / "extra.csv").write_text("a\n1\n", encoding="utf-8")
    ctx = make_context(tmp_path, store)
    ctx.settings = ctx.settings.with_overrides(data_roots=(files, second))  # type: ignore[union-attr]

    assert ok_of(load_dataset({"path": "extra.csv"}, ctx)).rows == 1
    assert ok_of(load_dataset({"path": os.fspath(second / "extra.csv")}, ctx)).rows == 1
