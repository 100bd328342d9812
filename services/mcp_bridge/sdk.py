"""The MCP SDK seam: imported lazily (without it the bridge says what to install and the rest of
the mesh works), clients built from a ServerConfig, and SDK failures turned into ToolmeshError.

Trace context: the SDK injects W3C `traceparent`/`tracestate` into every request's
`params._meta`; for streamable HTTP a request hook copies them into the HTTP headers of that
POST, so an HTTP-instrumented server continues the same trace. Baggage is stripped by the caller
(see core.py) so it never leaves the mesh. The SDK's own "MCP send <method>" span duplicates the
bridge's MCP client span (core.py: semantic-convention name and attributes), so the bridge turns
the SDK's tracer off (`disable_sdk_tracer`): the context it injects is then the bridge's span."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from services.mcp_bridge.annotations import clean_listing
from services.mcp_bridge.model import redact_url
from shared.errors import DeadlineExceeded, FailedPrecondition, ToolmeshError, Unavailable

logger = logging.getLogger(__name__)

INSTALL_HINT = "MCP SDK not installed. Run: pip install 'mcp>=2'"
# JSON-RPC error codes of the SDK (mcp_types.jsonrpc), kept here so callers need no SDK import.
CONNECTION_CLOSED = -32000
REQUEST_TIMEOUT = -32001
# JSON-RPC's "invalid JSON was received": what a server's unreadable answer becomes (see
# UnreadableAnswers).
PARSE_ERROR = -32700
_TRACE_KEYS = ("traceparent", "tracestate")
SESSION_HEADER = "mcp-session-id"
# What of a server's stderr and log messages the bridge logs: lines clipped to this many
# characters, at most this many a minute (LineBudget).
STDERR_LINE_CHARS = 2000
STDERR_LINES_PER_MIN = 600
# A listen stream that stays up this long (seconds) is healthy again: its next drop is retried
# after the shortest delay (LISTEN_RETRY_S) rather than the last one.
LISTEN_RETRY_S = 0.5
LISTEN_RETRY_MAX_S = 30.0
LISTEN_STABLE_S = 60.0
# How many records a minute each of the SDK's per-message complaints (a server's unparseable
# line, an invalid notification) may put in the bridge's log, with its traceback; the rest are
# counted (SdkLogBudget).
SDK_LOG_RECORDS_PER_MIN = 30
SDK_LOG_KINDS = 256
_SDK_NOISY_LOGGERS = ("mcp.client.stdio", "mcp.client.streamable_http", "client")
# The instrumentation scope of the SDK's tracer (mcp.shared._otel).
SDK_TRACER_SCOPE = "mcp-python-sdk"
# The longest message (one line) a stdio server may send: a longer one ends the session (the
# bridge restarts the server) instead of being held in memory while it grows (WholeLines).
MAX_MESSAGE_BYTES = 128 << 20


class WholeLines:
    """A stdio server's stdout handed to the SDK's reader in whole lines (anyio's
    ByteReceiveStream protocol, wrapped around the process's).

    The SDK's reader joins each chunk it receives (64 KB at most) to the unfinished line before
    it and splits the result again, so a message of n bytes costs O(n²/64 KB) of copying on the
    bridge's event loop (measured: one 5 / 20 / 40 MB result 0.4 / 4.7 / 16.8 s; through this,
    0.09 / 0.37 / 0.7 s), and a server that writes without a newline grows that line for as
    long as it writes. Here a chunk without a
    newline is only kept aside; what is handed on ends at a newline (or at the end of the
    stream), so the SDK's unfinished line stays empty and reading is linear. A line past
    `max_bytes` ends the stream, as if the server had closed it: the session ends and the
    bridge's restart policy takes over."""

    def __init__(self, inner: Any, max_bytes: int, command: str) -> None:
        self._inner = inner
        self._max = max_bytes
        self._command = command
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._ended = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        import anyio

        while not self._ended:
            try:
                data = await self._inner.receive()
            except anyio.EndOfStream:
                self._ended = True
                break
            end = data.rfind(b"\n") + 1
            if end == 0:
                self._held.append(data)
                self._held_bytes += len(data)
                if self._held_bytes > self._max:
                    logger.warning(
                        "MCP server %s sent a message over %d MiB on stdout (the most the "
                        "bridge reads); ending its session",
                        self._command,
                        self._max >> 20,
                    )
                    self._held.clear()
                    self._held_bytes = 0
                    self._ended = True
                continue
            lines = b"".join([*self._held, data[:end]]) if self._held else data[:end]
            self._held = [data[end:]] if end < len(data) else []
            self._held_bytes = len(data) - end
            return lines
        if self._held:  # the last line, without its newline
            rest = b"".join(self._held)
            self._held.clear()
            self._held_bytes = 0
            return rest
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __getattr__(self, name: str) -> Any:  # extra attributes of the wrapped stream
        return getattr(self._inner, name)


