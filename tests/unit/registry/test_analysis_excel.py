"""load_dataset on Excel workbooks (.xlsx/.xlsm), as statistical offices and finance teams
publish them: a notes sheet before the table, a title above it, notes below, dates as dates,
errors in cells, a total row — and hostile ones: a ZIP bomb dressed as a workbook, XML entity
expansion, a file that only says it is a workbook. Workbooks are written with openpyxl."""

from __future__ import annotations

import datetime
import io
import re
import resource
import threading
import zipfile
from pathlib import Path

import openpyxl
import pandas as pd
import pytest

from services.registry.context import (
    CallCancelled,
    ToolContext,
    cancellable,
    reset_cancellation,
)
from services.registry.datasets import SqlDatasetStore
from services.registry.tools import analysis
from services.registry.tools.analysis import DatasetTooLarge, load_dataset, query
from shared.contract import HintException

from .analysis_support import kinds, make_context, ok_of, warning_of


def published_workbook(path: Path) -> None:
    """A workbook as an agency publishes one: a notes sheet first, then the table under a
    title and a blank row, with a total row, an error cell and a note below it; a hidden
    sheet; a chart-like summary sheet after it."""
    book = openpyxl.Workbook()
    notes = book.active
    assert notes is not None
    notes.title = "Notes"
    notes.append(["About this table"])
    notes.append(["Source: Ministry of Examples"])
    table = book.create_sheet("Table 1")
    table.append(["Table 1: Visits by region, 2024"])
    table.append([])
    table.append(["Region", "Opened", "Visits", "Share", "Code"])
    table.append(["North", datetime.datetime(2024, 1, 5), 1200, 0.25, "007"])
    table.append(["South", datetime.datetime(2024, 2, 10), 2400, 0.5, "012"])
    table.append(["East", datetime.datetime(2024, 3, 1), 1200, None, "120"])
    table["D6"] = "#DIV/0!"  # as a cached formula result
    table.append(["Total", None, 4800, None, None])
    table.append([])
    table.append(["Note: figures are provisional."])
    hidden = book.create_sheet("Lookup")
    hidden.append(["k", "v"])
    hidden.sheet_state = "hidden"
    summary = book.create_sheet("Summary")
    summary.append(["metric", "value"])
    summary.append(["regions", 3])
    book.save(path)


def test_a_published_workbook_loads_its_table_like_its_csv_export_would(
    ctx: ToolContext, files: Path
) -> None:
    published_workbook(files / "Visits 2024.xlsx")

    ok = ok_of(load_dataset({"path": "Visits 2024.xlsx"}, ctx))

    found = kinds(ok)
    assert {"sheets", "excel_errors", "total_row", "footnotes"} <= set(found), found
    sheets = next(w for w in ok.warnings if w.kind == "sheets")
    assert sheets.details == {"sheet": "Table 1", "others": ["Notes", "Summary"]}
    errors = next(w for w in ok.warnings if w.kind == "excel_errors")
    assert errors.details == {"errors": {"#DIV/0!": 1}}
    stored = ctx.load_dataset("visits_2024")
    assert list(stored.columns) == ["Region", "Opened", "Visits", "Share", "Code"]
    assert stored["Region"].tolist() == ["North", "South", "East", "Total"]
    assert stored["Opened"].tolist()[:3] == [
        pd.Timestamp("2024-01-05"),
        pd.Timestamp("2024-02-10"),
        pd.Timestamp("2024-03-01"),
    ]
    assert stored["Visits"].tolist() == [1200, 2400, 1200, 4800]
    assert stored["Share"].tolist()[:2] == [0.25, 0.5] and stored["Share"].isna().iloc[2]
    assert stored["Code"].tolist()[:3] == ["007", "012", "120"]  # text cells stay text
    sql = "SELECT count(*) AS n FROM visits_2024 WHERE Opened >= DATE '2024-02-01'"
    assert ok_of(query({"sql": sql}, ctx)).data["n"].tolist() == [2]


