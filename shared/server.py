"""The one server pattern every service uses: grpc.aio with the tracing/error handler wrapper, the
standard health service, server reflection, and graceful shutdown on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import os
import signal
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from shared import reflection
from shared.auth import ApiKeys, Principal
from shared.errors import (
    Internal,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    ToolmeshError,
    Unavailable,
)
from shared.mux import CALLS_METHOD, MuxServicer
from shared.rpc_errors import status_message, to_status_code, trailing_metadata
from shared.service_main import EXIT_WITH_PARENT_ENV
from shared.telemetry.tracing import current_trace_id, extract_context, tracer
from toolmesh.mux.v1 import mux_pb2, mux_pb2_grpc

logger = logging.getLogger(__name__)

# Infrastructure RPCs that are not traced (they would drown real calls), but still error-mapped.
_UNTRACED_PREFIXES = ("/grpc.health.", "/grpc.reflection.")
# How close to its deadline a cancelled call counts as having run out of time (deadline_passed).
DEADLINE_SLACK_S = 0.25
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# After the drain, what server.stop still waits for (call streams sending their last answers).
STOP_GRACE_FLOOR_S = 0.5
MUX_SERVICE = mux_pb2.DESCRIPTOR.services_by_name["MuxService"].full_name
# Each server's call-stream servicer, drained when the server shuts down.
_MUX_OF: weakref.WeakKeyDictionary[grpc.aio.Server, MuxServicer] = weakref.WeakKeyDictionary()
# Each server's handler wrapper, which drains the server's calls before it stops.
_WRAPPER_OF: weakref.WeakKeyDictionary[grpc.aio.Server, HandlerWrapper] = (
    weakref.WeakKeyDictionary()
)


# The non-admin caller of the RPC being served (MeshAuth), for a handler's own checks. Not set
# for an admin key (the mesh's own calls: nothing more to do on their path) or without keys.
_RESTRICTED: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "toolmesh_restricted_principal", default=None
)


def restricted_principal() -> Principal | None:
    """The non-admin API key's principal of the RPC being served; None for an admin key, when
    the service runs without API keys, or outside an RPC."""
    return _RESTRICTED.get()


def require_admin_caller(what: str) -> None:
    """PERMISSION_DENIED when the RPC being served came with a non-admin key (a service
    running without API keys lets everyone through)."""
    principal = _RESTRICTED.get()
    if principal is not None:
        principal.require_admin(what)


@dataclass(frozen=True)
class MeshAuth:
    """API keys on a mesh-internal service (TOOLMESH_API_KEYS_FILE): every RPC but health and
    reflection needs a known key, and `admin_methods` (method names, or "*" for all) an admin
    key. With `scoped`, a non-admin key must name its own tenant wherever a request has a
    `tenant_id` or `context.tenant_id` (an empty one included: no implicit "every tenant").
    A non-admin key may claim (`capabilities` or `context.capabilities`) only what it may at
    the dispatcher (Principal.not_allowed). The mesh's services call each other with
    their own admin key (TOOLMESH_API_KEY, sent by shared.clients.open_channel)."""

    keys: ApiKeys
    admin_methods: frozenset[str] = frozenset()
    scoped: bool = True

    def check(self, name: str, request: Any, context: grpc.aio.ServicerContext) -> Principal | None:
        """The caller when it is not an admin (None for an admin key); raises when the key
        is unknown or may not make this call."""
        principal = self.keys.authenticate(context.invocation_metadata())
        if principal.admin:
            return None
        if name in self.admin_methods or "*" in self.admin_methods:
            principal.require_admin(name)
        tenant = request_tenant(request) if self.scoped else None
        if tenant is not None:
            principal.require_tenant(tenant, name)
        claimed = request_capabilities(request)
        if claimed:
            extra = principal.not_allowed(claimed)
            if extra:
                raise PermissionDenied(
                    f"{name} claims capabilities the API key {principal.name!r} may not: "
                    f"{', '.join(extra)}",
                    reason="CAPABILITY_NOT_ALLOWED",
                    metadata={"capabilities": ",".join(extra), "key": principal.name},
                )
        return principal


def mesh_auth(
    api_keys_file: str, *, admin_methods: Iterable[str] = (), scoped: bool = True
) -> MeshAuth | None:
    """The MeshAuth of a service whose settings name a keys file (None without one)."""
    if not api_keys_file:
        return None
    if not os.environ.get("TOOLMESH_API_KEY"):
        logger.warning(
            "TOOLMESH_API_KEYS_FILE is set but TOOLMESH_API_KEY is not: this service's own "
            "calls to other services that check keys will be refused"
        )
    return MeshAuth(ApiKeys.load(api_keys_file), frozenset(admin_methods), scoped)


def request_capabilities(request: Any) -> Sequence[str]:
    """The capabilities a request claims (its `capabilities`, else its
    `context.capabilities`); empty when it has no such field."""
    fields = getattr(getattr(request, "DESCRIPTOR", None), "fields_by_name", {})
    if "capabilities" in fields:
        return list(request.capabilities)
    if "context" in fields and "capabilities" in request.context.DESCRIPTOR.fields_by_name:
        return list(request.context.capabilities)
    return ()


def request_tenant(request: Any) -> str | None:
    """The tenant a request names (its `tenant_id`, else its `context.tenant_id`), or None when
    it has no such field."""
    fields = getattr(getattr(request, "DESCRIPTOR", None), "fields_by_name", {})
    if "tenant_id" in fields:
        return str(request.tenant_id)
    if "context" in fields and "tenant_id" in request.context.DESCRIPTOR.fields_by_name:
        return str(request.context.tenant_id)
    return None


class HandlerWrapper:
    """Per RPC: a SERVER span continuing the caller's trace, the API-key check when the service
    has one, and the mapping of ToolmeshError to a rich status (any other exception becomes
    INTERNAL without a traceback).

    Applied to each method handler once, when it is registered (see Registrar), rather than as
    a grpc.aio ServerInterceptor: an aio interceptor runs an extra coroutine chain on every
    RPC to find the handler, measured at 0.1-0.17 ms of server CPU per call, on every hop."""

    def __init__(
        self,
        tracing: bool,
        *,
        trust_baggage: bool = True,
        auth: MeshAuth | None = None,
        max_in_flight: int = 0,
        stream_keys: ApiKeys | None = None,
    ) -> None:
        self._tracing = tracing
        self._max_in_flight = max_in_flight  # 0: no limit
        self._trust_baggage = trust_baggage
        self._auth = auth
        # The keys a call stream must carry as it opens (admit_stream): auth's, or those of a
        # service that checks its callers itself (the dispatcher).
        self.stream_keys = auth.keys if auth is not None else stream_keys
        # method -> (the service's handler, its wrapped handler): one wrapper per method, shared
        # by the generic and the registered-method lookups.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}
        # Calls running (health and reflection aside), and whether new ones are refused.
        self._inflight = 0
        self._draining = False
        self._idle: asyncio.Event | None = None

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new calls (UNAVAILABLE, reason SHUTTING_DOWN: a client retries them on
        another replica) and wait up to `timeout_s` for the running ones to end; True when
        they did. The server goes on matching calls meanwhile: a call gRPC has received but
        not yet handed to a handler when the server stops is answered CANCELLED, which no
        client retries (grpc/grpc#41785), so the server stops only once idle."""
        self._draining = True
        if self._inflight == 0:
            return True
        self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _enter(self) -> None:
        if self._draining:
            raise Unavailable(
                "the service is shutting down; retry on another replica",
                reason="SHUTTING_DOWN",
            )
        if self._max_in_flight and self._inflight >= self._max_in_flight:
            # Shed at once rather than queue without bound: a retry with backoff, here or on
            # another replica, finds room.
            raise ResourceExhausted(
                f"the service is running its limit of {self._max_in_flight} calls at once "
                "(TOOLMESH_MAX_IN_FLIGHT); retry with backoff",
                reason="OVERLOADED",
                metadata={"max_in_flight": str(self._max_in_flight)},
            )
        self._inflight += 1

    def _exit(self) -> None:
        self._inflight -= 1
        if self._inflight == 0 and self._idle is not None:
            self._idle.set()

    async def admit_stream(self, context: grpc.aio.ServicerContext) -> None:
        """Let a call stream (shared.mux, MuxService/Calls) open, or refuse it at once.

        With API keys, the stream's own metadata must carry a known key: a stream opened
        without one, or with an unknown key, is refused UNAUTHENTICATED, with the status and
        ErrorInfo a unary call without that key gets, before any of its frames is read; so a
        caller without a key cannot hold streams open on the service. Admitting a stream grants
        nothing else: each call on it is still checked on its own, as a unary call is (an
        admin method, the tenant, the capabilities claimed). Once per stream, never per call.
        Without API keys every stream opens (create_server then passes no check at all).

        An open stream is not counted in flight (TOOLMESH_MAX_IN_FLIGHT): a client keeps its
        streams open, busy or idle, for as long as it runs (shared.mux renews them), so
        counting them would hold slots for good and shed ordinary calls once enough clients
        were connected. Each call on a stream is counted while it runs, as a unary call is.
        Nor are streams capped per peer or in total: a peer is one connection (a client opens
        as many as it likes), and a cap in total would let one key holder push every other
        client's calls off their streams. What bounds them is the key: only a key holder
        holds a stream (about 23 KB of server memory while idle, measured), with at most
        shared.mux.MAX_CALLS_PER_STREAM calls in flight on it, and keepalive drops a peer that
        vanished (keepalive_options)."""
        if self.stream_keys is None:
            return
        try:
            self.stream_keys.authenticate(context.invocation_metadata())
        except ToolmeshError as exc:
            await _abort(context, trace.INVALID_SPAN, exc, CALLS_METHOD)  # raises

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        infrastructure = method.startswith(_UNTRACED_PREFIXES)
        traced = self._tracing and not infrastructure
        auth = None if infrastructure else self._auth
        counting = not infrastructure  # a health Watch never ends: it does not hold a drain
        service, _, name = method.lstrip("/").rpartition("/")
        rpc = _Rpc(
            wrapper=self,
            method=method,
            name=name,
            span_name=method.lstrip("/"),
            attrs={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
            traced=traced,
            trust_baggage=self._trust_baggage,
            auth=auth,
            counting=counting,
        )

        def boundary(request: Any, context: grpc.aio.ServicerContext) -> _Boundary:
            return _Boundary(rpc, request, context)

        deserialize = _decoding(handler.request_deserializer, method)
        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                async with boundary(request, context):
                    return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary,
                request_deserializer=deserialize,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            inner_stream = handler.unary_stream

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                async with boundary(request, context):
                    async for item in inner_stream(request, context):
                        yield item

            async def unary_stream_writer(request: Any, context: grpc.aio.ServicerContext) -> None:
                """A handler that answers with `await context.write(...)` rather than by
                yielding (grpc.aio takes both; the standard health Watch is one)."""
                async with boundary(request, context):
                    await inner_stream(request, context)

            writer = inspect.iscoroutinefunction(inner_stream)
            return grpc.unary_stream_rpc_method_handler(
                unary_stream_writer if writer else unary_stream,
                request_deserializer=deserialize,
                response_serializer=handler.response_serializer,
            )
        return handler  # stream-unary / stream-stream: reflection only; passed through


@dataclass(frozen=True)
class _Rpc:
    """What the boundary of one wrapped method needs, fixed when the method is registered."""

    wrapper: HandlerWrapper
    method: str
    name: str
    span_name: str
    attrs: dict[str, str]
    traced: bool
    trust_baggage: bool
    auth: MeshAuth | None
    counting: bool


_UNTRACED_CONTEXT = trace.set_span_in_context(trace.INVALID_SPAN)


class _Boundary:
    """The RPC boundary every wrapped call runs inside: its SERVER span (continuing the
    caller's trace, whose context, with its baggage when trusted, is the current one for the
    whole call, so the handler's spans and outgoing calls carry it), the drain's count, the
    API-key check, an undecodable request refused, a cancellation recorded on the span, and any
    failure mapped to a rich status. A class rather than a pair of generator-based context
    managers: those cost ~4 µs a call, on every hop."""

    __slots__ = (
        "_context",
        "_counted",
        "_principal_token",
        "_request",
        "_rpc",
        "_scope",
        "_span",
        "_token",
    )

    def __init__(self, rpc: _Rpc, request: Any, context: grpc.aio.ServicerContext) -> None:
        self._rpc = rpc
        self._request = request
        self._context = context
        self._token: Any = None
        self._scope: Any = None
        self._span: trace.Span = trace.INVALID_SPAN
        self._counted = False
        self._principal_token: contextvars.Token[Principal | None] | None = None

    async def __aenter__(self) -> None:
        rpc, context = self._rpc, self._context
        if rpc.traced:
            md = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
            self._token = otel_context.attach(extract_context(md, trust_baggage=rpc.trust_baggage))
            self._scope = tracer().start_as_current_span(
                rpc.span_name,
                kind=SpanKind.SERVER,
                attributes=rpc.attrs,
                record_exception=False,
                set_status_on_exception=False,
            )
            self._span = self._scope.__enter__()
        else:
            self._token = otel_context.attach(_UNTRACED_CONTEXT)
            self._span = trace.INVALID_SPAN
        try:
            if rpc.counting:
                rpc.wrapper._enter()
                self._counted = True
            if rpc.auth is not None:
                restricted = rpc.auth.check(rpc.name, self._request, context)
                if restricted is not None:
                    self._principal_token = _RESTRICTED.set(restricted)
            if isinstance(self._request, _Undecodable):
                raise self._request.error()
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        try:
            if isinstance(exc, asyncio.CancelledError):
                _mark_cancelled(self._span, self._context)
            elif isinstance(exc, Exception):
                await _abort(self._context, self._span, exc, self._rpc.method)  # raises
            return False
        finally:
            if self._counted:
                self._counted = False
                self._rpc.wrapper._exit()
            principal_token, self._principal_token = self._principal_token, None
            if principal_token is not None:
                # An async generator closed by the loop's finalizer runs in another context.
                with contextlib.suppress(ValueError, RuntimeError):
                    _RESTRICTED.reset(principal_token)
            scope, self._scope = self._scope, None
            if scope is not None:
                scope.__exit__(None, None, None)
            token, self._token = self._token, None
            if token is not None:
                otel_context.detach(token)


@dataclass(frozen=True)
class _Undecodable:
    """A request whose bytes are not its message (corrupt, truncated, or a string field that
    is not UTF-8, which some languages' protobuf libraries let a client send): handed to the
    wrapped handler, which answers INVALID_ARGUMENT. gRPC itself would answer UNKNOWN with a
    Python exception's repr."""

    message_type: str
    detail: str

    def error(self) -> InvalidArgument:
        return InvalidArgument(
            f"the request is not a valid {self.message_type}: {self.detail} (send the message's "
            "protobuf encoding; string fields must be valid UTF-8)",
            reason="REQUEST_NOT_DECODABLE",
            field_violations=[("request", self.detail)],
        )


def _decoding(
    deserializer: Callable[[bytes], Any] | None, method: str
) -> Callable[[bytes], Any] | None:
    """`deserializer` returning an _Undecodable instead of raising."""
    if deserializer is None:
        return None
    message = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    message_type = getattr(message, "full_name", "") or f"request of {method}"

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - any failure to decode is the client's input
            detail = str(exc).rpartition(": ")[2] or type(exc).__name__
            return _Undecodable(message_type, detail[:200])

    return deserialize


async def _abort(
    context: grpc.aio.ServicerContext, span: trace.Span, exc: Exception, method: str
) -> None:
    if isinstance(exc, grpc.aio.AbortError) or _is_abort(exc):
        raise exc
    if isinstance(exc, ToolmeshError):
        error = exc
        logger.info("%s -> %s (%s): %s", method, error.code, error.reason, error.message)
    else:
        trace_id = current_trace_id()
        logger.error("unhandled error in %s", method, exc_info=exc)
        error = Internal(
            f"internal error in {method}" + (f" (trace {trace_id})" if trace_id else ""),
            reason="INTERNAL",
        )
    code = to_status_code(error)
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    span.set_attribute("error.type", error.reason)
    span.set_status(Status(StatusCode.ERROR, error.message))
    await context.abort(code, status_message(error), trailing_metadata=trailing_metadata(error))


def deadline_passed(context: grpc.aio.ServicerContext) -> bool:
    """Whether a cancelled call ran out of time rather than being cancelled by its caller.

    A client whose deadline passes cancels the call itself, and the server's copy of the
    deadline runs from when the call arrived, a little later: so a cancellation within
    DEADLINE_SLACK_S of the server's deadline counts as the deadline."""
    try:
        remaining = context.time_remaining()
    except Exception:  # noqa: BLE001 - a context without a deadline to ask about
        return False
    return remaining is not None and remaining <= DEADLINE_SLACK_S


def _mark_cancelled(span: trace.Span, context: grpc.aio.ServicerContext) -> None:
    """A call gRPC cancelled (its deadline passed, the caller cancelled it or went away, or
    the server stopped): the span says which, as the gRPC conventions do for its status code.
    Per those conventions a passed deadline is an error of a server span, a cancellation not."""
    if not span.is_recording():
        return
    if deadline_passed(context):
        span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
        span.set_attribute("error.type", "DEADLINE_EXCEEDED")
        span.set_status(Status(StatusCode.ERROR, "the caller's deadline passed"))
    else:
        span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.CANCELLED.value[0])
        span.set_attribute("error.type", "CANCELLED")