_stdio_bounded = False


def _bound_stdio_reads(stdio: Any) -> None:
    """Have the SDK's stdio transport (module `stdio`) read each server's stdout through
    WholeLines: the process it spawns gets its stdout stream wrapped. The SDK offers no hook
    for this, so its spawning function is wrapped; where that function or anyio's process
    layout is not what this expects, reads stay the SDK's own."""
    global _stdio_bounded
    spawn = getattr(stdio, "_create_platform_compatible_process", None)
    if _stdio_bounded or spawn is None:
        return

    async def spawn_bounded(command: str, *args: Any, **kwargs: Any) -> Any:
        process = await spawn(command, *args, **kwargs)
        stdout = getattr(process, "_stdout", None)
        if stdout is not None and getattr(process, "stdout", None) is stdout:
            process._stdout = WholeLines(stdout, MAX_MESSAGE_BYTES, command)
        return process

    stdio._create_platform_compatible_process = spawn_bounded
    _stdio_bounded = True


def require_sdk() -> Any:
    """The `mcp` package, or FailedPrecondition(MCP_SDK_MISSING) saying what to install."""
    try:
        import mcp
        import mcp.client.streamable_http
    except ImportError as exc:
        raise FailedPrecondition(
            f"{INSTALL_HINT} ({exc})", reason="MCP_SDK_MISSING", metadata={"install": "mcp>=2"}
        ) from None
    return mcp


def disable_sdk_tracer(provider: Any) -> bool:
    """Turn off the MCP SDK's tracer in `provider` (an OpenTelemetry SDK TracerProvider): its
    spans become non-recording stand-ins for the current span, so each tools/call is one span
    (the bridge's) and the server's parent is that span. Uses the SDK's tracer configurator
    (still experimental in opentelemetry-sdk, hence the underscores); returns False, with a
    warning, where that is not available."""
    try:
        from opentelemetry.sdk.trace import _TracerConfig
    except ImportError:
        _TracerConfig = None  # type: ignore[assignment,misc]
    configure = getattr(provider, "_set_tracer_configurator", None)
    previous = getattr(provider, "_tracer_configurator", None)
    if _TracerConfig is None or configure is None or previous is None:
        logger.warning(
            "this opentelemetry-sdk has no tracer configurator: the MCP SDK's own spans "
            "(%s) stay on, next to the bridge's MCP client spans",
            SDK_TRACER_SCOPE,
        )
        return False
    disabled = _TracerConfig(is_enabled=False)

    def configurator(scope: Any) -> Any:
        return disabled if scope.name == SDK_TRACER_SCOPE else previous(scope)

    configure(tracer_configurator=configurator)
    return True


@dataclass
class HttpState:
    """What the HTTP hooks learn about a streamable HTTP session."""

    session_id: str = ""
    # The session id the server answered it no longer knows (it restarted, or expired it).
    lost: str = ""
    # The last HTTP error status the server answered, as a line of text, and when
    # (time.monotonic()): the SDK reports most of them as "Server returned an error response".
    failure: str = ""
    failed_at: float = float("-inf")

    @property
    def session_lost(self) -> bool:
        return bool(self.lost) and self.lost == self.session_id

    def failure_since(self, started: float) -> str:
        """The HTTP error the server answered since `started`, or ""."""
        return self.failure if self.failed_at >= started else ""


_SESSION_WORDS = re.compile(r"session", re.IGNORECASE)
_MAX_ERROR_BODY = 64 * 1024  # error bodies read for their text, at most
_FAILURE_HINTS = {
    401: "check the credentials in the connection's headers (Reconnect with new ones)",
    403: "the credentials in the connection's headers are not allowed this",
}


async def _short_body(response: Any, kinds: tuple[str, ...]) -> str | None:
    """The body of an error answer as text when its content type is one of `kinds` and it
    declares at most _MAX_ERROR_BODY bytes; None otherwise, or when it cannot be read (httpx
    keeps what was read, so the SDK can read it again)."""
    kind = response.headers.get("content-type", "").lower()
    length = response.headers.get("content-length", "")
    if not kind.startswith(kinds) or not length.isdigit() or not 0 < int(length) <= _MAX_ERROR_BODY:
        return None
    try:
        body: bytes = await response.aread()
    except Exception:  # noqa: BLE001 - the body is a courtesy: never the failure
        return None
    return body.decode("utf-8", "replace")


