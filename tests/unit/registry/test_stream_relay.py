"""ExecuteToolStream's progress relay under a flood with a caller that reads slowly: the handler
(async, or sync in a worker thread) never waits for the caller, only its latest report waits
to be sent, the last one always arrives before the result, and a report from a worker thread
wakes the stream without a callback per report."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from services.registry.context import ToolContext
from services.registry.servicer import LatestProgress, RegistryServicer
from shared.contract import ToolResult
from toolmesh.registry.v1 import registry_pb2 as rpb


class FloodingCore:
    """A registry core whose tool reports `count` progress updates, from a worker thread when
    `threaded` (a sync handler), then answers."""

    def __init__(self, count: int, *, threaded: bool) -> None:
        self.count = count
        self.threaded = threaded
        self.finished = asyncio.Event()

    def _report(self, context: ToolContext) -> None:
        for i in range(1, self.count + 1):
            context.report_progress(f"step {i}", fraction=i / self.count, i=i)

    async def execute(self, name: str, inputs: dict[str, Any], context: ToolContext) -> Any:
        if self.threaded:
            await asyncio.to_thread(self._report, context)
        else:
            for i in range(1, self.count + 1):
                context.report_progress(f"step {i}", fraction=i / self.count, i=i)
                if i % 100 == 0:
                    await asyncio.sleep(0)
        self.finished.set()
        return SimpleNamespace(
            result=ToolResult(content="done"),
            tool=SimpleNamespace(tool_type="system"),
            execution_ms=1.0,
        )


async def slow_stream(threaded: bool) -> list[rpb.ExecuteToolStreamResponse]:
    core = FloodingCore(50_000, threaded=threaded)
    servicer = RegistryServicer(core, max_input_bytes=1 << 20)  # type: ignore[arg-type]
    request = rpb.ExecuteToolStreamRequest(name="flood", input_json="{}")
    stream = servicer.ExecuteToolStream(request, None)  # type: ignore[arg-type]
    first = await stream.__anext__()
    await asyncio.wait_for(core.finished.wait(), 60)
    return [first, *[m async for m in stream]]


async def test_an_async_handler_flooding_a_slow_caller() -> None:
    messages = await slow_stream(threaded=False)
    assert [m.WhichOneof("event") for m in messages] == ["progress", "progress", "result"]
    assert messages[1].progress.message == "step 50000"
    assert messages[1].progress.fraction == 1.0
    assert messages[1].progress.data_json == '{"i":50000}'
    assert messages[-1].result.result.content.endswith("done")


async def test_a_sync_handler_flooding_from_a_thread() -> None:
    messages = await slow_stream(threaded=True)
    kinds = [m.WhichOneof("event") for m in messages]
    assert kinds[-1] == "result" and len(kinds) <= 3, kinds
    assert messages[-2].progress.message == "step 50000"


async def test_reports_from_a_thread_wake_the_stream_once_per_take() -> None:
    loop = asyncio.get_running_loop()
    slot = LatestProgress(loop)
    scheduled = 0
    real = loop.call_soon_threadsafe

    def counting(callback: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal scheduled
        if callback == slot.ready.set:
            scheduled += 1
        return real(callback, *args, **kwargs)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        await asyncio.to_thread(lambda: [slot.put({"message": str(i)}) for i in range(10_000)])
        await asyncio.wait_for(slot.ready.wait(), 5)
    finally:
        del loop.call_soon_threadsafe
    assert scheduled == 1
    assert slot.superseded == 9_999
    assert slot.take() == {"message": "9999"}
    assert slot.take() is None
