"""render_envelope: the text the model reads. The rendering is the model-facing contract; every
template is locked by the golden snapshots in tests/golden/render/.

    Ok                ✓ ok. N row(s).  + schema line + bounded preview (true count, elided rows)
    Hint(schema)      ⚠ schema hint: … + "did you mean:" ranked alternatives
    Hint(fetch)       ⚠ fetch hint: …  + an "add:" or "narrow:" line per alternative
    Hint(ambiguous)   ⚠ ambiguous: …   + "pick one:" candidates
    Err               ✗ error (kind): message
    Ok.warnings       ⚠ <kind>: <message> inline in an otherwise successful render

The preview of a table is a window, never the whole table: at most PREVIEW_ROWS rows and the
columns that fit PREVIEW_COLUMNS / TABLE_WIDTH, aligned by display width. The status line states
the true row count (Ok.rows) and marker lines say what was left out:
`... (N more rows) ...`, `... (N earlier rows) ...` and `... (N more columns: a, b) ...`.
A DataFrame that is a slice of a larger result (`df.iloc[k:k + n]`, whose RangeIndex starts at
k) is marked as such. An Ok without a table (a text, render or status tool) renders as `✓ ok.`
followed by its text or JSON."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from shared.contract.envelope import Alternative, ColumnSpec, Envelope, Err, Hint, Ok
from shared.contract.table import (
    COLUMN_GAP,
    FormattedColumn,
    escape_controls,
    fit,
    format_columns,
    lay_out,
)

PREVIEW_ROWS = 10
PREVIEW_COLUMNS = 20
TABLE_WIDTH = 160  # display columns of a preview line before further columns are left out
NAMED_HIDDEN_COLUMNS = 10  # hidden columns listed by name in the marker line
OK_PREFIX = "✓ ok."
# Data rendered as JSON (one encoder for every call; it keeps no state between calls).
_INDENTED = json.JSONEncoder(ensure_ascii=False, indent=2, default=str)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _column_name(name: str) -> str:
    """A column name as written in the schema line: quoted when it could be misread."""
    if not name or any(c.isspace() or c in ',"()' for c in name):
        return json.dumps(name, ensure_ascii=False)
    return escape_controls(name)


def schema_line(schema: list[ColumnSpec]) -> str:
    """`schema: name dtype, …` with the null count of columns that have nulls."""
    parts = []
    for col in schema:
        part = f"{_column_name(col.name)} {col.dtype}"
        if col.null_count:
            part += f" ({col.null_count} null)"
        parts.append(part)
    return "schema: " + ", ".join(parts)


def _window_offset(df: pd.DataFrame, total_rows: int) -> int:
    """Where `df` starts in the full result: the start of a positional RangeIndex when that is
    consistent with the true row count, else 0."""
    index = df.index
    if (
        isinstance(index, pd.RangeIndex)
        and index.step == 1
        and index.start > 0
        and index.start + len(df) <= total_rows
    ):
        return int(index.start)
    return 0


def _hidden_columns_marker(names: list[str]) -> str:
    listed = ", ".join(fit(n) for n in names[:NAMED_HIDDEN_COLUMNS])
    if len(names) > NAMED_HIDDEN_COLUMNS:
        listed += ", …"
    return f"... ({len(names)} more {'column' if len(names) == 1 else 'columns'}: {listed}) ..."


def preview(df: pd.DataFrame, total_rows: int) -> list[str]:
    """The bounded, honestly labelled preview lines of a table whose full result has
    `total_rows` rows."""
    if df.shape[1] == 0:
        return ["(no columns)"]
    if total_rows == 0 and len(df) == 0:
        return ["(no rows)"]
    offset = _window_offset(df, total_rows)
    shown = df.iloc[:PREVIEW_ROWS]
    lines: list[str] = []
    if offset:
        lines.append(f"... ({_plural(offset, 'earlier row')}) ...")
    if len(shown) == 0:
        lines.append(f"... ({_plural(total_rows - offset, 'row')} not shown) ...")
        return lines
    columns = format_columns(shown, PREVIEW_COLUMNS)
    kept: list[FormattedColumn] = []
    used = 0
    for column in columns:
        width = column.width + (len(COLUMN_GAP) if kept else 0)
        if kept and used + width > TABLE_WIDTH:
            break
        kept.append(column)
        used += width
    lines.extend(lay_out(kept, len(shown)))
    after = max(0, total_rows - offset - len(shown))
    if after:
        lines.append(f"... ({_plural(after, 'more row')}) ...")
    if len(kept) < df.shape[1]:
        lines.append(_hidden_columns_marker([str(c) for c in df.columns[len(kept) :]]))
    return lines


def _render_data(data: Any) -> list[str]:
    if data is None:
        return []
    if isinstance(data, str):
        return [data] if data else []
    try:
        return [_INDENTED.encode(data)]
    except (TypeError, ValueError):  # circular structures
        return [str(data)]


def render_ok(ok: Ok) -> str:
    lines: list[str] = []
    if ok.schema or isinstance(ok.data, pd.DataFrame) or ok.rows:
        lines.append(f"{OK_PREFIX} {ok.rows} row(s).")
        if ok.schema:
            lines.append(schema_line(ok.schema))
        if isinstance(ok.data, pd.DataFrame):
            lines.extend(preview(ok.data, ok.rows))
        else:
            lines.extend(_render_data(ok.data))
    else:
        lines.append(OK_PREFIX)
        lines.extend(_render_data(ok.data))
    lines.extend(f"⚠ {w.kind}: {w.message}" for w in ok.warnings)
    return "\n".join(lines)


def _ranked(alternatives: list[Alternative]) -> list[Alternative]:
    """Best first; equal scores keep the order the tool gave."""
    return sorted(alternatives, key=lambda a: -a.score)


def _candidate(alt: Alternative) -> str:
    return f"{escape_controls(alt.label)} ({alt.score:.2f})"


def render_hint(hint: Hint) -> str:
    ranked = _ranked(hint.alternatives)
    if hint.hint_kind == "schema":
        lines = [f"⚠ schema hint: {hint.message}"]
        if ranked:
            lines.append("did you mean: " + ", ".join(_candidate(a) for a in ranked))
    elif hint.hint_kind == "fetch":
        lines = [f"⚠ fetch hint: {hint.message}"]
        for alt in ranked:
            action = "narrow" if alt.details.get("action") == "narrow" else "add"
            lines.append(f"{action}: {escape_controls(alt.label)}")
    else:
        lines = [f"⚠ ambiguous: {hint.message}"]
        if ranked:
            lines.append("pick one: " + " | ".join(_candidate(a) for a in ranked))
    return "\n".join(lines)


def render_err(err: Err) -> str:
    return f"✗ error ({err.err_kind}): {err.message}"


def render_envelope(envelope: Envelope) -> str:
    """The model-facing text of an envelope."""
    if isinstance(envelope, Ok):
        return render_ok(envelope)
    if isinstance(envelope, Hint):
        return render_hint(envelope)
    return render_err(envelope)


def strip_ok_status(content: str) -> str:
    """Content as data for another tool: drop a leading `✓ ok.` status line, keep Hint/Err."""
    if not content.startswith(OK_PREFIX):
        return content
    first, _, rest = content.partition("\n")
    remainder = first[len(OK_PREFIX) :].strip()
    # "✓ ok. N row(s)." carries the count; plain "✓ ok." carries nothing.
    return rest if not remainder or remainder.endswith("row(s).") else content
