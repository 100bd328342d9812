"""Sync handlers run on the registry's own worker threads, one bounded pool per nesting depth.

Before, they ran on asyncio's default executor (min(32, cores + 4) threads: 6 on 2 cores), the
same threads the registry's catalog reads use: six slow queries stalled every tool lookup, and a
sync handler composing another sync tool held its thread while the nested call waited for one,
so a handful of composing calls at once deadlocked the pool until their timeouts."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.registry.context import ToolContext
from services.registry.core import HandlerThreads, Registry
from services.registry.repository import SqlToolRepository
from shared.config import Settings

from .test_registry_core import InProcessCaller

# Longer than any wait below: a handler that is never released still ends.
RELEASE_S = 30.0


def make_registry(sessions: sessionmaker[Session], threads: int) -> Registry:
    registry = Registry(SqlToolRepository(sessions), cache_ttl_s=0.0, handler_threads=threads)
    caller = InProcessCaller(registry)

    def defaults(ctx: ToolContext) -> None:
        ctx.caller = caller
        ctx.loop = asyncio.get_running_loop()

    registry._context_defaults = defaults
    registry.seed_system_tools()
    assert registry.auto_register_handlers() == {}
    return registry


def ctx(depth: int = 0) -> ToolContext:
    return ToolContext(tool_name="", tenant_id="t1", conversation_id="c1", depth=depth)


async def until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.01)


async def test_slow_sync_tools_do_not_stall_the_registrys_own_reads(
    sessions: sessionmaker[Session],
) -> None:
    registry = make_registry(sessions, threads=40)
    release = threading.Event()
    running = 0
    lock = threading.Lock()

    def slow(inputs: dict[str, Any], context: ToolContext) -> str:
        nonlocal running
        with lock:
            running += 1
        release.wait(RELEASE_S)
        return "done"

    registry.register_handler("ping", slow)
    # More slow calls than asyncio's default executor has threads on any machine (at most 32).
    many = 34
    calls = [asyncio.create_task(registry.execute("ping", {}, ctx())) for _ in range(many)]
    try:
        await until(lambda: running == many)
        # A lookup that misses the cache (ttl 0) reads the database on a thread: it answers at
        # once instead of waiting for a slow tool to end.
        tool = await asyncio.wait_for(registry.lookup("describe_entry", "t1"), 5)
        assert tool.name == "describe_entry"
        tools = await asyncio.wait_for(asyncio.to_thread(registry.tools_for_llm, "t1"), 5)
        assert any(t.name == "query" for t in tools)
    finally:
        release.set()
        results = await asyncio.gather(*calls)
    assert all(r.result.error is None for r in results)
    registry.close()


async def test_handler_threads_are_bounded_and_queued_calls_wait_their_turn(
    sessions: sessionmaker[Session],
) -> None:
    registry = make_registry(sessions, threads=2)
    release = threading.Event()
    peak = running = 0
    lock = threading.Lock()

    def slow(inputs: dict[str, Any], context: ToolContext) -> str:
        nonlocal peak, running
        with lock:
            running += 1
            peak = max(peak, running)
        release.wait(RELEASE_S)
        with lock:
            running -= 1
        return "done"

    registry.register_handler("ping", slow)
    calls = [asyncio.create_task(registry.execute("ping", {}, ctx())) for _ in range(6)]
    await until(lambda: running == 2)
    await asyncio.sleep(0.2)
    assert running == 2  # the other four wait for a thread
    release.set()
    results = await asyncio.gather(*calls)
    assert peak == 2
    assert [r.result.error for r in results] == [None] * 6
    registry.close()


async def test_a_queued_call_that_is_cancelled_never_runs(
    sessions: sessionmaker[Session],
) -> None:
    registry = make_registry(sessions, threads=1)
    release = threading.Event()
    ran: list[str] = []

    def slow(inputs: dict[str, Any], context: ToolContext) -> str:
        ran.append(str(inputs.get("echo")))
        release.wait(RELEASE_S)
        return "done"

    registry.register_handler("ping", slow)
    first = asyncio.create_task(registry.execute("ping", {"echo": "first"}, ctx()))
    await until(lambda: ran == ["first"])
    queued = asyncio.create_task(registry.execute("ping", {"echo": "queued"}, ctx()))
    await asyncio.sleep(0.1)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    release.set()
    await first
    third = await registry.execute("ping", {"echo": "third"}, ctx())
    assert third.result.error is None
    assert ran == ["first", "third"]
    registry.close()


async def test_sync_tools_composing_sync_tools_cannot_deadlock_the_pool(
    sessions: sessionmaker[Session],
) -> None:
    """Every thread of depth 0 is held by a parent waiting for its nested call: the nested
    calls run on depth 1's threads, so all of them finish."""
    registry = make_registry(sessions, threads=2)

    def inner(inputs: dict[str, Any], context: ToolContext) -> str:
        return f"inner {context.depth}"

    def outer(inputs: dict[str, Any], context: ToolContext) -> str:
        nested = context.call_tool_blocking("ping", {})
        return f"outer got {nested.content}"

    registry.register_handler("ping", inner)
    registry.register_handler("compose_ping", outer)
    calls = [registry.execute("compose_ping", {}, ctx()) for _ in range(6)]
    results = await asyncio.wait_for(asyncio.gather(*calls), 20)
    assert all("inner 1" in r.result.content for r in results), [r.result for r in results]
    registry.close()


def test_pools_are_per_depth_made_on_first_use_and_clamped() -> None:
    threads = HandlerThreads(per_depth=3, max_depth=2)
    try:
        assert threads.pool(0) is threads.pool(0)
        assert threads.pool(0) is not threads.pool(1)
        # Deeper than max_depth is refused before it runs; a negative depth from a hostile
        # context shares depth 0's pool. Neither makes a pool of its own.
        assert threads.pool(9) is threads.pool(2)
        assert threads.pool(-4) is threads.pool(0)
        assert threads.pools_made == 3
        assert threads.per_depth == 3
    finally:
        threads.shutdown()


def test_a_pool_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        HandlerThreads(per_depth=0, max_depth=8)


def test_the_setting_is_read_and_checked() -> None:
    assert Settings.from_env({}).handler_threads == 16
    assert Settings.from_env({"TOOLMESH_HANDLER_THREADS": "48"}).handler_threads == 48
    for bad in ("0", "-1", "5000", "many"):
        with pytest.raises(ValueError, match="TOOLMESH_HANDLER_THREADS"):
            Settings.from_env({"TOOLMESH_HANDLER_THREADS": bad})
