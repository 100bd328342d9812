"""Reads a spreadsheet with python-calamine in a child process of its own, under a memory cap.

calamine builds a sheet as one dense grid spanning its first to its last filled cell: a file of
a few kilobytes can declare a grid of millions of cells (an .xls with a cell at A1 and one at
IV65536 took 1 GB; an .ods row of a thousand repeated cells repeated 20,000 times took 2.5 GB
and 9 s). Read in the registry's own process, such a file would take the service down with it;
here the child fails alone, at RLIMIT_AS, and the caller answers with a clear refusal.

Run by services.registry.tools.analysis as

    python -I sheet_reader.py FD MAX_MEMORY_BYTES MAX_OUTPUT_BYTES

with the file open on descriptor FD. A conversation of JSON lines:
- it writes {"sheets": [{"name", "visible", "tabular"}...]} — the worksheets in workbook order;
  `tabular`: one of a sheet's first TABULAR_ROWS rows has two filled cells (see
  analysis._looks_tabular);
- it reads the position of the sheet wanted (a line holding an integer; -1: none);
- it writes {"merged": [[first row, first column, last row, last column]...]} (1-based), then
  that sheet's rows, each a JSON array of cells (trailing empty cells left out; a
  date, time, datetime or duration as {"date": iso} and the like), then {"end": true}.
A failure is {"error": message}, {"memory": true} or {"too_large": bytes}, and exit status 1; a
child whose memory runs out in calamine's Rust code is killed by the signal that follows.

Standalone on purpose (only the standard library and python_calamine): it starts in ~50 ms.
"""

from __future__ import annotations

import datetime
import json
import resource
import sys
from typing import Any

TABULAR_ROWS = 200
MAX_MERGED_RANGES = 100_000  # analysis.MAX_MERGED_RANGES


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, datetime.datetime):
        return {"datetime": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"date": value.isoformat()}
    if isinstance(value, datetime.time):
        return {"time": value.isoformat()}
    if isinstance(value, datetime.timedelta):
        return {"timedelta": value.total_seconds()}
    if isinstance(value, (str, int, float)):  # bool is an int
        return value
    return str(value)  # anything else calamine may hand over (an error cell): its text


def _tabular(rows: Any) -> bool:
    for number, row in enumerate(rows):
        if number >= TABULAR_ROWS:
            return False
        if sum(cell is not None and cell != "" for cell in row) >= 2:
            return True
    return False


class _TooLarge(Exception):
    pass


def main(argv: list[str]) -> int:
    fd, max_memory, max_output = int(argv[1]), int(argv[2]), int(argv[3])
    resource.setrlimit(resource.RLIMIT_AS, (max_memory, max_memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    out = sys.stdout
    written = 0

    def emit(item: Any) -> None:
        nonlocal written
        line = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
        written += len(line) + 1
        if written > max_output:
            raise _TooLarge(written)
        out.write(line + "\n")

    try:
        from python_calamine import CalamineWorkbook, SheetTypeEnum, SheetVisibleEnum

        # Its own open file description: the parent's offset is left alone.
        with open(f"/proc/self/fd/{fd}", "rb") as opened:
            book = CalamineWorkbook.from_filelike(opened)
        worksheets = [
            (index, meta)
            for index, meta in enumerate(book.sheets_metadata)
            if meta.typ == SheetTypeEnum.WorkSheet  # not a chart, dialog or macro sheet
        ]
        listed = []
        for index, meta in worksheets:
            visible = meta.visible == SheetVisibleEnum.Visible
            tabular = visible and _tabular(book.get_sheet_by_index(index).iter_rows())
            listed.append({"name": str(meta.name), "visible": visible, "tabular": tabular})
        emit({"sheets": listed})
        out.flush()
        wanted = int(sys.stdin.readline() or -1)
        if not 0 <= wanted < len(worksheets):
            return 0
        sheet = book.get_sheet_by_index(worksheets[wanted][0])
        ranges = getattr(sheet, "merged_cell_ranges", None) or []
        emit(
            {
                "merged": [
                    [r1 + 1, c1 + 1, r2 + 1, c2 + 1]
                    for (r1, c1), (r2, c2) in ranges[:MAX_MERGED_RANGES]
                ]
            }
        )
        for row in sheet.iter_rows():
            cells = [_cell(v) for v in row]
            while cells and cells[-1] == "":
                cells.pop()
            emit(cells)
        emit({"end": True})
    except _TooLarge as exc:
        out.write(json.dumps({"too_large": exc.args[0]}) + "\n")
        return 1
    except MemoryError:
        out.write(json.dumps({"memory": True}) + "\n")
        return 1
    except Exception as exc:  # noqa: BLE001 - calamine's errors: a corrupt or foreign file
        lines = str(exc).strip().splitlines()
        out.write(json.dumps({"error": f"{type(exc).__name__}: {lines[0] if lines else ''}"}))
        out.write("\n")
        return 1
    finally:
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
