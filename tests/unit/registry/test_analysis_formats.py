"""The analysis tools against the quirks of published data files: codes with leading zeros,
Excel's exports, stray quotes, pandas' Parquet index, column names SQL folds together, and the
types a query gives back. Each value comes back as the file has it, or with a warning saying
what was done — never silently changed, shifted or dropped."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from services.registry.context import ToolContext
from services.registry.tools.analysis import describe_entry, load_dataset, query
from shared.contract import HintException

from .analysis_support import kinds, ok_of, warning_of

# --------------------------------------------------------------------------------------------
# CSV values


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("zips.csv", b"zip,n\n01234,1\n90210,2\n00501,3\n"),
        ("blanks.csv", b"zip,n\n01234,1\n,2\n00501,3\n"),  # float64 before: 1234.0
        ("marked.csv", b"zip,n\n01234,1\n?,2\n00501,3\n"),  # '?' read as missing before
        ("excel.txt", "zip\tn\r\n01234\t1\r\n90210\t2\r\n00501\t3\r\n".encode("utf-16")),
    ],
)
def test_codes_with_leading_zeros_keep_them(
    ctx: ToolContext, files: Path, name: str, data: bytes
) -> None:
    (files / name).write_bytes(data)

    ok = ok_of(load_dataset({"path": name}, ctx))

    stored = ctx.load_dataset(Path(name).stem)
    assert stored["zip"].tolist()[0] == "01234" and stored["zip"].tolist()[2] == "00501"
    assert stored["n"].tolist() == [1, 2, 3]
    if name != "marked.csv":  # '?' among text is a value, not a number marker
        assert "leading_zeros" in kinds(ok)


def test_numbers_without_leading_zeros_stay_numbers(ctx: ToolContext, files: Path) -> None:
    (files / "plain.csv").write_text("n,x,d\n10,0.5,2020-01-05\n0,1.0,2021-02-03\n", "utf-8")

    ok = ok_of(load_dataset({"path": "plain.csv"}, ctx))

    assert "leading_zeros" not in kinds(ok)
    assert ctx.load_dataset("plain")["n"].tolist() == [10, 0]


def test_big_integers_among_blanks_are_not_rounded(ctx: ToolContext, files: Path) -> None:
    (files / "ids.csv").write_text("id,n\n1234567890123456789,1\n,2\n9007199254740993,3\n")

    ok = ok_of(load_dataset({"path": "ids.csv"}, ctx))

    assert "big_integers" in kinds(ok)
    ids = ctx.load_dataset("ids")["id"].tolist()
    assert ids[0] == 1234567890123456789 and ids[2] == 9007199254740993 and pd.isna(ids[1])
    found = ok_of(query({"sql": "SELECT n FROM ids WHERE id = 9007199254740993"}, ctx))
    assert found.data["n"].tolist() == [3]


def test_integers_with_blanks_stay_integers(ctx: ToolContext, files: Path) -> None:
    """pandas reads an integer column with a blank as float64: a count of 10 became 10.0 in
    every preview, query result and client. Written as decimals, a column stays float."""
    (files / "counts.csv").write_text("count,price,year\n10,1.0,2019\n,2.0,\n7,,2021\n", "utf-8")

    ok = ok_of(load_dataset({"path": "counts.csv"}, ctx))

    assert "big_integers" not in kinds(ok)
    stored = ctx.load_dataset("counts")
    assert str(stored["count"].dtype) == "Int64" and str(stored["year"].dtype) == "Int64"
    assert stored["count"].tolist()[::2] == [10, 7] and pd.isna(stored["count"].tolist()[1])
    assert stored["price"].dtype == "float64"
    summed = ok_of(query({"sql": "SELECT sum(count) AS s, max(year) AS y FROM counts"}, ctx))
    assert summed.data["s"].tolist() == [17] and summed.data["y"].tolist() == [2021]
    described = ok_of(describe_entry({"name": "counts"}, ctx)).data.set_index("column")
    assert described.loc["count", ["null_count", "min", "max"]].tolist() == [1, "7", "10"]
    assert described.loc["count", "dtype"] != described.loc["price", "dtype"]


def test_true_false_with_blanks_is_a_boolean_column(ctx: ToolContext, files: Path) -> None:
    (files / "flags.csv").write_text("flag,n\nTRUE,1\nFALSE,2\n,3\n", "utf-8")

    ok = ok_of(load_dataset({"path": "flags.csv"}, ctx))

    assert kinds(ok) == []  # was: "integers too large for 64 bits are kept as text in: flag"
    assert ok.schema[0].dtype == "boolean"
    count = ok_of(query({"sql": "SELECT count(*) AS c FROM flags WHERE flag"}, ctx))
    assert count.data["c"][0] == 1


def test_a_trailing_delimiter_on_the_header_too_adds_no_column(
    ctx: ToolContext, files: Path
) -> None:
    (files / "ends.csv").write_text("a,b,\n1,2,\n3,4,\n", "utf-8")

    ok = ok_of(load_dataset({"path": "ends.csv"}, ctx))

    assert kinds(ok) == ["trailing_delimiter"]
    assert ctx.load_dataset("ends").to_dict("list") == {"a": [1, 3], "b": [2, 4]}


@pytest.mark.parametrize("first", ["sep=;\n", "\ufeffsep=;\r\n"])
def test_excels_separator_line_names_the_separator(
    ctx: ToolContext, files: Path, first: str
) -> None:
    (files / "excel.csv").write_text(first + "a;b\n1;2\n3;4\n", "utf-8")

    ok = ok_of(load_dataset({"path": "excel.csv"}, ctx))

    assert ctx.load_dataset("excel").to_dict("list") == {"a": [1, 3], "b": [2, 4]}
    assert "delimiter" in kinds(ok)


def _titles(stray: set[int], separator: str) -> str:
    """An IMDb-like file: some titles start with a quote that nothing closes."""
    rows = [separator.join(["id", "title", "year"])]
    for i in range(10):
        title = '"Weird title' if i in stray else f"Title {i}"
        rows.append(separator.join([f"tt{i}", title, str(2000 + i)]))
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("separator", ["\t", ","])
@pytest.mark.parametrize("stray", [{2, 6}, {2}])
def test_a_stray_quote_does_not_swallow_rows(
    ctx: ToolContext, files: Path, separator: str, stray: set[int]
) -> None:
    # Two stray quotes: the rows between them were one value (10 rows → 6), silently; one:
    # a parse error the model could do nothing about.
    (files / "titles.csv").write_text(_titles(stray, separator), "utf-8")

    ok = ok_of(load_dataset({"path": "titles.csv"}, ctx))

    assert ok.rows == 10 and "quotes" in kinds(ok)
    stored = ctx.load_dataset("titles")
    assert stored["year"].tolist() == list(range(2000, 2010))
    assert stored["title"][2] == '"Weird title'


def test_quoted_values_with_line_breaks_still_read_as_quoted(ctx: ToolContext, files: Path) -> None:
    (files / "notes.csv").write_text('id,note\n1,"a, b\nc"\n2,"say ""hi"""\n', "utf-8")

    ok = ok_of(load_dataset({"path": "notes.csv"}, ctx))

    assert kinds(ok) == []
    assert ctx.load_dataset("notes")["note"].tolist() == ["a, b\nc", 'say "hi"']


