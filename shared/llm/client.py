"""`create_llm_client_for_role(role)`: an `anthropic` SDK client bound to the model config of a
role. Every call is a CLIENT span with the GenAI attributes, its token usage and its USD cost
(usage × the config's prices), and feeds the token/duration metrics.

The SDK reads ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL from the environment, so tests point it
at a loopback fake Messages API and production at the real one with the same code. Nothing of
the mesh's trace context or baggage is sent to the provider: the SDK's HTTP client is not
instrumented, so no traceparent/baggage header leaves the mesh."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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

DEFAULT_MAX_RETRIES = 2
DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )


def cost_usd(usage: Usage, cfg: ModelConfig) -> float:
    """USD cost of `usage` at the config's prices (per million tokens)."""
    return (
        usage.input_tokens * cfg.input_price_per_mtok
        + usage.output_tokens * cfg.output_price_per_mtok
        + usage.cache_read_tokens * cfg.cache_read_price_per_mtok
        + usage.cache_write_tokens * cfg.cache_write_price_per_mtok
    ) / 1_000_000


@dataclass(frozen=True)
class LLMReply:
    """What one Messages API call returned, with its cost."""

    text: str
    model: str
    stop_reason: str
    usage: Usage
    cost_usd: float
    response_id: str = ""
    tool_uses: tuple[dict[str, Any], ...] = ()
    provider: str = "anthropic"


@dataclass
class LLMClient:
    """One role's client. `complete` makes one Messages API call under a span."""

    config: ModelConfig
    role: str
    sdk: anthropic.AsyncAnthropic
    extra_attributes: Mapping[str, Any] = field(default_factory=dict)

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
    ) -> LLMReply:
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
        with tracer().start_as_current_span(
            f"{semconv.OPERATION_CHAT} {cfg.model}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                message = await self.sdk.messages.create(**kwargs)
            except _sdk().APIError as exc:
                error = _translate(exc)
                span.set_attribute(semconv.ERROR_TYPE, type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, error.message))
                metrics.record_llm_call(
                    cfg, time.perf_counter() - started, None, error_type=type(exc).__name__
                )
                raise error from exc
            reply = _reply(message, cfg)
            _annotate(span, reply)
            metrics.record_llm_call(cfg, time.perf_counter() - started, reply.usage)
            return reply


def _reply(message: Any, cfg: ModelConfig) -> LLMReply:
    u = message.usage
    usage = Usage(
        input_tokens=int(u.input_tokens or 0),
        output_tokens=int(u.output_tokens or 0),
        cache_read_tokens=int(getattr(u, "cache_read_input_tokens", 0) or 0),
        cache_write_tokens=int(getattr(u, "cache_creation_input_tokens", 0) or 0),
    )
    texts: list[str] = []
    tool_uses: list[dict[str, Any]] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            tool_uses.append({"id": block.id, "name": block.name, "input": block.input})
    return LLMReply(
        text="".join(texts),
        model=message.model,
        stop_reason=message.stop_reason or "",
        usage=usage,
        cost_usd=cost_usd(usage, cfg),
        response_id=message.id,
        tool_uses=tuple(tool_uses),
        provider=cfg.provider,
    )


def _annotate(span: trace.Span, reply: LLMReply) -> None:
    span.set_attributes(
        {
            semconv.GEN_AI_RESPONSE_MODEL: reply.model,
            semconv.GEN_AI_RESPONSE_ID: reply.response_id,
            semconv.GEN_AI_RESPONSE_FINISH_REASONS: [reply.stop_reason],
            semconv.GEN_AI_USAGE_INPUT_TOKENS: reply.usage.input_tokens,
            semconv.GEN_AI_USAGE_OUTPUT_TOKENS: reply.usage.output_tokens,
            semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: reply.usage.cache_read_tokens,
            semconv.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: reply.usage.cache_write_tokens,
            semconv.GEN_AI_USAGE_COST_AMOUNT: reply.cost_usd,
            semconv.GEN_AI_USAGE_COST_CURRENCY: semconv.COST_CURRENCY,
        }
    )


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


def _translate(exc: anthropic.APIError) -> ToolmeshError:
    """The SDK's errors (after its own retries of 408/409/429/5xx) as toolmesh errors."""
    sdk = _sdk()
    if isinstance(exc, sdk.APITimeoutError):
        return DeadlineExceeded(f"LLM provider timed out: {exc.message}", reason="LLM_TIMEOUT")
    if isinstance(exc, sdk.APIConnectionError):
        return Unavailable(f"LLM provider unreachable: {exc.message}", reason="LLM_UNAVAILABLE")
    if isinstance(exc, sdk.RateLimitError):
        return ResourceExhausted(
            f"LLM provider rate limit (429) persisted after retries: {exc.message}",
            reason="LLM_RATE_LIMITED",
        )
    if isinstance(exc, sdk.AuthenticationError | sdk.PermissionDeniedError):
        return FailedPrecondition(
            f"LLM provider refused the credentials: {exc.message}", reason="LLM_AUTH"
        )
    if isinstance(exc, sdk.BadRequestError | sdk.UnprocessableEntityError):
        return InvalidArgument(f"LLM provider rejected the request: {exc.message}")
    if isinstance(exc, sdk.APIStatusError):
        return Unavailable(
            f"LLM provider error {exc.status_code} persisted after retries: {exc.message}",
            reason="LLM_UNAVAILABLE",
        )
    return Unavailable(f"LLM call failed: {exc.message}", reason="LLM_UNAVAILABLE")


def create_llm_client_for_role(
    role: str,
    store: ModelConfigStore | None = None,
    *,
    env: Mapping[str, str] | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
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
        max_retries=max_retries,
        timeout=timeout_s,
        # The SDK's own span (HTTP status, retries) nests under our chat span, but it must not
        # send the mesh's trace context or baggage (tenant, conversation) to the provider.
        open_telemetry={"propagation": False},
    )
    return LLMClient(config=cfg, role=role, sdk=sdk)


class LlmClientCache:
    """One client per role for a process, refreshed when the role's model config changes (an
    operator's UpsertModelConfig takes effect without a restart: configs are re-read after
    `ttl_s`)."""

    def __init__(self, store: ModelConfigStore | None, *, ttl_s: float = 10.0) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self._clients: dict[str, tuple[float, LLMClient]] = {}
        self._retired: list[LLMClient] = []

    def for_role(self, role: str) -> LLMClient:
        now = time.monotonic()
        cached = self._clients.get(role)
        if cached is not None and cached[0] > now:
            return cached[1]
        client = create_llm_client_for_role(role, self._store)
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
