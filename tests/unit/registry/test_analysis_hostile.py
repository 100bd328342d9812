"""The analysis tools against hostile and unusual data: every file, path and query answers a
clear Ok, Hint or Err — never a raw library exception, a hang, unbounded memory, or data from
outside the data roots."""

from __future__ import annotations

import bz2
import concurrent.futures
import decimal
import gzip
import lzma
import os
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from services.registry.context import ToolContext
from services.registry.datasets import SqlDatasetStore
from services.registry.tools import analysis
from services.registry.tools.analysis import (
    DatasetTooLarge,
    PathOutsideDataRoots,
    QueryResultTooLarge,
    load_dataset,
    query,
)
from shared.contract import HintException, Ok
from shared.convert import tool_result_to_pb

from .analysis_support import make_context, ok_of

DEADLINE_S = 30.0


def within_deadline(fn: Callable[[], Any]) -> Any:
    """Run `fn` in a thread and fail, instead of hanging the suite, if it does not return."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(fn).result(timeout=DEADLINE_S)
    except concurrent.futures.TimeoutError:
        pytest.fail(f"did not finish within {DEADLINE_S}s")
    finally:
        pool.shutdown(wait=False)


def hint(fn: Callable[..., Any], inputs: dict[str, Any], ctx: ToolContext) -> HintException:
    with pytest.raises(HintException) as excinfo:
        fn(inputs, ctx)
    return excinfo.value


# --------------------------------------------------------------------------------------------
# the result of load_dataset


def test_load_dataset_returns_a_preview_not_the_whole_table(ctx: ToolContext, files: Path) -> None:
    (files / "many.csv").write_text("n\n" + "".join(f"{i}\n" for i in range(5000)), "utf-8")

    result = load_dataset({"path": "many.csv"}, ctx)

    ok = ok_of(result)
    assert ok.rows == 5000
    assert len(ok.data) == analysis.PREVIEW_DEFAULT_LIMIT
    assert len(ctx.load_dataset("many")) == 5000  # stored whole
    assert len(tool_result_to_pb(result).SerializeToString()) < 10_000


# --------------------------------------------------------------------------------------------
# CSV contents


def test_a_row_with_more_fields_than_the_header_is_a_hint_not_a_shifted_table(
    ctx: ToolContext, files: Path
) -> None:
    # pandas would take the first field for an index: a=2, b=3, and the 1 gone.
    (files / "long_rows.csv").write_text("a,b\n1,2,3\n4,5,6\n", "utf-8")

    assert hint(load_dataset, {"path": "long_rows.csv"}, ctx).hint_kind == "schema"
    assert ctx.list_datasets() == []


def test_a_trailing_delimiter_on_every_row_is_dropped_with_a_warning(
    ctx: ToolContext, files: Path
) -> None:
    (files / "ends.csv").write_text("a,b\n1,2,\n3,4,\n", "utf-8")

    ok = ok_of(load_dataset({"path": "ends.csv"}, ctx))

    assert [w.kind for w in ok.warnings] == ["trailing_delimiter"]
    assert ctx.load_dataset("ends").to_dict("list") == {"a": [1, 3], "b": [2, 4]}


# The start of the UCI wine-quality data: semicolons, quoted header, decimal points.
WINE_CSV = (
    '"fixed acidity";"volatile acidity";"citric acid";"quality"\n'
    "7.4;0.7;0;5\n7.8;0.88;0;5\n11.2;0.28;0.56;6\n"
)


@pytest.mark.parametrize(
    ("text", "delimiter", "columns"),
    [
        (WINE_CSV, ";", ["fixed acidity", "volatile acidity", "citric acid", "quality"]),
        ("a\tb\tc\n1\t2\t3\n", "\t", ["a", "b", "c"]),
        ("a|b\n1|2\n3|4\n", "|", ["a", "b"]),
        ("a;b\n1;2;\n3;4;\n", ";", ["a", "b"]),  # a trailing separator on every row
    ],
)
def test_the_separator_is_read_off_the_file_and_named_in_a_warning(
    ctx: ToolContext, files: Path, text: str, delimiter: str, columns: list[str]
) -> None:
    (files / "data.txt").write_text(text, "utf-8")

    ok = ok_of(load_dataset({"path": "data.txt"}, ctx))

    assert [c.name for c in ok.schema] == columns
    assert ok.warnings[0].kind == "delimiter"
    assert ok.warnings[0].details == {"delimiter": delimiter}
    assert ok.rows == text.count("\n") - 1


@pytest.mark.parametrize(
    "text",
    [
        "id,note\n1,a;b;c\n2,d;e;f\n",  # semicolons inside values, none in the header
        'id,note\n1,"x|y|z"\n2,"u|v|w"\n',  # quoted values
        "x\n1\n2\n",  # one column
        "a,b;c\n1,2;3\n",  # as many fields either way: the comma wins
    ],
)
def test_a_comma_file_stays_comma_separated(ctx: ToolContext, files: Path, text: str) -> None:
    (files / "c.csv").write_text(text, "utf-8")

    ok = ok_of(load_dataset({"path": "c.csv"}, ctx))

    assert ok.warnings == []
    assert [c.name for c in ok.schema] == text.split("\n")[0].split(",")


def test_the_separator_is_sniffed_past_a_long_first_block_and_an_explicit_one_wins(
    ctx: ToolContext, files: Path
) -> None:
    # Longer than the sample: the sample's last, cut-off record does not count against ';'.
    rows = "".join(f"{i};{'word ' * 20};{i * 2}\n" for i in range(5000))
    (files / "long.csv").write_text("n;text;double\n" + rows, "utf-8")

    ok = ok_of(load_dataset({"path": "long.csv"}, ctx))
    assert (ok.rows, [c.name for c in ok.schema]) == (5000, ["n", "text", "double"])

    forced = ok_of(load_dataset({"path": "long.csv", "delimiter": ",", "name": "forced"}, ctx))
    assert [c.name for c in forced.schema] == ["n;text;double"]
    assert [w.kind for w in forced.warnings] == []


def test_decimal_commas_are_read_as_numbers_in_a_semicolon_file(
    ctx: ToolContext, files: Path
) -> None:
    (files / "eu.csv").write_text(
        "Artikel;Preis;Menge;Kennung\nTee;1,5;2;1,500\nKaffee;-12,25;;2,000\nBrot;3;4;\n",
        "utf-8",
    )

    ok = ok_of(load_dataset({"path": "eu.csv"}, ctx))

    assert [w.kind for w in ok.warnings] == ["delimiter", "decimal_comma"]
    assert ok.warnings[1].details == {"columns": ["Preis"]}
    stored = ctx.load_dataset("eu")
    assert stored["Preis"].tolist() == [1.5, -12.25, 3.0]
    # Three digits after every comma may be thousands: kept as written.
    assert stored["Kennung"].tolist()[:2] == ["1,500", "2,000"]
    total = ok_of(query({"sql": "SELECT sum(Preis) AS s FROM eu"}, ctx)).data
    assert total["s"].tolist() == [pytest.approx(-7.75)]


# The start of UCI's iris.data and adult.data: no header row; adult puts a space after
# every comma.
IRIS_DATA = (
    "5.1,3.5,1.4,0.2,Iris-setosa\n4.9,3.0,1.4,0.2,Iris-setosa\n7.0,3.2,4.7,1.4,Iris-versicolor\n\n"
)
ADULT_DATA = (
    "39, State-gov, 77516, Bachelors, <=50K\n"
    "50, Self-emp-not-inc, 83311, Bachelors, <=50K\n"
    "38, Private, 215646, HS-grad, <=50K\n"
    "53, Private, 234721, 11th, >50K\n"
)


def test_a_file_without_a_header_row_gets_numbered_columns_and_keeps_its_first_row(
    ctx: ToolContext, files: Path
) -> None:
    (files / "iris.data.txt").write_text(IRIS_DATA, "utf-8")

    ok = ok_of(load_dataset({"path": "iris.data.txt", "name": "iris"}, ctx))

    assert [w.kind for w in ok.warnings] == ["no_header"]
    assert [c.name for c in ok.schema] == [f"column_{i}" for i in range(1, 6)]
    assert ok.rows == 3
    stored = ctx.load_dataset("iris")
    assert stored["column_1"].tolist() == [5.1, 4.9, 7.0]
    rows = ok_of(
        query({"sql": "SELECT count(*) AS n FROM iris WHERE column_5 = 'Iris-setosa'"}, ctx)
    )
    assert rows.data["n"].tolist() == [2]


def test_spaces_after_every_separator_are_not_kept_in_the_values(
    ctx: ToolContext, files: Path
) -> None:
    (files / "adult.csv").write_text(ADULT_DATA, "utf-8")

    ok = ok_of(load_dataset({"path": "adult.csv"}, ctx))

    assert [w.kind for w in ok.warnings] == ["no_header", "initial_space"]
    stored = ctx.load_dataset("adult")
    assert stored["column_2"].tolist() == ["State-gov", "Self-emp-not-inc", "Private", "Private"]
    assert stored["column_3"].tolist() == [77516, 83311, 215646, 234721]


@pytest.mark.parametrize(
    "text",
    [
        "id,name,city\n1,Ada,London\n2,Grace,Arlington\n",  # a name over numbers
        "name,city\nAda,London\nGrace,Arlington\n",  # names that are not values below
        "country,2019,2020\nFrance,1,2\nItaly,3,4\n",  # years among the names
        ",a,b\n0,1,2\n1,3,4\n",  # pandas' unnamed index column
    ],
)
def test_a_header_row_is_kept_as_the_column_names(ctx: ToolContext, files: Path, text: str) -> None:
    (files / "h.csv").write_text(text, "utf-8")

    ok = ok_of(load_dataset({"path": "h.csv"}, ctx))

    assert "no_header" not in [w.kind for w in ok.warnings]
    assert ok.rows == 2


def test_an_explicit_header_flag_overrides_the_guess(ctx: ToolContext, files: Path) -> None:
    (files / "years.csv").write_text("2019,2020\n1,2\n3,4\n", "utf-8")
    (files / "named.csv").write_text("a,b\n1,2\n", "utf-8")

    guessed = ok_of(load_dataset({"path": "years.csv"}, ctx))
    assert (guessed.rows, [w.kind for w in guessed.warnings]) == (3, ["no_header"])
    forced = ok_of(load_dataset({"path": "years.csv", "header": True, "name": "y2"}, ctx))
    assert (forced.rows, [c.name for c in forced.schema]) == (2, ["2019", "2020"])
    headless = ok_of(load_dataset({"path": "named.csv", "header": False}, ctx))
    assert ctx.load_dataset("named").to_dict("list") == {
        "column_1": ["a", "1"],
        "column_2": ["b", "2"],
    }
    assert headless.warnings == []
    assert hint(load_dataset, {"path": "named.csv", "header": "yes"}, ctx).hint_kind == "schema"


def test_question_marks_and_dashes_among_numbers_are_missing_values(
    ctx: ToolContext, files: Path
) -> None:
    # As in UCI's breast-cancer-wisconsin data ("?" for a missing bare-nuclei count).
    (files / "bc.csv").write_text(
        "id,bare_nuclei,clump,label\n1000025,1,5,?\n1002945,?,5,benign\n1015425,2,-,?\n",
        "utf-8",
    )

    ok = ok_of(load_dataset({"path": "bc.csv"}, ctx))

    assert [w.kind for w in ok.warnings] == ["missing_markers"]
    assert ok.warnings[0].details["columns"] == ["bare_nuclei", "clump"]
    stored = ctx.load_dataset("bc")
    assert stored["bare_nuclei"].isna().tolist() == [False, True, False]
    assert stored["label"].tolist() == ["?", "benign", "?"]  # text keeps its question marks
    total = ok_of(query({"sql": "SELECT sum(bare_nuclei) AS s, count(clump) AS c FROM bc"}, ctx))
    assert total.data.to_dict("list") == {"s": [3.0], "c": [2]}


def test_comment_lines_before_the_header_are_skipped_and_a_hash_header_is_kept(
    ctx: ToolContext, files: Path
) -> None:
    (files / "notes.csv").write_text("# exported 2024-05-01\n#\n\n# by hand\na,b\n1,2\n3,4\n")
    (files / "calls.tsv").write_text(
        "##fileformat=VCFv4.2\n##source=x\n#CHROM\tPOS\tID\n1\t100\trs1\n2\t200\trs2\n"
    )
    (files / "hash.csv").write_text("#id,name\n1,a\n2,b\n")

    notes = ok_of(load_dataset({"path": "notes.csv"}, ctx))
    assert [w.kind for w in notes.warnings] == ["preamble"]
    assert notes.warnings[0].details == {"lines": 4}
    assert ctx.load_dataset("notes").to_dict("list") == {"a": [1, 3], "b": [2, 4]}
    calls = ok_of(load_dataset({"path": "calls.tsv"}, ctx))
    assert ([c.name for c in calls.schema], calls.rows) == (["#CHROM", "POS", "ID"], 2)
    assert calls.warnings[0].details == {"lines": 2}
    hashed = ok_of(load_dataset({"path": "hash.csv"}, ctx))
    assert ([c.name for c in hashed.schema], hashed.warnings) == (["#id", "name"], [])


def test_an_html_page_saved_as_csv_is_a_schema_hint(ctx: ToolContext, files: Path) -> None:
    (files / "data.csv").write_text(
        "\n<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head></html>\n"
    )

    found = hint(load_dataset, {"path": "data.csv"}, ctx)

    assert (found.hint_kind, "HTML" in str(found)) == ("schema", True)
    assert ctx.list_datasets() == []


def test_spaces_around_column_names_are_trimmed_unless_names_would_clash(
    ctx: ToolContext, files: Path
) -> None:
    (files / "padded.csv").write_text(" id , total \n1,2\n")
    (files / "clash.csv").write_text("a, a\n1,2\n")

    padded = ok_of(load_dataset({"path": "padded.csv"}, ctx))
    assert [c.name for c in padded.schema] == ["id", "total"]
    assert padded.warnings[0].details == {"renamed": [" id ", " total "]}
    clash = ok_of(load_dataset({"path": "clash.csv"}, ctx))
    assert [c.name for c in clash.schema] == ["a", " a"]


def test_quoted_numbers_with_thousands_separators_are_numbers(
    ctx: ToolContext, files: Path
) -> None:
    (files / "sales.csv").write_text(
        'region,amount,code\nnorth,"1,234.50","1,2"\nsouth,"12,000",7\neast,99.5,8\n'
    )

    ok = ok_of(load_dataset({"path": "sales.csv"}, ctx))

    assert [w.kind for w in ok.warnings] == ["thousands_separators"]
    stored = ctx.load_dataset("sales")
    assert stored["amount"].tolist() == [1234.5, 12000.0, 99.5]
    assert stored["code"].tolist() == ["1,2", "7", "8"]  # not grouped by thousands: text


def test_integers_beyond_64_bits_are_kept_exactly_as_text(ctx: ToolContext, files: Path) -> None:
    (files / "huge.csv").write_text("id,n\n123456789012345678901234567890,1\n,2\n", "utf-8")

    ok = ok_of(load_dataset({"path": "huge.csv"}, ctx))

    assert [w.kind for w in ok.warnings] == ["big_integers"]
    stored = ctx.load_dataset("huge")
    assert stored["id"].iloc[0] == "123456789012345678901234567890"
    assert stored["id"].isna().iloc[1]
    rows = ok_of(query({"sql": "SELECT n FROM huge WHERE id LIKE '1234%'"}, ctx)).data
    assert rows["n"].tolist() == [1]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_files_are_decoded(ctx: ToolContext, files: Path, encoding: str) -> None:
    (files / "wide_chars.csv").write_bytes("id,name\n1,Zoë\n2,東京\n".encode(encoding))

    ok = ok_of(load_dataset({"path": "wide_chars.csv"}, ctx))

    assert [c.name for c in ok.schema] == ["id", "name"]
    assert ctx.load_dataset("wide_chars")["name"].tolist() == ["Zoë", "東京"]
    assert ok.warnings == []


def test_a_windows_1252_file_keeps_its_euro_sign_and_quotes(ctx: ToolContext, files: Path) -> None:
    (files / "prices.csv").write_bytes("item\nCafé € “best”\n".encode("cp1252"))

    ok = ok_of(load_dataset({"path": "prices.csv"}, ctx))

    assert [w.kind for w in ok.warnings] == ["encoding"]
    assert "Windows-1252" in ok.warnings[0].message
    assert ctx.load_dataset("prices")["item"].tolist() == ["Café € “best”"]


def test_a_file_without_line_breaks_is_not_taken_for_a_header(
    ctx: ToolContext, files: Path
) -> None:
    (files / "blob.csv").write_text("x" * 100_000, "utf-8")

    found = hint(load_dataset, {"path": "blob.csv"}, ctx)

    assert found.hint_kind == "schema"
    assert len(found.message) < 1000


def test_nul_bytes_embedded_newlines_and_quotes_survive(ctx: ToolContext, files: Path) -> None:
    (files / "odd.csv").write_bytes(b'a,"b c"\n"x\ny","he said ""hi"""\nq\x00r,2\n')

    ok_of(load_dataset({"path": "odd.csv"}, ctx))

    stored = ctx.load_dataset("odd")
    assert stored["a"].tolist() == ["x\ny", "q\x00r"]
    assert stored["b c"].tolist() == ['he said "hi"', "2"]