def test_unpaired_quotes_that_also_hide_separators_are_a_schema_hint(
    ctx: ToolContext, files: Path
) -> None:
    (files / "broken.csv").write_text('id,txt\n1,"a, b"\n2,"oops\n3,c\n', "utf-8")

    with pytest.raises(HintException) as excinfo:
        load_dataset({"path": "broken.csv"}, ctx)

    assert excinfo.value.hint_kind == "schema" and "quotes" in str(excinfo.value)
    assert ctx.list_datasets() == []


# --------------------------------------------------------------------------------------------
# Parquet and column names


def test_a_pandas_index_in_a_parquet_file_is_kept_as_columns(ctx: ToolContext, files: Path) -> None:
    pd.DataFrame({"v": [1, 2, 3]}, index=[10, 20, 30]).to_parquet(files / "unnamed.parquet")
    keyed = pd.DataFrame({"v": [1, 2]}, index=pd.Index(["a", "b"], name="key"))
    keyed.to_parquet(files / "named.parquet")
    pd.DataFrame({"v": [1, 2]}).to_parquet(files / "ranged.parquet")

    unnamed = ok_of(load_dataset({"path": "unnamed.parquet"}, ctx))
    named = ok_of(load_dataset({"path": "named.parquet"}, ctx))
    ranged = ok_of(load_dataset({"path": "ranged.parquet"}, ctx))

    assert ctx.load_dataset("unnamed").to_dict("list") == {"index": [10, 20, 30], "v": [1, 2, 3]}
    assert [c.name for c in named.schema] == ["key", "v"]  # as stored
    assert ctx.load_dataset("named")["key"].tolist() == ["a", "b"]
    assert "index_columns" in kinds(unnamed) and "index_columns" in kinds(named)
    assert [c.name for c in ranged.schema] == ["v"] and kinds(ranged) == []


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_column_names_differing_only_in_case_are_renamed(
    ctx: ToolContext, files: Path, suffix: str
) -> None:
    frame = pd.DataFrame({"Name": ["upper"], "name": ["lower"]})
    if suffix == "csv":
        frame.to_csv(files / "names.csv", index=False)
    else:
        frame.to_parquet(files / "names.parquet")

    ok = ok_of(load_dataset({"path": f"names.{suffix}"}, ctx))

    assert [c.name for c in ok.schema] == ["Name", "name_2"]
    assert "duplicate_columns" in kinds(ok)
    # Before, "name" read the Name column: SQL folds case, and the first of them won.
    read = ok_of(query({"sql": 'SELECT "Name", name_2 FROM names'}, ctx))
    assert read.data.iloc[0].tolist() == ["upper", "lower"]


def test_a_stored_dataset_with_names_differing_in_case_is_queried_with_a_warning(
    ctx: ToolContext,
) -> None:
    ctx.save_dataset("saved", pd.DataFrame({"A": [1], "a": [2]}))

    read = ok_of(query({"sql": "SELECT * FROM saved"}, ctx))

    assert read.data.iloc[0].tolist() == [1, 2]
    assert "duplicate_columns" in kinds(read)
    assert ok_of(query({"sql": "SELECT a_2 FROM saved"}, ctx)).data["a_2"][0] == 2


