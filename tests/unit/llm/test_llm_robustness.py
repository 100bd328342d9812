"""The LLM client and `call_llm` against everything the Messages API and a flaky network do,
driven through the loopback fake: rate limits with retry-after, overload, 5xx, permanent 4xx,
bodies cut short or not JSON, odd stop reasons and content blocks, missing or cached usage,
slow answers, deadlines and cancellation."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeVar

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.registry.context import ToolContext
from services.registry.tools.llm import call_llm
from shared.contract import Err, Ok
from shared.costs import BudgetExceeded
from shared.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from shared.llm import client as llm_client
from shared.llm.client import LLMClient, LLMReply, Usage, cost_usd, create_llm_client_for_role
from shared.llm.config import DEFAULT_MODEL_CONFIGS
from shared.telemetry.usage import UsageEntry
from tests.support.fake_anthropic import FakeAnthropic, Reply, overloaded

SONNET = DEFAULT_MODEL_CONFIGS[0]
E = TypeVar("E", bound=Exception)
ASK = [{"role": "user", "content": "q"}]


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic().start()
    yield server
    server.stop()


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(llm_client, "tracer", lambda: provider.get_tracer("test"))
    return exporter


def client_of(fake: FakeAnthropic, **kwargs: Any) -> LLMClient:
    env = {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": fake.base_url}
    return create_llm_client_for_role("call_llm", env=env, **kwargs)


async def timed_call(client: LLMClient) -> tuple[LLMReply, float]:
    """One call of `client`'s reply, and the seconds it took (the client closed after it)."""
    started = time.monotonic()
    try:
        reply = await client.complete(ASK)
    finally:
        await client.aclose()
    return reply, time.monotonic() - started


async def failed_call(client: LLMClient, error: type[E]) -> tuple[E, float]:
    """The `error` one call of `client` ends with, and the seconds it took (the client closed
    after it)."""
    started = time.monotonic()
    try:
        with pytest.raises(error) as caught:
            await asyncio.wait_for(client.complete(ASK), 10)
    finally:
        await client.aclose()
    return caught.value, time.monotonic() - started


def chat_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    return span


# --- retries --------------------------------------------------------------------------------


async def test_a_429_waits_its_retry_after_and_the_retry_is_counted_and_traced(
    fake: FakeAnthropic, spans: InMemorySpanExporter
) -> None:
    fake.script(
        Reply(status=429, error_type="rate_limit_error", headers={"retry-after": "1"}),
        Reply(text="after the wait"),
    )
    reply, took = await timed_call(client_of(fake))
    assert reply.text == "after the wait" and reply.attempts == 2
    assert took >= 0.95
    span = chat_span(spans)
    assert span.attributes is not None and span.attributes[llm_client.LLM_ATTEMPTS] == 2
    (event,) = [e for e in span.events if e.name == llm_client.LLM_RETRY_EVENT]
    assert event.attributes is not None
    assert event.attributes["http.response.status_code"] == 429
    assert event.attributes["toolmesh.llm.retry_after_s"] == pytest.approx(1.0)


async def test_a_retry_after_past_the_deadline_fails_at_once_saying_so(
    fake: FakeAnthropic,
) -> None:
    """The SDK would sleep for whatever retry-after says (an hour here)."""
    fake.script(Reply(status=429, error_type="rate_limit_error", headers={"retry-after": "3600"}))
    error, took = await failed_call(client_of(fake, deadline_s=5), ResourceExhausted)
    assert took < 3
    assert error.reason == "LLM_RATE_LIMITED"
    assert "3600s, past the call's deadline" in error.message
    assert error.metadata["retry_after_s"] == "3600"
    assert len(fake.requests) == 1


