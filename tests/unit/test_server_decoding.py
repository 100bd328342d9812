"""A request whose bytes are not its message — corrupt, truncated, or a string field that is not
UTF-8 (some languages' protobuf libraries let a client send that) — is INVALID_ARGUMENT naming
the message type and what is wrong, over a plain unary call and over the call stream alike,
and the server keeps serving. gRPC alone answers UNKNOWN with a Python exception's repr."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from shared.mux import MuxServicer
from shared.rpc_errors import from_rpc_error
from shared.server import HandlerWrapper
from toolmesh.mux.v1 import mux_pb2 as mpb
from toolmesh.mux.v1 import mux_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

SERVICE = "test.Tools"
METHOD = f"/{SERVICE}/Name"
GOOD = pb.ToolUse(id="toolu_1", name="AAAA", input_json="{}").SerializeToString()
BAD_UTF8 = GOOD.replace(b"AAAA", b"\xff\xfe\xfd\xfc")
CORRUPT = b"\x0a\xff\xff\xff\xff\x0f"


async def name_of(request: pb.ToolUse, context: Any) -> pb.ToolUse:
    return pb.ToolUse(name=request.name)


@pytest.fixture
async def address() -> AsyncIterator[str]:
    wrapper = HandlerWrapper(False)
    handler = wrapper.wrap(
        METHOD,
        grpc.unary_unary_rpc_method_handler(
            name_of,
            request_deserializer=pb.ToolUse.FromString,
            response_serializer=pb.ToolUse.SerializeToString,
        ),
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Name": handler}),)
    )
    mux_pb2_grpc.add_MuxServiceServicer_to_server(MuxServicer({METHOD: handler}), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)


@pytest.mark.parametrize(
    ("payload", "detail"), [(BAD_UTF8, "UTF-8"), (CORRUPT, "corrupt"), (b"\x0a\x05ab", "")]
)
async def test_an_undecodable_unary_request_is_invalid_argument(
    address: str, payload: bytes, detail: str
) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(METHOD)  # raw bytes in and out
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(payload, timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        message = caught.value.details() or ""
        assert "not a valid toolmesh.type.v1.ToolUse" in message and detail in message
        assert "<class" not in message  # no Python internals
        assert from_rpc_error(caught.value).reason == "REQUEST_NOT_DECODABLE"
        answer = pb.ToolUse.FromString(await call(GOOD, timeout=10))
        assert answer.name == "AAAA"  # still serving


async def test_an_undecodable_request_on_the_call_stream_is_invalid_argument(
    address: str,
) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stream = channel.stream_stream(
            "/toolmesh.mux.v1.MuxService/Calls",
            request_serializer=mpb.CallsRequest.SerializeToString,
            response_deserializer=mpb.CallsResponse.FromString,
        )()
        await stream.write(
            mpb.CallsRequest(
                calls=[
                    mpb.Call(call_id=1, method=METHOD, request=BAD_UTF8),
                    mpb.Call(call_id=2, method=METHOD, request=GOOD),
                ]
            )
        )
        got: dict[int, mpb.Reply] = {}
        while len(got) < 2:
            message = await asyncio.wait_for(stream.read(), 10)
            got.update({r.call_id: r for r in message.replies})
        stream.cancel()
    assert got[1].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "UTF-8" in got[1].message
    assert got[2].code == 0 and pb.ToolUse.FromString(got[2].response).name == "AAAA"
