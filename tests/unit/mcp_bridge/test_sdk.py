"""The MCP SDK seam: the SDK's own tracer turned off, so a tools/call is one span (the bridge's)
and the context the SDK injects into `_meta` is that span's; a server's answer the SDK cannot
read fails its request at once; a server's stderr and log messages reach the bridge's log,
clipped and rate-limited."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.mcp_bridge.sdk import (
    PARSE_ERROR,
    SDK_TRACER_SCOPE,
    UnreadableAnswers,
    disable_sdk_tracer,
)


def test_the_sdk_tracer_records_nothing_and_injects_the_bridges_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    early = provider.get_tracer(SDK_TRACER_SCOPE)  # made before: updated too
    assert disable_sdk_tracer(provider)
    ours = provider.get_tracer("toolmesh")
    with ours.start_as_current_span("tools/call echo") as span:
        expected = span.get_span_context()
        for sdk_tracer in (early, provider.get_tracer(SDK_TRACER_SCOPE)):
            with sdk_tracer.start_as_current_span("MCP send tools/call echo") as sdk_span:
                assert not sdk_span.is_recording()
                carrier: dict[str, str] = {}
                TraceContextTextMapPropagator().inject(carrier)
            _, trace_id, parent_id, _ = carrier["traceparent"].split("-")
            assert (trace_id, parent_id) == (
                f"{expected.trace_id:032x}",
                f"{expected.span_id:016x}",
            )
    with ours.start_as_current_span("another scope still records"):
        pass
    assert [s.name for s in exporter.get_finished_spans()] == [
        "tools/call echo",
        "another scope still records",
    ]
    provider.shutdown()


def test_without_an_sdk_tracer_provider_nothing_changes() -> None:
    assert not disable_sdk_tracer(trace.NoOpTracerProvider())


def _unreadable(line: str) -> Exception:
    from mcp import types

    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        return exc
    raise AssertionError(f"{line!r} parsed")


class _Stream:
    """A read stream handing out the given items (the SDK transport's, stubbed)."""

    def __init__(self, *items: object) -> None:
        self.items = list(items)
        self.last_context = "ctx"
        self.closed = False

    async def receive(self) -> object:
        return self.items.pop(0)

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> object:
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    async def aclose(self) -> None:
        self.closed = True


async def test_an_unreadable_answer_becomes_a_parse_error_for_its_request() -> None:
    from mcp import types
    from mcp.shared.message import SessionMessage

    answer = (
        '{"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "\\udc80"}]}}'
    )
    stream = UnreadableAnswers(_Stream(_unreadable(answer)))
    item = await stream.receive()
    assert isinstance(item, SessionMessage)
    assert isinstance(item.message, types.JSONRPCError)
    assert item.message.id == 7 and item.message.error.code == PARSE_ERROR
    assert "surrogate" in item.message.error.message
    assert stream.last_context == "ctx"  # the rest of the stream's surface passes through
    await stream.aclose()


async def test_what_is_not_an_unreadable_answer_passes_through_unchanged() -> None:
    request = _unreadable(
        '{"jsonrpc": "2.0", "id": 1, "method": "sampling/x", "params": "\\udc80"}'
    )
    notification = _unreadable('{"jsonrpc": "2.0", "method": "n", "params": {"m": "\\ud800"}}')
    garbage = _unreadable("{not json at all")
    other = RuntimeError("transport trouble")
    stream = UnreadableAnswers(_Stream(request, notification, garbage, other, "a message"))
    assert [item async for item in stream] == [request, notification, garbage, other, "a message"]


def test_the_id_of_an_answer_too_deep_to_parse_is_found_in_bounded_time() -> None:
    import time

    from services.mcp_bridge.sdk import _top_level

    deep = '{"jsonrpc": "2.0", "id": "r-7", "result": ' + "[" * 20_000_000
    started = time.perf_counter()
    assert _top_level(deep) == {"jsonrpc": None, "id": "r-7", "result": None}
    assert time.perf_counter() - started < 1  # a 20 MB line: only its start is read
    nested_id = '{"result": {"id": 9, "x": [[[]]]}, "id": 3}'
    assert _top_level(nested_id) == {"result": None, "id": 3}
    assert _top_level("[1, 2]") is None
    assert _top_level('{"method": "ping", "id": 1}') == {"method": None, "id": 1}


def test_a_servers_stderr_is_logged_clipped_and_rate_limited(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stdio server's stderr went straight to the bridge's own, without bound."""
    import logging

    from services.mcp_bridge import sdk

    monkeypatch.setattr(sdk, "STDERR_LINES_PER_MIN", 3)
    caplog.set_level(logging.INFO, logger="services.mcp_bridge.sdk")
    relay = sdk.StderrRelay("noisy")
    relay.file.write("x" * 100_000 + "\n")
    for i in range(10):
        relay.file.write(f"line {i}\n")
    relay.close()
    relay._thread.join(timeout=10)
    said = [r.getMessage() for r in caplog.records if "mcp server noisy" in r.getMessage()]
    assert said[0] == "mcp server noisy: " + "x" * sdk.STDERR_LINE_CHARS
    assert said[1:3] == ["mcp server noisy: line 0", "mcp server noisy: line 1"]
    assert said[-1] == "mcp server noisy: 8 stderr lines dropped"


async def test_a_servers_log_messages_are_logged_capped_at_warning_and_rate_limited(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, make_bridge: Any
) -> None:
    """A server's notifications/message were dropped unseen."""
    import logging

    from services.mcp_bridge import sdk
    from tests.unit.mcp_bridge.conftest import raw_config

    monkeypatch.setattr(sdk, "STDERR_LINES_PER_MIN", 4)
    caplog.set_level(logging.INFO, logger="services.mcp_bridge.sdk")
    bridge = make_bridge()
    await bridge.connect(raw_config("chatty"))
    answer = await bridge.call_tool("chatty", "log", {"count": 10, "level": "critical"})
    assert answer.envelope.data == "logged"

    def said_so_far() -> list[Any]:
        return [r for r in caplog.records if r.getMessage().startswith("mcp server chatty [")]

    async with asyncio.timeout(10):  # notifications may be handled after the answer
        while True:
            if len(said_so_far()) >= 4:
                break
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    said = said_so_far()
    assert [r.getMessage() for r in said] == [
        f'mcp server chatty [widgets] critical: {{"message": "m{i}"}}' for i in range(4)
    ]
    assert {r.levelno for r in said} == {logging.WARNING}  # a server's errors are not ours


async def test_log_messages_dropped_over_the_budget_are_counted_when_the_session_ends(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, make_bridge: Any
) -> None:
    """The count was reported only by a message arriving after the minute: never, for a
    session that ended within it."""
    import logging

    from services.mcp_bridge import sdk
    from tests.unit.mcp_bridge.conftest import raw_config

    monkeypatch.setattr(sdk, "STDERR_LINES_PER_MIN", 2)
    caplog.set_level(logging.INFO, logger="services.mcp_bridge.sdk")
    bridge = make_bridge()
    await bridge.connect(raw_config("brief"))
    await bridge.call_tool("brief", "log", {"count": 7, "level": "info"})
    # The SDK hands each notification to a task it spawns as it reads it: a round trip later
    # they have all run.
    await bridge.call_tool("brief", "echo", {"message": "after"})
    await bridge.disconnect("brief")
    said = [r.getMessage() for r in caplog.records]
    assert "mcp server brief: 5 log messages dropped" in said