async def test_overload_and_5xx_are_retried_with_backoff_then_reported(
    fake: FakeAnthropic, spans: InMemorySpanExporter
) -> None:
    fake.script(
        Reply(status=500, error_type="api_error", headers={}),
        Reply(status=503, error_type="api_error", headers={}),
        Reply(text="third time"),
    )
    client = client_of(fake, max_retries=2)
    try:
        reply = await client.complete(ASK)
        assert reply.text == "third time" and reply.attempts == 3
        fake.script(overloaded(), overloaded(), overloaded())
        with pytest.raises(Unavailable) as caught:
            await client.complete(ASK)
    finally:
        await client.aclose()
    assert caught.value.reason == "LLM_UNAVAILABLE" and "529 overloaded_error" in str(caught.value)
    assert "3 attempts" in caught.value.message and caught.value.metadata["attempts"] == "3"
    failed = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")][-1]
    assert failed.attributes is not None and failed.attributes[llm_client.LLM_ATTEMPTS] == 3


@pytest.mark.parametrize(
    ("reply", "error", "reason"),
    [
        (
            Reply(
                status=400,
                error_type="invalid_request_error",
                error_message="prompt is too long: 250000 tokens > 200000 maximum",
            ),
            InvalidArgument,
            "LLM_PROMPT_TOO_LONG",
        ),
        (
            Reply(status=400, error_type="invalid_request_error", error_message="bad role"),
            InvalidArgument,
            "LLM_INVALID_REQUEST",
        ),
        (Reply(status=401, error_type="authentication_error"), FailedPrecondition, "LLM_AUTH"),
        (Reply(status=403, error_type="permission_error"), FailedPrecondition, "LLM_AUTH"),
        (
            Reply(status=404, error_type="not_found_error", error_message="model: nope"),
            FailedPrecondition,
            "LLM_MODEL_NOT_FOUND",
        ),
        (
            Reply(status=413, error_type="request_too_large"),
            InvalidArgument,
            "LLM_REQUEST_TOO_LARGE",
        ),
    ],
)
async def test_permanent_errors_are_not_retried_and_say_what_to_do(
    fake: FakeAnthropic, reply: Reply, error: type[Exception], reason: str
) -> None:
    fake.script(reply)
    client = client_of(fake)
    try:
        with pytest.raises(error) as caught:
            await client.complete(ASK)
    finally:
        await client.aclose()
    assert len(fake.requests) == 1
    assert getattr(caught.value, "reason", "") == reason
    assert "persisted after retries" not in str(caught.value)
    if reason == "LLM_MODEL_NOT_FOUND":
        assert SONNET.model in str(caught.value) and "call_llm" in str(caught.value)


async def test_a_malformed_or_cut_body_is_retried_then_a_clear_error(fake: FakeAnthropic) -> None:
    fake.script(Reply(raw=b'{"id": "msg_1", "type": "mess'), Reply(text="whole"))
    client = client_of(fake, max_retries=1)
    try:
        reply = await client.complete(ASK)
        assert reply.text == "whole" and reply.attempts == 2
        fake.script(Reply(raw=b"not json"), Reply(raw=b'{"id": "msg_2"}'))
        with pytest.raises(Unavailable) as caught:
            await client.complete(ASK)
        assert caught.value.reason == "LLM_BAD_RESPONSE"
        fake.script(Reply(text="x" * 300, truncate=True), Reply(text="y" * 300, truncate=True))
        with pytest.raises(Unavailable) as broken:
            await client.complete(ASK)
        assert broken.value.reason == "LLM_UNAVAILABLE" and "mid-response" in str(broken.value)
    finally:
        await client.aclose()