# --------------------------------------------------------------------------------------------
# query results and describe_entry


def test_intervals_come_back_as_durations_or_readable_text(ctx: ToolContext) -> None:
    # Before: pandas DateOffset objects, shown as "<DateOffset: days=1, months=0, nanoseco…".
    ok = ok_of(
        query(
            {
                "sql": "SELECT TIMESTAMP '2020-01-02 03:00' - TIMESTAMP '2020-01-01' AS d, "
                "INTERVAL 14 MONTH + INTERVAL 90 MINUTE AS m",
                "save_as": "spans",
            },
            ctx,
        )
    )

    assert ok.data["d"][0] == pd.Timedelta(days=1, hours=3)
    assert ok.data["m"][0] == "14 months 01:30:00"
    again = ok_of(query({"sql": "SELECT d + TIMESTAMP '2020-01-01' AS t FROM spans"}, ctx))
    assert again.data["t"][0] == pd.Timestamp("2020-01-02 03:00")


def test_describe_gives_min_and_max_of_dates_decimals_and_times(
    ctx: ToolContext, files: Path
) -> None:
    table = pa.table(
        {
            "day": pa.array([datetime.date(2020, 1, 2), None, datetime.date(1999, 12, 31)]),
            "price": pa.array(
                [decimal.Decimal("10.50"), decimal.Decimal("-2.25"), None],
                type=pa.decimal128(10, 2),
            ),
            "at": pa.array([datetime.time(8, 30), datetime.time(23, 59), None]),
        }
    )
    pq.write_table(table, files / "typed.parquet")
    load_dataset({"path": "typed.parquet"}, ctx)

    described = ok_of(describe_entry({"name": "typed"}, ctx)).data

    rows = {r["column"]: (r["min"], r["max"]) for r in described.to_dict("records")}
    assert rows == {
        "day": ("1999-12-31", "2020-01-02"),
        "price": ("-2.25", "10.50"),
        "at": ("08:30:00", "23:59:00"),
    }


def test_an_empty_column_name_in_parquet_is_given_one_sql_can_use(
    ctx: ToolContext, files: Path
) -> None:
    pq.write_table(pa.table({"": [1, 2], "v": [3, 4]}), files / "blank.parquet")

    ok = ok_of(load_dataset({"path": "blank.parquet"}, ctx))

    assert [c.name for c in ok.schema] == ["column_1", "v"]  # DuckDB called it v0
    assert ok_of(query({"sql": "SELECT sum(column_1) AS s FROM blank"}, ctx)).data["s"][0] == 3


# --------------------------------------------------------------------------------------------
# Times with UTC offsets


def test_local_times_across_a_daylight_saving_change_are_read_as_utc_times(
    ctx: ToolContext, files: Path
) -> None:
    """Local time written with its offset (+01:00 in winter, +02:00 in summer) stayed text, so
    no date function or time comparison worked on the column."""
    (files / "meter.csv").write_text(
        "at,kwh\n"
        "2024-03-31T01:30:00+01:00,1.5\n"
        "2024-03-31T03:30:00+02:00,2.5\n"
        "2024-10-27T02:30:00Z,3.5\n"
        ",4.5\n",
        encoding="utf-8",
    )

    ok = ok_of(load_dataset({"path": "meter.csv"}, ctx))

    assert "mixed_offsets" in kinds(ok)
    at = ctx.load_dataset("meter")["at"]
    assert str(at.dtype).startswith("datetime64") and str(at.dt.tz) == "UTC"
    assert at.iloc[0] == pd.Timestamp("2024-03-31T00:30:00Z")
    assert at.iloc[1] == pd.Timestamp("2024-03-31T01:30:00Z") and at.isna().iloc[3]
    sql = 'SELECT max("at") - min("at") AS span, count("at") AS n FROM meter'
    gap = ok_of(query({"sql": sql}, ctx))
    assert gap.data["n"][0] == 3
    assert gap.data["span"][0] == datetime.timedelta(days=210, hours=2)


def test_sql_naming_a_reserved_word_column_unquoted_gets_the_quoted_sql_to_retry(
    ctx: ToolContext, files: Path
) -> None:
    """A column called `at`, `order` or `group` is common in published data; unquoted, the model
    only read "syntax error at or near )"."""
    (files / "shop.csv").write_text("order,at,qty\n1,x,2\n2,y,3\n", encoding="utf-8")
    ok_of(load_dataset({"path": "shop.csv"}, ctx))
    sql = "SELECT at, sum(qty) AS q FROM shop WHERE at <> 'at' -- at\nGROUP BY at ORDER BY at"

    with pytest.raises(HintException) as raised:
        query({"sql": sql}, ctx)

    hint = raised.value
    assert "'at'" in hint.message and "double quotes" in hint.message
    fixed = hint.alternatives[0].label
    assert fixed == (
        'SELECT "at", sum(qty) AS q FROM shop WHERE "at" <> \'at\' -- at\n'
        'GROUP BY "at" ORDER BY "at"'
    )
    assert ok_of(query({"sql": fixed}, ctx)).data["q"].tolist() == [2, 3]
    with pytest.raises(HintException) as other:  # a syntax error of another kind: no guess
        query({"sql": "SELECT qty FROM shop WHERE"}, ctx)
    assert other.value.alternatives == [] and "double quotes" not in other.value.message


