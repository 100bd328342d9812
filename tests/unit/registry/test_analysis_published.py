"""The analysis tools against the shapes of published datasets: World Bank and BLS exports with
notes above the header, Parquet as Spark or Arrow write it (nullable integers, MAP columns, zoned
timestamps), files named for one format holding another, and formats load_dataset does not read.
Every value comes back as the file has it, or the load is refused with a Hint saying why."""

from __future__ import annotations

import datetime
import decimal
import gzip
import io
import zipfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from services.registry.context import ToolContext
from services.registry.tools.analysis import describe_entry, load_dataset, preview_data, query
from shared.contract import HintException

from .analysis_support import kinds, ok_of


def hint(inputs: dict[str, object], ctx: ToolContext) -> HintException:
    with pytest.raises(HintException) as excinfo:
        load_dataset(inputs, ctx)
    return excinfo.value


def write_parquet(path: Path, table: pa.Table) -> None:
    pq.write_table(table, path)  # no pandas metadata: as Spark, DuckDB or Arrow write it


# --------------------------------------------------------------------------------------------
# notes above the header

# The start of a World Bank WDI download: a BOM, notes, blank lines, a trailing comma on every
# line (as an empty last column), CRLF line ends.
WORLD_BANK = (
    '\ufeff"Data Source","World Development Indicators",\r\n\r\n'
    '"Last Updated Date","2024-06-28",\r\n\r\n'
    '"Country Name","Country Code","Indicator Name","Indicator Code","1960","2023",\r\n'
    '"Aruba","ABW","Population, total","SP.POP.TOTL","54608","106445",\r\n'
    '"Africa Eastern and Southern","AFE","Population, total","SP.POP.TOTL","130692579","",\r\n'
)
# A BLS series download: tab-separated notes, a blank line, then the table.
BLS = (
    "Series Id:\tCUUR0000SA0\nSeries Title:\tAll items in U.S. city average\n\n"
    "Year\tJan\tFeb\n2023\t299.170\t300.840\n2024\t308.417\t310.326\n"
)


def test_notes_above_a_world_bank_table_are_skipped_and_quoted(
    ctx: ToolContext, files: Path
) -> None:
    (files / "API_SP.POP.TOTL_DS2_en_csv_v2.csv").write_bytes(WORLD_BANK.encode("utf-8"))

    ok = ok_of(load_dataset({"path": "API_SP.POP.TOTL_DS2_en_csv_v2.csv", "name": "wdi"}, ctx))

    # Before: a schema Hint ("Expected 3 fields in line 5, saw 7").
    assert [c.name for c in ok.schema] == [
        "Country Name",
        "Country Code",
        "Indicator Name",
        "Indicator Code",
        "1960",
        "2023",
    ]
    preamble = next(w for w in ok.warnings if w.kind == "preamble")
    assert "World Development Indicators" in preamble.message and "2024-06-28" in preamble.message
    assert preamble.details["lines"] == 4
    assert "trailing_delimiter" in kinds(ok)
    stored = ctx.load_dataset("wdi")
    assert stored["Indicator Name"].tolist() == ["Population, total"] * 2
    assert stored["1960"].tolist() == [54608, 130692579]
    assert stored["2023"].tolist()[0] == 106445 and pd.isna(stored["2023"].tolist()[1])
    found = ok_of(query({"sql": 'SELECT "Country Code" FROM wdi WHERE "1960" > 100000'}, ctx))
    assert found.data["Country Code"].tolist() == ["AFE"]


def test_notes_above_a_tab_separated_table_are_skipped(ctx: ToolContext, files: Path) -> None:
    (files / "cpi.txt").write_text(BLS, "utf-8")

    ok = ok_of(load_dataset({"path": "cpi.txt"}, ctx))

    assert kinds(ok) == ["delimiter", "preamble"]
    assert ctx.load_dataset("cpi").to_dict("list") == {
        "Year": [2023, 2024],
        "Jan": [299.170, 308.417],
        "Feb": [300.840, 310.326],
    }