async def test_an_error_event_mid_stream_is_classified_by_its_type(
    fake: FakeAnthropic, spans: InMemorySpanExporter
) -> None:
    """The API can fail after its 200: an `error` event in the stream. Overload is retried; an
    invalid request is not, and says what the provider said."""
    fake.script(Reply(text="a" * 100, stream_error="overloaded_error"), Reply(text="whole"))
    client = client_of(fake, max_retries=1)
    try:
        reply = await client.complete(ASK)
        assert reply.text == "whole" and reply.attempts == 2
        (event,) = [e for e in chat_span(spans).events if e.name == llm_client.LLM_RETRY_EVENT]
        assert event.attributes is not None and event.attributes["error.type"] == "overloaded_error"
        fake.script(*[Reply(text="b" * 50, stream_error="overloaded_error") for _ in range(2)])
        with pytest.raises(Unavailable) as overloaded_twice:
            await client.complete(ASK)
        assert overloaded_twice.value.reason == "LLM_UNAVAILABLE"
        assert "529 overloaded_error" in overloaded_twice.value.message
        assert "mid-stream" in overloaded_twice.value.message
        assert overloaded_twice.value.metadata["attempts"] == "2"
        sent = len(fake.requests)
        fake.script(
            Reply(text="c" * 50, stream_error="invalid_request_error", error_message="bad tool")
        )
        with pytest.raises(InvalidArgument) as invalid:
            await client.complete(ASK)
    finally:
        await client.aclose()
    assert len(fake.requests) == sent + 1
    assert invalid.value.reason == "LLM_INVALID_REQUEST" and "bad tool" in invalid.value.message


async def test_an_attempt_that_broke_after_the_answer_began_is_still_priced(
    fake: FakeAnthropic, spans: InMemorySpanExporter
) -> None:
    """The provider bills a request it began answering even if the stream then breaks: the
    usage its `message_start` reported counts, beside the answer's, in the reply's cost and on
    the span; an attempt refused before it began (a 529 status) costs nothing."""
    fake.script(
        Reply(text="a" * 100, input_tokens=1_000, stream_error="overloaded_error"),
        overloaded(),
        Reply(text="b" * 100, input_tokens=1_000, truncate=True),
        Reply(text="whole", input_tokens=1_000, output_tokens=20),
    )
    reply = await client_of(fake, max_retries=3).complete(ASK)
    assert reply.text == "whole" and reply.attempts == 4
    assert reply.usage == Usage(1_000, 20)
    assert reply.failed_usage == Usage(2_000, 0)
    assert reply.billed_usage == Usage(3_000, 20)
    assert reply.cost_usd == pytest.approx(cost_usd(Usage(3_000, 20), SONNET))
    attributes = chat_span(spans).attributes
    assert attributes is not None
    assert attributes["gen_ai.usage.input_tokens"] == 3_000
    assert attributes["gen_ai.usage.output_tokens"] == 20
    assert attributes[llm_client.LLM_FAILED_INPUT_TOKENS] == 2_000
    assert attributes["gen_ai.usage.cost.amount"] == pytest.approx(reply.cost_usd)
    entry = UsageEntry.of_llm_spend(reply.spend, tenant_id="t", tool_name="call_llm")
    assert (entry.input_tokens, entry.output_tokens) == (3_000, 20)
    assert entry.cost_usd == pytest.approx(reply.cost_usd)


async def test_a_failed_call_says_what_its_broken_attempts_were_billed_for(
    fake: FakeAnthropic, spans: InMemorySpanExporter
) -> None:
    fake.script(*[Reply(text="c" * 80, input_tokens=500, stream_error="overloaded_error")] * 2)
    error, _ = await failed_call(client_of(fake, max_retries=1), Unavailable)
    spend = llm_client.spend_of(error)
    assert spend is not None and spend.usage == Usage(1_000, 0)
    assert spend.model == SONNET.model and spend.provider == "anthropic"
    assert spend.cost_usd == pytest.approx(cost_usd(Usage(1_000, 0), SONNET))
    attributes = chat_span(spans).attributes
    assert attributes is not None and attributes["gen_ai.usage.input_tokens"] == 1_000
    spans.clear()
    fake.script(Reply(status=404, error_type="not_found_error"))
    refused, _ = await failed_call(client_of(fake), FailedPrecondition)
    assert llm_client.spend_of(refused) is None  # nothing began, nothing billed
    attributes = chat_span(spans).attributes
    assert attributes is not None and "gen_ai.usage.input_tokens" not in attributes


# --- replies --------------------------------------------------------------------------------