def test_times_with_one_offset_keep_it_and_a_mix_of_zoned_and_naive_stays_text(
    ctx: ToolContext, files: Path
) -> None:
    (files / "same.csv").write_text(
        "at\n2024-01-01T10:00:00+01:00\n2024-01-02T10:00:00+01:00\n", encoding="utf-8"
    )
    (files / "mixed.csv").write_text(
        "at\n2024-01-01T10:00:00+01:00\n2024-01-02T10:00:00\n", encoding="utf-8"
    )

    same = ok_of(load_dataset({"path": "same.csv"}, ctx))
    mixed = ok_of(load_dataset({"path": "mixed.csv"}, ctx))

    assert "mixed_offsets" not in kinds(same) + kinds(mixed)
    assert str(ctx.load_dataset("same")["at"].dt.tz) == "UTC+01:00"
    assert ctx.load_dataset("mixed")["at"].tolist() == [
        "2024-01-01T10:00:00+01:00",
        "2024-01-02T10:00:00",
    ]


# --------------------------------------------------------------------------------------------
# Dates and numbers as spreadsheets outside ISO write them


def test_month_first_dates_of_a_us_export_are_read_as_dates(ctx: ToolContext, files: Path) -> None:
    """Dates such as Superstore's "11/8/2016" stayed text: no date arithmetic, and sorting them
    put "11/22/2016" before "11/8/2016". A day above 12 in the second place tells the order."""
    (files / "orders.csv").write_text(
        "Order ID,Order Date,Ship Date,Sales\n"
        "CA-1,11/8/2016,11/11/2016,261.96\n"
        "CA-2,6/12/2016,6/16/2016,14.62\n"
        "CA-3,11/22/2015,,957.58\n"
        "CA-4,1/2/2017,1/5/2017 10:15,3.50\n",
        encoding="utf-8",
    )

    ok = ok_of(load_dataset({"path": "orders.csv"}, ctx))

    warning = warning_of(ok, "written_dates")
    assert warning.details == {
        "columns": {"Order Date": "month/day/year", "Ship Date": "month/day/year with times"}
    }
    stored = ctx.load_dataset("orders")
    assert stored["Order Date"].tolist() == [
        pd.Timestamp("2016-11-08"),
        pd.Timestamp("2016-06-12"),
        pd.Timestamp("2015-11-22"),
        pd.Timestamp("2017-01-02"),
    ]
    assert stored["Ship Date"].iloc[3] == pd.Timestamp("2017-01-05 10:15")
    assert stored["Ship Date"].isna().iloc[2]
    sql = (
        'SELECT "Order ID" AS id, date_diff(\'day\', "Order Date", "Ship Date") AS days '
        'FROM orders ORDER BY "Order Date"'
    )
    rows = ok_of(query({"sql": sql}, ctx)).data
    assert rows["id"].tolist() == ["CA-3", "CA-2", "CA-1", "CA-4"]
    assert rows["days"].tolist()[1:] == [4, 3, 3]


def test_a_german_export_reads_day_first_dates_and_grouped_decimal_comma_numbers(
    ctx: ToolContext, files: Path
) -> None:
    """ "1.234,50" stayed text beside "12,00" (only ungrouped decimal commas were read), and
    "31.12.2023" stayed text."""
    (files / "buchungen.csv").write_bytes(
        "Datum;Empfänger;Betrag;Saldo\n"
        "31.12.2023;Müller;1.234,50;12.000\n"
        "01.02.2024;Zoë GmbH;-12,00;10.765,5\n"
        "05.02.2024 09:30;Bäckerei;;-\n"
        "3.3.2024;Post;1.000.000;1,25\n".encode("cp1252")
    )

    ok = ok_of(load_dataset({"path": "buchungen.csv"}, ctx))

    assert {"written_dates", "decimal_comma", "missing_markers"} <= set(kinds(ok))
    stored = ctx.load_dataset("buchungen")
    assert stored["Datum"].tolist() == [
        pd.Timestamp("2023-12-31"),
        pd.Timestamp("2024-02-01"),
        pd.Timestamp("2024-02-05 09:30"),
        pd.Timestamp("2024-03-03"),
    ]
    assert stored["Betrag"].tolist()[:2] == [1234.5, -12.0]
    assert stored["Betrag"].isna().iloc[2] and stored["Betrag"].iloc[3] == 1_000_000.0
    assert stored["Saldo"].tolist()[:2] == [12000.0, 10765.5]
    assert stored["Saldo"].isna().iloc[2] and stored["Saldo"].iloc[3] == 1.25
    total = ok_of(query({"sql": "SELECT sum(Betrag) AS s FROM buchungen"}, ctx)).data
    assert total["s"].tolist() == [pytest.approx(1_001_222.5)]