def _is_abort(exc: Exception) -> bool:
    # grpc.aio raises a private AbortError subclass of Exception from context.abort().
    return type(exc).__name__ == "AbortError"


class _WrappingGenericHandler(grpc.GenericRpcHandler):
    """A generic handler whose method handlers come out wrapped."""

    def __init__(self, inner: grpc.GenericRpcHandler, wrapper: HandlerWrapper) -> None:
        self._inner = inner
        self._wrapper = wrapper

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        return self._wrapper.wrap(handler_call_details.method, handler)


class Registrar:
    """What the generated `add_*Servicer_to_server` functions (and health and reflection) are
    given as the server: each method handler they register is wrapped by the HandlerWrapper
    first. Everything else goes to the real server."""

    def __init__(self, server: grpc.aio.Server, wrapper: HandlerWrapper) -> None:
        self._server = server
        self._wrapper = wrapper
        # Method path -> its wrapped handler, for the unary methods: what the call stream
        # (shared.mux) serves.
        self.unary_handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_WrappingGenericHandler(h, self._wrapper) for h in handlers)
        )

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        wrapped = {
            name: self._wrapper.wrap(f"/{service}/{name}", handler)
            for name, handler in handlers.items()
        }
        for name, handler in wrapped.items():
            if handler.unary_unary is not None:
                self.unary_handlers[f"/{service}/{name}"] = handler
        self._server.add_registered_method_handlers(service, wrapped)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