def test_a_sheet_is_chosen_by_name_or_position_and_an_unknown_one_is_a_hint(
    ctx: ToolContext, files: Path
) -> None:
    published_workbook(files / "visits.xlsx")

    by_name = ok_of(load_dataset({"path": "visits.xlsx", "sheet": "summary", "name": "s"}, ctx))
    by_position = ok_of(load_dataset({"path": "visits.xlsx", "sheet": 4, "name": "p"}, ctx))

    assert "sheets" not in kinds(by_name) + kinds(by_position)
    assert ctx.load_dataset("s")["value"].tolist() == [3]
    assert ctx.load_dataset("p")["metric"].tolist() == ["regions"]
    with pytest.raises(HintException) as unknown:
        load_dataset({"path": "visits.xlsx", "sheet": "Tabel 1"}, ctx)
    assert "has no sheet 'Tabel 1'" in unknown.value.message
    assert "'Table 1'" in unknown.value.message
    assert unknown.value.alternatives[0].label == "Table 1"


def test_a_workbook_named_csv_is_read_as_a_workbook(ctx: ToolContext, files: Path) -> None:
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.append(["a", "b"])
    sheet.append([1, 2.5])
    book.save(files / "export.csv")

    ok = ok_of(load_dataset({"path": "export.csv"}, ctx))

    assert "format" in kinds(ok)
    assert ctx.load_dataset("export")["b"].tolist() == [2.5]


def test_a_zip_bomb_dressed_as_a_workbook_is_refused_before_it_is_parsed(
    tmp_path: Path, files: Path, store: SqlDatasetStore
) -> None:
    small = make_context(tmp_path, store, max_dataset_bytes=1 << 20)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("xl/workbook.xml", "<workbook/>")
        archive.writestr("xl/sharedStrings.xml", b"\0" * (8 << 20))  # compresses to ~8 KB
    (files / "bomb.xlsx").write_bytes(buffer.getvalue())

    with pytest.raises(DatasetTooLarge, match="decompress to"):
        load_dataset({"path": "bomb.xlsx"}, small)