def test_dates_whose_order_no_value_tells_stay_text_with_sql_that_reads_them(
    ctx: ToolContext, files: Path
) -> None:
    (files / "visits.csv").write_text(
        "visit,when,n\n1,01/02/2020,3\n2,03/04/2020,4\n3,,5\n", encoding="utf-8"
    )

    ok = ok_of(load_dataset({"path": "visits.csv"}, ctx))

    warning = warning_of(ok, "ambiguous_dates")
    assert "written_dates" not in kinds(ok)
    assert ctx.load_dataset("visits")["when"].tolist()[:2] == ["01/02/2020", "03/04/2020"]
    advice = warning.details["columns"]["when"]
    assert advice == (
        "strptime(\"when\", '%d/%m/%Y') (day first) or strptime(\"when\", '%m/%d/%Y') (month first)"
    )
    day_first = advice.split(" (day first)")[0]
    rows = ok_of(query({"sql": f"SELECT {day_first} AS d FROM visits WHERE n < 5"}, ctx)).data
    assert rows["d"].tolist() == [datetime.datetime(2020, 2, 1), datetime.datetime(2020, 4, 3)]


@pytest.mark.parametrize(
    "values",
    [
        ["31/02/2024", "01/03/2024"],  # no 31st of February
        ["13/14/2020", "01/01/2020"],  # neither place is a month
        ["01.02.2024", "01/02/2024"],  # two separators
        ["1/2/24", "3/4/24"],  # two-digit years: which century is a guess
        ["1/2/2024 13:00 PM", "1/13/2024"],  # no 13 o'clock on a 12-hour clock
        ["1.2.2024", "version"],
    ],
)
def test_text_that_only_looks_like_dates_stays_text(
    ctx: ToolContext, files: Path, values: list[str]
) -> None:
    (files / "odd.csv").write_text("v\n" + "\n".join(values) + "\n", encoding="utf-8")

    ok = ok_of(load_dataset({"path": "odd.csv"}, ctx))

    assert not {"written_dates", "ambiguous_dates"} & set(kinds(ok))
    assert ctx.load_dataset("odd")["v"].tolist() == values


def test_dot_grouped_numbers_without_a_decimal_comma_are_left_as_read(
    ctx: ToolContext, files: Path
) -> None:
    """Alone, "1.234" may be a number with a decimal point: only a decimal comma somewhere in
    the column says the dots are between thousands."""
    (files / "dots.csv").write_text("a;b\n1.234;1.234\n5.678;2,5\n", encoding="utf-8")

    ok_of(load_dataset({"path": "dots.csv"}, ctx))

    stored = ctx.load_dataset("dots")
    assert stored["a"].tolist() == [1.234, 5.678]
    assert stored["b"].tolist() == [1234.0, 2.5]


# --------------------------------------------------------------------------------------------
# SQL written in another dialect


@pytest.fixture
def sales(ctx: ToolContext, files: Path) -> ToolContext:
    (files / "sales.csv").write_text(
        "id,region,day,amount\n1,north,2024-01-05,3.5\n2,south,2024-02-10,\n3,north,2024-03-01,2\n",
        encoding="utf-8",
    )
    ok_of(load_dataset({"path": "sales.csv"}, ctx))
    return ctx


def hint_of(sql: str, ctx: ToolContext) -> HintException:
    with pytest.raises(HintException) as raised:
        query({"sql": sql}, ctx)
    return raised.value


@pytest.mark.parametrize(
    ("sql", "named", "fixed", "rows"),
    [
        (
            "SELECT id, iif(amount > 3, 'big', 'small') AS size FROM sales ORDER BY id",
            "iif",
            "SELECT id, if(amount > 3, 'big', 'small') AS size FROM sales ORDER BY id",
            [[1, "big"], [2, "small"], [3, "small"]],
        ),
        (
            "SELECT id, JULIANDAY(day) - julianday(day) AS d FROM sales ORDER BY id -- iif(",
            "julianday",
            "SELECT id, julian(day) - julian(day) AS d FROM sales ORDER BY id -- iif(",
            [[1, 0.0], [2, 0.0], [3, 0.0]],
        ),
        (
            "SELECT id, nvl(amount, 0) AS a FROM sales WHERE region <> 'nvl(' ORDER BY id",
            "nvl",
            "SELECT id, coalesce(amount, 0) AS a FROM sales WHERE region <> 'nvl(' ORDER BY id",
            [[1, 3.5], [2, 0.0], [3, 2.0]],
        ),
    ],
)
def test_a_function_of_another_dialect_gets_duckdbs_and_the_sql_renamed(
    sales: ToolContext, sql: str, named: str, fixed: str, rows: list[list[object]]
) -> None:
    """Models write SQLite's iif/julianday or Oracle's nvl out of habit; DuckDB's own "did you
    mean" offered isinf, julian-less guesses, or nothing."""
    hint = hint_of(sql, sales)

    assert f"{named}() is another SQL dialect's" in hint.message
    assert [a.label for a in hint.alternatives] == [fixed]
    again = ok_of(query({"sql": fixed}, sales)).data
    assert again.values.tolist() == rows


def test_a_foreign_function_without_a_renaming_gets_advice_only(sales: ToolContext) -> None:
    hint = hint_of("SELECT total(amount) AS t FROM sales", sales)
    assert "total() is another SQL dialect's" in hint.message
    assert "coalesce(sum(x), 0)" in hint.message and hint.alternatives == []
    # A renaming that would not bind (here: a wrong argument count) is not offered.
    wrong = hint_of("SELECT newid(1) AS u FROM sales", sales)
    assert "uuid()" in wrong.message and wrong.alternatives == []
    # A function no dialect has: DuckDB's own message, no advice.
    unknown = hint_of("SELECT frobnicate(amount) FROM sales", sales)
    assert "another SQL dialect" not in unknown.message


