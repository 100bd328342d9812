"""`create_llm_client_for_role(role)`: an `anthropic` SDK client bound to the model config of a
role. Every call is a CLIENT span with the GenAI attributes, its token usage and its USD cost
(usage × the config's prices), and feeds the token/duration metrics.

The SDK reads ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL from the environment, so tests point it
at a loopback fake Messages API and production at the real one with the same code. Nothing of
the mesh's trace context or baggage is sent to the provider: the SDK's HTTP client is not
instrumented, so no traceparent/baggage header leaves the mesh.

Every call streams (`messages.stream`), so a long answer is never cut by a timeout on the whole
response: `timeout_s` bounds how long the provider may stay silent (to connect, or between two
stream events: the API sends pings while a model thinks), and the call's deadline bounds the
whole of it. A stream that ends before the message's stop reason is a broken connection, never
a partial answer taken as whole; an `error` event in the middle of a stream (`overloaded_error`…) is
classified as the status its type stands for. An endpoint that ignores `stream` (some gateways
and local fakes) and answers with the whole Message as JSON is read as such.

Retries are ours, not the SDK's (its `max_retries` is 0): a transient failure (connection
lost, a stream cut short or not readable, 408/409/429/5xx/529, or `x-should-retry: true`) is
tried again up to `max_retries` times, after the provider's `retry-after(-ms)` when it sends
one and after an exponential backoff with jitter otherwise, but never past the call's deadline:
a wait that would end after it fails the call at once, saying so. Each retry is an event on the
chat span and the attempts are counted on it (`toolmesh.llm.attempts`); each attempt is its own
SDK span under it. Permanent failures (400 prompt too long, 401/403, 404 unknown model, 413)
are not retried, and every failure is a ToolmeshError whose reason starts with `LLM_` and whose
message says what to do.

An attempt that fails after the provider began answering (a stream cut, an `error` event or a
timeout after `message_start`) was still billed for what it had consumed: the usage it reported
so far is priced into the call — `LLMReply.failed_usage` and `cost_usd` when a retry succeeds,
`spend_of(error)` when the call fails — so the usage log and the tool's cost count it."""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from shared.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    ToolmeshError,
    Unavailable,
)
from shared.llm.config import ModelConfig, ModelConfigStore, get_model_for_role
from shared.telemetry import metrics, semconv
from shared.telemetry.tracing import tracer

if TYPE_CHECKING:
    import anthropic

logger = logging.getLogger(__name__)

DEFAULT_MAX_RETRIES = 2
DEFAULT_TIMEOUT_S = 120.0  # the longest silence of the provider within one attempt
DEFAULT_DEADLINE_S = 300.0  # the whole call: every attempt and every wait between them
INITIAL_BACKOFF_S = 0.5
TEXT_PROGRESS_INTERVAL_S = 0.5  # how often on_text hears of a streaming answer's length
MAX_BACKOFF_S = 8.0
# Anthropic prices a 1-hour cache write at twice the base input price (a 5-minute one, the
# config's cache_write price, at 1.25x).
CACHE_WRITE_1H_INPUT_MULTIPLIER = 2.0

LLM_ATTEMPTS = "toolmesh.llm.attempts"
LLM_RETRY_EVENT = "toolmesh.llm.retry"
LLM_USAGE_MISSING = "toolmesh.llm.usage_missing"
# Of the span's usage, what attempts that broke after the provider began answering consumed.
LLM_FAILED_INPUT_TOKENS = "toolmesh.llm.failed_attempts.input_tokens"
LLM_FAILED_OUTPUT_TOKENS = "toolmesh.llm.failed_attempts.output_tokens"


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0  # every cache write, 5-minute and 1-hour
    cache_write_1h_tokens: int = 0  # of which 1-hour writes (priced higher)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.cache_write_1h_tokens + other.cache_write_1h_tokens,
        )


def cache_write_1h_price_per_mtok(cfg: ModelConfig) -> float:
    """The price of a 1-hour cache write: twice the input price, never below the config's
    (5-minute) cache write price."""
    return max(
        cfg.cache_write_price_per_mtok, CACHE_WRITE_1H_INPUT_MULTIPLIER * cfg.input_price_per_mtok
    )


