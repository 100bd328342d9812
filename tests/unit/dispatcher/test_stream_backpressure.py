"""A streamed call's display under floods and slow clients: the CoalescingDisplay keeps the
latest progress per call, merges consecutive text, keeps cards and notices (up to a guard cap,
past which it counts and logs what it leaves out), never makes the writer wait, and the
DispatchToolCallStream RPC sends the result last. CallEffects records a bounded number of
progress events, the last one always."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from services.dispatcher.core import DispatchOutcome
from services.dispatcher.effects import RECORDED_PROGRESS, CallEffects
from services.dispatcher.servicer import CoalescingDisplay, DispatcherServicer
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.type.v1 import types_pb2 as pb


def drain(display: CoalescingDisplay) -> list[dpb.DispatchToolCallStreamResponse]:
    out = []
    while (message := display.pop()) is not None:
        out.append(message)
    return out


def kinds(messages: list[dpb.DispatchToolCallStreamResponse]) -> list[str | None]:
    return [m.WhichOneof("event") for m in messages]


def report(display: CoalescingDisplay, step: int, tool_use_id: str = "t-1") -> None:
    display.progress(
        {"tool_use_id": tool_use_id, "message": f"step {step}", "fraction": step / 100}
    )


def text(display: CoalescingDisplay, chunk: str, tool_use_id: str = "t-1") -> None:
    display.text({"tool_use_id": tool_use_id, "text": chunk})


def test_a_newer_progress_supersedes_the_one_not_yet_sent() -> None:
    display = CoalescingDisplay()
    for step in range(100_000):
        report(display, step)
    assert len(display) == 1
    assert display.superseded == 99_999
    (message,) = drain(display)
    assert message.progress.message == "step 99999"
    assert message.progress.tool_use_id == "t-1"
    assert message.progress.fraction == pytest.approx(999.99)


def test_progress_of_each_call_is_kept_and_order_follows_the_writes() -> None:
    display = CoalescingDisplay()
    report(display, 1, "a")
    report(display, 1, "b")
    text(display, "hello")
    report(display, 2, "a")  # moves behind the text: sent after what was written before it
    messages = drain(display)
    assert kinds(messages) == ["progress", "text_delta", "progress"]
    assert [m.progress.tool_use_id for m in messages if m.HasField("progress")] == ["b", "a"]
    assert messages[-1].progress.message == "step 2"
    # Sent progress is not replaced: the next one waits on its own.
    report(display, 3, "a")
    assert [m.progress.message for m in drain(display)] == ["step 3"]


def test_a_backlog_of_text_is_merged_up_to_a_size_and_never_dropped() -> None:
    display = CoalescingDisplay()
    chunks = [f"{i:04d}" * 256 for i in range(200)]  # 200 chunks of 1,024 characters
    for chunk in chunks:
        text(display, chunk)
    messages = drain(display)
    assert all(m.HasField("text_delta") for m in messages)
    assert "".join(m.text_delta.text for m in messages) == "".join(chunks)
    # The first chunks as written while few wait, then merged into the last, 64 to a message.
    sizes = [len(m.text_delta.text) // 1024 for m in messages]
    assert sizes == [1] * 15 + [64, 64, 57]
    assert max(len(m.text_delta.text) for m in messages) <= CoalescingDisplay.MAX_TEXT_CHARS
    # A short text that does not pile up arrives in its chunks.
    for chunk in chunks[:3]:
        text(display, chunk)
    assert [m.text_delta.text for m in drain(display)] == chunks[:3]


def test_text_of_another_call_or_after_something_else_is_not_merged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(CoalescingDisplay, "MERGE_AFTER", 0)
    display = CoalescingDisplay()
    text(display, "x", "t-1")
    text(display, "y", "t-2")
    text(display, "y", "t-2")
    report(display, 1)
    text(display, "z", "t-2")
    messages = drain(display)
    assert kinds(messages) == ["text_delta", "text_delta", "progress", "text_delta"]
    assert messages[1].text_delta.text == "yy"


def test_cards_and_notices_are_kept_in_order_and_capped_with_a_logged_count(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    display = CoalescingDisplay()
    for i in range(50):
        display.card({"type": "note", "n": i})
        display.notice({"file_id": f"f{i}", "filename": "a.csv", "size_bytes": 3})
    messages = drain(display)
    assert kinds(messages) == ["card", "export_ready"] * 50
    assert [dict(m.card)["n"] for m in messages if m.HasField("card")] == list(range(50))
    assert display.dropped == 0
    # Sent ones free their room.
    monkeypatch.setattr(CoalescingDisplay, "MAX_PENDING_ITEMS", 10)
    capped = CoalescingDisplay()
    with caplog.at_level(logging.WARNING, logger="services.dispatcher.servicer"):
        for i in range(25):
            capped.card({"type": "note", "n": i})
            report(capped, i)
    assert capped.dropped == 15
    assert len(capped) == 11  # ten cards and the latest progress
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "left out of the stream" in warnings[0]
    assert [dict(m.card)["n"] for m in drain(capped) if m.HasField("card")] == list(range(10))
    capped.card({"type": "note", "n": 99})
    assert [dict(m.card)["n"] for m in drain(capped)] == [99]


def test_the_byte_cap_bounds_what_cards_keep_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CoalescingDisplay, "MAX_PENDING_BYTES", 100_000)
    display = CoalescingDisplay()
    for i in range(100):
        display.card({"type": "blob", "n": i, "data": "z" * 10_000})
    assert 5 <= len(display) < 10
    assert display.dropped == 100 - len(display)


def test_ready_is_set_while_something_waits() -> None:
    display = CoalescingDisplay()
    assert not display.ready.is_set()
    report(display, 1)
    assert display.ready.is_set()
    assert display.pop() is not None
    assert display.pop() is None
    assert not display.ready.is_set()


# --- the record of a streamed call ---------------------------------------------------------


class ListDisplay:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Mapping[str, Any]]] = []

    def progress(self, data: Mapping[str, Any]) -> None:
        self.seen.append(("progress", data))

    def card(self, data: Mapping[str, Any]) -> None:
        self.seen.append(("card", data))

    def text(self, data: Mapping[str, Any]) -> None:
        self.seen.append(("text", data))

    def notice(self, data: Mapping[str, Any]) -> None:
        self.seen.append(("notice", data))


def test_a_flood_of_progress_is_recorded_boundedly_and_its_last_state_kept() -> None:
    display = ListDisplay()
    fx = CallEffects(display)
    count = 20_000
    for i in range(1, count + 1):
        fx.report_progress("t-1", {"message": f"step {i}", "data": {"i": i}})
    fx.event("tool_result", {"content": "done"}, "t-1")
    recorded = [e for e in fx.events if e.event_type == "progress"]
    assert len(recorded) == RECORDED_PROGRESS + 1
    assert [e.data["data"]["i"] for e in recorded[:3]] == [1, 2, 3]
    last = recorded[-1]
    assert last.data["data"]["i"] == count and last.tool_use_id == "t-1"
    assert last.data["superseded"] == count - RECORDED_PROGRESS - 1
    assert [e.event_type for e in fx.events][-2:] == ["progress", "tool_result"]
    # The effect log (what replay re-applies) is bounded too.
    assert len(fx.effects) <= 2 * RECORDED_PROGRESS + 2
    # Every report was shown as it came (the display coalesces for a slow client).
    assert len(display.seen) == count
    assert display.seen[-1][1]["data"] == {"i": count}


def test_a_call_with_few_reports_records_each_one() -> None:
    fx = CallEffects(ListDisplay())
    for i in range(3):
        fx.report_progress("t-1", {"message": f"step {i}"})
    fx.event("tool_result", {}, "t-1")
    types = [e.event_type for e in fx.events]
    assert types == ["progress", "progress", "progress", "tool_result"]
    assert all("superseded" not in e.data for e in fx.events)


# --- the RPC -------------------------------------------------------------------------------


class FloodingCore:
    """A dispatcher core whose call reports `count` progress updates, yielding to the loop
    now and then, then answers with some text."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.finished = asyncio.Event()
        self.display: CoalescingDisplay | None = None
        self.most_waiting = 0

    async def dispatch(
        self,
        tool_use: pb.ToolUse,
        context: pb.CallContext,
        *,
        display: Any = None,
        stop: Any = None,
    ) -> DispatchOutcome:
        fx = CallEffects(display)
        self.display = display
        for i in range(1, self.count + 1):
            fx.report_progress(tool_use.id, {"message": f"step {i}", "fraction": i / self.count})
            self.most_waiting = max(self.most_waiting, len(display))
            if i % 100 == 0:
                await asyncio.sleep(0)
        fx.stream(*(("text_delta", {"tool_use_id": tool_use.id, "text": "t" * 1024}),) * 10)
        fx.event("tool_result", {}, tool_use.id)
        self.finished.set()
        return DispatchOutcome(
            result=pb.ToolResult(content="t" * 10_240),
            duration_ms=1.0,
            args_hash="",
            tool_use_id=tool_use.id,
        )