def test_text_in_double_quotes_gets_the_sql_with_single_quotes(sales: ToolContext) -> None:
    """SQLite reads "north" as text when no column is called so; DuckDB only said there is
    no column "north" and suggested columns."""
    sql = 'SELECT count(*) AS n, region AS "region" FROM sales WHERE region = "north" GROUP BY 2'
    hint = hint_of(sql, sales)

    assert "a text value goes in single quotes: 'north'" in hint.message
    [fixed] = [a.label for a in hint.alternatives]
    assert fixed == (
        "SELECT count(*) AS n, region AS \"region\" FROM sales WHERE region = 'north' GROUP BY 2"
    )
    assert ok_of(query({"sql": fixed}, sales)).data["n"].tolist() == [2]
    # A column that is truly missing still gets the columns that exist.
    missing = hint_of('SELECT "regoin" FROM sales', sales)
    assert "single quotes" not in missing.message
    assert any("region" in a.label for a in missing.alternatives)


def test_text_in_double_quotes_in_an_in_list_and_a_case_is_fixed_too(sales: ToolContext) -> None:
    sql = (
        'SELECT id, CASE WHEN region IN ("north", "east") THEN "n" ELSE "s" END AS side '
        "FROM sales ORDER BY id"
    )
    hint = hint_of(sql, sales)  # DuckDB reports one missing column at a time: all are fixed

    assert "single quotes: 'north', 'east', 'n', 's'" in hint.message
    [fixed] = [a.label for a in hint.alternatives]
    assert fixed == (
        "SELECT id, CASE WHEN region IN ('north', 'east') THEN 'n' ELSE 's' END AS side "
        "FROM sales ORDER BY id"
    )
    assert ok_of(query({"sql": fixed}, sales)).data["side"].tolist() == ["n", "s", "n"]


@pytest.mark.parametrize(
    ("sql", "fixed", "ids"),
    [
        (
            "SELECT TOP 2 id FROM sales ORDER BY amount DESC NULLS LAST;",
            "SELECT id FROM sales ORDER BY amount DESC NULLS LAST LIMIT 2;",
            [1, 3],
        ),
        (
            "select distinct top (1) region from sales where region <> 'TOP 5' order by 1",
            "select distinct region from sales where region <> 'TOP 5' order by 1 LIMIT 1",
            None,
        ),
        (
            "SELECT id FROM sales ORDER BY id LIMIT 1, 2 -- LIMIT 3, 4",
            "SELECT id FROM sales ORDER BY id LIMIT 2 OFFSET 1 -- LIMIT 3, 4",
            [2, 3],
        ),
    ],
)
def test_row_limits_of_sql_server_and_mysql_get_duckdbs_limit(
    sales: ToolContext, sql: str, fixed: str, ids: list[int] | None
) -> None:
    hint = hint_of(sql, sales)

    assert "query runs DuckDB SQL: LIMIT" in hint.message
    assert [a.label for a in hint.alternatives] == [fixed]
    data = ok_of(query({"sql": fixed}, sales)).data
    if ids is not None:
        assert data["id"].tolist() == ids
    else:
        assert data["region"].tolist() == ["north"]


# --------------------------------------------------------------------------------------------
# Rows of totals


def test_a_total_row_below_the_table_is_kept_with_the_sql_that_leaves_it_out(
    ctx: ToolContext, files: Path
) -> None:
    """Published tables end with their totals; SUM() over the column counted every value
    twice without a word."""
    (files / "budget.csv").write_text(
        "Department,Staff,Spend (k€)\n"
        "Health,120,1530.25\n"
        "Schools,340,2210.5\n"
        "Roads,45,980.0\n"
        "Total,505,4720.8\n",  # rounded, as published
        encoding="utf-8",
    )

    ok = ok_of(load_dataset({"path": "budget.csv"}, ctx))

    warning = warning_of(ok, "total_row")
    assert warning.details == {
        "row": "last",
        "column": "Department",
        "label": "Total",
        "columns": ["Staff", "Spend (k€)"],
    }
    assert ok.rows == 4  # kept, as in the file
    where = warning.message.split("aggregating: ")[1]
    assert where == "WHERE \"Department\" IS DISTINCT FROM 'Total'"
    total = ok_of(query({"sql": f"SELECT sum(Staff) AS s FROM budget {where}"}, ctx)).data
    assert total["s"].tolist() == [505]


@pytest.mark.parametrize(
    "text",
    [
        # "Total" names a category whose numbers are not the others' sums.
        "kind,n\nTotal,3\nPartial,5\nNone,2\n",
        # The sums match but no cell says it is a total.
        "kind,n\na,1\nb,2\nc,3\n",
        # One column is the sum, another is not: not a row of totals.
        "kind,n,m\na,1,1\nb,2,1\nTotal,3,9\n",
    ],
)
def test_rows_that_are_not_totals_get_no_total_warning(
    ctx: ToolContext, files: Path, text: str
) -> None:
    (files / "kinds.csv").write_text(text, encoding="utf-8")
    assert "total_row" not in kinds(ok_of(load_dataset({"path": "kinds.csv"}, ctx)))


