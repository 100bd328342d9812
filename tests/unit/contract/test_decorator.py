"""The contract boundary guarantees an envelope: Ok passes through, HintException is a Hint before
any other exception is an Err, legacy returns are coerced; the validator flags an empty schema on
a tabular tool, a kind outside expected_envelopes and an under-counted Ok; and every call is one
`contract_envelope` event."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, cast

import pandas as pd
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.contract import (
    Envelope,
    Err,
    Hint,
    HintException,
    Ok,
    ToolResult,
    Warning,
    envelope_to_tool_result,
    uniform_contract,
    wrap_handler,
)
from shared.contract.spec import ToolSpec
from shared.contract.telemetry import process_counters
from tests.unit.contract.conftest import FakeContext


class Boom(RuntimeError):
    """A handler bug."""


def spec(name: str, **kw: Any) -> ToolSpec:
    return ToolSpec(
        name=name, handler=lambda i, c: None, is_tabular=kw.pop("is_tabular", False), **kw
    )


def run(handler: Any, context: Any, inputs: dict[str, Any] | None = None) -> Envelope:
    """Call a wrapper the way the registry does: await what an async one returns."""
    result = handler(inputs or {}, context)
    if isinstance(result, Awaitable):

        async def wait() -> Envelope:
            return cast(Envelope, await result)

        return asyncio.run(wait())
    return cast(Envelope, result)


def test_a_decorated_handler_returns_its_ok(tool_name: str, context: FakeContext) -> None:
    @uniform_contract(name=tool_name, is_tabular=False)
    def handler(inputs: dict[str, Any], context: Any) -> Envelope:
        return Ok(data={"x": inputs["x"]})

    envelope = handler({"x": 1}, context)

    assert envelope == Ok(data={"x": 1})


def test_a_hint_exception_is_a_hint_not_an_err(tool_name: str, context: FakeContext) -> None:
    @uniform_contract(name=tool_name, is_tabular=False)
    def handler(inputs: dict[str, Any], context: Any) -> Envelope:
        raise HintException("ambiguous", "two matches", [{"label": "a", "score": 0.9}])

    envelope = handler({}, context)

    assert isinstance(envelope, Hint) and envelope.hint_kind == "ambiguous"
    assert envelope.alternatives[0].label == "a"


def test_any_other_exception_is_an_err_named_after_its_class(
    tool_name: str, context: FakeContext, caplog: pytest.LogCaptureFixture
) -> None:
    @uniform_contract(name=tool_name, is_tabular=False)
    def handler(inputs: dict[str, Any], context: Any) -> Envelope:
        raise Boom("it broke")

    with caplog.at_level(logging.ERROR, logger="shared.contract.decorator"):
        envelope = handler({}, context)

    assert envelope == Err("it broke", "Boom")
    assert any(r.exc_info and r.exc_info[0] is Boom for r in caplog.records)


def test_async_handlers_and_sync_handlers_returning_coroutines_are_wrapped(
    tool_name: str, context: FakeContext
) -> None:
    async def hinting(inputs: dict[str, Any], context: Any) -> ToolResult:
        await asyncio.sleep(0)
        raise HintException("fetch", "add a filter")

    def returns_coroutine(inputs: dict[str, Any], context: Any) -> Awaitable[ToolResult]:
        async def later() -> ToolResult:
            return ToolResult(content="later")

        return later()

    wrapped_async = wrap_handler(hinting, spec(tool_name))
    wrapped_sync = wrap_handler(returns_coroutine, spec(tool_name))

    assert asyncio.iscoroutinefunction(wrapped_async)
    assert isinstance(run(wrapped_async, context), Hint)
    assert run(wrapped_sync, context) == Ok(data="later")


def test_a_spec_only_handler_stays_a_toolresult_handler_until_wrapped(
    tool_name: str, context: FakeContext
) -> None:
    def legacy(inputs: dict[str, Any], context: Any) -> ToolResult:
        return ToolResult(error="schema hint: no column 'agee'")

    wrapped = wrap_handler(legacy, spec(tool_name))

    assert legacy({}, context).error == "schema hint: no column 'agee'"
    assert run(wrapped, context) == Hint("schema", "no column 'agee'")


def test_an_empty_schema_on_a_tabular_tool_is_a_contract_warning(
    tool_name: str, context: FakeContext, caplog: pytest.LogCaptureFixture
) -> None:
    wrapped = wrap_handler(
        lambda i, c: ToolResult(content="no table"), spec(tool_name, is_tabular=True)
    )

    with caplog.at_level(logging.WARNING, logger="shared.contract.decorator"):
        envelope = run(wrapped, context)

    assert isinstance(envelope, Ok)
    assert [w.kind for w in envelope.warnings] == ["contract"]
    assert "empty schema" in envelope.warnings[0].message
    assert any("contract violation" in r.getMessage() for r in caplog.records)
    assert envelope_to_tool_result(envelope).content.endswith(
        f"⚠ contract: {tool_name} is tabular but returned an empty schema"
    )
    [stats] = context.contract_recorder.snapshot(tool_name)
    assert stats.contract_violations == 1


def test_an_empty_schema_is_legitimate_on_a_non_tabular_tool(
    tool_name: str, context: FakeContext
) -> None:
    envelope = run(wrap_handler(lambda i, c: Ok(data="text"), spec(tool_name)), context)

    assert isinstance(envelope, Ok) and envelope.warnings == []


def test_a_kind_outside_expected_envelopes_warns_on_an_ok_and_is_logged_for_a_hint_or_err(
    tool_name: str, context: FakeContext, caplog: pytest.LogCaptureFixture
) -> None:
    only_err = spec(tool_name, expected_envelopes=frozenset({"err"}))
    only_ok = spec(tool_name, expected_envelopes=frozenset({"ok"}))

    def hinting(inputs: dict[str, Any], context: Any) -> ToolResult:
        raise HintException("schema", "unknown column")

    with caplog.at_level(logging.WARNING, logger="shared.contract.decorator"):
        ok = run(wrap_handler(lambda i, c: Ok(data="fine"), only_err), context)
        hint = run(wrap_handler(hinting, only_ok), context)

    assert isinstance(ok, Ok) and [w.kind for w in ok.warnings] == ["contract"]
    assert "returned ok, not one of its expected kinds (err)" in ok.warnings[0].message
    assert hint == Hint("schema", "unknown column")  # a Hint has no room for warnings...
    logged = [r.getMessage() for r in caplog.records]
    assert any("returned hint, not one of its expected kinds (ok)" in m for m in logged)  # ...
    [stats] = context.contract_recorder.snapshot(tool_name)
    assert stats.contract_violations == 2


def test_an_ok_claiming_fewer_rows_than_its_data_holds_is_flagged(
    tool_name: str, context: FakeContext
) -> None:
    df = pd.DataFrame({"a": [1, 2, 3]})
    envelope = run(wrap_handler(lambda i, c: Ok(rows=1, data=df), spec(tool_name)), context)

    assert isinstance(envelope, Ok)
    assert envelope.warnings == [
        Warning(
            "contract", f"{tool_name} reported 1 row(s) but its data holds 3", {"tool": tool_name}
        )
    ]


def test_a_forgotten_schema_is_measured_from_the_data(tool_name: str, context: FakeContext) -> None:
    df = pd.DataFrame({"a": [1, None]})
    envelope = run(
        wrap_handler(lambda i, c: Ok(rows=2, data=df), spec(tool_name, is_tabular=True)), context
    )

    assert isinstance(envelope, Ok) and envelope.warnings == []
    assert [(c.name, c.null_count, c.dtype_provenance) for c in envelope.schema] == [
        ("a", 1, "measured")
    ]


def test_a_single_row_record_of_a_tabular_tool_gets_an_inferred_schema(
    tool_name: str, context: FakeContext
) -> None:
    envelope = run(
        wrap_handler(lambda i, c: Ok(data={"n": 3, "name": "x"}), spec(tool_name, is_tabular=True)),
        context,
    )

    assert isinstance(envelope, Ok) and envelope.rows == 1 and envelope.warnings == []
    assert [(c.name, c.dtype, c.dtype_provenance) for c in envelope.schema] == [
        ("n", "integer", "inferred"),
        ("name", "string", "inferred"),
    ]


def test_every_call_is_counted_by_kind_with_hint_and_err_tallies(
    tool_name: str, context: FakeContext
) -> None:
    def handler(inputs: dict[str, Any], context: Any) -> Any:
        match inputs.get("do"):
            case "hint":
                raise HintException("fetch", "narrow it")
            case "raise":
                raise Boom("x")
            case "legacy_error":
                return ToolResult(error="disk full")
            case _:
                return Ok(data="fine")

    wrapped = wrap_handler(handler, spec(tool_name))
    for do in ("ok", "ok", "hint", "raise", "legacy_error"):
        run(wrapped, context, {"do": do})

    [stats] = context.contract_recorder.snapshot()
    assert (stats.ok, stats.hint, stats.err, stats.calls) == (2, 1, 2, 5)
    assert stats.hint_kinds == {"fetch": 1}
    assert stats.err_kinds == {"Boom": 1, "legacy": 1}
    assert stats.coerced == 1  # the legacy ToolResult; exceptions are not returns


def test_a_direct_call_without_a_recorder_counts_in_the_process_counters(tool_name: str) -> None:
    @uniform_contract(name=tool_name, is_tabular=False)
    def handler(inputs: dict[str, Any], context: Any) -> Envelope:
        return Ok()

    handler({}, object())

    [stats] = process_counters().snapshot(tool_name)
    assert stats.ok == 1


def test_the_event_is_logged_and_added_to_the_current_span(
    tool_name: str, context: FakeContext, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    wrapped = wrap_handler(lambda i, c: ToolResult(error="fetch hint: add a year"), spec(tool_name))

    with (
        caplog.at_level(logging.DEBUG, logger="shared.contract.telemetry"),
        provider.get_tracer("test").start_as_current_span("execute_tool"),
    ):
        run(wrapped, context)
    provider.shutdown()

    [record] = [r for r in caplog.records if r.getMessage().startswith("contract_envelope ")]
    assert record.levelno == logging.INFO
    assert f"tool={tool_name} kind=hint hint_kind=fetch" in record.getMessage()
    event = record.contract_envelope  # type: ignore[attr-defined]
    assert event["kind"] == "hint" and event["coerced"] is True and event["origin"] == "handler"
    [span] = exporter.get_finished_spans()
    [span_event] = span.events
    assert span_event.name == "contract_envelope"
    assert span_event.attributes is not None
    assert span_event.attributes["toolmesh.envelope.hint_kind"] == "fetch"


def test_a_clean_ok_logs_at_debug(
    tool_name: str, context: FakeContext, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="shared.contract.telemetry"):
        run(wrap_handler(lambda i, c: Ok(), spec(tool_name)), context)

    [record] = caplog.records
    assert record.levelno == logging.DEBUG and "kind=ok" in record.getMessage()