async def describe_failure(response: Any) -> str:
    """One line for an HTTP error response: its status, the start of a short text or JSON body
    (control characters removed), and a hint for 401/403."""
    status = int(response.status_code)
    try:
        line = f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:  # a status the standard does not name
        line = f"HTTP {status}"
    text = await _short_body(response, ("application/json", "text/plain", "text/html"))
    if text:
        text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
        if text:
            line += f": {text[:200]}"
    hint = _FAILURE_HINTS.get(status)
    return f"{line}; {hint}" if hint else line


# What the SDK says of an HTTP error status whose body is not a JSON-RPC error.
SDK_HTTP_ERROR = "Server returned an error response"


def with_http_failure(message: str, http_failure: str) -> str:
    """The SDK's message with the HTTP error the server answered: instead of the SDK's
    status-less stand-in, or after any other message."""
    if not http_failure:
        return message
    return http_failure if message == SDK_HTTP_ERROR else f"{message} ({http_failure})"


async def forgot_session(response: Any) -> bool:
    """Whether `response` says the server does not know the session id its request carried.

    A server that restarted, or expired a session, answers a request carrying its id with 404
    (the MCP spec: the client must then open a new session); servers on older SDKs answer 400
    with a JSON-RPC error about the session ("Bad Request: No valid session ID provided")."""
    if response.status_code == 404:
        return True
    if response.status_code != 400:
        return False
    text = await _short_body(response, ("application/json",))
    try:
        body = json.loads(text) if text else None
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return isinstance(message, str) and bool(_SESSION_WORDS.search(message))


def _copy_trace_headers(request: Any) -> None:
    """A request hook: the trace context of the JSON-RPC message's `_meta` as W3C headers."""
    if request.method != "POST":
        return
    try:
        body = json.loads(request.content)
    except (ValueError, TypeError, AttributeError, RuntimeError):
        return  # a streamed or non-JSON body carries no _meta we could read
    messages = body if isinstance(body, list) else [body]
    for message in messages:
        params = message.get("params") if isinstance(message, dict) else None
        meta = params.get("_meta") if isinstance(params, dict) else None
        if not isinstance(meta, dict):
            continue
        for key in _TRACE_KEYS:
            value = meta.get(key)
            if isinstance(value, str):
                request.headers[key] = value
        return


def _message_handler(on_tools_changed: Callable[[], None] | None) -> Any:
    """The client's handler of server notifications: `notifications/tools/list_changed` sent
    on the session (handshake-era servers) calls `on_tools_changed`; the copies the SDK tees
    from a `subscriptions/listen` stream (stamped with its subscription id) are left to
    `listen_for_tool_changes`, so one event is one call; everything else is left to the SDK."""
    from mcp import types
    from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY

    async def handler(message: Any) -> None:
        if on_tools_changed is None or not isinstance(message, types.ToolListChangedNotification):
            return
        meta = getattr(message.params, "meta", None) or {}
        if SUBSCRIPTION_ID_META_KEY not in meta:
            on_tools_changed()

    return handler


class SdkLogBudget(logging.Filter):
    """A filter on the SDK's loggers: each kind of record (logger and message template) at
    most SDK_LOG_RECORDS_PER_MIN a minute (a LineBudget each), the rest counted and reported
    once the minute is over. The SDK logs an error with a traceback for every line a server
    writes that is not a JSON-RPC message, and a warning with one for every invalid
    notification: a server writing garbage without end filled the bridge's log, around the
    LineBudget of its stderr."""

    def __init__(self) -> None:
        super().__init__()
        self._budgets: dict[tuple[str, str], LineBudget] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        if key not in self._budgets and len(self._budgets) >= SDK_LOG_KINDS:
            # Some SDK messages are f-strings holding what a server sent: past this many kinds,
            # the rest share one budget (and the table stays bounded).
            key = (record.name, "(other messages)")
        budget = self._budgets.get(key)
        if budget is None:
            budget = LineBudget(
                "MCP SDK",
                f"more {key[1]!r} records",
                SDK_LOG_RECORDS_PER_MIN,
                level=logging.WARNING,
                source_prefix="",
            )
            self._budgets[key] = budget
        return budget.admit()


_sdk_log_budget = SdkLogBudget()