def test_a_total_row_above_the_table_in_a_german_export_is_found(
    ctx: ToolContext, files: Path
) -> None:
    (files / "einw.csv").write_text(
        "Bezirk;Einwohner\nInsgesamt;3.755.251\nMitte;397.134\nPankow;3.358.117\n",
        encoding="utf-8",
    )

    ok = ok_of(load_dataset({"path": "einw.csv"}, ctx))

    warning = warning_of(ok, "total_row")
    assert warning.details["row"] == "first" and warning.details["label"] == "Insgesamt"
    # Two dots in one number can only be between thousands: the column is numbers.
    assert ctx.load_dataset("einw")["Einwohner"].tolist() == [3755251, 397134, 3358117]


# --------------------------------------------------------------------------------------------
# Numbers with units


def test_percent_and_currency_columns_are_read_as_numbers_with_their_unit(
    ctx: ToolContext, files: Path
) -> None:
    """ "12.5%" and "$1,234.56" stayed text: no sum, no average, and ORDER BY sorted "9%"
    after "10%"."""
    (files / "results.csv").write_text(
        "Region,Share,Revenue,Net\n"
        'North,12.5%,"$1,234.56","(1,200.00)"\n'
        "South,9%,$80.00,300.50\n"
        'East,,"-$3.10","(5.25)"\n'
        "West,10 %,$0,7\n",
        encoding="utf-8",
    )

    ok = ok_of(load_dataset({"path": "results.csv"}, ctx))

    warning = warning_of(ok, "units")
    assert warning.details == {"columns": {"Share": "percent", "Revenue": "$", "Net": ""}}
    assert "(parentheses) were read as negative in: Net" in warning.message
    stored = ctx.load_dataset("results")
    assert stored["Share"].tolist()[:2] == [12.5, 9.0] and stored["Share"].isna().iloc[2]
    assert stored["Revenue"].tolist() == [1234.56, 80.0, -3.1, 0.0]
    assert stored["Net"].tolist() == [-1200.0, 300.5, -5.25, 7.0]
    top = ok_of(query({"sql": "SELECT Region FROM results ORDER BY Share DESC LIMIT 2"}, ctx))
    assert top.data["Region"].tolist() == ["North", "West"]


def test_euro_amounts_with_decimal_commas_are_read_in_a_semicolon_file(
    ctx: ToolContext, files: Path
) -> None:
    (files / "preise.csv").write_text(
        "Artikel;Preis;Rabatt\nTee;1.234,50 €;12,5 %\nKaffee;12,00 €;7 %\nBrot;-3 €;\n",
        encoding="utf-8",
    )

    ok_of(load_dataset({"path": "preise.csv"}, ctx))

    stored = ctx.load_dataset("preise")
    assert stored["Preis"].tolist() == [1234.5, 12.0, -3.0]
    assert stored["Rabatt"].tolist()[:2] == [12.5, 7.0]


@pytest.mark.parametrize(
    "values",
    [
        ["$1", "€2", "$3"],  # two currencies: not one column of amounts
        ["(1)", "(2)", "(3)"],  # references, not a column of debits
        ["12%", "n/a%", "3%"],
        ["$1.2.3", "$4"],
        ["(5", "6)"],
    ],
)
def test_text_that_only_looks_like_amounts_stays_text(
    ctx: ToolContext, files: Path, values: list[str]
) -> None:
    (files / "odd_units.csv").write_text(
        "v\n" + "\n".join(f'"{v}"' for v in values) + "\n", encoding="utf-8"
    )

    ok = ok_of(load_dataset({"path": "odd_units.csv"}, ctx))

    assert "units" not in kinds(ok)
    assert ctx.load_dataset("odd_units")["v"].tolist() == values


def test_times_on_both_clocks_and_with_fractions_are_read(ctx: ToolContext, files: Path) -> None:
    (files / "shifts.csv").write_text(
        "at,n\n1/2/2024 2:00 PM,1\n1/13/2024 14:00,2\n1/14/2024 12:00:00 AM,3\n"
        "1/15/2024 09:30:05.25,4\n1/16/2024,5\n",
        encoding="utf-8",
    )

    ok = ok_of(load_dataset({"path": "shifts.csv"}, ctx))

    assert "written_dates" in kinds(ok)
    assert ctx.load_dataset("shifts")["at"].tolist() == [
        pd.Timestamp("2024-01-02 14:00"),
        pd.Timestamp("2024-01-13 14:00"),
        pd.Timestamp("2024-01-14 00:00"),
        pd.Timestamp("2024-01-15 09:30:05.250"),
        pd.Timestamp("2024-01-16"),
    ]


# --------------------------------------------------------------------------------------------
# Headers over two rows


