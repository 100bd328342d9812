"""The surface core over the real SQL store (SQLite and PostgreSQL): sticky working sets shared
by replicas, the floor's fallback, TTL cache and derivation, search paging within the budget and
surface-miss counting, the catalog refreshed off the request path, and bad requests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.surface.assembly import MAX_TOOL_SURFACE
from services.surface.core import Caller, SurfaceCore
from services.surface.store import SqlSurfaceStore
from services.surface.tier0 import ANCHORS, SEED_KEY, STATIC_FLOOR
from shared.db.models import ToolDefinitionRow
from shared.errors import InvalidArgument, NotFound, Unavailable
from shared.llm.config import ModelConfigStore

FLOOR_TOOLS = ("search_tools", "query", "load_dataset")
GROUPS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def add_tools(sessions: sessionmaker[Session], names: list[tuple[str, str]]) -> None:
    with sessions.begin() as s:
        for name, description in names:
            s.add(
                ToolDefinitionRow(
                    name=name,
                    description=description,
                    input_schema={"type": "object"},
                    tool_type="custom",
                    status="approved",
                )
            )


@pytest.fixture
def tools(sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    add_tools(sessions, [(n, f"the {n} tool") for n in FLOOR_TOOLS])
    add_tools(
        sessions,
        [
            ("crm_create_lead", "Create a sales lead in the CRM"),
            ("crm_delete_lead", "Delete a sales lead from the CRM"),
            *[(f"widget_{i}", f"widget {GROUPS[i // 20]} operation") for i in range(130)],
        ],
    )
    return sessions


def core(sessions: sessionmaker[Session], clock: Clock | None = None) -> SurfaceCore:
    return SurfaceCore(
        SqlSurfaceStore(sessions),
        ModelConfigStore(sessions),
        None,
        catalog_ttl_s=0.0,
        floor_ttl_s=30.0,
        clock=clock or Clock(),
    )


CALLER = Caller("tenant", conversation_id="conv")


async def test_paged_tools_stay_for_the_conversation_on_every_replica(
    tools: sessionmaker[Session],
) -> None:
    one, two = core(tools), core(tools)
    outcome = await one.search("create a sales lead", 1, CALLER)
    assert outcome.paged_in == ["crm_create_lead"]
    surface = await two.assemble(CALLER)
    assert ("crm_create_lead", False) in [(t.name, r) for t, r in surface.tools]
    other = await two.assemble(Caller("tenant", conversation_id="other"))
    assert "crm_create_lead" not in other.names
    assert await two.working_set("conv", "") == ["crm_create_lead"]
    assert await two.working_set("conv", "ns2") == []


async def test_floor_falls_back_to_static_then_uses_the_derived_one(
    tools: sessionmaker[Session],
) -> None:
    clock = Clock()
    c = core(tools, clock)
    assert await c.resolve_floor_names() == tuple(
        dict.fromkeys(
            [*STATIC_FLOOR, *sorted(set(await c.resolve_floor_names()) - set(STATIC_FLOOR))]
        )
    )
    assert c.floor_source == "static"
    SqlSurfaceStore(tools).write_seed(SEED_KEY, '{"names": ["crm_delete_lead"]}')
    assert c.floor_source == "static" and "crm_delete_lead" not in await c.resolve_floor_names()
    clock.t += 31  # the TTL cache expires
    floor = await c.resolve_floor_names()
    assert floor[0] == "crm_delete_lead" and "search_tools" in floor and c.floor_source == "derived"
    SqlSurfaceStore(tools).write_seed(SEED_KEY, "{broken")
    clock.t += 31
    assert (await c.resolve_floor_names())[: len(STATIC_FLOOR)] == STATIC_FLOOR


async def test_derive_tier0_stores_anchors_first(tools: sessionmaker[Session]) -> None:
    c = core(tools)
    await c.search("delete a sales lead", 1, CALLER)
    derivation = await c.derive_tier0()
    assert derivation.names[: len(ANCHORS)] == ANCHORS
    assert "crm_delete_lead" in derivation.names  # a surface miss earned it a place
    assert "outside [25, 35]" in derivation.warning
    assert c.floor_source == "static"  # not read yet
    await c.resolve_floor_names()
    assert c.floor_source == "derived"


async def test_misses_count_only_tools_outside_the_floor(tools: sessionmaker[Session]) -> None:
    c = core(tools)
    store = SqlSurfaceStore(tools)
    await c.search("the query tool", 3, Caller("tenant", conversation_id="c2"))
    await c.search("create a sales lead", 1, Caller("tenant", conversation_id="c3"))
    misses = store.miss_counts(datetime.now(UTC))
    assert "query" not in misses
    assert misses["crm_create_lead"].recent == 1


async def test_search_refuses_pages_beyond_the_budget(tools: sessionmaker[Session]) -> None:
    c = core(tools)
    caller = Caller("tenant", conversation_id="full")
    refusal = ""
    for group in GROUPS:
        outcome = await c.search(f"{group} widget", 20, caller)
        refusal = refusal or outcome.refusal
    assert "budget of 120" in refusal
    assert len((await c.assemble(caller)).tools) == MAX_TOOL_SURFACE


@pytest.mark.parametrize(
    ("query", "limit", "caller", "field"),
    [
        ("", 0, CALLER, "query"),
        ("x" * 3000, 0, CALLER, "query"),
        ("ok", -1, CALLER, "limit"),
        ("ok", 0, Caller("tenant"), "context.conversation_id"),
        ("ok", 0, Caller("", conversation_id="c"), "context.tenant_id"),
    ],
)
async def test_bad_searches_name_the_field(
    tools: sessionmaker[Session], query: str, limit: int, caller: Caller, field: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        await core(tools).search(query, limit, caller)
    assert field in [f for f, _ in info.value.field_violations]


async def test_unknown_mode_and_model_are_refused(tools: sessionmaker[Session]) -> None:
    with pytest.raises(InvalidArgument):
        await core(tools).assemble(Caller("tenant", mode="turbo"))
    with pytest.raises(NotFound) as info:
        await core(tools).assemble(Caller("tenant", model="nope"))
    assert info.value.reason == "MODEL_NOT_CONFIGURED"


async def wait_until(condition: Callable[[], Awaitable[bool]], deadline_s: float = 10.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not await condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.01)


async def test_a_stale_catalog_is_refreshed_in_the_background(
    tools: sessionmaker[Session],
) -> None:
    clock = Clock()
    c = SurfaceCore(
        SqlSurfaceStore(tools), ModelConfigStore(tools), None, catalog_ttl_s=2.0, clock=clock
    )
    before = await c.catalog()
    add_tools(tools, [("crm_merge_leads", "Merge two sales leads in the CRM")])
    assert await c.catalog() is before  # within the TTL: no check at all
    clock.t += 3
    # Past the TTL the caller still gets the snapshot at once; a background task re-reads.
    assert await c.catalog() is before

    async def refreshed() -> bool:
        return "crm_merge_leads" in (await c.catalog()).tools

    await wait_until(refreshed)
    outcome = await c.search("merge two leads", 1, Caller("tenant", conversation_id="merge"))
    assert outcome.paged_in == ["crm_merge_leads"]
    await c.close()


class FailingFingerprint(SqlSurfaceStore):
    """The real store whose catalog check finds the database unreachable."""

    failing = False

    def catalog_fingerprint(self) -> tuple[Any, ...]:
        if self.failing:
            raise Unavailable("database unavailable", reason="DATABASE_UNAVAILABLE")
        return super().catalog_fingerprint()


async def test_a_failed_background_refresh_keeps_the_snapshot(
    tools: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    store = FailingFingerprint(tools)
    c = SurfaceCore(store, ModelConfigStore(tools), None, catalog_ttl_s=2.0, clock=clock)
    before = await c.catalog()
    store.failing = True
    clock.t += 3
    assert await c.catalog() is before

    async def logged() -> bool:
        return "catalog refresh failed" in caplog.text

    await wait_until(logged)
    assert (await c.assemble(CALLER)).names  # still answering from the snapshot
    store.failing = False
    add_tools(tools, [("crm_merge_leads", "Merge two sales leads in the CRM")])

    async def recovered() -> bool:
        return "crm_merge_leads" in (await c.catalog()).tools

    await wait_until(recovered)
    await c.close()
