"""The call stream (shared.mux): unary calls over one bidirectional stream behave as unary calls
do — results, errors with their rich status, deadlines, cancellation, metadata, large messages —
and fall back to plain unary calls where the stream cannot serve. With API keys, a stream opens
only with a valid key of its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
import pytest

from shared import mux
from shared.auth import ApiKeys, Principal, key_digest
from shared.errors import FailedPrecondition
from shared.mux import MAX_FRAME_REQUEST_BYTES, MuxChannel, MuxServicer, MuxServicerContext
from shared.rpc_errors import DETAILS_KEY, from_rpc_error
from shared.server import HandlerWrapper, MeshAuth
from toolmesh.mux.v1 import mux_pb2 as mpb
from toolmesh.mux.v1 import mux_pb2_grpc

SERVICE = "test.Echo"
KEYS = ApiKeys(
    {
        key_digest("admin-key"): Principal("ops", "*", admin=True),
        key_digest("tenant-key"): Principal("a", "tenant-a"),
    }
)
TENANT_KEY = (("authorization", "Bearer tenant-key"),)


def _ident(b: bytes) -> bytes:
    return b


class Handlers:
    """A byte-level test service; records what each call saw."""

    def __init__(self) -> None:
        self.contexts: list[Any] = []
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.slow_started = 0
        self.streams_opened = 0  # on a server with API keys

    async def echo(self, request: bytes, context: Any) -> bytes:
        self.contexts.append(context)
        return request

    async def fail(self, request: bytes, context: Any) -> bytes:
        raise FailedPrecondition("not now", reason="NOT_NOW", metadata={"why": "testing"})

    async def crash(self, request: bytes, context: Any) -> bytes:
        raise RuntimeError("boom")

    async def slow(self, request: bytes, context: Any) -> bytes:
        self.slow_started += 1
        self.started.set()
        try:
            await asyncio.wait_for(self.release.wait(), 30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b"done"

    async def big(self, request: bytes, context: Any) -> bytes:
        return bytes(range(256)) * (int(request.decode()) // 256)

    async def metadata(self, request: bytes, context: Any) -> bytes:
        md = context.invocation_metadata()
        return "|".join(f"{k}={v}" for k, v in md if k in ("x-call", "authorization")).encode()


async def _server(
    handlers: Handlers,
    *,
    mux: bool = True,
    auth: MeshAuth | None = None,
    max_in_flight: int = 0,
) -> tuple[grpc.aio.Server, str]:
    wrapper = HandlerWrapper(False, auth=auth, max_in_flight=max_in_flight)
    table = {
        name: wrapper.wrap(
            f"/{SERVICE}/{name}",
            grpc.unary_unary_rpc_method_handler(getattr(handlers, name), _ident, _ident),
        )
        for name in ("echo", "fail", "crash", "slow", "big", "metadata")
    }
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ]
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, table),))
    if mux:

        async def admit(context: grpc.aio.ServicerContext) -> None:
            handlers.streams_opened += 1
            await wrapper.admit_stream(context)

        # As create_server wires it: streams are checked as they open when there are keys.
        servicer = MuxServicer(
            {f"/{SERVICE}/{n}": h for n, h in table.items()},
            admit=admit if auth is not None else None,
        )
        mux_pb2_grpc.add_MuxServiceServicer_to_server(servicer, server)
        server.mux = servicer  # type: ignore[attr-defined]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def handlers() -> Handlers:
    return Handlers()


@pytest.fixture
async def served(handlers: Handlers) -> AsyncIterator[tuple[grpc.aio.Server, MuxChannel]]:
    server, address = await _server(handlers)
    channel = MuxChannel(
        grpc.aio.insecure_channel(
            address, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        ),
        (("authorization", "Bearer stream-key"),),
    )
    yield server, channel
    await channel.close()
    await server.stop(None)


def method(channel: grpc.aio.Channel, name: str) -> Any:
    return channel.unary_unary(f"/{SERVICE}/{name}", _ident, _ident)


async def test_calls_go_over_the_stream_and_answer_as_unary(
    served: tuple[grpc.aio.Server, MuxChannel], handlers: Handlers
) -> None:
    _, channel = served
    echo = method(channel, "echo")
    answers = await asyncio.gather(*(echo(f"n{i}".encode(), timeout=10) for i in range(300)))
    assert answers == [f"n{i}".encode() for i in range(300)]
    assert all(isinstance(c, MuxServicerContext) for c in handlers.contexts)
    assert not channel.disabled


async def test_an_error_keeps_its_code_message_and_rich_status(
    served: tuple[grpc.aio.Server, MuxChannel],
) -> None:
    _, channel = served
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await method(channel, "fail")(b"", timeout=10)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == "not now"
    error = from_rpc_error(caught.value)
    assert error.reason == "NOT_NOW" and error.metadata == {"why": "testing"}
    with pytest.raises(grpc.aio.AioRpcError) as crashed:
        await method(channel, "crash")(b"")
    assert crashed.value.code() == grpc.StatusCode.INTERNAL
    assert "boom" not in (crashed.value.details() or "")  # no internals leak


async def test_a_deadline_ends_the_call_on_both_sides(
    served: tuple[grpc.aio.Server, MuxChannel], handlers: Handlers
) -> None:
    _, channel = served
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await method(channel, "slow")(b"", timeout=0.3)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert loop.time() - started < 5
    await asyncio.wait_for(handlers.cancelled.wait(), 5)  # the handler was stopped too
    assert await method(channel, "echo")(b"after") == b"after"  # the stream still serves


async def test_a_cancelled_caller_cancels_the_call_on_the_server(
    served: tuple[grpc.aio.Server, MuxChannel], handlers: Handlers
) -> None:
    _, channel = served
    task = asyncio.ensure_future(method(channel, "slow")(b""))
    await asyncio.wait_for(handlers.started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(handlers.cancelled.wait(), 5)


async def test_call_metadata_and_the_streams_key_reach_the_handler(
    served: tuple[grpc.aio.Server, MuxChannel],
) -> None:
    _, channel = served
    seen = await method(channel, "metadata")(
        b"", metadata=(("x-call", "one"), ("authorization", "Bearer call-key"))
    )
    # Both arrive; the stream's key comes last, as a channel interceptor's would.
    assert seen == b"x-call=one|authorization=Bearer call-key|authorization=Bearer stream-key"


async def test_large_responses_come_in_parts_and_large_requests_go_unary(
    served: tuple[grpc.aio.Server, MuxChannel], handlers: Handlers
) -> None:
    _, channel = served
    size = 5 * 1024 * 1024 + 256 * 3
    small, large = await asyncio.gather(
        method(channel, "echo")(b"tiny"), method(channel, "big")(str(size).encode())
    )
    assert small == b"tiny"
    assert large == bytes(range(256)) * (size // 256)
    payload = b"x" * (MAX_FRAME_REQUEST_BYTES + 1)
    assert await method(channel, "echo")(payload) == payload
    assert not isinstance(handlers.contexts[-1], MuxServicerContext)  # sent unary


async def test_an_unknown_method_is_unimplemented(
    served: tuple[grpc.aio.Server, MuxChannel],
) -> None:
    _, channel = served
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await channel.unary_unary(f"/{SERVICE}/nope", _ident, _ident)(b"")
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_server_without_the_stream_is_called_unary(handlers: Handlers) -> None:
    server, address = await _server(handlers, mux=False)
    channel = MuxChannel(grpc.aio.insecure_channel(address))
    try:
        echo = method(channel, "echo")
        assert await asyncio.gather(echo(b"a"), echo(b"b")) == [b"a", b"b"]
        assert channel.disabled
        assert await echo(b"c", timeout=5) == b"c"
        assert not any(isinstance(c, MuxServicerContext) for c in handlers.contexts)
    finally:
        await channel.close()
        await server.stop(None)


async def test_draining_finishes_started_calls_and_refuses_new_ones(
    served: tuple[grpc.aio.Server, MuxChannel], handlers: Handlers
) -> None:
    server, channel = served
    slow = asyncio.ensure_future(method(channel, "slow")(b"", timeout=10))
    await asyncio.wait_for(handlers.started.wait(), 5)
    server.mux.drain()  # type: ignore[attr-defined]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await method(channel, "echo")(b"late", timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    handlers.release.set()
    assert await slow == b"done"


async def test_a_server_that_goes_away_fails_calls_promptly(handlers: Handlers) -> None:
    server, address = await _server(handlers)
    channel = MuxChannel(grpc.aio.insecure_channel(address))
    try:
        assert await method(channel, "echo")(b"up") == b"up"
        slow = asyncio.ensure_future(method(channel, "slow")(b"", timeout=20))
        await asyncio.wait_for(handlers.started.wait(), 5)
        await server.stop(None)  # no grace: the stream is cut
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(slow, 10)
        assert caught.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        with pytest.raises(grpc.aio.AioRpcError) as after:
            await asyncio.wait_for(method(channel, "echo")(b"down", timeout=5), 10)
        assert after.value.code() in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )
    finally:
        await channel.close()


async def test_streams_are_taken_in_turn_and_renewed_without_losing_calls(
    handlers: Handlers,
) -> None:
    server, address = await _server(handlers)
    channel = MuxChannel(grpc.aio.insecure_channel(address), streams=3, max_age_s=0.05)
    try:
        echo = method(channel, "echo")
        seen: set[int] = set()
        for round_ in range(6):
            answers = await asyncio.gather(*(echo(f"{round_}-{i}".encode()) for i in range(40)))
            assert answers == [f"{round_}-{i}".encode() for i in range(40)]
            seen.update(id(c) for c in channel._slots if c is not None)
            await asyncio.sleep(0.06)  # every stream is now due for renewal
        assert len(seen) > 3  # renewed: more streams than slots were used
        # The retired streams were half-closed and ended by the server, none left behind.
        await asyncio.sleep(0.2)
        assert len(server.mux._streams) <= 3  # type: ignore[attr-defined]
    finally:
        await channel.close()
        await server.stop(None)


def test_mux_settings_are_read_and_checked() -> None:
    from shared.config import MuxSettings

    assert MuxSettings.from_env({}) == MuxSettings(enabled=True, streams=2, max_age_s=60.0)
    assert not MuxSettings.from_env({"TOOLMESH_MUX": "0"}).enabled
    assert MuxSettings.from_env({"TOOLMESH_MUX_STREAMS": "4"}).streams == 4
    for bad in (
        {"TOOLMESH_MUX_STREAMS": "0"},
        {"TOOLMESH_MUX_STREAMS": "x"},
        {"TOOLMESH_MUX_MAX_AGE_S": "-1"},
    ):
        with pytest.raises(ValueError, match="TOOLMESH_MUX"):
            MuxSettings.from_env(bad)


async def test_open_channel_uses_the_call_stream_unless_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shared.clients import open_channel

    channel = open_channel("127.0.0.1:1")
    assert isinstance(channel, MuxChannel)
    await channel.close()
    monkeypatch.setenv("TOOLMESH_MUX", "0")
    plain = open_channel("127.0.0.1:1")
    assert not isinstance(plain, MuxChannel)
    await plain.close()


# --- a hostile client on the raw stream --------------------------------------------------------


def _raw_stream(channel: grpc.aio.Channel, metadata: Any = None) -> Any:
    return channel.stream_stream(
        "/toolmesh.mux.v1.MuxService/Calls",
        request_serializer=mpb.CallsRequest.SerializeToString,
        response_deserializer=mpb.CallsResponse.FromString,
    )(metadata=metadata)


async def _answers(call: Any, n: int) -> dict[int, mpb.Reply]:
    got: dict[int, mpb.Reply] = {}
    while len(got) < n:
        message = await asyncio.wait_for(call.read(), 10)
        for reply in message.replies:
            got[reply.call_id] = reply
    return got


async def test_bad_calls_on_the_raw_stream_get_clear_answers(
    served: tuple[grpc.aio.Server, MuxChannel],
) -> None:
    _, channel = served
    call = _raw_stream(channel.inner)
    echo = f"/{SERVICE}/echo"
    await call.write(
        mpb.CallsRequest(
            calls=[
                mpb.Call(call_id=1, method="/x/" + "y" * 100_000),
                mpb.Call(
                    call_id=2,
                    method=echo,
                    metadata=[mpb.MetadataEntry(key="x-big", text="z" * 20_000)],
                ),
                mpb.Call(call_id=3, method=echo, request=b"late", timeout_seconds=-1),
                mpb.Call(call_id=4, method=echo, request=b"nan", timeout_seconds=float("nan")),
                mpb.Call(call_id=5, method=echo, request=b"inf", timeout_seconds=float("inf")),
                mpb.Call(call_id=6, method=echo, request=b"a"),
                mpb.Call(call_id=6, method=echo, request=b"b"),
                mpb.Call(call_id=99, cancel=True),  # nothing to cancel: ignored
            ]
        )
    )
    got = await _answers(call, 6)
    assert got[1].code == grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert len(got[1].message) < 400  # the name is clipped, not echoed back whole
    assert got[2].code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert "metadata" in got[2].message
    assert got[3].code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert (got[4].code, got[4].response) == (0, b"nan")
    assert (got[5].code, got[5].response) == (0, b"inf")
    assert got[6].code in (0, grpc.StatusCode.INVALID_ARGUMENT.value[0])
    call.cancel()


async def test_a_client_that_floods_the_stream_is_held_back(
    served: tuple[grpc.aio.Server, MuxChannel],
    handlers: Handlers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mux, "MAX_CALLS_PER_STREAM", 20)
    _, channel = served
    call = _raw_stream(channel.inner)
    slow = f"/{SERVICE}/slow"
    for batch in range(5):
        await call.write(
            mpb.CallsRequest(
                calls=[mpb.Call(call_id=batch * 10 + i + 1, method=slow) for i in range(10)]
            )
        )
    await asyncio.sleep(0.5)
    assert handlers.slow_started == 20  # the server stopped reading at the limit
    handlers.release.set()
    got = await _answers(call, 50)  # then it went on, and every call was answered
    assert all(r.code == 0 and r.response == b"done" for r in got.values())
    call.cancel()


async def test_api_keys_are_checked_for_every_call_on_the_stream(handlers: Handlers) -> None:
    server, address = await _server(handlers, auth=MeshAuth(KEYS, frozenset({"echo"})))
    keyless = MuxChannel(grpc.aio.insecure_channel(address))
    tenant = MuxChannel(grpc.aio.insecure_channel(address), TENANT_KEY)
    admin = MuxChannel(grpc.aio.insecure_channel(address), (("authorization", "Bearer admin-key"),))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await method(keyless, "echo")(b"x")
        assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as not_admin:
            await method(tenant, "echo")(b"x")
        assert not_admin.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert await method(admin, "echo")(b"x") == b"x"
        # A key sent with one call does not lift the stream's own.
        with pytest.raises(grpc.aio.AioRpcError) as still:
            await method(tenant, "echo")(b"x", metadata=(("authorization", "Bearer admin-key"),))
        assert still.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert all(isinstance(c, MuxServicerContext) for c in handlers.contexts)
    finally:
        for channel in (keyless, tenant, admin):
            await channel.close()
        await server.stop(None)


async def test_calls_whose_write_fails_are_sent_again_on_a_new_stream(handlers: Handlers) -> None:
    """A write on a stream the server has already ended (a draining server ends an idle stream
    at once; the client can write before it has read that end) fails INTERNAL in gRPC: the
    calls in it never reached the server, so they go again on a new stream; a call already on
    the broken stream ends UNAVAILABLE, never INTERNAL."""
    server, address = await _server(handlers)
    channel = MuxChannel(grpc.aio.insecure_channel(address), streams=1)
    try:
        echo = method(channel, "echo")
        assert await echo(b"first") == b"first"
        slow = asyncio.ensure_future(method(channel, "slow")(b"", timeout=10))
        await asyncio.wait_for(handlers.started.wait(), 5)
        broken = channel._slots[0]
        assert broken is not None

        async def failing_write(message: Any) -> None:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.INTERNAL,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details="Internal error from Core",
            )

        broken.call.write = failing_write  # type: ignore[method-assign]
        assert await asyncio.wait_for(echo(b"again"), 5) == b"again"
        assert channel._slots[0] is not broken
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(slow, 5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        handlers.release.set()
        await channel.close()
        await server.stop(None)


# --- API keys at the stream's open -------------------------------------------------------------


def _refusal(error: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str, Any]:
    """What a refusal carries: code, message and the google.rpc.Status (ErrorInfo) trailer."""
    status = dict(error.trailing_metadata() or ()).get(DETAILS_KEY)
    assert status, "no google.rpc.Status trailer"
    return error.code(), error.details() or "", status


async def test_a_stream_without_a_valid_key_is_refused_as_it_opens(handlers: Handlers) -> None:
    """Refused at once, before any call on it is read, with the status and ErrorInfo a unary
    call without that key gets; a stream with a valid key opens and serves."""
    server, address = await _server(handlers, auth=MeshAuth(KEYS))
    channel = grpc.aio.insecure_channel(address)
    try:
        for metadata, reason in (
            (None, "API_KEY_MISSING"),
            ((("authorization", "Bearer not-a-key"),), "API_KEY_UNKNOWN"),
        ):
            call = _raw_stream(channel, metadata)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(call.read(), 5)  # nothing sent: it was never held open
            with pytest.raises(grpc.aio.AioRpcError) as unary:
                await method(channel, "echo")(b"x", metadata=metadata, timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert _refusal(refused.value) == _refusal(unary.value)
            assert from_rpc_error(refused.value).reason == reason
        assert not server.mux._streams
        admitted = _raw_stream(channel, TENANT_KEY)
        await admitted.write(
            mpb.CallsRequest(calls=[mpb.Call(call_id=1, method=f"/{SERVICE}/echo", request=b"in")])
        )
        got = await _answers(admitted, 1)
        assert (got[1].code, got[1].response) == (0, b"in")
        admitted.cancel()
        assert handlers.streams_opened == 3
    finally:
        await channel.close()
        await server.stop(None)


async def test_a_refused_streams_calls_fail_unauthenticated_at_once_and_later_ones_go_unary(
    handlers: Handlers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mesh's client (open_channel) with no key or a wrong one: every call fails
    UNAUTHENTICATED with the server's reason, promptly, neither retried on stream after stream
    nor failed as a broken stream; after the refusal its calls go unary (no stream per call),
    so a call that carries a valid key of its own is served, as it would be unary."""
    from shared.clients import open_channel

    for name in ("TOOLMESH_API_KEY", "TOOLMESH_MUX", "TOOLMESH_MUX_STREAMS"):
        monkeypatch.delenv(name, raising=False)
    server, address = await _server(handlers, auth=MeshAuth(KEYS))
    keyless = open_channel(address, api_key="")
    wrong = open_channel(address, api_key="not-a-key")
    try:
        for channel, reason in ((keyless, "API_KEY_MISSING"), (wrong, "API_KEY_UNKNOWN")):
            assert isinstance(channel, MuxChannel)
            echo = method(channel, "echo")
            at_once = asyncio.gather(
                *(echo(b"x", timeout=10) for _ in range(30)), return_exceptions=True
            )
            one_by_one = [
                await asyncio.wait_for(asyncio.gather(echo(b"y"), return_exceptions=True), 5)
                for _ in range(10)
            ]
            results = [*await asyncio.wait_for(at_once, 10), *(r[0] for r in one_by_one)]
            for error in results:
                assert isinstance(error, grpc.aio.AioRpcError), error
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error
                assert from_rpc_error(error).reason == reason
        assert handlers.streams_opened <= 4  # its two stream slots each, not one per call
        assert not server.mux._streams  # nor does it hold any
        mine = await method(keyless, "echo")(
            b"mine", metadata=(("authorization", "Bearer tenant-key"),), timeout=5
        )
        assert mine == b"mine"
    finally:
        await keyless.close()
        await wrong.close()
        await server.stop(None)


