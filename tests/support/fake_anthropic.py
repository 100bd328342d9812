"""A local fake of the Anthropic Messages API on loopback, for tests: the real `anthropic`
SDK reaches it through `base_url`. Replies are scripted (text, tool_use blocks, other content
blocks, usage, streaming) and failures can be injected: an error status with its type, message
and headers (429 / 529 with retry-after), a raw (malformed) body, a body or stream cut in the
middle, a slow answer (which notices when the client gives up: `disconnects`). Every request
body is recorded, with its headers, for assertions."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted reply. `status` other than 200 returns an error body of that status."""

    text: str = ""
    tool_uses: list[dict[str, Any]] = field(default_factory=list)
    input_tokens: int = 10
    output_tokens: int = 5
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    stop_reason: str = "end_turn"
    model: str | None = None  # defaults to the requested model
    status: int = 200
    error_type: str = ""
    hold: threading.Event | None = None  # answered only once set (at most 30 s later)
    error_message: str = "scripted error"
    # Response headers; an error reply without them gets `retry-after: 0`.
    headers: dict[str, str] | None = None
    blocks: list[dict[str, Any]] = field(default_factory=list)  # put before the text block
    usage: dict[str, Any] | None = None  # the usage object verbatim (fields may be missing)
    raw: bytes | None = None  # the body verbatim (with `status`), e.g. malformed JSON
    truncate: bool = False  # send half the body (or of the stream's events), then close
    pace_s: float = 0.0  # a streamed reply's pause before each event (a slow model)
    stall_after: int | None = None  # a streamed reply goes silent after this many events
    stream_error: str = ""  # a streamed reply sends an `error` event of this type halfway
    ignore_stream: bool = False  # answer a `stream: true` request with the whole JSON Message
    omit_message_stop: bool = False  # a streamed reply ends after its message_delta
    delay_s: float = 0.0  # answer this late, unless the client disconnects first

    def content(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = [dict(b) for b in self.blocks]
        if self.text:
            blocks.append({"type": "text", "text": self.text})
        for i, use in enumerate(self.tool_uses):
            blocks.append(
                {
                    "type": "tool_use",
                    "id": use.get("id", f"toolu_fake_{i}"),
                    "name": use["name"],
                    "input": use.get("input", {}),
                }
            )
        return blocks


def rate_limited() -> Reply:
    return Reply(status=429, error_type="rate_limit_error")


def overloaded() -> Reply:
    return Reply(status=529, error_type="overloaded_error")


def _client_gone(conn: socket.socket) -> bool:
    """Whether the client closed its end (a readable socket with nothing to read)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeAnthropic:
    """The server. Queue replies with `script(...)`; unscripted requests get `default`."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self.default = Reply(text="fake reply")
        self._lock = threading.Lock()
        self._counter = 0
        self.disconnects = 0  # slow replies whose client went away before the answer
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    self._send(400, _error("invalid_request_error", "body is not JSON"))
                    return
                fake._record(self.path, dict(self.headers.items()), body)
                if not self.path.startswith("/v1/messages"):
                    self._send(404, _error("not_found_error", f"no route {self.path}"))
                    return
                reply = fake._next()
                if reply.hold is not None:
                    reply.hold.wait(30)
                if reply.delay_s and not self._wait(reply.delay_s):
                    with fake._lock:
                        fake.disconnects += 1
                    self.close_connection = True
                    return
                if reply.raw is not None:
                    self._send(reply.status, reply.raw, reply.headers, truncate=reply.truncate)
                    return
                if reply.status != 200:
                    self._send(
                        reply.status,
                        _error(reply.error_type or "api_error", reply.error_message),
                        {"retry-after": "0"} if reply.headers is None else reply.headers,
                    )
                    return
                message = fake._message(body, reply)
                if body.get("stream") and not reply.ignore_stream:
                    self._stream(message, reply)
                else:
                    self._send(200, message, reply.headers, truncate=reply.truncate)

            def _wait(self, seconds: float) -> bool:
                """Sleep up to `seconds`; False as soon as the client disconnects."""
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    if _client_gone(self.connection):
                        return False
                    time.sleep(0.02)
                return True

            def _send(
                self,
                status: int,
                payload: Any,
                headers: dict[str, str] | None = None,
                *,
                truncate: bool = False,
            ) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.send_header("request-id", "req_fake")
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                try:
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2] if truncate else data)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up (a cancelled call)
                if truncate:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)

            def _stream(self, message: dict[str, Any], reply: Reply) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.send_header("request-id", "req_fake")
                self.end_headers()
                events = list(_sse_events(message))
                half = len(events) // 2
                if reply.stream_error:
                    error = _error(reply.stream_error, reply.error_message)
                    events = [*events[:half], ("error", error)]
                elif reply.truncate:
                    events = events[:half]
                elif reply.omit_message_stop:
                    events = events[:-1]
                self.close_connection = True
                try:
                    for n, (event, data) in enumerate(events):
                        if reply.stall_after is not None and n >= reply.stall_after:
                            self._wait(30)  # silent until the client gives up
                            return
                        if reply.pace_s and not self._wait(reply.pace_s):
                            with fake._lock:
                                fake.disconnects += 1
                            return
                        self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    with fake._lock:
                        fake.disconnects += 1

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    async def requested(self, count: int = 1, timeout_s: float = 5.0) -> None:
        """Wait until at least `count` requests have arrived (AssertionError after
        `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while len(self.requests) < count:
            assert time.monotonic() < deadline, f"{len(self.requests)} of {count} request(s) came"
            await asyncio.sleep(0.02)

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def start(self) -> FakeAnthropic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _record(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(Recorded(path, {k.lower(): v for k, v in headers.items()}, body))

    def _next(self) -> Reply:
        with self._lock:
            return self.replies.popleft() if self.replies else self.default

    def _message(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        with self._lock:
            self._counter += 1
            n = self._counter
        stop_reason = "tool_use" if reply.tool_uses else reply.stop_reason
        return {
            "id": f"msg_fake_{n:04d}",
            "type": "message",
            "role": "assistant",
            "model": reply.model or body.get("model", "fake-model"),
            "content": reply.content(),
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": reply.usage
            if reply.usage is not None
            else {
                "input_tokens": reply.input_tokens,
                "output_tokens": reply.output_tokens,
                "cache_read_input_tokens": reply.cache_read_tokens,
                "cache_creation_input_tokens": reply.cache_write_tokens,
            },
        }


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _sse_events(message: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    start = {**message, "content": [], "stop_reason": None}
    usage = message["usage"]  # a scripted usage stays as scripted (fields may be missing)
    start["usage"] = {**usage, "output_tokens": 0} if "output_tokens" in usage else dict(usage)
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
            )
            text = block["text"]
            for i in range(0, len(text), 8):
                yield (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": text[i : i + 8]},
                    },
                )
        elif "input" not in block:  # thinking, future block types: whole in their start event
            yield (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block},
            )
        else:
            yield (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {**block, "input": {}},
                },
            )
            yield (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {
                        "type": "input_json_delta",
                        "partial_json": json.dumps(block["input"]),
                    },
                },
            )
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {k: v for k, v in usage.items() if k == "output_tokens"},
        },
    )
    yield "message_stop", {"type": "message_stop"}


@contextmanager
def running_fake() -> Iterator[FakeAnthropic]:
    fake = FakeAnthropic().start()
    try:
        yield fake
    finally:
        fake.stop()
