"""Clients of the mesh's services: one channel per address, a CLIENT span per call with W3C
trace context injected into the metadata, and failed calls turned back into ToolmeshError with
their code, reason and metadata intact."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from shared.auth import AUTH_HEADER
from shared.config import MuxSettings
from shared.errors import Unavailable
from shared.mux import MuxChannel
from shared.rpc_errors import from_rpc_error
from shared.server import MAX_MESSAGE_BYTES
from shared.telemetry.tracing import inject_metadata, tracer
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.registry.v1 import registry_pb2_grpc

T = TypeVar("T")

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.enable_retries", 1),
    # With a dns:/// target that resolves to several replicas, spread calls across all of them.
    ("grpc.lb_policy_name", "round_robin"),
]


def open_channel(
    address: str,
    api_key: str | None = None,
    options: list[tuple[str, Any]] | None = None,
    *,
    mux: bool | None = None,
) -> grpc.aio.Channel:
    """A channel to a mesh service. With an API key (`api_key`, else this process's
    TOOLMESH_API_KEY: a service's own key) every call carries it as a bearer token, for services
    that check keys (TOOLMESH_API_KEYS_FILE). Its unary calls go over call streams to the
    service (shared.mux) unless `mux` is False or TOOLMESH_MUX is off (config.MuxSettings)."""
    key = api_key if api_key is not None else os.environ.get("TOOLMESH_API_KEY", "")
    interceptors = [_AioBearerAuth(key), _AioBearerAuthStream(key)] if key else None
    channel = grpc.aio.insecure_channel(
        address, options=options or CHANNEL_OPTIONS, interceptors=interceptors
    )
    settings = MuxSettings.from_env()
    if not (settings.enabled if mux is None else mux):
        return channel
    return MuxChannel(
        channel,
        ((AUTH_HEADER, f"Bearer {key}"),) if key else (),
        streams=settings.streams,
        max_age_s=settings.max_age_s,
    )


def _with_bearer(details: Any, key: str) -> Any:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata.add(AUTH_HEADER, f"Bearer {key}")
    return details._replace(metadata=metadata)


class _AioBearerAuth(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, key: str) -> None:
        self._key = key

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_bearer(details, self._key), request)


class _AioBearerAuthStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, key: str) -> None:
        self._key = key

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_bearer(details, self._key), request)


async def traced_call(
    method: Callable[..., Awaitable[T]],
    request: Any,
    *,
    span_name: str,
    peer_service: str,
    timeout: float | None = None,
    tracing: bool = True,
) -> T:
    """Call one unary RPC as a CLIENT span, propagating the current trace."""
    service, _, rpc_method = span_name.rpartition("/")
    if not tracing:
        return await _invoke(method, request, {}, timeout, peer_service)
    with tracer().start_as_current_span(
        span_name,
        kind=SpanKind.CLIENT,
        attributes={
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": rpc_method,
            "peer.service": peer_service,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        metadata = inject_metadata({})  # the server's parent is this CLIENT span
        try:
            return await _invoke(method, request, metadata, timeout, peer_service)
        except asyncio.CancelledError:  # the caller stopped waiting: the call was cancelled
            mark_cancelled_client(span)
            raise
        except Exception as exc:
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            span.set_attribute("error.type", getattr(exc, "reason", type(exc).__name__))
            raise


def mark_cancelled_client(span: Span) -> None:
    """A CLIENT span whose call this side cancelled: CANCELLED, an error for a client span in
    the gRPC conventions."""
    span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.CANCELLED.value[0])
    span.set_attribute("error.type", "CANCELLED")
    span.set_status(Status(StatusCode.ERROR, "cancelled by the caller"))


async def _invoke(
    method: Callable[..., Awaitable[T]],
    request: Any,
    metadata: dict[str, str] | Any,
    timeout: float | None,
    peer_service: str,
) -> T:
    try:
        return await method(request, metadata=tuple(metadata.items()), timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        err = from_rpc_error(exc)
        if exc.code() == grpc.StatusCode.UNAVAILABLE and not err.metadata:
            raise Unavailable(
                f"{peer_service} unavailable: {exc.details()}",
                reason=err.reason if err.reason != "UNAVAILABLE" else "SERVICE_UNAVAILABLE",
            ) from None
        raise err from None


class MeshClients:
    """Lazily opened channels and stubs to the mesh's services, shared per process."""

    def __init__(self, addresses: dict[str, str]) -> None:
        self._addresses = addresses
        self._channels: dict[str, grpc.aio.Channel] = {}

    def address(self, service: str) -> str:
        return self._addresses.get(service, "")

    def channel(self, service: str) -> grpc.aio.Channel:
        address = self.address(service)
        if not address:
            raise ValueError(f"no address configured for {service}")
        if service not in self._channels:
            self._channels[service] = open_channel(address)
        return self._channels[service]

    def registry(self) -> registry_pb2_grpc.RegistryServiceStub:
        return registry_pb2_grpc.RegistryServiceStub(self.channel("registry"))

    def dispatcher(self) -> dispatcher_pb2_grpc.DispatcherServiceStub:
        return dispatcher_pb2_grpc.DispatcherServiceStub(self.channel("dispatcher"))

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


class _BearerAuth(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <key>` to every call of a synchronous channel."""

    def __init__(self, key: str) -> None:
        self._header = ("authorization", f"Bearer {key}")

    def _details(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._header]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


# What the mesh's command-line channels accept in one response (README: message sizes).
CLIENT_MAX_RECEIVE_BYTES = 64 * 1024 * 1024


def cli_channel(address: str, api_key: str | None = None) -> grpc.Channel:
    """A synchronous channel for command-line tools: sends the API key of TOOLMESH_API_KEY (or
    `api_key`) as a bearer token, for a dispatcher that authenticates its callers."""
    # A tool's result may be up to 32 MB serialised: over gRPC's default 4 MB receive limit.
    channel = grpc.insecure_channel(
        address, options=[("grpc.max_receive_message_length", CLIENT_MAX_RECEIVE_BYTES)]
    )
    key = api_key if api_key is not None else os.environ.get("TOOLMESH_API_KEY", "")
    return grpc.intercept_channel(channel, _BearerAuth(key)) if key else channel