def cost_usd(usage: Usage, cfg: ModelConfig) -> float:
    """USD cost of `usage` at the config's prices (per million tokens). `input_tokens` excludes
    the cached ones, which are priced as cache reads and writes."""
    write_1h = min(usage.cache_write_1h_tokens, usage.cache_write_tokens)
    return (
        usage.input_tokens * cfg.input_price_per_mtok
        + usage.output_tokens * cfg.output_price_per_mtok
        + usage.cache_read_tokens * cfg.cache_read_price_per_mtok
        + (usage.cache_write_tokens - write_1h) * cfg.cache_write_price_per_mtok
        + write_1h * cache_write_1h_price_per_mtok(cfg)
    ) / 1_000_000


@dataclass(frozen=True)
class LLMSpend:
    """What a call was billed for: its tokens, priced, and on which model."""

    provider: str
    model: str
    usage: Usage
    cost_usd: float


_SPEND = "_toolmesh_llm_spend"


def spend_of(error: BaseException) -> LLMSpend | None:
    """What a failed LLM call was billed for before it failed (the usage its broken attempts
    reported), or None when nothing was."""
    spend = getattr(error, _SPEND, None)
    return spend if isinstance(spend, LLMSpend) else None


async def charge_billed(
    error: BaseException, charge: Callable[[LLMSpend], Awaitable[None]]
) -> None:
    """Run `charge` on what the LLM call that ended in `error` (a failure, or a cancellation)
    was billed for, if anything. Shielded: cancelled meanwhile, the charge still completes in
    the background and the cancellation goes on. A failure of the charge itself is raised."""
    spend = spend_of(error)
    if spend is None:
        return
    task = asyncio.ensure_future(charge(spend))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_retrieved)
        raise


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Retrieve a background charge's outcome (a failure of it is logged where it happens)."""
    if not task.cancelled():
        task.exception()


@dataclass(frozen=True)
class LLMReply:
    """What one Messages API call returned, with its cost."""

    text: str
    model: str
    stop_reason: str
    usage: Usage  # the answer's own usage
    cost_usd: float  # the answer's and its failed attempts' (`failed_usage`)
    response_id: str = ""
    tool_uses: tuple[dict[str, Any], ...] = ()
    provider: str = "anthropic"
    attempts: int = 1  # requests sent for it: the first and each retry
    usage_reported: bool = True  # False when the response had no usage (recorded as zero)
    max_tokens: int = 0  # the output ceiling the request asked for
    # What attempts that broke after the provider began answering were billed for.
    failed_usage: Usage = Usage()

    @property
    def billed_usage(self) -> Usage:
        """Every token the call was billed for: the answer's and its failed attempts'."""
        return self.usage + self.failed_usage

    @property
    def spend(self) -> LLMSpend:
        return LLMSpend(self.provider, self.model, self.billed_usage, self.cost_usd)

    @property
    def truncated(self) -> bool:
        """The answer stopped before the model finished it (token ceiling, or a paused turn)."""
        return self.stop_reason in ("max_tokens", "pause_turn", "model_context_window_exceeded")

    @property
    def refused(self) -> bool:
        return self.stop_reason == "refusal"