def test_xml_entity_expansion_in_a_workbook_is_refused(ctx: ToolContext, files: Path) -> None:
    """A billion-laughs DTD in a sheet: parsed without defusedxml, entities nested a few levels
    deeper than here would expand to gigabytes in the registry's memory."""
    path = files / "laughs.xlsx"
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.append(["name", "n"])
    sheet.append(["x", 1])
    book.save(path)
    dtd = (
        '<!DOCTYPE worksheet [<!ENTITY lol "lol">'
        '<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">'
        '<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>'
    )
    rewritten = io.BytesIO()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(rewritten, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "xl/worksheets/sheet1.xml":
                text = data.decode()
                root = text.index("<worksheet")
                text = text[:root] + dtd + text[root:]
                assert "<t>x</t>" in text
                data = text.replace("<t>x</t>", "<t>&lol3;</t>").encode()
            dst.writestr(info, data)
    path.write_bytes(rewritten.getvalue())

    with pytest.raises(HintException) as refused:
        load_dataset({"path": "laughs.xlsx"}, ctx)

    assert "could not read" in refused.value.message and "laughs.xlsx" in refused.value.message


def hollow_workbook() -> bytes:
    """A ZIP archive with a workbook part's name and nothing a workbook needs."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("[Content_Types].xml", "<?xml version='1.0'?><Types/>")
        archive.writestr("xl/workbook.xml", "<?xml version='1.0'?><workbook/>")
        archive.writestr("xl/worksheets/sheet1.xml", "<?xml version='1.0'?><worksheet/>")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        ("broken.xlsx", b"PK\x03\x04 not really a zip", "could not read 'broken.xlsx'"),
        ("book.xlsx", hollow_workbook(), "could not read 'book.xlsx' as an Excel workbook"),
        # Named CSV: before, a one-column table of the archive's bytes.
        ("export.csv", hollow_workbook(), "could not read 'export.csv' as an Excel workbook"),
        (
            "old.xls",
            b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 64,
            "could not read 'old.xls' as an Excel 97-2003 workbook",
        ),
    ],
)
def test_workbooks_it_cannot_read_are_hints_that_say_why(
    ctx: ToolContext, files: Path, name: str, data: bytes, expected: str
) -> None:
    (files / name).write_bytes(data)

    with pytest.raises(HintException) as refused:
        load_dataset({"path": name}, ctx)

    assert expected in refused.value.message


def test_an_empty_workbook_sheet_is_a_hint(ctx: ToolContext, files: Path) -> None:
    openpyxl.Workbook().save(files / "empty.xlsx")

    with pytest.raises(HintException, match="is empty"):
        load_dataset({"path": "empty.xlsx"}, ctx)


def test_merged_group_labels_over_the_column_headers_name_the_columns(
    ctx: ToolContext, files: Path
) -> None:
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.append(["Region", 2023, None, 2024, None])
    sheet.merge_cells("B1:C1")
    sheet.merge_cells("D1:E1")
    sheet.append([None, "Q1", "Q2", "Q1", "Q2"])
    sheet.append(["North", 10, 11.5, 12, 13])
    sheet.append(["South", 20, 21, 22, 23])
    book.save(files / "quarters.xlsx")

    ok = ok_of(load_dataset({"path": "quarters.xlsx"}, ctx))

    assert "header_rows" in kinds(ok)
    stored = ctx.load_dataset("quarters")
    assert list(stored.columns) == ["Region", "2023 Q1", "2023 Q2", "2024 Q1", "2024 Q2"]
    assert stored["2023 Q2"].tolist() == [11.5, 21.0]


def test_a_cancelled_load_stops_reading_a_sheet_of_empty_styled_rows(
    ctx: ToolContext, files: Path
) -> None:
    """A sheet of many styled but empty rows writes nothing the byte limit would stop: only
    the call's cancellation (or timeout) does, between rows."""
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.append(["a", "b"])
    for row in range(2, 5000):
        sheet.cell(row=row, column=1).number_format = "0.00"  # styled, no value
    book.save(files / "styled.xlsx")
    event = threading.Event()
    event.set()
    token = cancellable(event)
    try:
        with pytest.raises(CallCancelled):
            load_dataset({"path": "styled.xlsx"}, ctx)
    finally:
        reset_cancellation(token)


@pytest.mark.parametrize("chunk", [1 << 20, 7])  # 7: every merge tag cut across chunks
def test_a_category_merged_down_its_rows_labels_each_of_them(
    ctx: ToolContext, files: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """A report's region merged over its three rows: only the first row had it, and a GROUP
    BY region counted the others under NULL."""
    monkeypatch.setattr(analysis, "READ_CHUNK_BYTES", chunk)
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.append(["Region", "City", "Sales"])
    for region, city, sales in [
        ("North", "Oslo", 1),
        (None, "Tromsø", 2),
        (None, "Bodø", 3),
        ("South", "Rome", 4),
        (None, "Bari", 5),
    ]:
        sheet.append([region, city, sales])
    sheet.merge_cells("A2:A4")
    sheet.merge_cells("A5:A6")
    book.save(files / "report.xlsx")

    ok = ok_of(load_dataset({"path": "report.xlsx"}, ctx))

    assert warning_of(ok, "merged_cells").details == {"ranges": 2}
    assert ctx.load_dataset("report")["Region"].tolist() == ["North"] * 3 + ["South"] * 2
    sql = "SELECT Region, sum(Sales) AS s FROM report GROUP BY Region ORDER BY Region"
    assert ok_of(query({"sql": sql}, ctx)).data.to_dict("list") == {
        "Region": ["North", "South"],
        "s": [6, 9],
    }


def test_formulas_saved_without_values_are_named_not_silently_empty(
    ctx: ToolContext, files: Path
) -> None:
    """A workbook a script wrote (openpyxl, like most libraries, does not calculate): its
    formula cells have no saved value and read as empty."""
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.append(["price", "qty", "total"])
    sheet.append([2.5, 4, "=A2*B2"])
    sheet.append([1.0, 3, "=A3*B3"])
    book.save(files / "scripted.xlsx")

    ok = ok_of(load_dataset({"path": "scripted.xlsx"}, ctx))

    assert warning_of(ok, "uncalculated_formulas").details == {"cells": 2}
    assert ctx.load_dataset("scripted")["total"].isna().all()


@pytest.mark.parametrize(
    ("xml", "found"),
    [
        (b'<c r="C2"><f>A2*B2</f></c>', 1),
        (b'<c r="C2"><f>A2*B2</f><v /></c>', 1),  # as openpyxl writes it
        (b'<c r="C2"><f>A2*B2</f><v></v></c>', 1),
        (b'<c r="C2"><f>A2*B2</f><v>10</v></c>', 0),  # calculated: read as its value
        (b'<x:c r="C2"><x:f t="shared" si="0"/></x:c>', 1),
        (b'<c r="C2"><v>3</v></c>', 0),
    ],
)
def test_uncalculated_formula_cells_are_recognised_in_the_sheet_xml(xml: bytes, found: int) -> None:
    assert len(analysis._UNCALCULATED_RE.findall(xml)) == found


def test_a_row_label_header_merged_down_both_header_rows_is_one_column(
    ctx: ToolContext, files: Path
) -> None:
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.append(["Country", "Population", None, "GDP", None])
    sheet.append([None, 2022, 2023, 2022, 2023])
    sheet.merge_cells("A1:A2")  # "Country" spans both header rows
    sheet.merge_cells("B1:C1")
    sheet.merge_cells("D1:E1")
    sheet.append(["Norway", 5.46, 5.52, 579, 485])
    sheet.append(["Chile", 19.6, 19.63, 301, 335])
    book.save(files / "countries.xlsx")

    ok = ok_of(load_dataset({"path": "countries.xlsx"}, ctx))

    assert warning_of(ok, "header_rows").details["columns"] == [
        "Country",
        "Population 2022",
        "Population 2023",
        "GDP 2022",
        "GDP 2023",
    ]
    assert ctx.load_dataset("countries")["Country"].tolist() == ["Norway", "Chile"]


# --------------------------------------------------------------------------------------------
# OpenDocument spreadsheets (.ods), written by hand: no library here writes them

ODS_NS = (
    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" '
    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"'
)


def ods_cell(value: object) -> str:
    if value is None:
        return "<table:table-cell/>"
    if isinstance(value, datetime.date):
        return (
            f'<table:table-cell office:value-type="date" office:date-value="{value.isoformat()}">'
            f"<text:p>{value}</text:p></table:table-cell>"
        )
    if isinstance(value, (int, float)):
        return (
            f'<table:table-cell office:value-type="float" office:value="{value}">'
            f"<text:p>{value}</text:p></table:table-cell>"
        )
    return (
        f'<table:table-cell office:value-type="string"><text:p>{value}</text:p></table:table-cell>'
    )


def ods_bytes(sheets: dict[str, list[list[object]]], doctype: str = "") -> bytes:
    tables = "".join(
        f'<table:table table:name="{name}">'
        + "".join(
            "<table:table-row>" + "".join(ods_cell(v) for v in row) + "</table:table-row>"
            for row in rows
        )
        + "</table:table>"
        for name, rows in sheets.items()
    )
    content = (
        f'<?xml version="1.0" encoding="UTF-8"?>{doctype}<office:document-content {ODS_NS} '
        f'office:version="1.2"><office:body><office:spreadsheet>{tables}'
        "</office:spreadsheet></office:body></office:document-content>"
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(
            zipfile.ZipInfo("mimetype"), "application/vnd.oasis.opendocument.spreadsheet"
        )
        archive.writestr("content.xml", content)
        archive.writestr(
            "META-INF/manifest.xml",
            '<?xml version="1.0" encoding="UTF-8"?><manifest:manifest xmlns:manifest='
            '"urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" manifest:version="1.2">'
            '<manifest:file-entry manifest:full-path="/" manifest:media-type='
            '"application/vnd.oasis.opendocument.spreadsheet"/><manifest:file-entry '
            'manifest:full-path="content.xml" manifest:media-type="text/xml"/></manifest:manifest>',
        )
    return buffer.getvalue()


def test_an_opendocument_spreadsheet_loads_like_a_workbook(ctx: ToolContext, files: Path) -> None:
    """As UK government statistics are published: a cover sheet, then the table under a
    title."""
    (files / "stats.ods").write_bytes(
        ods_bytes(
            {
                "Cover": [["Statistics release"], ["Contact: stats@example.org"]],
                "Table_1": [
                    ["Table 1: Visits"],
                    [],
                    ["Region", "Opened", "Visits"],
                    ["North", datetime.date(2024, 1, 5), 1200],
                    ["South", datetime.date(2024, 2, 10), 2400.5],
                ],
            }
        )
    )

    ok = ok_of(load_dataset({"path": "stats.ods"}, ctx))

    assert warning_of(ok, "sheets").details == {"sheet": "Table_1", "others": ["Cover"]}
    stored = ctx.load_dataset("stats")
    assert list(stored.columns) == ["Region", "Opened", "Visits"]
    assert stored["Opened"].tolist() == [pd.Timestamp("2024-01-05"), pd.Timestamp("2024-02-10")]
    assert stored["Visits"].tolist() == [1200.0, 2400.5]
    cover = ok_of(load_dataset({"path": "stats.ods", "sheet": "cover", "name": "cover"}, ctx))
    assert cover.rows >= 1


def test_an_opendocument_spreadsheet_expands_no_entities_and_a_broken_one_is_a_hint(
    ctx: ToolContext, files: Path
) -> None:
    laughs = (
        '<!DOCTYPE office:document-content [<!ENTITY lol "lol">'
        '<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>'
    )
    data = ods_bytes({"S": [["a", "b"], ["&lol2;", 1]]}, doctype=laughs)
    (files / "laughs.ods").write_bytes(data)
    (files / "broken.ods").write_bytes(b"PK\x03\x04 not a spreadsheet")

    try:
        loaded = ok_of(load_dataset({"path": "laughs.ods"}, ctx))
    except HintException as refused:
        assert "could not read 'laughs.ods'" in refused.message
    else:
        assert "lollol" not in str(ctx.load_dataset("laughs").to_dict()), loaded
    with pytest.raises(HintException, match=r"could not read 'broken\.ods'"):
        load_dataset({"path": "broken.ods"}, ctx)


# Excel 97-2003 workbooks (.xls): tests/fixtures/sales.xls was written by xlwt 1.3.0 — a sheet
# "sales" (header; text, integers, floats, dates formatted YYYY-MM-DD; one empty cell) and a
# hidden sheet "notes".

SALES_XLS = Path(__file__).resolve().parents[2] / "fixtures" / "sales.xls"


def test_an_excel_97_2003_workbook_loads_like_a_workbook(ctx: ToolContext, files: Path) -> None:
    (files / "Sales 2024.xls").write_bytes(SALES_XLS.read_bytes())

    ok = ok_of(load_dataset({"path": "Sales 2024.xls"}, ctx))

    stored = ctx.load_dataset("sales_2024")
    assert list(stored.columns) == ["region", "units", "price", "day", "note"]
    assert stored["region"].tolist() == ["north", "south", "east"]
    assert stored["units"].tolist() == [12, 7, 0]
    assert stored["price"].tolist() == [3.5, 4.25, 10.0]
    assert stored["day"].tolist() == [
        pd.Timestamp("2024-01-05"),
        pd.Timestamp("2024-01-06"),
        pd.Timestamp("2024-02-29"),
    ]
    assert stored["note"].tolist()[0] == "first" and pd.isna(stored["note"].tolist()[1])
    assert "sheets" not in kinds(ok)  # the only visible sheet; the hidden one is not offered
    notes = ok_of(load_dataset({"path": "Sales 2024.xls", "sheet": 2, "name": "n"}, ctx))
    assert notes.rows >= 0 and ctx.load_dataset("n").shape[1] >= 1


def test_an_excel_97_2003_workbook_under_another_name_is_read_when_asked(
    ctx: ToolContext, files: Path
) -> None:
    (files / "export.csv").write_bytes(SALES_XLS.read_bytes())

    with pytest.raises(HintException) as refused:
        load_dataset({"path": "export.csv"}, ctx)
    assert "Excel 97-2003" in refused.value.message
    assert "format='excel'" in refused.value.message

    ok_of(load_dataset({"path": "export.csv", "format": "excel"}, ctx))
    assert ctx.load_dataset("export")["units"].tolist() == [12, 7, 0]


def test_an_excel_97_2003_workbook_over_the_limit_is_refused_unread(
    tmp_path: Path, files: Path, store: SqlDatasetStore
) -> None:
    small = make_context(tmp_path, store, max_dataset_bytes=1024)
    (files / "sales.xls").write_bytes(SALES_XLS.read_bytes())  # 5.5 KB

    with pytest.raises(DatasetTooLarge, match=r"'sales\.xls' is too large"):
        load_dataset({"path": "sales.xls"}, small)


def test_another_legacy_office_file_given_as_excel_is_a_hint(ctx: ToolContext, files: Path) -> None:
    # An OLE compound file that holds no workbook (as a .doc or .msg does).
    (files / "letter.doc").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(range(256)) * 8)

    with pytest.raises(HintException) as refused:
        load_dataset({"path": "letter.doc", "format": "excel"}, ctx)

    assert "could not read 'letter.doc' as an Excel 97-2003 workbook" in refused.value.message
    assert ctx.list_datasets() == []


# Spreadsheets whose grid is far larger than their file: calamine builds a sheet as one dense
# grid, so these are read in a child process capped in memory (sheet_reader.py).
# tests/fixtures/grid_bomb.xls (xlwt 1.3.0): "a" at A1 and "b" at IV65536 — 5.6 KB, a grid of
# 16.7 million cells (1 GB when read in process).

GRID_BOMB_XLS = SALES_XLS.with_name("grid_bomb.xls")


def repeated_ods(rows: int, columns: int) -> bytes:
    """An .ods whose second row is `columns` copies of one cell, repeated `rows` times."""
    table = (
        '<table:table table:name="S"><table:table-row><table:table-cell office:value-type='
        '"string"><text:p>a</text:p></table:table-cell></table:table-row>'
        f'<table:table-row table:number-rows-repeated="{rows}"><table:table-cell '
        f'table:number-columns-repeated="{columns}" office:value-type="string"><text:p>x'
        "</text:p></table:table-cell></table:table-row></table:table>"
    )
    data = ods_bytes({"S": []})
    with zipfile.ZipFile(io.BytesIO(data)) as source:
        parts = {info.filename: source.read(info) for info in source.infolist()}
    parts["content.xml"] = re.sub(
        rb"<table:table .*</table:table>", table.encode(), parts["content.xml"]
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, part in parts.items():
            archive.writestr(name, part)
    return buffer.getvalue()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("grid.xls", GRID_BOMB_XLS.read_bytes()),
        ("repeats.ods", repeated_ods(20_000, 1_000)),  # 20 million cells from ~1 KB
    ],
)
def test_a_sheet_whose_grid_dwarfs_its_file_is_refused_and_the_registry_keeps_its_memory(
    ctx: ToolContext, files: Path, name: str, data: bytes
) -> None:
    (files / name).write_bytes(data)
    before = peak_rss_mb()

    with pytest.raises(DatasetTooLarge, match=r"reading it takes more than \d+ MiB of memory"):
        load_dataset({"path": name}, ctx)

    assert peak_rss_mb() - before < 200  # read elsewhere: in process it took 1-2.5 GB
    assert ctx.list_datasets() == []
    # ... and the next spreadsheet loads as ever.
    (files / "sales.xls").write_bytes(SALES_XLS.read_bytes())
    ok_of(load_dataset({"path": "sales.xls"}, ctx))


def test_merged_cells_of_an_excel_97_2003_workbook_fill_as_in_a_workbook(
    ctx: ToolContext, files: Path
) -> None:
    """tests/fixtures/quarters.xls (xlwt 1.3.0): the quarters table of the .xlsx test above,
    year labels merged over their quarters and a region merged down its two rows."""
    (files / "quarters.xls").write_bytes(SALES_XLS.with_name("quarters.xls").read_bytes())

    ok = ok_of(load_dataset({"path": "quarters.xls"}, ctx))

    assert "header_rows" in kinds(ok) and "merged_cells" in kinds(ok)
    stored = ctx.load_dataset("quarters")
    assert list(stored.columns) == ["Region", "2023 Q1", "2023 Q2", "2024 Q1", "2024 Q2"]
    assert stored["Region"].tolist() == ["North", "North"]
    assert stored["2023 Q2"].tolist() == [11.5, 21.0]