def test_a_short_header_over_a_blank_line_is_not_taken_for_notes(
    ctx: ToolContext, files: Path
) -> None:
    # The line after the blank one reads as data, not as a header: the rows are too long for
    # the header, as before, not a table whose header was skipped as a note.
    (files / "longer.csv").write_text("a,b\n\n1,2,3\n4,5,6\n", "utf-8")

    assert hint({"path": "longer.csv"}, ctx).hint_kind == "schema"
    assert ctx.list_datasets() == []


# --------------------------------------------------------------------------------------------
# Parquet as Spark, DuckDB or Arrow write it


def taxi_table() -> pa.Table:
    when = datetime.datetime(2023, 1, 1, 5, 32, 10, 123456, tzinfo=datetime.UTC)
    return pa.table(
        {
            "VendorID": pa.array([1, 2, None], pa.int8()),
            "trip_id": pa.array([9007199254740993, None, 3], pa.int64()),
            "big": pa.array([2**64 - 1, None, 0], pa.uint64()),
            "store_and_fwd_flag": pa.array(["N", None, "Y"]).dictionary_encode(),
            "pickup": pa.array([when, None, when], pa.timestamp("us", tz="America/New_York")),
            "fare": pa.array(
                [decimal.Decimal("12.30"), None, decimal.Decimal("-0.01")], pa.decimal128(10, 2)
            ),
            "tags": pa.array([["a", "b"], [], None], pa.list_(pa.string())),
            "loc": pa.array(
                [{"lat": 1.5, "lon": 2.5}, None, {"lat": None, "lon": 3.0}],
                pa.struct([("lat", pa.float64()), ("lon", pa.float64())]),
            ),
            "attrs": pa.array([[("k", 1)], [], None], pa.map_(pa.string(), pa.int64())),
            "select": pa.array([1, 2, 3], pa.int32()),
        }
    )


def test_integers_with_nulls_in_parquet_stay_exact_integers(ctx: ToolContext, files: Path) -> None:
    write_parquet(files / "trips.parquet", taxi_table())

    ok = ok_of(load_dataset({"path": "trips.parquet"}, ctx))

    # Before: float64, 1.0 for a vendor, and 9007199254740992 for trip 9007199254740993.
    stored = ctx.load_dataset("trips")
    assert str(stored["VendorID"].dtype) == "Int8"
    assert stored["trip_id"].tolist()[0] == 9007199254740993
    assert stored["big"].tolist()[0] == 2**64 - 1
    dtypes = {c.name: c.dtype for c in ok.schema}
    assert dtypes["VendorID"] == "Int8" and dtypes["big"] == "UInt64"
    described = ok_of(describe_entry({"name": "trips"}, ctx)).data.set_index("column")
    assert described.loc["trip_id", "max"] == "9007199254740993"
    assert described.loc["big", "max"] == str(2**64 - 1)
    shown = ok_of(preview_data({"name": "trips"}, ctx)).data
    assert shown["VendorID"].tolist()[:2] == [1, 2]
    found = ok_of(query({"sql": "SELECT trip_id, big, VendorID FROM trips"}, ctx))
    assert found.data["trip_id"].tolist()[0] == 9007199254740993
    assert found.data["big"].tolist()[0] == 2**64 - 1
    assert found.data["VendorID"].tolist()[:2] == [1, 2]


def test_a_query_gives_integer_columns_with_nulls_back_as_integers(
    ctx: ToolContext, files: Path
) -> None:
    (files / "ids.csv").write_text("id,n\n9007199254740993,1\n,2\n", "utf-8")
    load_dataset({"path": "ids.csv"}, ctx)

    found = ok_of(query({"sql": "SELECT id, n FROM ids ORDER BY n"}, ctx))

    # Before: float64, 9007199254740992.0 (the load kept it exact, the query did not).
    assert found.data["id"].tolist()[0] == 9007199254740993
    assert pd.isna(found.data["id"].tolist()[1])
    summed = ok_of(query({"sql": "SELECT sum(n) FILTER (WHERE id IS NULL) AS s FROM ids"}, ctx))
    assert summed.data["s"].tolist() == [2]


