"""The model-facing rendering is locked by golden snapshots (tests/golden/render/<case>.txt): every
template — Ok with its schema line and bounded preview, the three Hints, Err and inline warnings —
including unicode, wide tables, nulls, long cells and empty results.

A rendering change shows up as a unified diff. When it is intended, rewrite the snapshots and
review them like code:

    UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/contract/test_render_golden.py
    git diff tests/golden/
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from shared.contract import (
    Alternative,
    ColumnSpec,
    Envelope,
    Err,
    Hint,
    Ok,
    Warning,
    render_envelope,
)
from shared.contract.envelope import infer_schema
from shared.contract.table import display_width

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden" / "render"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def schema(*columns: tuple[str, str] | tuple[str, str, int]) -> list[ColumnSpec]:
    """Explicit schemas: the goldens lock rendering, not pandas' dtype names."""
    return [
        ColumnSpec(name=c[0], dtype=c[1], null_count=c[2] if len(c) > 2 else 0) for c in columns
    ]


def people() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": [1, 2, 3, 4, 5],
            "name": ["Ada", "Grace", "Linus", "Margaret", "Zoë"],
            "city": ["London", "Arlington", "Helsinki", "Boston", "Zürich"],
            "age": [36.0, 45.0, 28.0, np.nan, np.nan],
            "joined": pd.to_datetime(
                ["2021-03-01", "2020-11-15", "2022-01-20", "2019-07-04", "2023-05-05"]
            ),
        }
    )


PEOPLE_SCHEMA = schema(
    ("id", "int64"),
    ("name", "string"),
    ("city", "string"),
    ("age", "float64", 2),
    ("joined", "datetime64[ns]"),
)


def numbers(n: int) -> pd.DataFrame:
    return pd.DataFrame({"n": range(n), "square": [i * i for i in range(n)]})


NUMBERS_SCHEMA = schema(("n", "int64"), ("square", "int64"))


def ok_table() -> Envelope:
    return Ok(rows=5, schema=PEOPLE_SCHEMA, data=people())


def ok_table_elided() -> Envelope:
    return Ok(rows=25, schema=NUMBERS_SCHEMA, data=numbers(25))


def ok_window() -> Envelope:
    # preview_data(offset=10, limit=5) of a 25-row dataset: a slice keeping its RangeIndex.
    return Ok(rows=25, schema=NUMBERS_SCHEMA, data=numbers(25).iloc[10:15])


def ok_truncated_result() -> Envelope:
    # query's shape: the true count is 5000, the payload holds the first 1000 rows.
    return Ok(
        rows=5000,
        schema=NUMBERS_SCHEMA,
        data=numbers(1000),
        warnings=[
            Warning(
                "truncated",
                "returned the first 1000 of 5000 rows; aggregate or filter in SQL, or raise "
                "limit (at most 10000)",
            )
        ],
    )


def ok_unicode() -> Envelope:
    df = pd.DataFrame(
        {
            "città": ["Zürich", "東京", "São Paulo", "Ελλάδα", "القاهرة", "Montréal"],
            "人口": [421_878, 13_960_000, 12_330_000, 10_400_000, 9_540_000, 1_762_949],
            "note": ["ok", "全角の文字", "e\u0301 combining", "emoji 🎉", "rtl", "naïve café"],
        }
    )
    return Ok(
        rows=6, schema=schema(("città", "string"), ("人口", "int64"), ("note", "string")), data=df
    )


def ok_wide() -> Envelope:
    columns: dict[str, list[Any]] = {
        f"metric_{i:02d}": [round(i * 1.5 + r, 2) for r in range(3)] for i in range(30)
    }
    columns["a long descriptive column name"] = ["x", "y", "z"]
    df = pd.DataFrame(columns)
    return Ok(
        rows=3,
        schema=[
            ColumnSpec(str(c), "float64" if c.startswith("metric") else "string", 0)
            for c in df.columns
        ],
        data=df,
    )


def ok_long_cells() -> Envelope:
    df = pd.DataFrame(
        {
            "text": [
                "A sentence that is much longer than the forty display columns a cell may take.",
                "line one\nline two\ttabbed",
                "東京都は日本の首都であり、世界最大級の都市圏を持つ。",
            ],
            "payload": [{"a": 1, "b": [1, 2]}, [1, "two", None], b"\x00\x01bytes"],
        }
    )
    return Ok(rows=3, schema=schema(("text", "string"), ("payload", "object")), data=df)


def ok_nulls() -> Envelope:
    df = pd.DataFrame(
        {
            "maybe_int": pd.array([1, None, 3], dtype="Int64"),
            "maybe_float": [1.5, np.nan, float("inf")],
            "maybe_text": ["a", None, ""],
            "maybe_bool": pd.array([True, None, False], dtype="boolean"),
            "maybe_time": pd.to_datetime(
                pd.Series(["2024-01-02 03:04:05", None, "2024-12-31 23:59:59"])
            ),
        }
    )
    return Ok(
        rows=3,
        schema=schema(
            ("maybe_int", "Int64", 1),
            ("maybe_float", "float64", 1),
            ("maybe_text", "string", 1),
            ("maybe_bool", "boolean", 1),
            ("maybe_time", "datetime64[ns]", 1),
        ),
        data=df,
    )


def ok_empty_rows() -> Envelope:
    return Ok(rows=0, schema=NUMBERS_SCHEMA, data=numbers(0))


def ok_no_columns() -> Envelope:
    return Ok(rows=0, schema=[], data=pd.DataFrame())


def ok_record() -> Envelope:
    record = {"country": "CH", "population": 8_960_000, "capital": "Bern", "area_km2": 41_285.0}
    return Ok(rows=1, schema=infer_schema(record), data=record)


