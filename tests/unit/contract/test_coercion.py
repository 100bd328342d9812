"""Legacy returns become envelopes by the spec's rules — a `schema hint:` / `fetch hint:` error is
that Hint, any other error Err(legacy), anything else Ok measured from the first dataset — and a
malformed return is an Err whose kind names the problem. Reading another tool's output as data
drops the `✓ ok.` status line but keeps Hint and Err text."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pandas as pd
import pytest

from shared.contract import (
    Effects,
    Err,
    Hint,
    HintException,
    Ok,
    ToolResult,
    coerce_return,
    envelope_to_tool_result,
    exception_to_envelope,
    normalise_result,
    render_envelope,
    to_envelope,
)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ("schema hint: no column 'agee'", Hint("schema", "no column 'agee'")),
        ("Fetch Hint:  add a date filter", Hint("fetch", "add a date filter")),
        ("connection refused", Err("connection refused", "legacy")),
        (
            "the schema hint: is not a prefix here",
            Err("the schema hint: is not a prefix here", "legacy"),
        ),
    ],
)
def test_a_legacy_error_string_becomes_a_hint_only_with_a_hint_prefix(
    error: str, expected: Any
) -> None:
    assert to_envelope(ToolResult(content="partial", error=error)) == expected


def test_a_legacy_success_is_ok_measured_from_the_first_dataframe() -> None:
    first = pd.DataFrame({"a": [1, None, 3]})
    second = pd.DataFrame({"b": ["x"]})
    result = ToolResult(
        content="Loaded 3 rows.",
        cards=[{"type": "chart"}],
        cost=0.25,
        datasets={"first": first, "second": second},
    )

    envelope = to_envelope(result)

    assert isinstance(envelope, Ok)
    assert envelope.rows == 3 and envelope.data == "Loaded 3 rows."
    assert [(c.name, c.null_count) for c in envelope.schema] == [("a", 1)]
    assert envelope.effects.cards == [{"type": "chart"}] and envelope.effects.cost == 0.25
    assert set(envelope.effects.datasets) == {"first", "second"}
    # The legacy text survives the rendering after the status and schema lines.
    assert render_envelope(envelope).splitlines()[-1] == "Loaded 3 rows."


def test_a_legacy_success_without_datasets_is_a_plain_ok() -> None:
    assert to_envelope(ToolResult(content="done")) == Ok(rows=0, data="done")
    assert render_envelope(to_envelope(ToolResult(content="done"))) == "✓ ok.\ndone"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"message": "legacy dict", "cards": [{"type": "chart"}]}, Ok),
        ("plain text", Ok),
        ({"message": "x", "error": "fetch hint: add a filter"}, Hint),
        (Ok(data=1), Ok),
        (Hint("schema", "x"), Hint),
        (envelope_to_tool_result(Err("x", "Boom")), Err),
    ],
)
def test_coerce_return_accepts_every_legacy_shape_and_envelopes(raw: Any, expected: type) -> None:
    envelope, coerced = coerce_return("t", raw)

    assert isinstance(envelope, expected)
    assert coerced == (not isinstance(raw, Ok | Hint | Err | ToolResult))


@pytest.mark.parametrize(
    ("raw", "err_kind"),
    [
        (42, "invalid_result"),
        (None, "invalid_result"),
        ({"message": ["not", "text"]}, None),  # a dict's non-text message is JSON-encoded
        (ToolResult(datasets={"d": [1, 2]}), "invalid_dataset"),
        (ToolResult(cards=["not a dict"]), "invalid_card"),  # type: ignore[list-item]
        (ToolResult(cards=[{"when": dt.datetime(2024, 1, 1)}]), "invalid_card"),
        (Ok(effects=Effects(datasets={"d": {"not": "a frame"}})), "invalid_dataset"),  # type: ignore[dict-item]
        (Ok(effects=Effects(cards=[{"f": object()}])), "invalid_card"),
    ],
)
def test_a_malformed_return_is_an_err_naming_the_problem(raw: Any, err_kind: str | None) -> None:
    envelope, _ = coerce_return("t", raw)
    legacy = normalise_result("t", raw) if not isinstance(raw, Ok) else None

    if err_kind is None:
        assert isinstance(envelope, Ok)
        return
    assert isinstance(envelope, Err) and envelope.err_kind == err_kind, envelope
    if legacy is not None:
        assert isinstance(legacy.envelope, Err) and legacy.envelope.err_kind == err_kind


def test_hint_exceptions_become_hints_and_other_exceptions_errs() -> None:
    hint = exception_to_envelope(HintException("fetch", "narrow", [{"label": "x", "score": 1}]))
    assert isinstance(hint, Hint) and hint.alternatives[0].label == "x"
    assert exception_to_envelope(KeyError()) == Err("KeyError", "KeyError")
    with pytest.raises(ValueError, match="hint_kind"):
        HintException("nope", "x")  # type: ignore[arg-type]


def test_reading_an_ok_as_data_strips_only_the_status_line() -> None:
    table = envelope_to_tool_result(Ok(rows=1, data=pd.DataFrame({"a": [1]})))
    text = envelope_to_tool_result(Ok(data="the answer"))

    assert table.content.startswith("✓ ok. 1 row(s).\n")
    assert table.content_as_data() == "a\n1"
    assert text.content_as_data() == "the answer"
    assert text._get_content() == "the answer"  # the spec's name for it


def test_reading_a_hint_or_err_as_data_keeps_the_text() -> None:
    hint = envelope_to_tool_result(Hint("schema", "no column"))
    err = envelope_to_tool_result(Err("down", "ConnectionError"))

    assert hint.content_as_data() == "⚠ schema hint: no column"
    assert err.content_as_data() == "✗ error (ConnectionError): down"
    assert ToolResult(content="✓ ok. custom status").content_as_data() == "✓ ok. custom status"