def test_a_header_over_two_rows_names_the_columns_by_both(ctx: ToolContext, files: Path) -> None:
    """Group labels in merged cells above the columns' own (a year over its quarters): the
    second row was read as data, and every column of numbers became text."""
    (files / "quarters.csv").write_text(
        "Region,2023,,2024,\n,Q1,Q2,Q1,Q2\nNorth,10,11,12,13\nSouth,20,21,22,\n",
        encoding="utf-8",
    )

    ok = ok_of(load_dataset({"path": "quarters.csv"}, ctx))

    warning = warning_of(ok, "header_rows")
    names = ["Region", "2023 Q1", "2023 Q2", "2024 Q1", "2024 Q2"]
    assert warning.details == {"columns": names}
    stored = ctx.load_dataset("quarters")
    assert list(stored.columns) == names and ok.rows == 2
    assert stored["2023 Q1"].tolist() == [10, 20]
    assert stored["2024 Q2"].tolist()[0] == 13 and stored["2024 Q2"].isna().iloc[1]
    sql = 'SELECT sum("2024 Q1") AS s FROM quarters'
    assert ok_of(query({"sql": sql}, ctx)).data["s"].tolist() == [34]


@pytest.mark.parametrize(
    "text",
    [
        # A blank header cell, but the first row is data.
        "name,,n\na,b,1\nc,d,2\n",
        # A text first row under a full header: a category, not a second header.
        "kind,label,n\nx,y,1\nz,w,2\n",
        # Labels below a blank header, but no column of numbers under them.
        "a,,c\nx,y,z\np,q,r\n",
    ],
)
def test_one_row_headers_are_not_joined_with_the_first_row(
    ctx: ToolContext, files: Path, text: str
) -> None:
    (files / "plain.csv").write_text(text, encoding="utf-8")

    ok = ok_of(load_dataset({"path": "plain.csv"}, ctx))

    assert "header_rows" not in kinds(ok)
    assert ok.rows == 2


@pytest.mark.parametrize(
    ("sql", "fixed"),
    [
        # Read as `Sales AS Amount`: "no column Sales".
        (
            "SELECT Region, sales amount FROM orders_2024 ORDER BY 2",
            'SELECT Region, "Sales Amount" FROM orders_2024 ORDER BY 2',
        ),
        # ORDER is a keyword: a syntax error.
        (
            'SELECT Order Date, "Spend (k€)" FROM orders_2024 WHERE Spend (k€) > 1 -- Order Date',
            'SELECT "Order Date", "Spend (k€)" FROM orders_2024 WHERE "Spend (k€)" > 1 '
            "-- Order Date",
        ),
    ],
)
def test_column_names_with_spaces_written_unquoted_get_the_quoted_sql(
    ctx: ToolContext, files: Path, sql: str, fixed: str
) -> None:
    """Published files name columns `Order Date` or `Spend (k€)`; the model only read "no
    column Sales" or "syntax error at or near Date"."""
    (files / "orders 2024.csv").write_text(
        "Order Date,Region,Sales Amount,Spend (k€)\n"
        "2024-01-05,North,10,1.5\n2024-02-01,South,20,0.5\n",
        encoding="utf-8",
    )
    ok_of(load_dataset({"path": "orders 2024.csv"}, ctx))

    with pytest.raises(HintException) as raised:
        query({"sql": sql}, ctx)

    assert "hold spaces or symbols: write them in double quotes" in raised.value.message
    assert [a.label for a in raised.value.alternatives] == [fixed]
    assert ok_of(query({"sql": fixed}, ctx)).rows >= 1


def test_years_under_group_labels_name_the_columns_too(ctx: ToolContext, files: Path) -> None:
    (files / "pop.csv").write_text(
        "Country,Population,,GDP (bn),\n,2022,2023,2022,2023\nNorway,5.46,5.52,579,485\n"
        "Chile,19.6,19.63,301,335\n",
        encoding="utf-8",
    )

    ok = ok_of(load_dataset({"path": "pop.csv"}, ctx))

    assert warning_of(ok, "header_rows").details["columns"] == [
        "Country",
        "Population 2022",
        "Population 2023",
        "GDP (bn) 2022",
        "GDP (bn) 2023",
    ]
    assert ctx.load_dataset("pop")["GDP (bn) 2023"].tolist() == [485, 335]


def test_a_first_row_of_year_like_numbers_with_its_own_label_is_data(
    ctx: ToolContext, files: Path
) -> None:
    (files / "counts.csv").write_text("site,count,\nA,2022,2023\nB,1999,2001\n", encoding="utf-8")

    ok = ok_of(load_dataset({"path": "counts.csv"}, ctx))

    assert "header_rows" not in kinds(ok) and ok.rows == 2


def test_unclear_dates_some_with_times_get_sql_that_reads_them_all(
    ctx: ToolContext, files: Path
) -> None:
    (files / "log.csv").write_text("at,n\n01/02/2020 10:30,1\n03/04/2020,2\n", encoding="utf-8")

    ok = ok_of(load_dataset({"path": "log.csv"}, ctx))

    advice = warning_of(ok, "ambiguous_dates").details["columns"]["at"]
    day_first = advice.split(" (day first)")[0]
    assert day_first == "strptime(\"at\", ['%d/%m/%Y %H:%M', '%d/%m/%Y'])"
    rows = ok_of(query({"sql": f"SELECT {day_first} AS d FROM log ORDER BY n"}, ctx)).data
    assert rows["d"].tolist() == [
        datetime.datetime(2020, 2, 1, 10, 30),
        datetime.datetime(2020, 4, 3),
    ]