def ok_legacy_text() -> Envelope:
    # A coerced legacy ToolResult: its content is the data, its first dataset the schema.
    return Ok(rows=5, schema=PEOPLE_SCHEMA, data="Loaded people.csv as dataset 'people'.")


def ok_text() -> Envelope:
    return Ok(data="The corpus covers three topics:\n1. tides\n2. currents\n3. salinity")


def ok_json() -> Envelope:
    return Ok(data={"pong": True, "echo": {"ünïcode": "✓", "n": [1, 2.5, None]}})


def ok_bare() -> Envelope:
    return Ok()


def ok_warnings() -> Envelope:
    return Ok(
        rows=5,
        schema=PEOPLE_SCHEMA,
        data=people().iloc[:2],
        warnings=[
            Warning("replaced", "replaced the existing dataset 'people'"),
            Warning("contract", "load_dataset reported 5 row(s) but its data holds 6"),
        ],
    )


def hint_schema() -> Envelope:
    return Hint(
        "schema",
        "no column 'agee': Binder Error: Referenced column \"agee\" not found",
        [
            Alternative("orders.amount", 0.2),
            Alternative("people.age", 0.857),
            Alternative("people.name", 0.25),
        ],
    )


def hint_schema_bare() -> Envelope:
    return Hint(
        "schema",
        "no dataset named 'people': this conversation has no datasets yet; load a file with "
        "load_dataset first",
    )


def hint_fetch() -> Envelope:
    return Hint(
        "fetch",
        "this source returns at most 10000 rows; the request matches 2.1 million",
        [
            Alternative("a filter on `year`", 0.9, {"action": "add"}),
            Alternative("the date range to one year", 0.8, {"action": "narrow"}),
        ],
    )


def hint_ambiguous() -> Envelope:
    return Hint(
        "ambiguous",
        "'Springfield' matches two places within tolerance",
        [
            Alternative("Springfield, Illinois", 0.91),
            Alternative("Springfield, Massachusetts", 0.9),
        ],
    )


def err() -> Envelope:
    return Err(
        "refused to read '../../etc/passwd': it resolves outside the data roots",
        "PathOutsideDataRoots",
    )


def err_multiline() -> Envelope:
    return Err("the query ran longer than 60s and was cancelled\nnarrow it", "QueryTimeout")


CASES: dict[str, Callable[[], Envelope]] = {
    f.__name__: f
    for f in (
        ok_table,
        ok_table_elided,
        ok_window,
        ok_truncated_result,
        ok_unicode,
        ok_wide,
        ok_long_cells,
        ok_nulls,
        ok_empty_rows,
        ok_no_columns,
        ok_record,
        ok_legacy_text,
        ok_text,
        ok_json,
        ok_bare,
        ok_warnings,
        hint_schema,
        hint_schema_bare,
        hint_fetch,
        hint_ambiguous,
        err,
        err_multiline,
    )
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_rendering_matches_its_golden_snapshot(case: str) -> None:
    rendered = render_envelope(CASES[case]()) + "\n"
    path = GOLDEN_DIR / f"{case}.txt"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(
            f"no golden snapshot {path.relative_to(GOLDEN_DIR.parents[1])}; create it with "
            "UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/contract/test_render_golden.py",
            pytrace=False,
        )
    golden = path.read_text(encoding="utf-8")
    if rendered != golden:
        diff = "".join(
            difflib.unified_diff(
                golden.splitlines(keepends=True),
                rendered.splitlines(keepends=True),
                fromfile=f"tests/golden/render/{case}.txt",
                tofile="render_envelope()",
            )
        )
        pytest.fail(
            f"the rendering of {case!r} differs from its golden snapshot:\n{diff}\n"
            "If the change is intended: UPDATE_GOLDEN=1 .venv/bin/pytest "
            "tests/unit/contract/test_render_golden.py, then review `git diff tests/golden/`.",
            pytrace=False,
        )


def test_every_snapshot_file_belongs_to_a_case() -> None:
    assert sorted(p.stem for p in GOLDEN_DIR.glob("*.txt")) == sorted(CASES)


def test_the_snapshots_cover_all_six_templates() -> None:
    rendered = [render_envelope(make()) for make in CASES.values()]
    firsts = [text.splitlines()[0] for text in rendered]
    assert any(f.startswith("✓ ok. ") and f.endswith(" row(s).") for f in firsts)
    assert any(f.startswith("⚠ schema hint: ") for f in firsts)
    fetch = [t for t in rendered if t.startswith("⚠ fetch hint: ")]
    assert fetch and "\nadd: " in fetch[0] and "\nnarrow: " in fetch[0]
    assert any(f.startswith("⚠ ambiguous: ") for f in firsts)
    assert any(f.startswith("✗ error (") for f in firsts)
    assert any(t.startswith("✓ ok.") and "\n⚠ " in t for t in rendered)


def test_unicode_columns_line_up_by_display_width() -> None:
    lines = render_envelope(ok_unicode()).splitlines()[2:]  # header and rows
    header = lines[0]
    for line in lines[1:]:
        # The last column starts at the same display column on every line.
        last_cell = line.rsplit("  ", 1)[1].strip()
        start = display_width(line[: line.rindex(last_cell)])
        assert start == display_width(header[: header.index("note")]), line


def test_the_preview_always_states_the_true_row_count_and_what_was_left_out() -> None:
    text = render_envelope(ok_truncated_result())
    assert text.startswith("✓ ok. 5000 row(s).")
    assert "... (4990 more rows) ..." in text
    window = render_envelope(ok_window())
    assert "... (10 earlier rows) ..." in window and "... (10 more rows) ..." in window
    assert "... (" in render_envelope(ok_wide()) and "more columns:" in render_envelope(ok_wide())