@dataclass
class LLMClient:
    """One role's client. `complete` makes one Messages API call under a span."""

    config: ModelConfig
    role: str
    sdk: anthropic.AsyncAnthropic
    extra_attributes: Mapping[str, Any] = field(default_factory=dict)
    max_retries: int = DEFAULT_MAX_RETRIES
    timeout_s: float = DEFAULT_TIMEOUT_S
    deadline_s: float = DEFAULT_DEADLINE_S

    async def aclose(self) -> None:
        await self.sdk.close()

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        system: str | None = None,
        max_output_tokens: int | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        temperature: float | None = None,
        deadline_s: float | None = None,
        on_text: Callable[[int], None] | None = None,
    ) -> LLMReply:
        """One Messages API call, retried while transient within `deadline_s` (at most the
        client's); raises a ToolmeshError with an `LLM_…` reason when it cannot succeed.
        `on_text(chars)`, when given, hears how many characters of text the answer has so far
        while it streams (at most every TEXT_PROGRESS_INTERVAL_S; from 0 again on a retry)."""
        cfg = self.config
        max_tokens = cfg.max_output_tokens
        if max_output_tokens is not None:
            if max_output_tokens <= 0:
                raise InvalidArgument("max_output_tokens must be a positive integer")
            max_tokens = min(max_output_tokens, cfg.max_output_tokens)
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "max_tokens": max_tokens,
            "messages": list(messages),
        }
        if system:
            kwargs["system"] = system
        if tools:
            kwargs["tools"] = list(tools)
        if temperature is not None:
            kwargs["temperature"] = temperature
        attributes = {
            semconv.GEN_AI_OPERATION_NAME: semconv.OPERATION_CHAT,
            semconv.GEN_AI_PROVIDER_NAME: cfg.provider,
            semconv.GEN_AI_REQUEST_MODEL: cfg.model,
            semconv.GEN_AI_REQUEST_MAX_TOKENS: max_tokens,
            "toolmesh.llm.role": self.role,
            **self.extra_attributes,
        }
        started = time.perf_counter()
        budget_s = self.deadline_s if deadline_s is None else min(deadline_s, self.deadline_s)
        deadline = time.monotonic() + max(0.0, budget_s)
        with tracer().start_as_current_span(
            f"{semconv.OPERATION_CHAT} {cfg.model}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            attempts = 0
            failed = Usage()  # what broken attempts were billed for
            attempt = _Attempt()  # the current one; a new one after each failure (and its wait)
            try:
                while True:
                    attempts += 1
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DeadlineExceeded(
                            f"LLM call out of time: its deadline of {budget_s:.0f}s passed "
                            f"after {attempts - 1} attempt(s); try again later or ask for less",
                            reason="LLM_TIMEOUT",
                            metadata={"attempts": str(attempts - 1)},
                        )
                    timeout = min(self.timeout_s, remaining)
                    try:
                        message = await self._streamed(kwargs, timeout, remaining, attempt, on_text)
                        # Billed even if the message turns out unusable below.
                        attempt.usage = _usage(getattr(message, "usage", None))[0]
                        reply = _reply(
                            message, cfg, attempts=attempts, max_tokens=max_tokens, failed=failed
                        )
                        break
                    except (
                        _sdk().APIError,
                        _MalformedReply,
                        _CutShort,
                        ValueError,
                        TimeoutError,
                    ) as exc:
                        failed += attempt.usage
                        attempt = _Attempt()
                        failure = _Failure.of(exc, timeout < self.timeout_s)
                        left = deadline - time.monotonic()
                        wait = failure.retry_after_s
                        if not wait:  # none, or 0: the SDK's rule, back off instead
                            wait = _backoff_s(attempts)
                        if not failure.retryable or attempts > self.max_retries or wait >= left:
                            out_of_time = attempts <= self.max_retries and wait >= left
                            raise _translate(
                                failure,
                                cfg,
                                self.role,
                                attempts,
                                wait_s=wait,
                                out_of_time=out_of_time,
                            ) from exc
                        span.add_event(
                            LLM_RETRY_EVENT,
                            {
                                "toolmesh.llm.attempt": attempts,
                                semconv.ERROR_TYPE: failure.error_type,
                                "http.response.status_code": failure.status,
                                "toolmesh.llm.retry_after_s": wait,
                            },
                        )
                        logger.info(
                            "LLM %s attempt %d failed (%s); retrying in %.2fs",
                            cfg.model,
                            attempts,
                            failure.error_type,
                            wait,
                        )
                        await asyncio.sleep(wait)
            except ToolmeshError as error:
                span.set_status(Status(StatusCode.ERROR, error.message))
                _failed(span, cfg, attempts, failed, started, error.reason, error)
                raise
            except asyncio.CancelledError as cancelled:
                # The tool call was cancelled: the SDK's request is abandoned with it (its
                # connection closed).
                _failed(
                    span, cfg, attempts, failed + attempt.usage, started, "cancelled", cancelled
                )
                raise
            span.set_attribute(LLM_ATTEMPTS, attempts)
            _annotate(span, reply)
            metrics.record_llm_call(cfg, time.perf_counter() - started, reply.billed_usage)
            return reply

    async def _streamed(
        self,
        kwargs: Mapping[str, Any],
        idle_s: float,
        total_s: float,
        attempt: _Attempt,
        on_text: Callable[[int], None] | None = None,
    ) -> Any:
        """One attempt: the Message of a streamed response, read to its stop reason within
        `total_s`, the provider silent for at most `idle_s` at a time (TimeoutError past
        `total_s`; the SDK's APITimeoutError past `idle_s`). When it fails after the message
        began, `attempt.usage` holds what the provider had reported it consumed."""
        try:
            return await self._stream_once(kwargs, idle_s, total_s, attempt, on_text)
        except BaseException:
            if attempt.stream is not None and attempt.started:
                snapshot = attempt.stream.current_message_snapshot
                attempt.usage = _usage(getattr(snapshot, "usage", None))[0]
            raise

    async def _stream_once(
        self,
        kwargs: Mapping[str, Any],
        idle_s: float,
        total_s: float,
        attempt: _Attempt,
        on_text: Callable[[int], None] | None,
    ) -> Any:
        async with asyncio.timeout(total_s):
            async with self.sdk.messages.stream(**kwargs, timeout=idle_s) as stream:
                attempt.stream = stream
                kind = stream.response.headers.get("content-type", "")
                if not kind.startswith("text/event-stream"):
                    # An endpoint that ignores `stream` (some gateways and local fakes) answers
                    # with the whole Message as JSON: taken as it is.
                    return await _whole_message(stream.response, kind)
                # Whole once the stop reason came (`message_delta`; an endpoint may leave out
                # the `message_stop` after it), cut short if the stream ends before.
                finished = False
                chars, told = 0, time.monotonic()
                try:
                    async for event in stream:
                        if event.type == "message_start":
                            attempt.started = True
                        if on_text is not None and event.type == "text":
                            chars += len(event.text)
                            if time.monotonic() - told >= TEXT_PROGRESS_INTERVAL_S:
                                told = time.monotonic()
                                on_text(chars)
                        if event.type == "message_stop" or (
                            event.type == "message_delta"
                            and getattr(getattr(event, "delta", None), "stop_reason", None)
                        ):
                            finished = True
                except _sdk().APIError:
                    raise
                except Exception as exc:  # an event the SDK cannot fold into the Message
                    raise _MalformedReply(
                        f"the response stream could not be read ({type(exc).__name__}: "
                        f"{str(exc)[:200]})"
                    ) from exc
                if not finished:
                    raise _CutShort("the response stream ended before the message did")
                return await stream.get_final_message()


@dataclass
class _Attempt:
    """One request of a call: its stream once open, whether the message began, and what the
    provider reported it consumed when the attempt broke."""

    stream: Any = None
    started: bool = False
    usage: Usage = Usage()


def _failed(
    span: trace.Span,
    cfg: ModelConfig,
    attempts: int,
    usage: Usage,
    started: float,
    error_type: str,
    exc: BaseException,
) -> None:
    """A call that ends without a reply: its attempts and error type on its span, and what it
    was billed for (`usage`, by attempts that broke after the provider began answering) on the
    span, in the metrics and on `exc` (spend_of)."""
    span.set_attribute(LLM_ATTEMPTS, attempts)
    span.set_attribute(semconv.ERROR_TYPE, error_type)
    spend = None
    if usage != Usage():
        spend = LLMSpend(cfg.provider, cfg.model, usage, cost_usd(usage, cfg))
        span.set_attributes(_usage_attributes(usage, spend.cost_usd))
        setattr(exc, _SPEND, spend)
    metrics.record_llm_call(
        cfg,
        time.perf_counter() - started,
        spend.usage if spend is not None else None,
        error_type=error_type,
    )


def _usage_attributes(usage: Usage, cost: float) -> dict[str, Any]:
    return {
        semconv.GEN_AI_USAGE_INPUT_TOKENS: usage.input_tokens,
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: usage.output_tokens,
        semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: usage.cache_read_tokens,
        semconv.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: usage.cache_write_tokens,
        semconv.GEN_AI_USAGE_COST_AMOUNT: cost,
        semconv.GEN_AI_USAGE_COST_CURRENCY: semconv.COST_CURRENCY,
    }


async def _whole_message(response: Any, kind: str) -> Any:
    """The Message of a 200 response that is not an event stream: its JSON body, with its
    content blocks as objects (the shape `_reply` reads)."""
    try:
        body = await response.aread()
    except Exception as exc:  # the body broke off: httpx's own errors, unwrapped here
        raise _CutShort(f"the response body broke off ({type(exc).__name__})") from exc
    try:
        data = json.loads(body)
    except ValueError:
        shown = kind or "no content-type"
        raise _MalformedReply(
            f"the response is neither an event stream nor JSON ({shown})"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise _MalformedReply("the response has no content list")
    blocks = [SimpleNamespace(**b) if isinstance(b, dict) else b for b in data["content"]]
    return SimpleNamespace(**{**data, "content": blocks})


class _MalformedReply(Exception):
    """A 200 response that is not a usable Message."""


class _CutShort(Exception):
    """A stream that ended, without an error, before the Message was whole."""


# The HTTP status each error type of the Messages API stands for: an `error` event in the middle
# of a stream arrives on a 200 response, and is classified as the status its type names.
_ERROR_TYPE_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


def _backoff_s(attempt: int) -> float:
    """Exponential backoff after the `attempt`-th failure, with jitter (no retry-after)."""
    return min(INITIAL_BACKOFF_S * 2.0 ** (attempt - 1), MAX_BACKOFF_S) * (
        1 - 0.25 * random.random()
    )


def _retry_after_s(headers: Any) -> float | None:
    """The provider's `retry-after-ms` / `retry-after` (seconds or an HTTP date), if any."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000)
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        pass
    parsed = email.utils.parsedate_tz(str(value))
    if parsed is None:
        return None
    return max(0.0, float(email.utils.mktime_tz(parsed) - time.time()))


@dataclass(frozen=True)
class _Failure:
    """One failed attempt, classified."""

    kind: str  # timeout | connection | malformed | status
    retryable: bool
    status: int = 0
    error_type: str = ""
    message: str = ""
    request_id: str = ""
    retry_after_s: float | None = None
    clamped: bool = False  # a timeout of an attempt shortened by the call's deadline

    @staticmethod
    def of(exc: BaseException, clamped: bool) -> _Failure:
        sdk = _sdk()
        if isinstance(exc, sdk.APITimeoutError):
            return _Failure("timeout", True, error_type="timeout", clamped=clamped)
        if isinstance(exc, TimeoutError):  # the call's deadline ran out mid-stream
            return _Failure("timeout", True, error_type="timeout", clamped=True)
        if isinstance(exc, sdk.APIConnectionError):
            return _Failure("connection", True, error_type="connection", message=str(exc))
        if isinstance(exc, _CutShort):
            return _Failure("connection", True, error_type="stream_cut", message=str(exc))
        if isinstance(exc, sdk.APIStatusError) and 200 <= int(exc.status_code) < 300:
            # An `error` event mid-stream: its type says what failed; the 200's headers do not.
            error_type, message = _error_body(exc)
            status = _ERROR_TYPE_STATUS.get(error_type, 500)
            return _Failure(
                "status",
                status in (408, 409, 429) or status >= 500,
                status=status,
                error_type=error_type or "stream_error",
                message=f"{message} (an error event mid-stream)".lstrip(),
                request_id=str(getattr(exc, "request_id", "") or ""),
            )
        if isinstance(exc, sdk.APIStatusError):
            status = int(exc.status_code)
            error_type, message = _error_body(exc)
            should = exc.response.headers.get("x-should-retry")
            retryable = (
                should == "true"
                if should in ("true", "false")
                else status in (408, 409, 429) or status >= 500
            )
            return _Failure(
                "status",
                retryable,
                status=status,
                error_type=error_type or f"http_{status}",
                message=message,
                request_id=str(getattr(exc, "request_id", "") or ""),
                retry_after_s=_retry_after_s(exc.response.headers),
            )
        # A 200 whose body is not JSON (ValueError), not a Message, or fails validation.
        detail = str(exc) if isinstance(exc, _MalformedReply) else type(exc).__name__
        return _Failure("malformed", True, error_type="malformed_response", message=detail)


def _error_body(exc: Any) -> tuple[str, str]:
    """The provider's error type and message from an error body, else what the SDK says."""
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping):
            return str(error.get("type") or ""), str(error.get("message") or "")
    text = ""
    try:
        text = exc.response.text[:300]
    except (AttributeError, RuntimeError, UnicodeDecodeError):  # a streamed or closed body
        text = str(getattr(exc, "message", ""))
    return "", text


def _tokens(obj: Any, name: str) -> int:
    value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
    return value if isinstance(value, int) and value > 0 else 0


def _usage(u: Any) -> tuple[Usage, bool]:
    """The response's usage, and whether it had any (a missing field counts as zero)."""
    if u is None:
        return Usage(), False
    write = _tokens(u, "cache_creation_input_tokens")
    split = (
        u.get("cache_creation") if isinstance(u, Mapping) else getattr(u, "cache_creation", None)
    )
    write_1h = _tokens(split, "ephemeral_1h_input_tokens") if split is not None else 0
    write_5m = _tokens(split, "ephemeral_5m_input_tokens") if split is not None else 0
    write = max(write, write_1h + write_5m)
    usage = Usage(
        input_tokens=_tokens(u, "input_tokens"),
        output_tokens=_tokens(u, "output_tokens"),
        cache_read_tokens=_tokens(u, "cache_read_input_tokens"),
        cache_write_tokens=write,
        cache_write_1h_tokens=min(write_1h, write),
    )
    has_counts = any(
        isinstance(u.get(n) if isinstance(u, Mapping) else getattr(u, n, None), int)
        for n in ("input_tokens", "output_tokens")
    )
    return usage, has_counts


def _reply(
    message: Any,
    cfg: ModelConfig,
    *,
    attempts: int = 1,
    max_tokens: int = 0,
    failed: Usage = Usage(),
) -> LLMReply:
    """The Message as an LLMReply: text blocks joined, tool_use blocks listed, every other
    block type (thinking, server tools' blocks, types newer than this code) ignored."""
    content = getattr(message, "content", None)
    if not isinstance(content, list):
        raise _MalformedReply("the response has no content list")
    usage, reported = _usage(getattr(message, "usage", None))
    if not reported:
        logger.warning("LLM %s: the response reported no token usage; recorded as zero", cfg.model)
    texts: list[str] = []
    tool_uses: list[dict[str, Any]] = []
    for block in content:
        kind = getattr(block, "type", None)
        if kind == "text" and isinstance(getattr(block, "text", None), str):
            texts.append(block.text)
        elif kind == "tool_use":
            tool_uses.append(
                {
                    "id": str(getattr(block, "id", "")),
                    "name": str(getattr(block, "name", "")),
                    "input": getattr(block, "input", None) or {},
                }
            )
    return LLMReply(
        text="".join(texts),
        model=str(getattr(message, "model", None) or cfg.model),
        stop_reason=str(getattr(message, "stop_reason", None) or ""),
        usage=usage,
        cost_usd=cost_usd(usage + failed, cfg),
        response_id=str(getattr(message, "id", None) or ""),
        tool_uses=tuple(tool_uses),
        provider=cfg.provider,
        attempts=attempts,
        usage_reported=reported,
        max_tokens=max_tokens,
        failed_usage=failed,
    )


def _annotate(span: trace.Span, reply: LLMReply) -> None:
    """The reply on its chat span: usage and cost are what the call was billed for, its failed
    attempts' included (also counted apart when there were any)."""
    span.set_attributes(
        {
            semconv.GEN_AI_RESPONSE_MODEL: reply.model,
            semconv.GEN_AI_RESPONSE_ID: reply.response_id,
            semconv.GEN_AI_RESPONSE_FINISH_REASONS: [reply.stop_reason],
            **_usage_attributes(reply.billed_usage, reply.cost_usd),
        }
    )
    if reply.failed_usage != Usage():
        span.set_attributes(
            {
                LLM_FAILED_INPUT_TOKENS: reply.failed_usage.input_tokens,
                LLM_FAILED_OUTPUT_TOKENS: reply.failed_usage.output_tokens,
            }
        )
    if not reply.usage_reported:
        span.set_attribute(LLM_USAGE_MISSING, True)


def warm_up(env: Mapping[str, str] | None = None) -> threading.Thread | None:
    """Import the SDK in a background thread when LLM credentials are configured, so a service
    announces readiness without waiting for it and its first LLM call does not pay for it
    either. Without credentials nothing is imported (no LLM call can succeed anyway)."""
    env = os.environ if env is None else env
    if not env.get("ANTHROPIC_API_KEY"):
        return None
    thread = threading.Thread(target=_sdk, name="anthropic-import", daemon=True)
    thread.start()
    return thread


def _sdk() -> Any:
    """The `anthropic` module, imported on first use: importing it takes seconds (its pydantic
    types), and most processes that can make LLM calls (registry, sandbox) seldom or never do,
    so it must not be paid at every service start."""
    import anthropic

    return anthropic


def _translate(
    failure: _Failure,
    cfg: ModelConfig,
    role: str,
    attempts: int,
    *,
    wait_s: float,
    out_of_time: bool,
) -> ToolmeshError:
    """The last failed attempt as a toolmesh error the caller (often a model) can act on."""
    metadata = {"attempts": str(attempts), "model": cfg.model}
    if failure.status:
        metadata["status"] = str(failure.status)
    if failure.error_type:
        metadata["error_type"] = failure.error_type
    if failure.request_id:
        metadata["request_id"] = failure.request_id
    if failure.retry_after_s is not None:
        metadata["retry_after_s"] = f"{failure.retry_after_s:g}"
    said = f": {failure.message}" if failure.message else ""
    tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
    if failure.retryable:
        if out_of_time:
            why = (
                f"the provider asks to retry after {wait_s:.0f}s, past the call's deadline"
                if failure.retry_after_s is not None
                else "no time was left before the call's deadline for another attempt"
            )
        else:
            why = "no retries left"
        tail = f" ({tries}; {why}); try again later"
    else:
        tail = ""
    s = failure.status
    if failure.kind == "timeout":
        what = (
            "the call's deadline"
            if failure.clamped
            else "the per-attempt timeout (the longest silence allowed while it answers)"
        )
        return DeadlineExceeded(
            f"LLM provider did not answer within {what}{tail}",
            reason="LLM_TIMEOUT",
            metadata=metadata,
        )
    if failure.kind == "connection":
        return Unavailable(
            f"LLM provider unreachable or the connection broke mid-response{said}{tail}",
            reason="LLM_UNAVAILABLE",
            metadata=metadata,
        )
    if failure.kind == "malformed":
        return Unavailable(
            f"LLM provider sent a malformed response{said}{tail}",
            reason="LLM_BAD_RESPONSE",
            metadata=metadata,
        )
    if s == 429:
        return ResourceExhausted(
            f"LLM provider rate limit (429 {failure.error_type}){said}{tail}",
            reason="LLM_RATE_LIMITED",
            metadata=metadata,
        )
    if s == 401:
        return FailedPrecondition(
            f"LLM provider refused the credentials (401{said}); an operator must fix "
            "ANTHROPIC_API_KEY",
            reason="LLM_AUTH",
            metadata=metadata,
        )
    if s == 403:
        return FailedPrecondition(
            f"LLM provider does not permit this key to use model {cfg.model!r} (403{said}); "
            "an operator must grant access or change the model",
            reason="LLM_AUTH",
            metadata=metadata,
        )
    if s == 404:
        return FailedPrecondition(
            f"LLM provider does not know model {cfg.model!r}, configured for role {role!r} "
            f"(404{said}); an operator must fix the model config (`toolmesh models set`) or "
            "ANTHROPIC_BASE_URL",
            reason="LLM_MODEL_NOT_FOUND",
            metadata=metadata,
        )
    if s == 413:
        return InvalidArgument(
            f"the request is too large for the LLM provider (413{said}); send a shorter prompt",
            reason="LLM_REQUEST_TOO_LARGE",
            metadata=metadata,
        )
    if s in (400, 422):
        too_long = "too long" in failure.message.lower() or "too many" in failure.message.lower()
        return InvalidArgument(
            f"LLM provider rejected the request ({s} {failure.error_type}{said})"
            + ("; shorten the prompt or ask for fewer output tokens" if too_long else ""),
            reason="LLM_PROMPT_TOO_LONG" if too_long else "LLM_INVALID_REQUEST",
            metadata=metadata,
        )
    if 400 <= s < 500 and not failure.retryable:
        return FailedPrecondition(
            f"LLM provider refused the request ({s} {failure.error_type}{said})",
            reason="LLM_REJECTED",
            metadata=metadata,
        )
    return Unavailable(
        f"LLM provider error {s} {failure.error_type}{said}{tail}",
        reason="LLM_UNAVAILABLE",
        metadata=metadata,
    )


def create_llm_client_for_role(
    role: str,
    store: ModelConfigStore | None = None,
    *,
    env: Mapping[str, str] | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> LLMClient:
    """A client for `role` on the model its config names. Credentials and endpoint come from
    ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL; without a key there is no client, and the error
    says what to set."""
    env = os.environ if env is None else env
    cfg = get_model_for_role(role, store)
    if cfg.provider != "anthropic":
        raise FailedPrecondition(f"provider {cfg.provider!r} has no client", reason="LLM_PROVIDER")
    api_key = env.get("ANTHROPIC_API_KEY", "")
    if not api_key:
        raise FailedPrecondition(
            "no LLM credentials: set ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL for a "
            "non-default endpoint)",
            reason="LLM_NOT_CONFIGURED",
        )
    sdk = _sdk().AsyncAnthropic(
        api_key=api_key,
        base_url=env.get("ANTHROPIC_BASE_URL") or None,
        max_retries=0,  # retries are LLMClient.complete's: bounded by the call's deadline
        timeout=timeout_s,
        # The SDK's own span (HTTP status, retries) nests under our chat span, but it must not
        # send the mesh's trace context or baggage (tenant, conversation) to the provider.
        open_telemetry={"propagation": False},
    )
    return LLMClient(
        config=cfg,
        role=role,
        sdk=sdk,
        max_retries=max(0, max_retries),
        timeout_s=timeout_s,
        deadline_s=deadline_s,
    )


class LlmClientCache:
    """One client per role for a process, refreshed when the role's model config changes (an
    operator's UpsertModelConfig takes effect without a restart: configs are re-read after
    `ttl_s`)."""

    def __init__(
        self,
        store: ModelConfigStore | None,
        *,
        ttl_s: float = 10.0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        deadline_s: float = DEFAULT_DEADLINE_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ) -> None:
        """`timeout_s`, `deadline_s`, `max_retries`: every client's (TOOLMESH_LLM_TIMEOUT_S,
        TOOLMESH_LLM_DEADLINE_S, TOOLMESH_LLM_MAX_RETRIES)."""
        self._store = store
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._deadline_s = deadline_s
        self._max_retries = max_retries
        self._clients: dict[str, tuple[float, LLMClient]] = {}
        self._retired: list[LLMClient] = []

    def for_role(self, role: str) -> LLMClient:
        now = time.monotonic()
        cached = self._clients.get(role)
        if cached is not None and cached[0] > now:
            return cached[1]
        client = create_llm_client_for_role(
            role,
            self._store,
            timeout_s=self._timeout_s,
            deadline_s=self._deadline_s,
            max_retries=self._max_retries,
        )
        if cached is not None and cached[1].config == client.config:
            client = cached[1]  # keep the SDK's connection pool
        elif cached is not None:
            self._retired.append(cached[1])
        self._clients[role] = (now + self._ttl_s, client)
        return client

    async def aclose(self) -> None:
        """Close every client's connection pool (at shutdown)."""
        clients = [c for _, c in self._clients.values()] + self._retired
        self._clients.clear()
        self._retired.clear()
        for client in clients:
            await client.aclose()
