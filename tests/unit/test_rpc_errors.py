"""Error statuses on the wire: code, reason, metadata and field violations survive a hop, and
what an error quotes is bounded, so an error about a huge input is still delivered as itself
(before: a NOT_FOUND quoting a 100 KB id reached the client as RESOURCE_EXHAUSTED, "metadata
size exceeds hard limit")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from shared.errors import NotFound
from shared.rpc_errors import MAX_DETAILS, MAX_MESSAGE_BYTES, from_rpc_error
from shared.server import HandlerWrapper

SERVICE = "test.Errors"


def _ident(b: bytes) -> bytes:
    return b


async def huge_error(request: bytes, context: Any) -> bytes:
    quoted = request.decode()
    raise NotFound(
        f"no export {quoted!r}",
        reason="EXPORT_NOT_FOUND",
        metadata={f"key{i}": quoted for i in range(100)},
        field_violations=[(f"field{i}", quoted) for i in range(100)],
    )


async def small_error(request: bytes, context: Any) -> bytes:
    raise NotFound("no export 'a'", reason="EXPORT_NOT_FOUND", metadata={"file_id": "a"})


@pytest.fixture
async def address() -> AsyncIterator[str]:
    wrapper = HandlerWrapper(False)
    table = {
        name: wrapper.wrap(
            f"/{SERVICE}/{name}", grpc.unary_unary_rpc_method_handler(fn, _ident, _ident)
        )
        for name, fn in (("huge", huge_error), ("small", small_error))
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, table),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)


async def call(address: str, name: str, payload: str) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(address) as channel:
        method = channel.unary_unary(f"/{SERVICE}/{name}", _ident, _ident)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await method(payload.encode())
        return failed.value


@pytest.mark.parametrize("quoted", ["x" * 100_000, "名" * 30_000])
async def test_an_error_quoting_a_huge_value_arrives_as_itself_clipped(
    address: str, quoted: str
) -> None:
    failed = await call(address, "huge", quoted)
    assert failed.code() == grpc.StatusCode.NOT_FOUND
    error = from_rpc_error(failed)
    assert error.reason == "EXPORT_NOT_FOUND"
    details = failed.details() or ""
    assert details.startswith("no export '") and details.endswith("characters)")
    assert len(details.encode()) < MAX_MESSAGE_BYTES + 40
    assert 0 < len(error.metadata) <= MAX_DETAILS
    assert 0 < len(error.field_violations) <= MAX_DETAILS


async def test_a_small_error_is_sent_whole(address: str) -> None:
    failed = await call(address, "small", "")
    error = from_rpc_error(failed)
    assert failed.details() == "no export 'a'"
    assert error.reason == "EXPORT_NOT_FOUND" and error.metadata == {"file_id": "a"}