def _budget_sdk_logs() -> None:
    """Install SdkLogBudget on the SDK's loggers (once)."""
    for name in _SDK_NOISY_LOGGERS:
        sdk_logger = logging.getLogger(name)
        if _sdk_log_budget not in sdk_logger.filters:
            sdk_logger.addFilter(_sdk_log_budget)


async def open_client(
    config: Any,
    stack: AsyncExitStack,
    http_state: HttpState,
    on_tools_changed: Callable[[], None] | None = None,
) -> Any:
    """An entered `mcp.Client` for `config` (a ServerConfig), its resources on `stack`;
    `on_tools_changed` is called (on the session's task, so it must not block) whenever the
    server says its tool list changed."""
    mcp = require_sdk()
    _budget_sdk_logs()
    handler = _message_handler(on_tools_changed)
    if config.transport == "stdio":
        if shutil.which(config.command) is None:
            raise FailedPrecondition(
                f"MCP server command {config.command!r} not found (not an executable path and "
                "not on PATH)",
                reason="MCP_COMMAND_NOT_FOUND",
                metadata={"connection": config.name, "command": config.command},
            )
        import mcp.client.stdio
        from mcp.client.stdio import stdio_client

        _bound_stdio_reads(mcp.client.stdio)
        params = mcp.StdioServerParameters(
            command=config.command,
            args=list(config.args),
            env=dict(config.env) or None,
            # One invalid UTF-8 byte on stdout killed the SDK's reader (strict decoding) while
            # the session still looked open: every later call waited out its timeout.
            encoding_error_handler="replace",
        )
        errlog = StderrRelay(config.name)
        stack.callback(errlog.close)
        client = mcp.Client(
            answering(stdio_client(params, errlog=errlog.file), config.name),
            client_info=_client_info(mcp),
            message_handler=handler,
            logging_callback=server_log_callback(config.name, stack),
        )
    else:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        async def on_response(response: Any) -> None:
            session_id = response.headers.get(SESSION_HEADER)
            if session_id:
                http_state.session_id = session_id
            # Only a POST's error answer (a JSON-RPC message refused) counts: the optional GET
            # stream may be refused (405, or 404 for any session on some servers) and a DELETE
            # closes the session — neither says anything of a call or the handshake.
            if response.status_code < 400 or response.request.method != "POST":
                return
            sent = response.request.headers.get(SESSION_HEADER)
            if sent and sent == http_state.session_id and await forgot_session(response):
                http_state.lost = sent
            http_state.failure = await describe_failure(response)
            http_state.failed_at = time.monotonic()

        async def on_request(request: Any) -> None:
            _copy_trace_headers(request)

        http = httpx2.AsyncClient(
            headers=dict(config.headers),
            timeout=httpx2.Timeout(30.0, read=300.0),
            event_hooks={"request": [on_request], "response": [on_response]},
        )
        await stack.enter_async_context(http)
        client = mcp.Client(
            answering(streamable_http_client(config.url, http_client=http), config.name),
            client_info=_client_info(mcp),
            message_handler=handler,
            logging_callback=server_log_callback(config.name, stack),
        )
    return await stack.enter_async_context(client)


class LineBudget:
    """What a server may put in the bridge's log: at most `per_minute` lines a minute, the rest
    counted and reported once the minute is over (a server writing without end must not fill
    whatever keeps the bridge's output). Used from one thread or one event loop at a time."""

    def __init__(
        self,
        name: str,
        what: str,
        per_minute: int | None = None,
        *,
        level: int = logging.INFO,
        source_prefix: str = "mcp server ",
    ) -> None:
        self._source = source_prefix + name
        self._what = what
        self._level = level
        self._per_minute = STDERR_LINES_PER_MIN if per_minute is None else per_minute
        self._window_start = time.monotonic()
        self._shown = 0
        self._dropped = 0

    def admit(self) -> bool:
        now = time.monotonic()
        if now - self._window_start >= 60:
            self.report()
            self._window_start, self._shown = now, 0
        if self._shown >= self._per_minute:
            self._dropped += 1
            return False
        self._shown += 1
        return True

    def report(self) -> None:
        if self._dropped:
            logger.log(self._level, "%s: %d %s dropped", self._source, self._dropped, self._what)
            self._dropped = 0