@dataclass
class ServiceBinding:
    """A servicer and the generated function that adds it to a server."""

    add_to_server: Callable[[Any, grpc.aio.Server], None]
    servicer: Any
    full_name: str


# Keepalive between clients and servers (keepalive_options).
MIN_PING_INTERVAL_S = 10.0
SERVER_PING_INTERVAL_S = 60.0
SERVER_PING_TIMEOUT_S = 20.0


def keepalive_options(min_ping_interval_s: float = MIN_PING_INTERVAL_S) -> list[tuple[str, int]]:
    """gRPC's server defaults refuse a client's keepalive pings more often than every 5 minutes
    while no data flows, and any ping without a call in flight: after two such pings the server
    sends GOAWAY too_many_pings and drops the connection. Yet the mesh's own channels ping every
    30 s while their call streams sit open and idle (measured: the registry dropped the
    dispatcher's connection after two idle minutes), and clients in other languages commonly
    ping every 10-30 s, with or without calls, to keep load balancers and NATs from dropping
    idle connections. So: pings every `min_ping_interval_s` or more are accepted, idle or not;
    and the server pings an idle client every SERVER_PING_INTERVAL_S, dropping one that does
    not answer within SERVER_PING_TIMEOUT_S (a peer that vanished stops holding its streams)."""
    return [
        ("grpc.http2.min_ping_interval_without_data_ms", int(min_ping_interval_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.keepalive_time_ms", int(SERVER_PING_INTERVAL_S * 1000)),
        ("grpc.keepalive_timeout_ms", int(SERVER_PING_TIMEOUT_S * 1000)),
        ("grpc.http2.max_pings_without_data", 0),
    ]


async def create_server(
    bindings: Iterable[ServiceBinding],
    *,
    host: str,
    port: int,
    tracing: bool,
    trust_baggage: bool = True,
    auth: MeshAuth | None = None,
    min_ping_interval_s: float = MIN_PING_INTERVAL_S,
    max_in_flight: int = 0,
    stream_keys: ApiKeys | None = None,
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """Build and start a server with health, reflection and the handler wrapper. Returns the bound
    port (pass port 0 in tests to get a free one). An edge service (the dispatcher) passes
    trust_baggage=False: W3C baggage from its callers is dropped, never propagated. With `auth`,
    every RPC but health and reflection is checked against the API keys, and a call stream as
    it opens (HandlerWrapper.admit_stream). Keepalive: see
    keepalive_options. With `max_in_flight`, a call past that many running at once is answered
    RESOURCE_EXHAUSTED (reason OVERLOADED) without running. A service that checks its callers'
    keys itself (the dispatcher) passes them as `stream_keys`, so that its call streams, too,
    open only with a known key."""
    bindings = list(bindings)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
            *keepalive_options(min_ping_interval_s),
        ],
    )
    wrapper = HandlerWrapper(
        tracing,
        trust_baggage=trust_baggage,
        auth=auth,
        max_in_flight=max_in_flight,
        stream_keys=stream_keys,
    )
    _WRAPPER_OF[server] = wrapper
    registrar: Any = Registrar(server, wrapper)
    for binding in bindings:
        binding.add_to_server(binding.servicer, registrar)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, registrar)
    # The mesh's own clients send their unary calls over one call stream (shared.mux); with
    # API keys, a stream opens only with a known key (HandlerWrapper.admit_stream).
    mux = MuxServicer(
        registrar.unary_handlers,
        admit=wrapper.admit_stream if wrapper.stream_keys is not None else None,
    )
    mux_pb2_grpc.add_MuxServiceServicer_to_server(mux, registrar)
    _MUX_OF[server] = mux
    names = [b.full_name for b in bindings] + [MUX_SERVICE]
    reflection.enable(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name], registrar
    )
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # grpc raises it (once returned 0) when the port cannot be bound
        bound = 0
    if bound == 0:
        raise OSError(
            f"cannot listen on {host}:{port}: the address is in use (another toolmesh?) or "
            "not available here; pick another port with TOOLMESH_<SERVICE>_PORT"
        )
    await server.start()
    for name in [*names, ""]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, bound, health_servicer


