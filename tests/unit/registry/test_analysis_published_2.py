"""The analysis tools against more shapes of published files: CSV headers with empty cells (named
by position, as Parquet's are), notes below a table (World Bank, Statistics Canada) and notes
above it padded to the table's width by a spreadsheet, and Parquet lists of integers with nulls
among them, which stay integers through storage, preview, describe and query."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from services.registry.context import ToolContext
from services.registry.tools.analysis import describe_entry, load_dataset, preview_data, query
from shared.arrow_ipc import (
    dataframe_to_ipc,
    ipc_to_dataframe,
    ipc_to_table,
    table_to_ipc,
)
from shared.convert import envelope_from_pb, envelope_to_pb

from .analysis_support import kinds, ok_of


def names(ok: object) -> list[str]:
    return [c.name for c in ok.schema]  # type: ignore[attr-defined]


def warning(ok: object, kind: str) -> Any:
    return next(w for w in ok.warnings if w.kind == kind)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------
# empty header cells


def test_an_empty_csv_header_cell_is_named_by_position_as_in_parquet(
    ctx: ToolContext, files: Path
) -> None:
    (files / "gaps.csv").write_text("a,,c\n1,2,3\n", "utf-8")
    columns = [pa.array([n]) for n in (1, 2, 3)]
    pq.write_table(pa.Table.from_arrays(columns, ["a", "", "c"]), files / "gaps_pq.parquet")

    csv_ok = ok_of(load_dataset({"path": "gaps.csv"}, ctx))
    parquet_ok = ok_of(load_dataset({"path": "gaps_pq.parquet"}, ctx))

    # Before: pandas' "Unnamed: 1" for the CSV file, column_2 for the Parquet one.
    assert names(csv_ok) == names(parquet_ok) == ["a", "column_2", "c"]
    assert kinds(csv_ok) == kinds(parquet_ok) == ["duplicate_columns"]
    assert warning(csv_ok, "duplicate_columns").details["renamed"] == ["column_2"]
    found = ok_of(query({"sql": "SELECT column_2 FROM gaps"}, ctx))
    assert found.data["column_2"].tolist() == [2]


def test_a_column_the_file_names_unnamed_is_kept_as_written(ctx: ToolContext, files: Path) -> None:
    (files / "named.csv").write_text("a,Unnamed: 1,,Unnamed: 3,NA,\n1,2,3,4,5,6\n", "utf-8")

    ok = ok_of(load_dataset({"path": "named.csv"}, ctx))

    # The header read as written: empty cells only are renamed, `NA` is a name, not a null.
    assert names(ok) == ["a", "Unnamed: 1", "column_3", "Unnamed: 3", "NA", "column_6"]
    assert warning(ok, "duplicate_columns").details["renamed"] == ["column_3", "column_6"]
    assert ctx.load_dataset("named").iloc[0].tolist() == [1, 2, 3, 4, 5, 6]


def test_a_trailing_delimiter_on_the_header_and_rows_is_still_dropped(
    ctx: ToolContext, files: Path
) -> None:
    (files / "ends.csv").write_text("a,b,\n1,2,\n3,4,\n", "utf-8")
    (files / "lastname.csv").write_text("a,Unnamed: 2\n1,\n", "utf-8")

    trailing = ok_of(load_dataset({"path": "ends.csv"}, ctx))
    lastname = ok_of(load_dataset({"path": "lastname.csv"}, ctx))

    assert names(trailing) == ["a", "b"] and kinds(trailing) == ["trailing_delimiter"]
    # A last column the header names, even `Unnamed: 2`, is a column, empty or not.
    assert names(lastname) == ["a", "Unnamed: 2"] and kinds(lastname) == []


# --------------------------------------------------------------------------------------------
# notes below the table

# A World Bank DataBank export: the data, blank lines, then where it comes from.
WORLD_BANK_FOOTER = (
    '"Country Name","Country Code","2022","2023"\n'
    '"Aruba","ABW","106445","107359"\n'
    '"Angola","AGO","35588987","36684202"\n'
    "\n\n"
    '"Data from database: World Development Indicators",,,\n'
    '"Last Updated: 06/28/2024",,,\n'
)
# A Statistics Canada table: a column of reference months, and a footer with a symbol legend.
LONG_NOTE = (
    "How to cite: Statistics Canada. Table 14-10-0287-01 " + "Labour force characteristics " * 5
)
STATCAN_FOOTER = (
    "REF_DATE,GEO,VALUE\n"
    "2024-01,Canada,5.7\n"
    "2024-02,Canada,5.8\n"
    ",,\n"
    "Symbol legend:,,\n"
    ".. not available for a specific reference period,,\n"
    f'"{LONG_NOTE}",,\n'
)


def test_notes_below_a_world_bank_table_are_dropped_with_a_warning(
    ctx: ToolContext, files: Path
) -> None:
    (files / "wdi.csv").write_text(WORLD_BANK_FOOTER, "utf-8")

    ok = ok_of(load_dataset({"path": "wdi.csv"}, ctx))

    # Before: two more rows, `Data from database: …` as a country with no code or values.
    assert ok.rows == 2
    footnotes = warning(ok, "footnotes")
    assert "Data from database: World Development Indicators" in footnotes.message
    assert footnotes.details["notes"][1] == "Last Updated: 06/28/2024"
    stored = ctx.load_dataset("wdi")
    assert stored["Country Name"].tolist() == ["Aruba", "Angola"]
    # Typed by the data alone: integers, not floats with NaN for the notes' empty fields.
    assert str(stored["2023"].dtype) == "int64"
    found = ok_of(query({"sql": 'SELECT count(*) AS n FROM wdi WHERE "2022" IS NULL'}, ctx))
    assert found.data["n"].tolist() == [0]


def test_notes_below_a_table_of_dates_are_dropped_and_quoted_clipped(
    ctx: ToolContext, files: Path
) -> None:
    (files / "lfs.csv").write_text(STATCAN_FOOTER, "utf-8")

    ok = ok_of(load_dataset({"path": "lfs.csv"}, ctx))

    assert ok.rows == 2
    footnotes = warning(ok, "footnotes")
    assert footnotes.details["lines"] == 3
    assert footnotes.details["notes"][0] == "Symbol legend:"
    assert footnotes.details["notes"][2] == LONG_NOTE.strip()
    assert "…" in footnotes.message and LONG_NOTE.strip() not in footnotes.message
    stored = ctx.load_dataset("lfs")
    assert stored["REF_DATE"].tolist() == ["2024-01", "2024-02"]
    assert stored["VALUE"].tolist() == [5.7, 5.8]


def test_a_note_directly_below_a_column_of_years_is_dropped(ctx: ToolContext, files: Path) -> None:
    (files / "years.csv").write_text("Year,Value\n2020,1\n2021,2\nSource: OECD,\n", "utf-8")

    ok = ok_of(load_dataset({"path": "years.csv"}, ctx))

    assert kinds(ok) == ["footnotes"]
    stored = ctx.load_dataset("years")
    # Before: Year was text ("2020") because of the note below it.
    assert stored.to_dict("list") == {"Year": [2020, 2021], "Value": [1, 2]}


@pytest.mark.parametrize(
    "text",
    [
        # A roster whose last people have no score yet: names like those above.
        "name,score\nAda,1\nBob,2\nCarol,\nDan,\n",
        # The same after a blank line.
        "name,score\nAda,1\nBob,2\n\nCarol,\nDan,\n",
        # A note-like label, but rows above with only a name too: cannot tell them apart.
        "name,score\nAda,1\nEve,\nBob,2\nNote: late,\n",
        # Text below years that does not start like a note.
        "Year,Value\n2020,1\n2021,2\nunknown,\n",
        # A number below numbers: a row with its other values missing.
        "Year,Value\n2020,1\n2021,\n",
    ],
)
def test_last_rows_with_only_their_first_field_are_kept_when_they_may_be_data(
    ctx: ToolContext, files: Path, text: str
) -> None:
    (files / "kept.csv").write_text(text, "utf-8")

    ok = ok_of(load_dataset({"path": "kept.csv"}, ctx))

    assert "footnotes" not in kinds(ok)
    assert ok.rows == len([line for line in text.splitlines()[1:] if line])


# --------------------------------------------------------------------------------------------
# notes above the header, padded to the table's width

# A World Bank download opened in a spreadsheet and saved again: every line, blank ones too,
# padded with empty fields to the table's width.
WORLD_BANK_PADDED = (
    '"Data Source","World Development Indicators",,,,\r\n'
    ",,,,,\r\n"
    '"Last Updated Date","2024-06-28",,,,\r\n'
    ",,,,,\r\n"
    '"Country Name","Country Code","Indicator Name","Indicator Code","1960","2023"\r\n'
    '"Aruba","ABW","Population, total","SP.POP.TOTL","54608","106445"\r\n'
    '"Angola","AGO","Population, total","SP.POP.TOTL","5357195",""\r\n'
)


def test_padded_notes_above_a_world_bank_table_are_skipped_and_quoted(
    ctx: ToolContext, files: Path
) -> None:
    (files / "wdi.csv").write_text(WORLD_BANK_PADDED, "utf-8")

    ok = ok_of(load_dataset({"path": "wdi.csv"}, ctx))

    # Before: the notes were the header ("Data Source", "World Development Indicators",
    # "Unnamed: 2", …) and the real header a row of data.
    assert names(ok) == [
        "Country Name",
        "Country Code",
        "Indicator Name",
        "Indicator Code",
        "1960",
        "2023",
    ]
    assert ok.rows == 2
    preamble = warning(ok, "preamble")
    assert preamble.details["lines"] == 4
    # Quoted without the padding.
    assert preamble.details["notes"] == [
        '"Data Source","World Development Indicators"',
        '"Last Updated Date","2024-06-28"',
    ]
    stored = ctx.load_dataset("wdi")
    assert stored["1960"].tolist() == [54608, 5357195]


def test_padded_notes_separated_by_semicolons_are_skipped(ctx: ToolContext, files: Path) -> None:
    text = (
        'Titel;"Bevölkerung";;\n\nStand;28.06.2024;;\n\n'
        "Land;Jahr;Wert;Quelle\nDE;2023;84;X\nAT;2023;9;Y\n"
    )
    (files / "bev.csv").write_text(text, "utf-8")
    # A padded line with a number over a column of numbers may be a row: not taken for a note.
    (files / "ambiguous.csv").write_text(text.replace("28.06.2024", "2024"), "utf-8")

    ok = ok_of(load_dataset({"path": "bev.csv"}, ctx))
    ambiguous = ok_of(load_dataset({"path": "ambiguous.csv"}, ctx))

    assert names(ok) == ["Land", "Jahr", "Wert", "Quelle"]
    assert "preamble" in kinds(ok) and ok.rows == 2
    assert "preamble" not in kinds(ambiguous)


def test_a_sparse_first_row_of_data_is_not_taken_for_notes(ctx: ToolContext, files: Path) -> None:
    # The first row has values in its first two fields only, and a blank line follows it, as
    # a padded note would; but 36 sits over a column of numbers: it is a row of data.
    (files / "people.csv").write_text("Ada,36,,\n\nGrace,45,1,2\nLinus,28,3,4\n", "utf-8")
    # Without a blank line below it, a sparse first row is not looked at as notes at all.
    (files / "iris.csv").write_text("5.1,3.5,,\n4.9,3.0,1.4,0.2\n4.7,3.2,1.3,0.2\n", "utf-8")

    people = ok_of(load_dataset({"path": "people.csv", "header": False}, ctx))
    iris = ok_of(load_dataset({"path": "iris.csv", "header": False}, ctx))

    assert "preamble" not in kinds(people) and "preamble" not in kinds(iris)
    assert people.rows == 3 and iris.rows == 3
    assert ctx.load_dataset("people")["column_1"].tolist() == ["Ada", "Grace", "Linus"]
    assert ctx.load_dataset("iris")["column_1"].tolist() == [5.1, 4.9, 4.7]


def test_a_sparse_header_without_a_blank_line_below_is_still_the_header(
    ctx: ToolContext, files: Path
) -> None:
    (files / "sparse.csv").write_text("id,name,,\n1,Ada,x,y\n2,Bob,z,w\n", "utf-8")

    ok = ok_of(load_dataset({"path": "sparse.csv"}, ctx))

    assert names(ok) == ["id", "name", "column_3", "column_4"]
    assert ok.rows == 2 and "preamble" not in kinds(ok)


# --------------------------------------------------------------------------------------------
# lists of integers with nulls


def lists_table() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "counts": pa.array([[1, None, 3], None, [4], []], pa.list_(pa.int64())),
            "nested": pa.array([[[1, None]], [[2]], None, [[]]], pa.list_(pa.list_(pa.int32()))),
            "whole": pa.array([[1, 2], [3], None, []], pa.list_(pa.int64())),
        }
    )


def test_lists_of_integers_with_nulls_stay_integers_in_every_tool(
    ctx: ToolContext, files: Path
) -> None:
    pq.write_table(lists_table(), files / "lists.parquet")

    ok = ok_of(load_dataset({"path": "lists.parquet"}, ctx))

    # Before: [1.0, nan, 3.0], stored as list<double> and queried as DOUBLE[].
    stored = ctx.load_dataset("lists")
    assert stored["counts"].tolist() == [[1, None, 3], None, [4], []]
    assert stored["nested"].tolist()[0] == [[1, None]]
    assert list(stored["whole"].tolist()[0]) == [1, 2]
    assert ok.data["counts"].tolist()[0] == [1, None, 3]
    shown = ok_of(preview_data({"name": "lists"}, ctx))
    assert shown.data["counts"].tolist()[0] == [1, None, 3]
    content = preview_data({"name": "lists"}, ctx).content
    assert "[1,null,3]" in content and "nan" not in content.lower()
    described = ok_of(describe_entry({"name": "lists"}, ctx)).data.set_index("column")
    assert described.loc["counts", "null_count"] == 1
    found = ok_of(
        query(
            {
                "sql": "SELECT typeof(counts) AS t, typeof(nested) AS tn, list_sum(counts) AS s, "
                "counts[2] IS NULL AS hole, counts FROM lists ORDER BY id"
            },
            ctx,
        )
    )
    assert found.data["t"].tolist()[0] == "BIGINT[]"
    assert found.data["tn"].tolist()[0] == "BIGINT[][]"
    assert found.data["s"].tolist()[0] == 4
    assert found.data["hole"].tolist()[0]
    assert found.data["counts"].tolist()[0] == [1, None, 3]


def test_a_saved_query_result_keeps_its_integer_lists(ctx: ToolContext, files: Path) -> None:
    pq.write_table(lists_table(), files / "lists.parquet")
    load_dataset({"path": "lists.parquet"}, ctx)

    ok_of(
        query({"sql": "SELECT id, list_append(counts, NULL) AS c FROM lists", "save_as": "x"}, ctx)
    )

    assert ctx.load_dataset("x")["c"].tolist()[0] == [1, None, 3, None]
    found = ok_of(query({"sql": "SELECT typeof(c) AS t FROM x LIMIT 1"}, ctx))
    assert found.data["t"].tolist() == ["BIGINT[]"]


def test_arrow_ipc_sent_to_clients_keeps_lists_of_integers(ctx: ToolContext, files: Path) -> None:
    pq.write_table(lists_table(), files / "lists.parquet")
    load_dataset({"path": "lists.parquet"}, ctx)
    shown = ok_of(preview_data({"name": "lists"}, ctx))

    message = envelope_to_pb(shown)
    table = ipc_to_table(message.ok.table.arrow_ipc)

    assert table.schema.field("counts").type == pa.list_(pa.int64())
    assert pa.types.is_integer(table.schema.field("nested").type.value_type.value_type)
    assert table.column("counts").to_pylist()[0] == [1, None, 3]
    # A client decoding with pandas gets integers back too, and a plain to_pandas() works.
    decoded = envelope_from_pb(message)
    assert decoded.data["counts"].tolist()[0] == [1, None, 3]  # type: ignore[union-attr]
    assert table.to_pandas()["counts"].tolist()[1] is None


def test_arrow_ipc_round_trips_integer_lists_with_nulls() -> None:
    table = pa.table(
        {
            "a": pa.array([[1, None], None], pa.list_(pa.int64())),
            "big": pa.array([[2**62 + 1, None]], pa.large_list(pa.int64())).take([0, 0]),
            "f": pa.array([[1.5, None], []], pa.list_(pa.float64())),
            # Past int64, Python ints could not be stored again: pandas' floats, as before.
            "u": pa.array([[2**64 - 1, None], None], pa.list_(pa.uint64())),
            "holes": pa.array([[None], []], pa.list_(pa.int64())),
        }
    )

    df = ipc_to_dataframe(table_to_ipc(table))

    # Before: [1.0, nan] and 4611686018427387904.0 (rounded).
    assert df["a"].tolist() == [[1, None], None]
    assert df["big"].tolist()[0] == [2**62 + 1, None]
    again = ipc_to_table(dataframe_to_ipc(df))
    assert again.schema.field("a").type == pa.list_(pa.int64())
    assert again.column("big").to_pylist()[0] == [2**62 + 1, None]
    # Lists of floats are pandas' as before: arrays of floats.
    assert pd.isna(df["f"].tolist()[0][1])
    assert pa.types.is_floating(again.schema.field("u").type.value_type)
    assert pa.types.is_list(again.schema.field("holes").type)
