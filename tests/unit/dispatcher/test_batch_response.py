"""A batch's response within one gRPC message: results that together would pass it are replaced,
largest first, by an Err saying where the full result is, and the others arrive whole."""

from __future__ import annotations

import pytest

from services.dispatcher import servicer
from services.dispatcher.servicer import _fit_batch
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.type.v1 import types_pb2 as pb


def batch(*sizes: int) -> dpb.DispatchToolCallsResponse:
    return dpb.DispatchToolCallsResponse(
        results=[
            dpb.DispatchToolCallResponse(
                tool_use_id=f"t{i}", result=pb.ToolResult(content="x" * size)
            )
            for i, size in enumerate(sizes)
        ]
    )


def test_results_that_fit_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(servicer, "MAX_BATCH_RESPONSE_BYTES", 10_000)
    response = batch(3000, 3000, 3000)
    _fit_batch(response)
    assert [len(r.result.content) for r in response.results] == [3000, 3000, 3000]


def test_the_largest_results_give_way_until_the_batch_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(servicer, "MAX_BATCH_RESPONSE_BYTES", 10_000)
    response = batch(4000, 9000, 100, 6000)
    _fit_batch(response)
    kinds = [r.result.envelope.err.err_kind for r in response.results]
    assert kinds == ["", "batch_result_too_large", "", "batch_result_too_large"]
    assert response.results[0].result.content == "x" * 4000
    assert "ListConversationEvents" in response.results[1].result.envelope.err.message
    assert response.results[1].tool_use_id == "t1"
    assert response.ByteSize() <= 10_000
