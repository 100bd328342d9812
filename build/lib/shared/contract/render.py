"""render_envelope: the text the model reads. The rendering is the model-facing contract; every
template is locked by golden snapshot tests.

    Ok                ✓ ok. N row(s).  + schema line + bounded preview (true count, elided rows)
    Hint(schema)      ⚠ schema hint: … + "did you mean:" ranked alternatives
    Hint(fetch)       ⚠ fetch hint: …  + an "add:" or "narrow:" line
    Hint(ambiguous)   ⚠ ambiguous: …   + "pick one:" candidates
    Err               ✗ error (kind): message
    Ok.warnings       ⚠ <kind>: <message> inline in an otherwise successful render
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from shared.contract.envelope import Alternative, ColumnSpec, Envelope, Err, Hint, Ok

PREVIEW_ROWS = 10
PREVIEW_COLUMNS = 20
CELL_WIDTH = 60
OK_PREFIX = "✓ ok."


def _plural_rows(n: int) -> str:
    return f"{n} row(s)."


def _schema_line(schema: list[ColumnSpec]) -> str:
    parts = []
    for col in schema:
        part = f"{col.name} {col.dtype}"
        if col.null_count:
            part += f" ({col.null_count} null)"
        parts.append(part)
    return "schema: " + ", ".join(parts)


def _preview(df: pd.DataFrame, total_rows: int) -> list[str]:
    shown = df.iloc[:PREVIEW_ROWS]
    hidden_cols = max(0, shown.shape[1] - PREVIEW_COLUMNS)
    if hidden_cols:
        shown = shown.iloc[:, :PREVIEW_COLUMNS]
    if shown.shape[1] == 0:
        return []
    lines = shown.to_string(index=False, max_colwidth=CELL_WIDTH, na_rep="null").splitlines()
    if hidden_cols:
        lines.append(f"... ({hidden_cols} more columns) ...")
    elided = total_rows - len(shown)
    if elided > 0:
        lines.append(f"... ({elided} more rows) ...")
    return lines


def _render_data(data: Any) -> list[str]:
    if data is None:
        return []
    if isinstance(data, str):
        return [data] if data else []
    try:
        return [json.dumps(data, ensure_ascii=False, indent=2, default=str)]
    except (TypeError, ValueError):
        return [str(data)]


def _ranked(alternatives: list[Alternative]) -> str:
    return ", ".join(f"{a.label} ({a.score:.2f})" for a in alternatives)


def render_ok(ok: Ok) -> str:
    lines: list[str] = []
    if ok.schema or isinstance(ok.data, pd.DataFrame):
        lines.append(f"{OK_PREFIX} {_plural_rows(ok.rows)}")
        if ok.schema:
            lines.append(_schema_line(ok.schema))
        if isinstance(ok.data, pd.DataFrame):
            lines.extend(_preview(ok.data, ok.rows))
    else:
        lines.append(OK_PREFIX)
        lines.extend(_render_data(ok.data))
    lines.extend(f"⚠ {w.kind}: {w.message}" for w in ok.warnings)
    return "\n".join(lines)


def render_hint(hint: Hint) -> str:
    if hint.hint_kind == "schema":
        lines = [f"⚠ schema hint: {hint.message}"]
        if hint.alternatives:
            lines.append(f"did you mean: {_ranked(hint.alternatives)}")
    elif hint.hint_kind == "fetch":
        lines = [f"⚠ fetch hint: {hint.message}"]
        for alt in hint.alternatives:
            action = "narrow" if alt.details.get("action") == "narrow" else "add"
            lines.append(f"{action}: {alt.label}")
    else:
        lines = [f"⚠ ambiguous: {hint.message}"]
        if hint.alternatives:
            lines.append(
                "pick one: " + " | ".join(f"{a.label} ({a.score:.2f})" for a in hint.alternatives)
            )
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
