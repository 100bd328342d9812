"""A cancelled call stops its sync handler's work: the handler runs on a worker thread that
cannot be stopped from outside, so the registry sets the call's cancellation and long work on
that thread stops on it (before: a cancelled query ran on to its 60 s cap, holding one of the
few worker threads every tenant's sync tools share)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from services.registry.context import (
    CallCancelled,
    ToolContext,
    call_cancellation,
    raise_if_cancelled,
)
from services.registry.core import Registry
from services.registry.datasets import SqlDatasetStore
from services.registry.repository import SqlToolRepository

from .analysis_support import make_context

# The analysis tests' fixtures.

NEVER_ENDS = (
    "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT count(*) FROM t"
)


def watchdogs() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "query-watchdog"]


async def wait_for(check: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.02)


async def test_a_cancelled_query_stops_at_once_not_at_its_time_limit(
    sessions: sessionmaker[Session], tmp_path: Path, files: Path, store: SqlDatasetStore
) -> None:
    registry = Registry(SqlToolRepository(sessions), cache_ttl_s=0.0)
    registry.seed_system_tools()
    assert registry.auto_register_handlers() == {}
    ctx = make_context(tmp_path, store)  # the query's own limit: 60 s
    call = asyncio.create_task(registry.execute("query", {"sql": NEVER_ENDS}, ctx))
    await wait_for(lambda: watchdogs(), 20)
    began = time.monotonic()
    call.cancel()
    await wait_for(lambda: not watchdogs(), 10)  # the DuckDB work itself ended
    assert time.monotonic() - began < 10
    assert call.cancelled()


async def test_work_in_a_cancelled_calls_thread_sees_its_cancellation(
    sessions: sessionmaker[Session],
) -> None:
    registry = Registry(SqlToolRepository(sessions), cache_ttl_s=0.0)
    registry.seed_system_tools()
    started, stopped = threading.Event(), threading.Event()

    def slow(inputs: dict[str, object], context: ToolContext) -> str:
        event = call_cancellation()
        assert event is not None
        started.set()
        try:
            while True:
                raise_if_cancelled()
                time.sleep(0.01)
        except CallCancelled:
            stopped.set()
            raise

    registry.register_handler("ping", slow)
    ctx = ToolContext(tool_name="ping", tenant_id="t1", conversation_id="c1")
    call = asyncio.create_task(registry.execute("ping", {}, ctx))
    await wait_for(started.is_set, 10)
    call.cancel()
    await wait_for(stopped.is_set, 10)
    assert raise_if_cancelled() is None  # nothing is cancelled outside that call