async def test_unexpected_blocks_are_ignored_and_missing_usage_is_flagged(
    fake: FakeAnthropic, spans: InMemorySpanExporter
) -> None:
    fake.script(
        Reply(
            text="the answer",
            blocks=[
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "redacted_thinking", "data": "xx"},
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
                {"type": "block_from_the_future", "x": 1},
            ],
            usage={},
        )
    )
    client = client_of(fake)
    try:
        reply = await client.complete(ASK)
    finally:
        await client.aclose()
    assert reply.text == "the answer" and reply.tool_uses == ()
    assert reply.usage == Usage() and not reply.usage_reported and reply.cost_usd == 0
    attributes = chat_span(spans).attributes
    assert attributes is not None and attributes[llm_client.LLM_USAGE_MISSING] is True


async def test_one_hour_cache_writes_are_priced_at_their_own_rate(fake: FakeAnthropic) -> None:
    fake.script(
        Reply(
            text="cached",
            usage={
                "input_tokens": 10,
                "output_tokens": 3,
                "cache_read_input_tokens": 1000,
                "cache_creation_input_tokens": 2000,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": 500,
                    "ephemeral_1h_input_tokens": 1500,
                },
            },
        )
    )
    client = client_of(fake)
    try:
        reply = await client.complete(ASK)
    finally:
        await client.aclose()
    assert reply.usage == Usage(10, 3, 1000, 2000, 1500)
    expected = (10 * 3.0 + 3 * 15.0 + 1000 * 0.30 + 500 * 3.75 + 1500 * 6.0) / 1e6
    assert reply.cost_usd == pytest.approx(expected)
    assert cost_usd(Usage(cache_write_tokens=100), SONNET) == pytest.approx(100 * 3.75 / 1e6)


# --- time -----------------------------------------------------------------------------------


async def test_slow_attempts_time_out_and_the_deadline_bounds_every_retry(
    fake: FakeAnthropic,
) -> None:
    fake.script(*[Reply(text="late", delay_s=5) for _ in range(6)])
    error, took = await failed_call(
        client_of(fake, max_retries=5, timeout_s=0.5, deadline_s=1.5), DeadlineExceeded
    )
    assert took < 2.5 and error.reason == "LLM_TIMEOUT"


async def test_every_call_streams_so_a_long_answer_outlasts_the_attempt_timeout(
    fake: FakeAnthropic,
) -> None:
    """`timeout_s` bounds the provider's silences, not the answer's length: a model writing for
    longer than it, an event at a time, is read to the end in one attempt."""
    fake.script(Reply(text="x" * 96, tool_uses=[{"name": "t", "input": {"a": 1}}], pace_s=0.08))
    reply, took = await timed_call(client_of(fake, timeout_s=0.5, deadline_s=20))
    assert took > 1.0  # twice the attempt timeout, and more
    assert reply.text == "x" * 96 and reply.attempts == 1 and reply.stop_reason == "tool_use"
    assert reply.tool_uses == ({"id": "toolu_fake_0", "name": "t", "input": {"a": 1}},)
    assert reply.usage.output_tokens == 5 and reply.cost_usd > 0
    assert fake.requests[0].body["stream"] is True


async def test_an_endpoint_that_ignores_stream_answers_with_its_whole_message(
    fake: FakeAnthropic,
) -> None:
    """Some gateways and local fakes answer `stream: true` with one JSON Message: it is read as
    it is, blocks, usage and cost alike; a cut one is retried like a cut stream."""
    fake.script(
        Reply(
            text="whole",
            tool_uses=[{"name": "t", "input": {"k": [1, 2]}}],
            blocks=[{"type": "thinking", "thinking": "hm", "signature": "s"}],
            cache_read_tokens=100,
            ignore_stream=True,
        ),
        Reply(text="cut" * 50, ignore_stream=True, truncate=True),
        Reply(text="again", ignore_stream=True),
    )
    client = client_of(fake, max_retries=1)
    try:
        reply = await client.complete(ASK)
        assert reply.text == "whole" and reply.attempts == 1 and reply.stop_reason == "tool_use"
        assert reply.tool_uses == ({"id": "toolu_fake_0", "name": "t", "input": {"k": [1, 2]}},)
        assert reply.usage == Usage(10, 5, 100, 0, 0) and reply.usage_reported
        assert reply.cost_usd == pytest.approx(cost_usd(Usage(10, 5, 100), SONNET))
        assert reply.response_id.startswith("msg_fake_")
        retried = await client.complete(ASK)
    finally:
        await client.aclose()
    assert retried.text == "again" and retried.attempts == 2
    assert all(r.body["stream"] is True for r in fake.requests)