class StderrRelay:
    """Where a stdio server's stderr goes: a pipe whose lines a thread logs (at INFO, as
    `mcp server <name>: …`), each clipped to STDERR_LINE_CHARS and at most STDERR_LINES_PER_MIN
    a minute, the rest counted and dropped. The server's stderr went straight to the bridge's
    own: a server writing without end filled whatever kept the bridge's output."""

    def __init__(self, name: str) -> None:
        read_fd, write_fd = os.pipe()
        self.file = os.fdopen(write_fd, "w")  # the child gets a copy of it at spawn
        self._name = name
        self._thread = threading.Thread(
            target=self._relay, args=(read_fd,), name=f"mcp-stderr-{name}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Close the bridge's end; the thread ends once the server's copy is closed too."""
        with contextlib.suppress(OSError):
            self.file.close()

    def _relay(self, read_fd: int) -> None:
        budget = LineBudget(self._name, "stderr lines")
        with os.fdopen(read_fd, "rb") as pipe:
            while True:
                line = pipe.readline(STDERR_LINE_CHARS * 4)
                if not line:
                    break
                if not line.endswith(b"\n"):  # a long line: skip the rest of it
                    while True:
                        rest = pipe.readline(STDERR_LINE_CHARS * 4)
                        if not rest or rest.endswith(b"\n"):
                            break
                if budget.admit():
                    text = one_line(line.decode("utf-8", "replace").rstrip(), STDERR_LINE_CHARS)
                    logger.info("mcp server %s: %s", self._name, text)
        budget.report()


# MCP log levels (RFC 5424 names) as the bridge logs them: a server's own errors are not the
# bridge's, so nothing a server says is logged above WARNING.
_SERVER_LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "notice": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.WARNING,
    "critical": logging.WARNING,
    "alert": logging.WARNING,
    "emergency": logging.WARNING,
}


_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")


def one_line(text: str, limit: int) -> str:
    """`text` clipped to `limit` characters, then with every control character (CR, LF, ESC,
    the Unicode line separators) a space: what a server says must not forge lines (or
    terminal escapes) in the bridge's log."""
    return _CONTROL.sub(" ", text[:limit])


def server_log_callback(name: str, stack: AsyncExitStack | None = None) -> Any:
    """The client's `logging_callback`: a server's `notifications/message` logged by the
    bridge as `mcp server <name> [<logger>] <level>: <data>`, clipped and rate-limited like its
    stderr (LineBudget; what it dropped is reported when `stack`, the session's, closes).
    Handshake-era sessions only: the 2026-07-28 protocol deprecates the logging capability
    (SEP-2577) and makes it a per-request opt-in the bridge does not make."""
    budget = LineBudget(name, "log messages")
    if stack is not None:
        stack.callback(budget.report)

    async def log(params: Any) -> None:
        if not budget.admit():
            return
        level = str(getattr(params, "level", "") or "info")
        data = getattr(params, "data", None)
        text = data if isinstance(data, str) else _json_text(data)
        source = getattr(params, "logger", None)
        where = f" [{one_line(str(source), 100)}]" if source else ""
        logger.log(
            _SERVER_LOG_LEVELS.get(level, logging.INFO),
            "mcp server %s%s %s: %s",
            name,
            where,
            one_line(level, 20),
            one_line(text, STDERR_LINE_CHARS),
        )

    return log


def _json_text(data: Any) -> str:
    """A log message's data as JSON text (whatever the SDK parsed, nested however deep)."""
    try:
        return json.dumps(data, default=str)
    except (ValueError, RecursionError):
        return repr(data)[:STDERR_LINE_CHARS]


@asynccontextmanager
async def answering(
    transport: AbstractAsyncContextManager[tuple[Any, Any]], connection: str = ""
) -> AsyncIterator[tuple[Any, Any]]:
    """`transport` (an SDK transport) with its read stream wrapped in UnreadableAnswers and
    both streams in ToolListings' watch."""
    async with transport as (read_stream, write_stream):
        listings = ToolListings(connection)
        yield UnreadableAnswers(read_stream, listings), ListingRequests(write_stream, listings)


# The most tools/list requests awaiting an answer that ToolListings remembers (an answer that
# never comes must not grow it for ever).
MAX_PENDING_LISTINGS = 64


class ToolListings:
    """The session's tools/list requests (their ids, as the write stream sends them) and their
    answers, which are cleaned before the SDK reads them: a tool's `title` and `annotations` are
    the server's untrusted word (annotations.clean_listing)."""

    def __init__(self, connection: str) -> None:
        self._connection = connection
        self._pending: dict[Any, None] = {}

    def sent(self, item: Any) -> None:
        message = getattr(item, "message", None)
        if getattr(message, "method", None) != "tools/list":
            return
        request_id = getattr(message, "id", None)
        if request_id is None:
            return
        if len(self._pending) >= MAX_PENDING_LISTINGS:
            self._pending.pop(next(iter(self._pending)))
        self._pending[request_id] = None

    def received(self, item: Any) -> Any:
        message = getattr(item, "message", None)
        result = getattr(message, "result", None)
        if isinstance(result, dict) and self._pending:
            request_id = getattr(message, "id", None)
            if request_id in self._pending:
                del self._pending[request_id]
                clean_listing(result, self._connection)
        return item