# --------------------------------------------------------------------------------------------
# compressed files


def test_every_advertised_compression_loads(ctx: ToolContext, files: Path) -> None:
    data = b"a,b\n1,x\n"
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as zst:
        zst.write(data)
    (files / "g.csv.gz").write_bytes(gzip.compress(data))
    (files / "b.csv.bz2").write_bytes(bz2.compress(data))
    (files / "x.csv.xz").write_bytes(lzma.compress(data))
    (files / "z.csv.zst").write_bytes(sink.getvalue().to_pybytes())
    with zipfile.ZipFile(files / "p.csv.zip", "w") as archive:
        archive.writestr("inner.csv", data)

    for name in ("g.csv.gz", "b.csv.bz2", "x.csv.xz", "z.csv.zst", "p.csv.zip"):
        assert ok_of(load_dataset({"path": name}, ctx)).rows == 1, name


@pytest.mark.parametrize("name", ["bad.csv.gz", "bad.csv.bz2", "bad.csv.xz", "bad.csv.zst"])
def test_a_corrupt_compressed_file_is_a_schema_hint(
    ctx: ToolContext, files: Path, name: str
) -> None:
    (files / name).write_bytes(b"\x28\xb5\x2f\xfd this is not compressed data")

    assert hint(load_dataset, {"path": name}, ctx).hint_kind == "schema"