async def test_a_stream_whole_up_to_its_stop_reason_needs_no_message_stop(
    fake: FakeAnthropic,
) -> None:
    fake.script(Reply(text="done", omit_message_stop=True))
    client = client_of(fake, max_retries=0)
    try:
        reply = await client.complete(ASK)
    finally:
        await client.aclose()
    assert reply.text == "done" and reply.stop_reason == "end_turn" and reply.attempts == 1


async def test_a_stream_that_goes_silent_times_out_and_is_retried(fake: FakeAnthropic) -> None:
    fake.script(Reply(text="y" * 64, stall_after=3), Reply(text="second"))
    reply, took = await timed_call(client_of(fake, timeout_s=0.5, deadline_s=20))
    assert reply.text == "second" and reply.attempts == 2
    assert took < 5


async def test_the_deadline_bounds_a_stream_that_keeps_trickling(fake: FakeAnthropic) -> None:
    fake.script(*[Reply(text="z" * 800, pace_s=0.05) for _ in range(4)])
    error, took = await failed_call(
        client_of(fake, max_retries=3, timeout_s=0.5, deadline_s=1.2), DeadlineExceeded
    )
    assert took < 2.5 and error.reason == "LLM_TIMEOUT"
    assert "the call's deadline" in error.message
    for _ in range(100):  # the abandoned stream's connection is closed, not left open
        if fake.disconnects:
            break
        await asyncio.sleep(0.02)
    assert fake.disconnects >= 1


async def test_cancelling_the_call_aborts_its_http_request(
    fake: FakeAnthropic, spans: InMemorySpanExporter
) -> None:
    fake.script(Reply(text="never read", delay_s=10))
    client = client_of(fake)
    try:
        task = asyncio.ensure_future(client.complete(ASK))
        await fake.requested()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if fake.disconnects:
                break
            await asyncio.sleep(0.02)
    finally:
        await client.aclose()
    assert fake.disconnects == 1
    attributes = chat_span(spans).attributes
    assert attributes is not None and attributes["error.type"] == "cancelled"


# --- call_llm -------------------------------------------------------------------------------


class MemoryUsage:
    def __init__(self) -> None:
        self.entries: list[UsageEntry] = []

    def record(self, entry: UsageEntry) -> None:
        self.entries.append(entry)

    def conversation_spent(self, tenant_id: str, conversation_id: str) -> float:
        return sum(e.cost_usd for e in self.entries)


ContextOf = Callable[..., ToolContext]


@pytest_asyncio.fixture
async def context_of(fake: FakeAnthropic) -> AsyncIterator[ContextOf]:
    """call_llm's contexts on clients of the fake (closed after the test)."""
    clients: dict[str, LLMClient] = {}

    def for_role(role: str) -> LLMClient:
        if role not in clients:
            clients[role] = client_of(fake, max_retries=2)
        return clients[role]

    def make(usage: MemoryUsage, **kwargs: Any) -> ToolContext:
        return ToolContext(
            tool_name="call_llm", tenant_id="t", llm_clients=for_role, usage=usage, **kwargs
        )

    yield make
    for client in clients.values():
        await client.aclose()