class ListingRequests:
    """A transport's write stream, telling ToolListings of each message the session sends."""

    def __init__(self, inner: Any, listings: ToolListings) -> None:
        self._inner = inner
        self._listings = listings

    async def send(self, item: Any) -> None:
        self._listings.sent(item)
        await self._inner.send(item)

    def send_nowait(self, item: Any) -> None:
        self._listings.sent(item)
        self._inner.send_nowait(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> ListingRequests:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._inner.__aexit__(*exc_info)

    def __getattr__(self, name: str) -> Any:  # close(), clone(), ...
        return getattr(self._inner, name)


class UnreadableAnswers:
    """A transport's read stream, except that a server's answer the SDK cannot read becomes an
    error answer to the request it answers, so that call fails at once with what was wrong.

    The SDK hands a line it cannot parse (not JSON to its strict parser: an unpaired UTF-16
    surrogate escape, say) to the session as an exception, which only logs it: the request it
    answered then waited for its timeout (120 s by default). When Python's own parser can read
    the line and it is an answer (an id, and a result or an error, no method), the answer
    becomes a JSON-RPC parse error for that id. Anything else passes through unchanged."""

    def __init__(self, inner: Any, listings: ToolListings | None = None) -> None:
        self._inner = inner
        self._listings = listings

    def _seen(self, item: Any) -> Any:
        item = _readable(item)
        return item if self._listings is None else self._listings.received(item)

    async def receive(self) -> Any:
        return self._seen(await self._inner.receive())

    def __aiter__(self) -> UnreadableAnswers:
        return self

    async def __anext__(self) -> Any:
        return self._seen(await self._inner.__anext__())

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> UnreadableAnswers:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._inner.__aexit__(*exc_info)

    def __getattr__(self, name: str) -> Any:  # close(), last_context, ...
        return getattr(self._inner, name)


def _readable(item: Any) -> Any:
    if not isinstance(item, Exception) or not hasattr(item, "errors"):
        return item
    try:
        errors = item.errors()
        line = errors[0].get("input") if errors else None
    except Exception:  # noqa: BLE001 - not the pydantic error of an unreadable line
        return item
    if isinstance(line, dict):  # parsed, but not a message ("result": null, say)
        answer: Any = line
    elif isinstance(line, str):
        try:
            answer = json.loads(line)
        except (ValueError, RecursionError):  # nested past any parser's depth, say
            answer = _top_level(line)
    else:
        return item
    if (
        not isinstance(answer, dict)
        or "method" in answer
        or not isinstance(answer.get("id"), int | str)
        or not ("result" in answer or "error" in answer)
    ):
        return item
    from mcp import types
    from mcp.shared.message import SessionMessage

    detail = str(errors[0].get("msg", "unreadable"))
    logger.warning("MCP server answered request %r unreadably: %s", answer["id"], detail)
    message = f"the server's answer is unreadable: {detail}"
    error = types.ErrorData(code=PARSE_ERROR, message=message)
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=answer["id"], error=error))


_SCALAR_END = re.compile(r"[,}\]\s]")
TOP_LEVEL_SCAN_CHARS = 64 * 1024


def _top_level(line: str) -> dict[str, Any] | None:
    """The top-level keys of a JSON object too deep to parse, with the value of `id` (a number
    or a string) and None for every other key; None when `line` is not such an object. One
    pass, no recursion, over the line's first TOP_LEVEL_SCAN_CHARS only (a server's line can
    be megabytes, and this runs on the event loop): an answer's id comes first in practice,
    and its result's or error's key before the value that made it unreadable."""
    text = line[:TOP_LEVEL_SCAN_CHARS].strip()
    if not text.startswith("{"):
        return None
    keys: dict[str, Any] = {}
    depth, i, n = 0, 0, len(text)
    expect_key = False
    while i < n:
        c = text[i]
        if c == '"':
            end = _string_end(text, i)
            if depth == 1 and expect_key:
                try:
                    key = json.loads(text[i : end + 1])
                except ValueError:
                    return None
                i = _skip_space(text, end + 1)
                if i >= n or text[i] != ":":
                    return None
                i = _skip_space(text, i + 1)
                keys[key] = None
                if key == "id":
                    keys[key] = _scalar(text, i)
                expect_key = False
                continue  # the value is scanned like any other
            i = end + 1
            continue
        if c in "{[":
            depth += 1
            expect_key = c == "{" and depth == 1
        elif c in "}]":
            depth -= 1
        elif c == "," and depth == 1:
            expect_key = True
        i += 1
    return keys