def test_a_parquet_map_is_kept_as_its_entries(ctx: ToolContext, files: Path) -> None:
    write_parquet(files / "trips.parquet", taxi_table())

    ok = ok_of(load_dataset({"path": "trips.parquet"}, ctx))

    # Before: the text "[('k', 1)]", a Python repr no SQL could read.
    assert "map_entries" in kinds(ok)
    found = ok_of(
        query({"sql": "SELECT map_from_entries(attrs)['k'] AS k FROM trips LIMIT 1"}, ctx)
    )
    assert found.data["k"].tolist() == [1]


def test_every_tool_reads_a_taxi_like_parquet_file(ctx: ToolContext, files: Path) -> None:
    write_parquet(files / "yellow_tripdata_2023-01.parquet", taxi_table())
    load_dataset({"path": "yellow_tripdata_2023-01.parquet", "name": "taxi"}, ctx)

    assert ok_of(preview_data({"name": "taxi"}, ctx)).rows == 3
    described = ok_of(describe_entry({"name": "taxi"}, ctx)).data.set_index("column")
    assert described.loc["VendorID", "dtype"] == "Int8"  # before: float64
    assert described.loc["fare", "min"] == "-0.01" and described.loc["fare", "max"] == "12.30"
    found = ok_of(
        query(
            {
                "sql": 'SELECT "select", store_and_fwd_flag AS flag, fare, tags[1] AS tag, '
                "loc.lon AS lon FROM taxi ORDER BY 1"
            },
            ctx,
        )
    )
    assert found.data["flag"].tolist()[0] == "N" and pd.isna(found.data["flag"].tolist()[1])
    assert found.data["fare"].tolist()[0] == 12.30
    assert found.data["tag"].tolist()[0] == "a" and found.data["lon"].tolist()[2] == 3.0


def test_zoned_times_are_computed_in_their_own_zone(ctx: ToolContext, files: Path) -> None:
    write_parquet(files / "trips.parquet", taxi_table())
    load_dataset({"path": "trips.parquet"}, ctx)

    found = ok_of(query({"sql": "SELECT hour(pickup) AS h, pickup FROM trips LIMIT 1"}, ctx))

    # 05:32 UTC is 00:32 in New York; before, DuckDB used the server's zone (here UTC): 5.
    assert found.data["h"].tolist() == [0]
    assert str(found.data["pickup"].dt.tz) == "America/New_York"
    assert found.data["pickup"].tolist()[0] == pd.Timestamp("2023-01-01 05:32:10.123456Z")


def test_zoned_times_in_several_zones_are_computed_in_utc_with_a_warning(
    ctx: ToolContext, files: Path
) -> None:
    when = datetime.datetime(2023, 1, 1, 5, 0, tzinfo=datetime.UTC)
    for name, zone in (("ny", "America/New_York"), ("paris", "Europe/Paris")):
        write_parquet(
            files / f"{name}.parquet", pa.table({"t": pa.array([when], pa.timestamp("s", zone))})
        )
        load_dataset({"path": f"{name}.parquet"}, ctx)

    found = ok_of(query({"sql": "SELECT hour(ny.t) AS a, hour(paris.t) AS b FROM ny, paris"}, ctx))

    assert found.data.iloc[0].tolist() == [5, 5]
    assert "time_zone" in kinds(found)
    alone = ok_of(query({"sql": "SELECT hour(t) AS h FROM paris"}, ctx))
    assert alone.data["h"].tolist() == [6] and "time_zone" not in kinds(alone)


# --------------------------------------------------------------------------------------------
# repeated column names


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_repeated_column_names_are_renamed_once_with_one_warning(
    ctx: ToolContext, files: Path, suffix: str
) -> None:
    if suffix == "csv":
        (files / "dups.csv").write_text("a,a,A,b\n1,2,3,4\n", "utf-8")
    else:
        columns = [pa.array([n]) for n in (1, 2, 3, 4)]
        write_parquet(files / "dups.parquet", pa.Table.from_arrays(columns, ["a", "a", "A", "b"]))

    ok = ok_of(load_dataset({"path": f"dups.{suffix}"}, ctx))

    # Before: two duplicate_columns warnings (one by the reader, one by the SQL renaming).
    assert kinds(ok) == ["duplicate_columns"]
    assert ok.warnings[0].details["renamed"] == ["a_2", "A_3"]
    assert ctx.load_dataset("dups").iloc[0].tolist() == [1, 2, 3, 4]
    read = ok_of(query({"sql": "SELECT a_2, A_3 FROM dups"}, ctx))
    assert read.data.iloc[0].tolist() == [2, 3]


