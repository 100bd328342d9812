"""The analysis tools against more published formats: Eurostat's TSV (dimension codes packed in
its first column, flags after the values, `:` for not available) and its SDMX-CSV, NOAA's
climate data (markers such as `T` and `M` among numbers, suffixes such as `27.2s`, and the
9999.9 / 999.9 / 99.99 that Global Summary of the Day writes for a missing measurement), and
Parquet lists of uint64 with nulls among them, which stay exact."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from services.registry.context import ToolContext
from services.registry.tools.analysis import describe_entry, load_dataset, preview_data, query

from .analysis_support import kinds, ok_of


def names(ok: object) -> list[str]:
    return [c.name for c in ok.schema]  # type: ignore[attr-defined]


def warning(ok: object, kind: str) -> Any:
    return next(w for w in ok.warnings if w.kind == kind)  # type: ignore[attr-defined]


def rows(sql: str, ctx: ToolContext) -> dict[str, list[Any]]:
    return dict(ok_of(query({"sql": sql}, ctx)).data.to_dict("list"))


def described(name: str, ctx: ToolContext) -> pd.DataFrame:
    return ok_of(describe_entry({"name": name}, ctx)).data.set_index("column")


# --------------------------------------------------------------------------------------------
# Eurostat's TSV

# nama_10_gdp as the dissemination API gives it (format=TSV): the row key's dimensions before
# the backslash, periods with a trailing space, a flag after a value's space, `:` for not
# available (alone or with a flag), CRLF line ends.
NAMA_10_GDP = (
    "freq,unit,na_item,geo\\TIME_PERIOD\t2021 \t2022 \t2023 \r\n"
    "A,CP_MEUR,B1GQ,AT\t406148.8 \t447218.9 \t477246.6 p\r\n"
    "A,CP_MEUR,B1GQ,DE\t3617450.0 \t3876810.0 p\t4121160.0 p\r\n"
    "A,CP_MEUR,B1GQ,LI\t: \t: c\t: \r\n"
)
# demo_pjan as the old bulk download gave it: `geo\time`, the latest year first, `:` alone.
DEMO_PJAN = (
    "unit,age,sex,geo\\time\t2020 \t2019 \t2018 \n"
    "NR,TOTAL,T,AT\t8901064 \t8858775 \t8822267 \n"
    "NR,TOTAL,T,FR\t67320216 p\t67012883 \t66918941 b\n"
    "NR,TOTAL,T,UK\t:\t66647112 \t66273576 \n"
)
# A quarterly table with the 2025 confidentiality status after `@`, and negative changes.
NAMQ_10_GDP = (
    "freq,unit,s_adj,na_item,geo\\TIME_PERIOD\t2021-Q1 \t2021-Q2 \n"
    "Q,CLV_PCH_PRE,SCA,B1GQ,AT\t-1.2 \t3.8 e\n"
    "Q,CLV_PCH_PRE,SCA,B1GQ,MT\t: @C\t0.9 p@C\n"
)


def test_a_eurostat_tsv_is_split_into_dimensions_numbers_and_flag_columns(
    ctx: ToolContext, files: Path
) -> None:
    (files / "nama_10_gdp.tsv").write_text(NAMA_10_GDP, "utf-8")

    ok = ok_of(load_dataset({"path": "nama_10_gdp.tsv"}, ctx))

    # Before: one text column `freq,unit,na_item,geo\TIME_PERIOD` and three text columns of
    # `477246.6 p` and `: c`.
    assert names(ok) == [
        *["freq", "unit", "na_item", "geo"],
        *["2021", "2022", "2022_flag", "2023", "2023_flag"],
    ]
    assert kinds(ok) == ["eurostat"]
    eurostat = warning(ok, "eurostat")
    assert eurostat.details["dimensions"] == ["freq", "unit", "na_item", "geo"]
    assert eurostat.details["across"] == "TIME_PERIOD"
    assert eurostat.details["flag_columns"] == ["2022_flag", "2023_flag"]
    assert eurostat.details["flags"] == {"p": 3, "c": 1}
    assert "p provisional" in eurostat.message and "c confidential" in eurostat.message
    stored = ctx.load_dataset("nama_10_gdp")
    assert stored["geo"].tolist() == ["AT", "DE", "LI"]
    assert stored["2023"].tolist()[:2] == [477246.6, 4121160.0]
    assert pd.isna(stored["2023"].tolist()[2])
    assert stored["2022_flag"].tolist()[1:] == ["p", "c"]
    found = rows(
        'SELECT geo, "2023" - "2022" AS growth FROM nama_10_gdp '
        "WHERE \"2023_flag\" = 'p' AND unit = 'CP_MEUR' ORDER BY geo",
        ctx,
    )
    assert found["geo"] == ["AT", "DE"]
    assert found["growth"] == pytest.approx([30027.7, 244350.0])
    description = described("nama_10_gdp", ctx)
    assert description.loc["2021", "null_count"] == 1
    assert description.loc["2021", "max"] == "3617450.0"
    assert description.loc["2023_flag", "null_count"] == 1


def test_an_old_bulk_download_keeps_its_integers_and_year_order(
    ctx: ToolContext, files: Path
) -> None:
    (files / "demo_pjan.tsv.gz").write_bytes(gzip.compress(DEMO_PJAN.encode("utf-8")))

    ok = ok_of(load_dataset({"path": "demo_pjan.tsv.gz"}, ctx))

    assert names(ok) == [
        *["unit", "age", "sex", "geo"],
        *["2020", "2020_flag", "2019", "2018", "2018_flag"],
    ]
    assert warning(ok, "eurostat").details["across"] == "time"
    stored = ctx.load_dataset("demo_pjan")
    # Counts as integers, the bare `:` as null.
    assert str(stored["2020"].dtype) == "Int64"
    assert stored["2020"].tolist()[:2] == [8901064, 67320216] and pd.isna(stored["2020"][2])
    assert stored["2018_flag"].tolist()[1] == "b"
    found = rows('SELECT sum("2019") AS s FROM demo_pjan', ctx)
    assert found["s"] == [8858775 + 67012883 + 66647112]


def test_a_eurostat_tsv_named_csv_is_read_as_tab_separated(ctx: ToolContext, files: Path) -> None:
    # Two periods and six dimensions: split by commas the lines have more fields than by tabs,
    # which the separator sniffing preferred.
    (files / "namq.csv").write_text(NAMQ_10_GDP, "utf-8")

    ok = ok_of(load_dataset({"path": "namq.csv"}, ctx))

    assert kinds(ok) == ["delimiter", "eurostat"]
    assert names(ok) == [
        *["freq", "unit", "s_adj", "na_item", "geo"],
        *["2021-Q1", "2021-Q1_flag", "2021-Q2", "2021-Q2_flag"],
    ]
    stored = ctx.load_dataset("namq")
    assert stored["2021-Q1"].tolist()[0] == -1.2 and pd.isna(stored["2021-Q1"][1])
    assert stored["2021-Q1_flag"].tolist()[1] == "@C"
    assert stored["2021-Q2_flag"].tolist() == ["e", "p@C"]
    assert "C confidential" in warning(ok, "eurostat").message
    found = rows("SELECT geo FROM namq WHERE \"2021-Q2_flag\" LIKE '%@C'", ctx)
    assert found["geo"] == ["MT"]


@pytest.mark.parametrize(
    "text",
    [
        # Keys that do not have the header's number of codes.
        "unit,geo\\time\t2020 \t2019 \nNR\t1 \t2 \nNR,AT\t3 \t4 \n",
        # Cells that are not Eurostat's numbers and flags: a matrix of words.
        "from\\to\tA\tB\nA\tnear\tfar\nB\tfar\tnear\n",
    ],
)
def test_a_backslash_header_over_other_rows_is_read_as_any_table(
    ctx: ToolContext, files: Path, text: str
) -> None:
    (files / "other.tsv").write_text(text, "utf-8")

    ok = ok_of(load_dataset({"path": "other.tsv"}, ctx))

    assert "eurostat" not in kinds(ok)
    assert names(ok)[0] == text.split("\t", 1)[0]
    assert ok.rows == 2


def test_eurostat_sdmx_csv_loads_with_its_flags_as_columns(ctx: ToolContext, files: Path) -> None:
    (files / "nama_sdmx.csv").write_text(
        "DATAFLOW,LAST UPDATE,freq,unit,na_item,geo,TIME_PERIOD,OBS_VALUE,OBS_FLAG,CONF_STATUS\n"
        "ESTAT:NAMA_10_GDP(1.0),22/05/26 11:00:00,A,CP_MEUR,B1GQ,AT,2023,477246.6,p,\n"
        "ESTAT:NAMA_10_GDP(1.0),22/05/26 11:00:00,A,CP_MEUR,B1GQ,LI,2023,:,,C\n"
        "ESTAT:NAMA_10_GDP(1.0),22/05/26 11:00:00,A,CP_MEUR,B1GQ,NO,2023,,,C\n",
        "utf-8",
    )

    ok = ok_of(load_dataset({"path": "nama_sdmx.csv"}, ctx))

    # Before: `:` (Eurostat's not available) made OBS_VALUE a text column.
    assert kinds(ok) == ["missing_markers"]
    stored = ctx.load_dataset("nama_sdmx")
    assert str(stored["OBS_VALUE"].dtype) == "float64"
    assert stored["OBS_VALUE"].isna().tolist() == [False, True, True]
    assert str(stored["TIME_PERIOD"].dtype) == "int64"
    found = rows(
        "SELECT geo FROM nama_sdmx WHERE OBS_VALUE IS NULL AND CONF_STATUS = 'C' ORDER BY geo",
        ctx,
    )
    assert found["geo"] == ["LI", "NO"]


# --------------------------------------------------------------------------------------------
# NOAA's markers and missing values

# Local Climatological Data (LCD) as NCEI's CSV gives it: a trace `T`, a missing `M`, a
# suspect value `27.2s`, a variable wind direction `VRB`, a trace written after its number.
LCD_HEADER = (
    '"STATION","DATE","REPORT_TYPE","HourlyDryBulbTemperature","HourlyPrecipitation",'
    '"HourlyWindDirection","HourlySkyConditions"\n'
)
LCD_VALUES = [
    ("32", "0.00", "240"),
    ("31", "T", "VRB"),
    ("27.2s", "0.01", "250"),
    ("30", "0.00", "260"),
    ("M", "M", "M"),
    ("29", "0.02", "270"),
    ("29", "0.00T", "280"),
    ("28", "0.01s", "290"),
    ("28", "0.00", "300"),
    ("27", "T", "310"),
]
LCD = LCD_HEADER + "".join(
    f'"72503014732","2024-01-01T{hour:02d}:51:00","FM-15","{temp}","{rain}","{wind}",'
    '"FEW:02 55 BKN:07 250"\n'
    for hour, (temp, rain, wind) in enumerate(LCD_VALUES)
)


def test_numbers_with_noaa_markers_are_numbers_with_their_markers_beside(
    ctx: ToolContext, files: Path
) -> None:
    (files / "lcd.csv").write_text(LCD, "utf-8")

    ok = ok_of(load_dataset({"path": "lcd.csv"}, ctx))

    # Before: the three measurement columns were text, without a word about why.
    assert kinds(ok) == ["number_markers"]
    assert names(ok) == [
        *["STATION", "DATE", "REPORT_TYPE"],
        *["HourlyDryBulbTemperature", "HourlyDryBulbTemperature_marker"],
        *["HourlyPrecipitation", "HourlyPrecipitation_marker"],
        *["HourlyWindDirection", "HourlyWindDirection_marker"],
        "HourlySkyConditions",
    ]
    markers = warning(ok, "number_markers")
    assert markers.details["columns"]["HourlyPrecipitation"] == {"T": 3, "M": 1, "s": 1}
    assert markers.details["columns"]["HourlyWindDirection"] == {"VRB": 1, "M": 1}
    assert "T trace" in markers.message and "VRB variable" in markers.message
    stored = ctx.load_dataset("lcd")
    assert stored["HourlyDryBulbTemperature"].tolist()[2] == 27.2
    assert stored["HourlyPrecipitation_marker"].fillna("").tolist()[:3] == ["", "T", ""]
    assert str(stored["HourlyWindDirection"].dtype) == "Int64"
    # Text stays text: the sky conditions, the report type.
    assert stored["HourlySkyConditions"].tolist()[0] == "FEW:02 55 BKN:07 250"
    found = rows(
        "SELECT sum(HourlyPrecipitation) AS rain, count(HourlyPrecipitation) AS measured, "
        "count(*) FILTER (WHERE HourlyPrecipitation_marker = 'T') AS traces, "
        "avg(HourlyWindDirection) AS wind FROM lcd",
        ctx,
    )
    assert found["rain"] == [pytest.approx(0.04)]
    assert found["measured"] == [7] and found["traces"] == [3]
    assert found["wind"] == [pytest.approx(275.0)]
    assert described("lcd", ctx).loc["HourlyPrecipitation", "null_count"] == 3


@pytest.mark.parametrize(
    ("values", "kept"),
    [
        # Station ids and names: text, whatever letters they hold.
        (["USW00094728", "USW00014732", "USC00305801", "USW00094789"], "ids"),
        (["NY CITY CENTRAL PARK, NY US", "LAGUARDIA AIRPORT, NY US", "T", "M"], "names"),
        # Sizes: more letters than the few markers, and most values not numbers.
        (["S", "M", "L", "XL", "38", "40"], "sizes"),
        # Markers among codes whose leading zeros matter.
        (["007", "012", "M", "044", "051"], "codes"),
        # Mostly markers: not a column of numbers.
        (["T", "T", "M", "T", "0.01"], "traces"),
    ],
)
def test_text_with_marker_like_values_stays_text(
    ctx: ToolContext, files: Path, values: list[str], kept: str
) -> None:
    text = "id,value\n" + "".join(f'{i},"{v}"\n' for i, v in enumerate(values))
    (files / f"{kept}.csv").write_text(text, "utf-8")

    ok = ok_of(load_dataset({"path": f"{kept}.csv"}, ctx))

    assert "number_markers" not in kinds(ok)
    assert names(ok) == ["id", "value"]
    assert ctx.load_dataset(kept)["value"].tolist() == values


def test_a_few_unknown_words_among_numbers_are_named_and_kept_as_text(
    ctx: ToolContext, files: Path
) -> None:
    counts = [str(n) for n in range(12, 30)] + ["NR", "NR"]
    (files / "counts.csv").write_text(
        "site,count\n" + "".join(f"s{i},{c}\n" for i, c in enumerate(counts)), "utf-8"
    )

    ok = ok_of(load_dataset({"path": "counts.csv"}, ctx))

    # Before: a text column, without a word.
    assert kinds(ok) == ["text_among_numbers"]
    assert warning(ok, "text_among_numbers").details["columns"] == {"count": {"NR": 2}}
    assert "TRY_CAST" in warning(ok, "text_among_numbers").message
    found = rows("SELECT sum(TRY_CAST(count AS DOUBLE)) AS s FROM counts", ctx)
    assert found["s"] == [sum(range(12, 30))]


# Global Summary of the Day as NCEI's CSV gives it: quoted, space-padded numbers, 9999.9 for
# a missing temperature or pressure, 999.9 for a missing visibility, wind or snow depth, 99.99
# for missing precipitation.
GSOD = (
    '"STATION","DATE","LATITUDE","LONGITUDE","ELEVATION","NAME","TEMP","TEMP_ATTRIBUTES",'
    '"DEWP","DEWP_ATTRIBUTES","SLP","SLP_ATTRIBUTES","STP","STP_ATTRIBUTES","VISIB",'
    '"VISIB_ATTRIBUTES","WDSP","WDSP_ATTRIBUTES","MXSPD","GUST","MAX","MAX_ATTRIBUTES","MIN",'
    '"MIN_ATTRIBUTES","PRCP","PRCP_ATTRIBUTES","SNDP","FRSHTT"\n'
    '"01001099999","2020-01-01","70.9333333","-8.6666667","9.0","JAN MAYEN NOR NAVY, NO",'
    '"  29.7"," 8","  21.5"," 8","1009.2"," 8","  8.9"," 8","999.9"," 0","  8.0"," 8","  9.7",'
    '"999.9","  33.6","*","  25.0","*"," 0.18","G","999.9","010000"\n'
    '"01001099999","2020-01-02","70.9333333","-8.6666667","9.0","JAN MAYEN NOR NAVY, NO",'
    '"  35.1","24","  30.2","24","9999.9"," 0","  5.4","24","  6.2"," 6"," 15.5","24"," 21.0",'
    '" 28.9","  37.4"," ","  30.2","*","99.99"," ","999.9","110000"\n'
    '"01001099999","2020-01-03","70.9333333","-8.6666667","9.0","JAN MAYEN NOR NAVY, NO",'
    '"9999.9"," 0","  30.0","24","1001.1","24","  1.2","24","  6.2"," 6"," 12.1","24"," 17.1",'
    '" 30.1","  36.1","*","  31.3"," "," 0.00","I"," 1.2","000000"\n'
)


def test_gsod_missing_values_are_null_with_a_warning(ctx: ToolContext, files: Path) -> None:
    (files / "gsod.csv").write_text(GSOD, "utf-8")

    ok = ok_of(load_dataset({"path": "gsod.csv"}, ctx))

    # Before: a gust of 999.9 knots and precipitation of 99.99 inches, averaged in.
    assert kinds(ok) == ["leading_zeros", "missing_sentinels"]
    assert warning(ok, "missing_sentinels").details["columns"] == {
        "TEMP": 1,
        "SLP": 1,
        "VISIB": 1,
        "GUST": 1,
        "PRCP": 1,
        "SNDP": 2,
    }
    found = rows(
        "SELECT avg(TEMP) AS temp, max(GUST) AS gust, sum(PRCP) AS rain, "
        "count(VISIB) AS visib, min(STATION) AS station, min(FRSHTT) AS frshtt FROM gsod",
        ctx,
    )
    assert found["temp"] == [pytest.approx(32.4)]
    assert found["gust"] == [30.1] and found["rain"] == [pytest.approx(0.18)]
    assert found["visib"] == [2]
    # Codes keep their zeros; the attribute counts and flags are left as they are.
    assert found["station"] == ["01001099999"] and found["frshtt"] == ["000000"]
    assert ctx.load_dataset("gsod")["MAX_ATTRIBUTES"].tolist()[0] == "*"


def test_a_repeated_far_out_sentinel_is_named_but_kept(ctx: ToolContext, files: Path) -> None:
    elevations = [120, 340, -9999, 55, -9999, 812]
    (files / "sites.csv").write_text(
        "site,elev,price\n"
        + "".join(f"s{i},{e},{9999 if i % 2 else 7999}\n" for i, e in enumerate(elevations)),
        "utf-8",
    )

    ok = ok_of(load_dataset({"path": "sites.csv"}, ctx))

    # A price of 9999 among ones of 7999 is not far from them: not named.
    assert kinds(ok) == ["possible_sentinels"]
    assert warning(ok, "possible_sentinels").details["columns"] == {"elev": {"-9999": 2}}
    assert ctx.load_dataset("sites")["elev"].tolist() == elevations


# --------------------------------------------------------------------------------------------
# lists of uint64 with nulls

BIG = 2**53 + 1  # a float rounds it to 2**53
HUGE = 2**64 - 1  # past int64


def test_lists_of_uint64_with_nulls_stay_exact_in_every_tool(ctx: ToolContext, files: Path) -> None:
    table = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "ids": pa.array([[BIG, None], None, [7]], pa.list_(pa.uint64())),
            "huge": pa.array([[HUGE, None], [1], None], pa.list_(pa.uint64())),
            "nested": pa.array([[[BIG, None]], [[1]], None], pa.list_(pa.list_(pa.uint64()))),
            "whole": pa.array([[HUGE], [1], None], pa.list_(pa.uint64())),
        }
    )
    pq.write_table(table, files / "u.parquet")

    ok = ok_of(load_dataset({"path": "u.parquet"}, ctx))

    # Before: [9007199254740992.0, nan] (rounded) and 1.8446744073709552e+19.
    changed = warning(ok, "unsigned_lists").details["columns"]
    assert set(changed) == {"ids", "huge", "nested"}
    stored = ctx.load_dataset("u")
    assert stored["ids"].tolist()[0] == [BIG, None]
    assert [int(v) if v is not None else None for v in stored["huge"].tolist()[0]] == [HUGE, None]
    assert stored["nested"].tolist()[0] == [[BIG, None]]
    assert list(stored["whole"].tolist()[0]) == [HUGE]  # no nulls: uint64 arrays, exact
    found = rows(
        "SELECT typeof(ids) AS t, typeof(huge) AS th, ids[1] AS first, huge[1] = "
        f"{HUGE} AS exact, nested[1][1] AS deep FROM u ORDER BY id",
        ctx,
    )
    assert found["t"][0] == "BIGINT[]" and found["th"][0] == "DECIMAL(20,0)[]"
    assert found["first"][0] == BIG and found["exact"][0] is True
    assert found["deep"][0] == BIG
    shown = preview_data({"name": "u"}, ctx).content
    assert str(BIG) in shown and str(HUGE) in shown
    assert described("u", ctx).loc["ids", "null_count"] == 1


def test_a_query_result_of_uint64_lists_with_nulls_is_saved_exactly(ctx: ToolContext) -> None:
    sql = f"SELECT [{HUGE}::UBIGINT, NULL] AS h, [{BIG}::UBIGINT, NULL] AS b"

    ok = ok_of(query({"sql": sql, "save_as": "big"}, ctx))

    assert "unsigned_lists" in kinds(ok)
    assert ok.data["b"].tolist()[0] == [BIG, None]
    saved = ctx.load_dataset("big")
    assert saved["b"].tolist()[0] == [BIG, None]
    assert int(saved["h"].tolist()[0][0]) == HUGE
    found = rows(f"SELECT h[1] = {HUGE} AS exact, b[1] AS b FROM big", ctx)
    assert found == {"exact": [True], "b": [BIG]}


def test_parquet_whose_pandas_metadata_names_arrow_backed_dtypes_loads(
    ctx: ToolContext, files: Path
) -> None:
    """pandas writes an Arrow-backed column's dtype into the file's metadata as
    'list<item: uint64>[pyarrow]', which pandas cannot parse back (TypeError): the load failed
    with an internal error. The Arrow types alone now decide."""
    frame = pd.DataFrame(
        {
            "id": [1, 2, 3],
            "tags": pd.Series(
                [["a", "b"], None, ["c"]], dtype=pd.ArrowDtype(pa.list_(pa.string()))
            ),
            "ids": pd.Series([[1, None], [2], None], dtype=pd.ArrowDtype(pa.list_(pa.uint64()))),
        }
    )
    frame.to_parquet(files / "arrow_backed.parquet")

    ok = ok_of(load_dataset({"path": "arrow_backed.parquet"}, ctx))

    assert names(ok) == ["id", "tags", "ids"]
    found = rows("SELECT id, len(tags) AS n, ids[1] AS first FROM arrow_backed ORDER BY id", ctx)
    assert found["id"] == [1, 2, 3]
    assert found["n"][0] == 2 and found["first"][1] == 2