def _string_end(text: str, start: int) -> int:
    """The index of the quote closing the JSON string opened at `start` (len(text) - 1 past
    the end when it is not closed)."""
    end = start + 1
    while end < len(text) and text[end] != '"':
        end += 2 if text[end] == "\\" else 1
    return min(end, len(text) - 1)


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _scalar(text: str, i: int) -> Any:
    """The string or integer JSON value at `i`, None for any other (or a malformed one)."""
    if text.startswith('"', i):
        try:
            return json.loads(text[i : _string_end(text, i) + 1])
        except ValueError:
            return None
    match = _SCALAR_END.search(text, i)
    number = text[i : match.start() if match else len(text)]
    return int(number) if number.lstrip("-").isdigit() else None


def _client_info(mcp: Any) -> Any:
    return mcp.Implementation(name="toolmesh-mcp-bridge", version="0.1.0")


def leaf_exception(exc: BaseException) -> BaseException:
    """The first non-group exception inside (anyio task groups wrap failures in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def connect_error(config: Any, exc: BaseException, http_failure: str = "") -> ToolmeshError:
    """A failure to open a session as an error naming the server and the problem (with the
    HTTP error the server answered meanwhile, `http_failure`, when there was one)."""
    exc = leaf_exception(exc)
    if isinstance(exc, ToolmeshError):
        return exc
    where = redact_url(config.url) if config.transport == "streamable_http" else config.command
    meta = {"connection": config.name, "target": where}
    if isinstance(exc, TimeoutError):
        return DeadlineExceeded(
            f"MCP server {config.name!r} ({where}) did not complete initialize in time",
            reason="MCP_INITIALIZE_TIMEOUT",
            metadata=meta,
        )
    code = getattr(exc, "code", None)
    if isinstance(code, int) and type(exc).__name__ == "MCPError":
        if code == CONNECTION_CLOSED:
            return Unavailable(
                f"MCP server {config.name!r} ({where}) closed the connection during initialize "
                "(did the process exit?)",
                reason="MCP_SERVER_EXITED",
                metadata=meta,
            )
        said = with_http_failure(str(exc), http_failure)
        return FailedPrecondition(
            f"MCP server {config.name!r} ({where}) refused the handshake: {said}",
            reason="MCP_HANDSHAKE_FAILED",
            metadata={**meta, "http_status": http_failure.split()[1]} if http_failure else meta,
        )
    if type(exc).__name__ == "ValidationError":
        return FailedPrecondition(
            f"MCP server {config.name!r} ({where}) sent a malformed response: "
            + " ".join(str(exc).splitlines()[:3]),
            reason="MCP_MALFORMED_RESPONSE",
            metadata=meta,
        )
    if isinstance(exc, OSError) or "ConnectError" in type(exc).__name__:
        return Unavailable(
            f"cannot reach MCP server {config.name!r} at {where}: {exc or type(exc).__name__}",
            reason="MCP_SERVER_UNREACHABLE",
            metadata=meta,
        )
    return Unavailable(
        f"MCP server {config.name!r} ({where}) failed to start a session: "
        f"{type(exc).__name__}: {exc}",
        reason="MCP_CONNECT_FAILED",
        metadata=meta,
    )


def tool_from_sdk(tool: Any) -> dict[str, Any]:
    """The fields of an SDK Tool the bridge keeps, as plain JSON values."""
    annotations = getattr(tool, "annotations", None)
    task_support = getattr(getattr(tool, "execution", None), "task_support", None)
    return {
        "name": str(tool.name),
        "title": getattr(tool, "title", None),
        "description": str(getattr(tool, "description", "") or ""),
        "input_schema": dict(getattr(tool, "input_schema", None) or {"type": "object"}),
        "output_schema": getattr(tool, "output_schema", None),
        "annotations": annotations.model_dump(mode="json", exclude_none=True)
        if annotations is not None and hasattr(annotations, "model_dump")
        else None,
        "task_support": task_support if task_support in _TASK_SUPPORT else None,
    }


_TASK_SUPPORT = ("forbidden", "optional", "required")


# What the SDK's own errors say, as against a server's error response with the same code:
# -32000 is also the usual code of any server-side error, and -32001 a server's to use too.
_LOCAL_CLOSED_MESSAGE = "Connection closed"
_LOCAL_TIMEOUT_MESSAGE = "Request 'tools/call' timed out"


# What the SDK's streamable HTTP client answers for itself a request whose response stream
# broke off (the server went away mid-call, or a proxy cut the connection): the request was
# sent and may have run.
_LOCAL_STREAM_LOST_MESSAGES = (
    "SSE stream ended without a response",
    "SSE stream ended and reconnection attempts were exhausted",
)
_LOCAL_STREAM_FAILED_PREFIX = "SSE stream failed: "


def local_closed(exc: BaseException) -> bool:
    """Whether `exc` is the SDK's own "connection closed" (its transport ended), not an error
    response of the server that happens to use code -32000."""
    return (
        getattr(exc, "code", None) == CONNECTION_CLOSED
        and getattr(exc, "message", None) == _LOCAL_CLOSED_MESSAGE
    )


def local_stream_lost(exc: BaseException) -> bool:
    """Whether `exc` is the SDK's own answer to a request whose HTTP response stream ended
    before the response (see _LOCAL_STREAM_LOST_MESSAGES), not a server's error response."""
    message = getattr(exc, "message", None)
    return (
        getattr(exc, "code", None) == CONNECTION_CLOSED
        and isinstance(message, str)
        and (
            message in _LOCAL_STREAM_LOST_MESSAGES
            or message.startswith(_LOCAL_STREAM_FAILED_PREFIX)
        )
    )