def test_a_header_that_looks_renamed_is_kept_as_written(ctx: ToolContext, files: Path) -> None:
    (files / "dotted.csv").write_text("x,x.1,y\n1,2,3\n", "utf-8")
    (files / "later.csv").write_text("x.1,x,x\n1,2,3\n", "utf-8")

    dotted = ok_of(load_dataset({"path": "dotted.csv"}, ctx))
    later = ok_of(load_dataset({"path": "later.csv"}, ctx))

    # Before: "duplicate column names were renamed: x.1" for a file with no repeated name.
    assert kinds(dotted) == []
    assert [c.name for c in dotted.schema] == ["x", "x.1", "y"]
    assert [c.name for c in later.schema] == ["x.1", "x", "x_2"]
    assert later.warnings[0].details["renamed"] == ["x_2"]


# --------------------------------------------------------------------------------------------
# files that are not what their name says, and formats load_dataset does not read


OLE2 = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(range(256)) * 4


@pytest.mark.parametrize(
    ("name", "data", "fmt", "what"),
    [
        ("old.csv", OLE2, None, "Excel"),  # an .xls is read (test_analysis_excel.py)
        ("records.json", '[{"a": 1}, {"a": 2}]', "csv", "JSON"),  # before: `[{"a": 1}` columns
        ("events.jsonl", '{"a": 1, "b": "x"}\n{"a": 2, "b": "y"}\n', "csv", "JSON Lines"),
        ("events.csv", '{"a": 1, "b": "x"}\n{"a": 2, "b": "y"}\n', None, "JSON Lines"),
    ],
)
def test_a_format_load_dataset_does_not_read_is_a_hint_naming_those_it_does(
    ctx: ToolContext, files: Path, name: str, data: bytes | str, fmt: str | None, what: str
) -> None:
    path = files / name
    path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data, "utf-8")
    inputs: dict[str, object] = {"path": name, **({"format": fmt} if fmt else {})}

    refused = hint(inputs, ctx)

    assert refused.hint_kind == "schema"
    assert what in refused.message
    assert "CSV" in refused.message and "Parquet" in refused.message
    assert ctx.list_datasets() == []


def test_a_parquet_file_named_csv_is_read_as_parquet(ctx: ToolContext, files: Path) -> None:
    write_parquet(files / "export.csv", pa.table({"id": [1, 2], "v": ["a", "b"]}))

    ok = ok_of(load_dataset({"path": "export.csv"}, ctx))

    # Before: a one-column table named after the file's binary footer.
    assert kinds(ok) == ["format"]
    assert ctx.load_dataset("export").to_dict("list") == {"id": [1, 2], "v": ["a", "b"]}


def test_compressed_files_are_read_whatever_they_are_named(ctx: ToolContext, files: Path) -> None:
    (files / "download.csv").write_bytes(gzip.compress(b"a,b\n1,x\n2,y\n"))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("2020_data.csv", "a,b\n3,z\n")
    (files / "bundle.zip").write_bytes(buffer.getvalue())

    gz = ok_of(load_dataset({"path": "download.csv"}, ctx))
    zipped = ok_of(load_dataset({"path": "bundle.zip"}, ctx))

    # Before: a mojibake table (gzip bytes read as Windows-1252), and "cannot tell the format".
    assert kinds(gz) == []
    assert ctx.load_dataset("download").to_dict("list") == {"a": [1, 2], "b": ["x", "y"]}
    assert zipped.rows == 1
    assert ctx.load_dataset("bundle").to_dict("list") == {"a": [3], "b": ["z"]}