async def _watch_parent(stop: asyncio.Event, interval_s: float = 1.0) -> None:
    """Stop when the launching process is gone (we get re-parented)."""
    parent = os.getppid()
    while not stop.is_set():
        await asyncio.sleep(interval_s)
        if os.getppid() != parent:
            logger.warning("launcher (pid %d) is gone; shutting down", parent)
            stop.set()


def install_stop_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT. Install it before announcing readiness, so a signal
    that arrives right after start-up still stops the service gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def serve_until_signalled(
    server: grpc.aio.Server,
    health_servicer: health.aio.HealthServicer,
    stop: asyncio.Event,
    *,
    grace_s: float,
    on_stop: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve until `stop` is set (see install_stop_signals), then report NOT_SERVING, drain
    in-flight calls for up to `grace_s` seconds, and run `on_stop`."""
    waiter = asyncio.ensure_future(server.wait_for_termination())
    stopper = asyncio.ensure_future(stop.wait())
    watcher = (
        asyncio.ensure_future(_watch_parent(stop))
        if os.environ.get(EXIT_WITH_PARENT_ENV) == "1"
        else None
    )
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if watcher is not None:
        watcher.cancel()
    logger.info("shutting down (grace %.1fs)", grace_s)
    await health_servicer.enter_graceful_shutdown()
    began = asyncio.get_running_loop().time()
    mux = _MUX_OF.get(server)
    if mux is not None:  # call streams: no new calls, the started ones answered, then ended
        mux.drain()
    wrapper = _WRAPPER_OF.get(server)
    if wrapper is not None and not await wrapper.drain(grace_s):
        logger.warning("calls still running after the %.1fs grace are cancelled", grace_s)
    left = grace_s - (asyncio.get_running_loop().time() - began)
    await server.stop(max(left, STOP_GRACE_FLOOR_S))
    for task in (waiter, stopper):
        task.cancel()
    if on_stop is not None:
        await on_stop()