def local_timeout(exc: BaseException) -> bool:
    """Whether `exc` is the SDK's own timeout of a tools/call (it cancelled the request), not
    an error response of the server with code -32001."""
    return (
        getattr(exc, "code", None) == REQUEST_TIMEOUT
        and getattr(exc, "message", None) == _LOCAL_TIMEOUT_MESSAGE
    )


def session_closed(client: Any) -> bool:
    """Whether the client's session has seen its transport end (a crashed stdio server, a
    dropped HTTP session). Reads the SDK dispatcher's closed flag; False when unknown."""
    try:
        dispatcher = getattr(client.session, "_dispatcher", None)
    except RuntimeError:
        return True
    return bool(getattr(dispatcher, "_closed", False))


def announces_tool_changes(client: Any) -> bool:
    """Whether the server said (capabilities.tools.listChanged) that it tells when its tools
    change."""
    try:
        tools = client.server_capabilities.tools
    except (RuntimeError, AttributeError):
        return False
    return bool(getattr(tools, "list_changed", False))


def uses_listen(client: Any) -> bool:
    """Whether the session's protocol delivers change events only on a `subscriptions/listen`
    stream (2026-07-28 and later) rather than as session notifications."""
    try:
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        return client.protocol_version in MODERN_PROTOCOL_VERSIONS
    except (ImportError, RuntimeError, AttributeError):
        return False


async def listen_for_tool_changes(client: Any, on_tools_changed: Callable[[], None]) -> None:
    """Hold a `subscriptions/listen` stream for tool-list changes open until cancelled (modern
    servers), calling `on_tools_changed` for each event. A dropped stream is opened again and,
    since events are not replayed, counted as a change; a server that refuses it is logged."""
    from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost

    delay = LISTEN_RETRY_S
    while True:
        opened = time.monotonic()
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    on_tools_changed()
            return  # the server closed the stream
        except ListenNotSupportedError:
            return
        except SubscriptionLost:
            on_tools_changed()
        except Exception as exc:  # noqa: BLE001 - a refused subscription leaves calls working
            if session_closed(client):
                return
            logger.warning("MCP listen for tool changes failed: %s", leaf_exception(exc))
            return
        # Reset only by a stream that stayed up: one acknowledged and dropped at once, again
        # and again, was re-opened (and its tools re-listed) twice a second without end.
        if time.monotonic() - opened >= LISTEN_STABLE_S:
            delay = LISTEN_RETRY_S
        await asyncio.sleep(delay)
        delay = min(delay * 2, LISTEN_RETRY_MAX_S)


def server_identity(client: Any) -> Mapping[str, str]:
    info = getattr(client, "server_info", None)
    try:
        version = client.protocol_version
    except RuntimeError:
        version = ""
    return {
        "name": str(getattr(info, "name", "") or ""),
        "version": str(getattr(info, "version", "") or ""),
        "protocol_version": str(version or ""),
    }