async def test_a_streaming_caller_hears_a_long_answer_being_written(
    fake: FakeAnthropic, context_of: ContextOf, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool's LLM call reports, as progress, how much of its answer the model has written;
    without a listener (a unary call) it reports nothing and costs nothing."""
    monkeypatch.setattr(llm_client, "TEXT_PROGRESS_INTERVAL_S", 0.1)
    fake.script(Reply(text="w" * 96, pace_s=0.05), Reply(text="v" * 96, pace_s=0.05))
    reports: list[Mapping[str, Any]] = []
    reply = await context_of(MemoryUsage(), progress_sink=reports.append).llm(ASK)
    assert reply.text == "w" * 96 and len(reports) >= 3, reports
    chars = [r["data"]["chars"] for r in reports]
    assert chars == sorted(chars) and chars[0] > 0 and chars[-1] <= 96
    assert (
        reports[-1]["message"] == f"the model is writing its answer: {chars[-1]} characters so far"
    )
    assert {r["data"]["role"] for r in reports} == {"call_llm"}
    unheard = await context_of(MemoryUsage()).llm(ASK)  # no progress sink: nothing to tell
    assert unheard.text == "v" * 96


async def test_call_llm_retries_are_logged_once_and_failures_are_stable_err_kinds(
    fake: FakeAnthropic,
    context_of: ContextOf,
) -> None:
    usage = MemoryUsage()
    ctx = context_of(usage)
    fake.script(overloaded(), Reply(text="fine", input_tokens=100, output_tokens=10))
    result = await call_llm({"prompt": "hi"}, ctx)
    assert isinstance(result.envelope, Ok) and result.envelope.data["text"] == "fine"
    assert [(e.input_tokens, e.output_tokens) for e in usage.entries] == [(100, 10)]
    assert ctx.cost.total == pytest.approx(cost_usd(Usage(100, 10), SONNET))
    fake.script(Reply(status=404, error_type="not_found_error", error_message="model: x"))
    failed = await call_llm({"prompt": "hi"}, ctx)
    assert isinstance(failed.envelope, Err)
    assert failed.envelope.err_kind == "llm_model_not_found"
    assert "toolmesh models set" in failed.envelope.message
    assert len(usage.entries) == 1  # nothing came back, nothing logged


async def test_call_llm_charges_what_a_failed_call_was_billed_for(
    fake: FakeAnthropic, context_of: ContextOf
) -> None:
    """A call whose every attempt broke mid-stream is an Err, yet its usage is logged and its
    cost is the tool's; when that cost crosses the budget the LLM's error is still the one
    the handler sees."""
    usage = MemoryUsage()
    ctx = context_of(usage)
    fake.script(*[Reply(text="d" * 80, input_tokens=400, stream_error="api_error")] * 3)
    failed = await call_llm({"prompt": "hi"}, ctx)
    assert isinstance(failed.envelope, Err) and failed.envelope.err_kind == "llm_unavailable"
    (entry,) = usage.entries
    assert (entry.kind, entry.input_tokens, entry.output_tokens) == ("llm", 1_200, 0)
    assert entry.cost_usd == pytest.approx(cost_usd(Usage(1_200, 0), SONNET))
    assert ctx.cost.total == pytest.approx(entry.cost_usd)
    tight = context_of(MemoryUsage(), budget_limit=0.001)  # 1,200 input tokens: $0.0036
    fake.script(*[Reply(text="e" * 80, input_tokens=400, stream_error="api_error")] * 3)
    with pytest.raises(Unavailable):
        await tight.llm(ASK)
    assert tight.cost.total == pytest.approx(entry.cost_usd)


async def test_a_tool_call_cancelled_mid_answer_still_logs_what_it_was_billed_for(
    fake: FakeAnthropic, context_of: ContextOf, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llm_client, "TEXT_PROGRESS_INTERVAL_S", 0.05)
    fake.script(Reply(text="w" * 400, input_tokens=900, pace_s=0.05))
    usage = MemoryUsage()
    writing = asyncio.Event()
    ctx = context_of(usage, progress_sink=lambda _: writing.set())
    task = asyncio.ensure_future(ctx.llm(ASK))
    await asyncio.wait_for(writing.wait(), 10)  # the answer has begun
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (entry,) = usage.entries
    assert (entry.input_tokens, entry.output_tokens) == (900, 0)
    assert ctx.cost.total == pytest.approx(cost_usd(Usage(900, 0), SONNET))


async def test_a_call_cancelled_while_it_waits_to_retry_counts_each_attempt_once(
    fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llm_client, "_backoff_s", lambda attempt: 30.0)
    fake.script(Reply(text="a" * 80, input_tokens=500, stream_error="overloaded_error"))
    client = client_of(fake, max_retries=2)
    try:
        task = asyncio.ensure_future(client.complete(ASK))
        await fake.requested()
        await asyncio.sleep(0.5)  # the first attempt broke; the call waits 30 s to retry
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as cancelled:
            await task
    finally:
        await client.aclose()
    spend = llm_client.spend_of(cancelled.value)
    assert spend is not None and spend.usage == Usage(500, 0)
    assert len(fake.requests) == 1


async def test_a_call_cancelled_while_its_failed_llm_call_is_charged_stays_cancelled(
    fake: FakeAnthropic, context_of: ContextOf
) -> None:
    """The LLM call failed after being billed; while its usage row is being written the tool
    call is cancelled: the cancellation goes on (it is not swallowed into the LLM's error) and
    the row is still written."""
    usage = MemoryUsage()
    writing, release, written = threading.Event(), threading.Event(), threading.Event()
    record = usage.record

    def slow_record(entry: UsageEntry) -> None:
        writing.set()
        release.wait(10)
        record(entry)
        written.set()

    usage.record = slow_record  # type: ignore[method-assign]
    fake.script(*[Reply(text="d" * 80, input_tokens=300, stream_error="api_error")] * 3)
    task = asyncio.ensure_future(context_of(usage).llm(ASK))
    assert await asyncio.to_thread(writing.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    assert await asyncio.to_thread(written.wait, 10)
    (entry,) = usage.entries
    assert entry.input_tokens == 900


async def test_call_llm_says_when_the_model_refused_or_was_cut_short(
    fake: FakeAnthropic, context_of: ContextOf
) -> None:
    usage = MemoryUsage()
    ctx = context_of(usage)
    fake.script(Reply(text="", stop_reason="refusal", input_tokens=50, output_tokens=1))
    refused = await call_llm({"prompt": "something bad"}, ctx)
    assert isinstance(refused.envelope, Err) and refused.envelope.err_kind == "llm_refusal"
    assert len(usage.entries) == 1  # it was still paid for, and logged
    fake.script(
        Reply(
            text="the start of",
            stop_reason="max_tokens",
            tool_uses=[],
            blocks=[{"type": "tool_use", "id": "toolu_x", "name": "ping", "input": {}}],
        )
    )
    cut = await call_llm({"prompt": "a long essay", "max_output_tokens": 5}, ctx)
    assert isinstance(cut.envelope, Ok)
    kinds = {w.kind for w in cut.envelope.warnings}
    assert kinds == {"truncated", "unexpected_tool_use"}


async def test_call_llm_asks_for_no_more_output_than_the_budget_can_pay(
    fake: FakeAnthropic,
    context_of: ContextOf,
) -> None:
    usage = MemoryUsage()
    ctx = context_of(usage, budget_limit=0.001)
    fake.script(Reply(text="short"))
    await call_llm({"prompt": "tell me everything"}, ctx)
    # $0.001 at $15 per million output tokens pays for 66 of them, not the role's 16384.
    assert fake.requests[-1].body["max_tokens"] == 66


async def test_cache_tokens_count_against_the_budget(
    fake: FakeAnthropic, context_of: ContextOf
) -> None:
    usage = MemoryUsage()
    ctx = context_of(usage, budget_limit=0.01)
    fake.script(
        Reply(text="cached", input_tokens=1, output_tokens=1, cache_write_tokens=10_000)
    )  # 10k cache writes at $3.75/M: $0.0375
    with pytest.raises(BudgetExceeded):
        await call_llm({"prompt": "with a big cached prefix"}, ctx)
    (entry,) = usage.entries
    assert entry.cache_write_tokens == 10_000
    assert entry.cost_usd == pytest.approx((3.0 + 15.0 + 10_000 * 3.75) / 1e6)