def test_a_zip_of_several_files_is_a_schema_hint(ctx: ToolContext, files: Path) -> None:
    with zipfile.ZipFile(files / "two.csv.zip", "w") as archive:
        archive.writestr("a.csv", "a\n1\n")
        archive.writestr("b.csv", "b\n2\n")

    assert "2 files" in hint(load_dataset, {"path": "two.csv.zip"}, ctx).message


def test_a_decompression_bomb_stops_at_the_size_limit(
    tmp_path: Path, files: Path, store: SqlDatasetStore
) -> None:
    ctx = make_context(tmp_path, store, max_dataset_bytes=1 << 20)
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip
    body = b"".join(packer.compress(b"1,2\n" * 65536) for _ in range(64))  # 16 MiB
    (files / "bomb.csv.gz").write_bytes(packer.compress(b"a,b\n") + body + packer.flush())
    assert (files / "bomb.csv.gz").stat().st_size < 100_000

    with pytest.raises(DatasetTooLarge) as excinfo:
        within_deadline(lambda: load_dataset({"path": "bomb.csv.gz"}, ctx))

    assert "TOOLMESH_MAX_DATASET_BYTES" in str(excinfo.value)
    assert ctx.list_datasets() == []


def test_a_file_over_the_size_limit_is_refused_before_it_is_parsed(
    tmp_path: Path, files: Path, store: SqlDatasetStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_context(tmp_path, store, max_dataset_bytes=1000)
    (files / "big.csv").write_text("a\n" + "1\n" * 1000, "utf-8")
    monkeypatch.setattr(analysis, "_read_csv", None)  # calling it would fail

    with pytest.raises(DatasetTooLarge):
        load_dataset({"path": "big.csv"}, ctx)


# --------------------------------------------------------------------------------------------
# Parquet


def test_a_parquet_file_with_a_corrupt_page_is_a_schema_hint(ctx: ToolContext, files: Path) -> None:
    pq.write_table(pa.table({"a": list(range(1000))}), files / "good.parquet")
    data = (files / "good.parquet").read_bytes()
    (files / "bad.parquet").write_bytes(data[:4] + b"\xff" * 200 + data[204:])

    assert hint(load_dataset, {"path": "bad.parquet"}, ctx).hint_kind == "schema"


def test_a_parquet_file_over_the_limit_uncompressed_is_refused_from_its_footer(
    tmp_path: Path, files: Path, store: SqlDatasetStore
) -> None:
    ctx = make_context(tmp_path, store, max_dataset_bytes=100_000)
    pq.write_table(pa.table({"zeros": [0] * 1_000_000}), files / "zeros.parquet")
    assert (files / "zeros.parquet").stat().st_size < 100_000  # small on disk

    with pytest.raises(DatasetTooLarge):
        load_dataset({"path": "zeros.parquet"}, ctx)


def test_unusual_parquet_types_load_and_query(ctx: ToolContext, files: Path) -> None:
    table = pa.table(
        {
            "s": pa.array([{"x": 1, "y": "a"}, None]),
            "l": pa.array([[1, 2], []]),
            "m": pa.array([[("k", 1)], None], type=pa.map_(pa.string(), pa.int64())),
            "d": pa.array(["a", "b"]).dictionary_encode(),
            "t": pa.array([0, 10**12], type=pa.timestamp("us", tz="Europe/Paris")),
            "dec": pa.array([decimal.Decimal("1.23"), None], type=pa.decimal128(22, 2)),
        }
    )
    pq.write_table(table, files / "odd.parquet")

    assert ok_of(load_dataset({"path": "odd.parquet"}, ctx)).rows == 2
    assert ok_of(query({"sql": "SELECT * FROM odd", "save_as": "odd_copy"}, ctx)).rows == 2
    assert ok_of(query({"sql": "SELECT count(*) AS n FROM odd_copy"}, ctx)).data["n"][0] == 2
    pq.write_table(table.slice(0, 0), files / "none.parquet")
    assert ok_of(load_dataset({"path": "none.parquet"}, ctx)).rows == 0


def test_a_column_sql_cannot_read_is_left_out_and_other_queries_still_run(
    ctx: ToolContext, files: Path
) -> None:
    """A decimal of 70 digits (Parquet's decimal256) made DuckDB refuse the whole dataset when
    it was registered, and every query of the conversation failed with it, SELECT 1 included,
    naming neither the dataset nor the column."""
    (files / "people.csv").write_text("name,age\nada,36\n", "utf-8")
    wide = pa.array([decimal.Decimal("1" * 60)], type=pa.decimal256(70, 0))
    pq.write_table(pa.table({"id": [1], "big": wide}), files / "wide.parquet")
    load_dataset({"path": "people.csv"}, ctx)
    load_dataset({"path": "wide.parquet"}, ctx)

    assert ok_of(query({"sql": "SELECT 1 AS one"}, ctx)).data["one"][0] == 1
    assert ok_of(query({"sql": "SELECT count(*) AS n FROM people"}, ctx)).data["n"][0] == 1
    read = ok_of(query({"sql": "SELECT * FROM wide"}, ctx))
    assert list(read.data.columns) == ["id"]
    (skipped,) = [w for w in read.warnings if w.kind == "column_skipped"]
    assert "'wide'" in skipped.message and "'big'" in skipped.message
    missing = hint(query, {"sql": "SELECT big FROM wide"}, ctx)
    assert missing.hint_kind == "schema"


def test_numbers_a_float_cannot_hold_are_named_and_odd_times_come_back_as_text(
    ctx: ToolContext,
) -> None:
    exact = ok_of(
        query({"sql": "SELECT 1.25::DECIMAL(38,2) AS d, sum(x) AS s FROM range(5) t(x)"}, ctx)
    )
    assert exact.data["d"][0] == 1.25 and exact.data["s"][0] == 10
    assert not [w for w in exact.warnings if w.kind == "precision"]
    wide = ok_of(
        query(
            {
                "sql": "SELECT 12345678901234567.891::DECIMAL(38,3) AS d, "
                "170141183460469231731687303715884105727::HUGEINT AS h"
            },
            ctx,
        )
    )
    (rounded,) = [w for w in wide.warnings if w.kind == "precision"]
    assert "d (decimal128(38, 3))" in rounded.message and "h (" in rounded.message
    # A nanosecond TIME has no pandas type: an Err naming only ArrowInvalid, before.
    nanos = ok_of(query({"sql": "SELECT '12:00:00.000000001'::TIME_NS AS t"}, ctx))
    assert nanos.data["t"][0].startswith("12:00:00.000000001")


def test_a_map_is_kept_as_its_entries_not_as_python_text(ctx: ToolContext) -> None:
    """A MAP came back as a list of tuples, stored (save_as) as their Python repr."""
    made = ok_of(query({"sql": "SELECT MAP {'k': 1, 'j': 2} AS m", "save_as": "maps"}, ctx))
    assert [dict(e) for e in made.data["m"][0]] == [
        {"key": "k", "value": 1},
        {"key": "j", "value": 2},
    ]
    again = ok_of(query({"sql": "SELECT map_from_entries(m)['j'] AS j FROM maps"}, ctx))
    assert again.data["j"][0] == 2


def test_a_query_never_spills_to_disk_nor_shows_a_server_path(ctx: ToolContext) -> None:
    shown = ok_of(query({"sql": "SELECT current_setting('temp_directory') AS t"}, ctx))
    assert shown.data["t"][0] == ""


def test_a_query_loads_only_the_datasets_it_names(
    ctx: ToolContext, files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b", "c"):
        (files / f"{name}.csv").write_text("x\n1\n", "utf-8")
        load_dataset({"path": f"{name}.csv"}, ctx)
    loaded: list[str] = []
    real = ctx.load_dataset

    def counting(name: str) -> Any:
        loaded.append(name)
        return real(name)

    monkeypatch.setattr(ctx, "load_dataset", counting)
    assert ok_of(query({"sql": "SELECT * FROM B JOIN c USING (x)"}, ctx)).rows == 1
    assert sorted(loaded) == ["b", "c"]
    loaded.clear()
    # A query over the catalog names no dataset: it sees every one.
    listed = ok_of(query({"sql": "SELECT table_name FROM information_schema.tables"}, ctx))
    assert sorted(listed.data["table_name"]) == ["a", "b", "c"]
    assert sorted(loaded) == ["a", "b", "c"]


# --------------------------------------------------------------------------------------------
# paths


def test_a_named_pipe_is_refused_without_blocking(ctx: ToolContext, files: Path) -> None:
    os.mkfifo(files / "pipe.csv")  # no writer: a plain open() would wait forever

    found = within_deadline(lambda: hint(load_dataset, {"path": "pipe.csv"}, ctx))

    assert found.hint_kind == "schema"
    assert "regular file" in found.message


def test_a_fifo_is_not_suggested_for_a_missing_file(ctx: ToolContext, files: Path) -> None:
    os.mkfifo(files / "peoplepipe.csv")

    labels = [a.label for a in hint(load_dataset, {"path": "peple.csv"}, ctx).alternatives]

    assert "people.csv" in labels
    assert "peoplepipe.csv" not in labels


def test_a_very_long_path_is_a_short_schema_hint(ctx: ToolContext) -> None:
    for raw in ("x" * 5000 + ".csv", "a/" * 3000 + "x.csv"):
        found = hint(load_dataset, {"path": raw}, ctx)

        assert found.hint_kind == "schema"
        assert len(found.message) < 600


def test_a_file_swapped_for_a_symlink_after_the_check_is_not_read(
    ctx: ToolContext, files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.csv").write_text("secret\nTOPSECRET\n", "utf-8")
    (files / "sub").mkdir()
    (files / "sub" / "data.csv").write_text("a\n1\n", "utf-8")
    checked = analysis._resolve_input_path

    def check_then_swap_file(raw: str, roots: Any) -> Path:
        path = checked(raw, roots)
        path.unlink()
        path.symlink_to(outside / "secret.csv")
        return path

    monkeypatch.setattr(analysis, "_resolve_input_path", check_then_swap_file)
    with pytest.raises(HintException):  # O_NOFOLLOW: the last component is now a link
        load_dataset({"path": "sub/data.csv"}, ctx)

    def check_then_swap_directory(raw: str, roots: Any) -> Path:
        path = checked(raw, roots)
        (files / "sub").rename(files / "sub_old")
        (files / "sub").symlink_to(outside, target_is_directory=True)
        (outside / "data.csv").write_text("secret\nTOPSECRET\n", "utf-8")
        return path

    (files / "sub" / "data.csv").unlink()
    (files / "sub" / "data.csv").write_text("a\n1\n", "utf-8")
    monkeypatch.setattr(analysis, "_resolve_input_path", check_then_swap_directory)
    with pytest.raises(PathOutsideDataRoots):  # the opened file is checked again
        load_dataset({"path": "sub/data.csv"}, ctx)
    assert ctx.list_datasets() == []


# --------------------------------------------------------------------------------------------
# query


def test_a_statement_type_unknown_to_the_driver_is_refused_as_a_hint(ctx: ToolContext) -> None:
    assert hint(query, {"sql": "UPDATE EXTENSIONS"}, ctx).hint_kind == "fetch"


def test_a_union_result_comes_back_as_text(ctx: ToolContext) -> None:
    ok = ok_of(query({"sql": "SELECT 1::UNION(a INT, b VARCHAR) AS u"}, ctx))

    assert ok.data["u"].tolist() == ["1"]


def test_a_result_of_huge_rows_is_clipped_by_size_with_a_note(ctx: ToolContext) -> None:
    result = query({"sql": "SELECT repeat('x', 100000) AS s FROM range(1000)"}, ctx)

    ok = ok_of(result)
    assert ok.rows == 1000
    assert 1 <= len(ok.data) < 1000
    (warning,) = ok.warnings
    assert warning.kind == "truncated"
    assert warning.details == {"total_rows": 1000, "returned_rows": len(ok.data)}
    assert len(tool_result_to_pb(result).SerializeToString()) < 2 * analysis.QUERY_MAX_RESULT_BYTES


def test_save_as_refuses_a_result_over_the_dataset_limit(
    tmp_path: Path, files: Path, store: SqlDatasetStore
) -> None:
    ctx = make_context(tmp_path, store, max_dataset_bytes=1 << 20)

    found = hint(query, {"sql": "SELECT * FROM range(10000000) t(n)", "save_as": "big"}, ctx)

    assert found.hint_kind == "fetch"
    assert ctx.list_datasets() == []


def test_a_result_memory_cannot_hold_is_an_err_not_an_os_error(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*_: Any) -> None:
        raise OSError("Invalid Input Error: Arrow Appender: The maximum total string size")

    monkeypatch.setattr(analysis, "_execute", fail)

    with pytest.raises(QueryResultTooLarge):
        query({"sql": "SELECT 1"}, ctx)


def test_a_recursive_query_that_never_ends_is_stopped(
    tmp_path: Path, files: Path, store: SqlDatasetStore
) -> None:
    ctx = make_context(tmp_path, store, tool_timeout_s=0.5)
    sql = "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT count(*) FROM t"

    with pytest.raises(analysis.QueryTimeout):
        within_deadline(lambda: query({"sql": sql}, ctx))


def test_unusual_identifiers_and_case(ctx: ToolContext, files: Path) -> None:
    (files / "kw.csv").write_text('select,"we""ird","has space",Name\n1,2,3,4\n', "utf-8")
    load_dataset({"path": "kw.csv"}, ctx)

    ok = ok_of(query({"sql": 'SELECT "select", "we""ird", "has space", name FROM KW'}, ctx))

    assert ok.data.iloc[0].tolist() == [1, 2, 3, 4]
    found = hint(query, {"sql": "SELECT has_space FROM kw"}, ctx)
    assert found.alternatives[0].label == "kw.has space"
    assert isinstance(ok, Ok)