class FakeContext:
    def time_remaining(self) -> float:
        return 60.0


async def test_a_slow_client_gets_the_latest_progress_then_text_then_the_result() -> None:
    core = FloodingCore(50_000)
    servicer = DispatcherServicer(core, log=None)  # type: ignore[arg-type]
    request = dpb.DispatchToolCallStreamRequest(tool_use=pb.ToolUse(id="t-1", name="flood"))
    stream = servicer.DispatchToolCallStream(request, FakeContext())  # type: ignore[arg-type]
    first = await stream.__anext__()
    assert first.HasField("progress")
    # The client reads nothing more until the call is over: the call ran at its own pace.
    await asyncio.wait_for(core.finished.wait(), 30)
    assert core.most_waiting <= 1
    rest = [m async for m in stream]
    assert kinds(rest) == ["progress", *["text_delta"] * 10, "result"]
    assert rest[0].progress.message == "step 50000"
    assert "".join(m.text_delta.text for m in rest[1:-1]) == "t" * 10_240
    assert rest[-1].result.result.content == "t" * 10_240


async def test_a_client_that_goes_away_stops_the_call() -> None:
    started = asyncio.Event()
    cancelled: list[str] = []

    class SlowCore:
        async def dispatch(
            self, tool_use: pb.ToolUse, context: pb.CallContext, *, display: Any, stop: Any
        ) -> DispatchOutcome:
            display.progress({"tool_use_id": tool_use.id, "message": "go"})
            started.set()
            cancelled.append(await stop)
            raise asyncio.CancelledError

    servicer = DispatcherServicer(SlowCore(), log=None)  # type: ignore[arg-type]
    request = dpb.DispatchToolCallStreamRequest(tool_use=pb.ToolUse(id="t-2", name="slow"))
    stream = servicer.DispatchToolCallStream(request, FakeContext())  # type: ignore[arg-type]
    first = await stream.__anext__()
    assert first.progress.message == "go"
    await started.wait()
    await stream.aclose()
    assert cancelled == ["the client cancelled the stream"]
