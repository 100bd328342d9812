"""CallTool under a flood of progress notifications (the raw test server's `flood` tool, a real
stdio process) with a caller that reads slowly: the servicer keeps only the latest update not
yet sent, so the call finishes at the server's pace and the caller then gets the last update
and the result, not every update."""

from __future__ import annotations

import asyncio
from typing import Any

from services.mcp_bridge.core import CallOutcome, McpBridge
from services.mcp_bridge.model import ProgressUpdate
from services.mcp_bridge.servicer import LatestProgress, McpBridgeServicer
from tests.unit.mcp_bridge.conftest import BridgeFactory, raw_config
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb


class Finishing:
    """The bridge core, telling when a call is over (whatever its caller has read)."""

    def __init__(self, bridge: McpBridge) -> None:
        self._bridge = bridge
        self.finished = asyncio.Event()

    async def call_tool(self, *args: Any, **kwargs: Any) -> CallOutcome:
        try:
            return await self._bridge.call_tool(*args, **kwargs)
        finally:
            self.finished.set()


async def test_a_slow_caller_gets_the_latest_progress_then_the_result(
    make_bridge: BridgeFactory,
) -> None:
    bridge = make_bridge()
    await bridge.connect(raw_config("raw"))
    core = Finishing(bridge)
    servicer = McpBridgeServicer(core)  # type: ignore[arg-type]
    count = 5_000
    request = mpb.CallToolRequest(
        connection="raw", tool="flood", arguments_json=f'{{"count": {count}}}'
    )
    stream = servicer.CallTool(request, None)  # type: ignore[arg-type]
    first = await stream.__anext__()
    assert first.HasField("progress")
    await asyncio.wait_for(core.finished.wait(), 60)
    rest = [m async for m in stream]
    assert [m.WhichOneof("event") for m in rest] == ["progress", "result"]
    assert (rest[0].progress.progress, rest[0].progress.total) == (count, count)
    assert rest[0].progress.message == f"flood {count} "
    assert rest[-1].result.content.endswith(f"flooded {count}")


async def test_a_caller_that_keeps_up_sees_progress_as_it_comes(
    make_bridge: BridgeFactory,
) -> None:
    bridge = make_bridge()
    await bridge.connect(raw_config("raw"))
    servicer = McpBridgeServicer(bridge)
    request = mpb.CallToolRequest(connection="raw", tool="progress")
    messages = [m async for m in servicer.CallTool(request, None)]  # type: ignore[arg-type]
    assert [m.WhichOneof("event") for m in messages][-1] == "result"
    steps = [m.progress.progress for m in messages if m.HasField("progress")]
    assert steps and steps[-1] == 3 and steps == sorted(steps)


def test_the_slot_holds_one_update_and_counts_the_superseded() -> None:
    slot = LatestProgress()
    assert slot.take() is None
    for i in range(10_000):
        slot.put(ProgressUpdate(float(i), 10_000.0, None))
    assert slot.superseded == 9_999
    assert slot.ready.is_set()
    update = slot.take()
    assert update is not None and update.progress == 9_999
    assert slot.take() is None