def _internal_from_core() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details="Internal error from Core",
    )


class _WriteInFlightAsItEnds:
    """A Calls stream as grpc.aio presents one the server ended while a write was in flight
    (a refusal at open arrives within a round trip, while the client goes on writing calls):
    the write fails, and from then on the call reads INTERNAL "Internal error from Core"
    (grpc.aio's _AioCall.set_internal_error replaces the server's status); only a done
    callback, run as the server's status is set, sees that status."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def add_done_callback(self, callback: Any) -> None:
        self._call.add_done_callback(callback)

    async def write(self, message: Any) -> None:
        await self._call.write(message)
        await self._call.code()  # still in flight when the stream ends
        raise _internal_from_core()

    async def read(self) -> Any:
        try:
            return await self._call.read()
        except grpc.aio.AioRpcError:
            raise _internal_from_core() from None

    async def done_writing(self) -> None:
        await self._call.done_writing()

    def cancel(self) -> bool:
        return bool(self._call.cancel())


class _WritesInFlightChannel:
    """A channel whose streams are _WriteInFlightAsItEnds; the rest is the wrapped channel."""

    def __init__(self, inner: grpc.aio.Channel) -> None:
        self._inner = inner

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        open_call = self._inner.stream_stream(*args, **kwargs)
        return lambda **options: _WriteInFlightAsItEnds(open_call(**options))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_refused_stream_whose_write_was_in_flight_still_fails_unauthenticated(
    handlers: Handlers,
) -> None:
    """The stream reads INTERNAL, as a broken one would, but the server refused it: the calls
    fail UNAUTHENTICATED (never UNAVAILABLE "the call stream broke" or "kept closing"), and a
    stream is tried again once max_age_s has passed."""
    server, address = await _server(handlers, auth=MeshAuth(KEYS))
    inner = _WritesInFlightChannel(grpc.aio.insecure_channel(address))
    channel = MuxChannel(cast(grpc.aio.Channel, inner), streams=1, max_age_s=0.2)
    try:
        echo = method(channel, "echo")
        results = await asyncio.wait_for(
            asyncio.gather(*(echo(b"x", timeout=10) for _ in range(5)), return_exceptions=True),
            10,
        )
        assert handlers.streams_opened == 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while handlers.streams_opened < 2 and loop.time() < deadline:
            results.append(*await asyncio.gather(echo(b"y", timeout=5), return_exceptions=True))
        assert handlers.streams_opened >= 2  # tried again after the refusal's max_age_s
        for error in results:
            assert isinstance(error, grpc.aio.AioRpcError), error
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error.details()
            assert from_rpc_error(error).reason == "API_KEY_MISSING"
    finally:
        await channel.close()
        await server.stop(None)


async def test_streams_take_no_in_flight_slot_and_the_calls_on_them_do(handlers: Handlers) -> None:
    """TOOLMESH_MAX_IN_FLIGHT (see HandlerWrapper.admit_stream): a stream refused at open is
    gone at once; an admitted one, open and idle, holds no slot, so however many are open an
    ordinary call is not shed; each call on a stream holds one while it runs."""
    server, address = await _server(handlers, auth=MeshAuth(KEYS), max_in_flight=1)
    plain = grpc.aio.insecure_channel(address)
    clients = [
        MuxChannel(grpc.aio.insecure_channel(address), TENANT_KEY, streams=1) for _ in range(3)
    ]
    try:
        for call in [_raw_stream(plain) for _ in range(20)]:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(call.read(), 5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for client in clients:
            assert await method(client, "echo")(b"open", timeout=5) == b"open"
        assert len(server.mux._streams) == 3
        assert await method(plain, "echo")(b"unary", metadata=TENANT_KEY, timeout=5) == b"unary"
        slow = asyncio.ensure_future(method(clients[0], "slow")(b"", timeout=10))
        await asyncio.wait_for(handlers.started.wait(), 5)
        for shed in (
            method(clients[1], "echo")(b"x", timeout=5),
            method(plain, "echo")(b"x", metadata=TENANT_KEY, timeout=5),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as overloaded:
                await shed
            assert overloaded.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert from_rpc_error(overloaded.value).reason == "OVERLOADED"
        handlers.release.set()
        assert await slow == b"done"
        assert await method(clients[1], "echo")(b"after", timeout=5) == b"after"
    finally:
        handlers.release.set()
        for client in clients:
            await client.close()
        await plain.close()
        await server.stop(None)
