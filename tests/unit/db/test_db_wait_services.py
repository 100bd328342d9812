"""Every service, not only the dispatcher, bounds its waits on the database: a database that
stops answering (a frozen server or host, its connections open and silent) ends the call with
UNAVAILABLE (DATABASE_UNAVAILABLE) after TOOLMESH_DB_WAIT_S, and the next call after it answers
again succeeds. Each service's core here over the real SQL store, one store call held."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.mcp_bridge.core import McpBridge
from services.mcp_bridge.store import SqlConnectionStore
from services.registry.context import ToolContext
from services.registry.core import Registry
from services.registry.repository import SqlToolRepository
from services.surface.core import SurfaceCore
from services.surface.store import SqlSurfaceStore
from shared.config import Settings
from shared.errors import NotFound, Unavailable
from shared.llm.config import ModelConfigStore
from tests.unit.mcp_bridge.conftest import RepositorySink

# Long enough for the read that follows a wait to answer in time on a loaded machine (0.3 s
# was missed once while the suite ran in two workers: a fresh PostgreSQL connection and a
# thread hand-off behind a stuck one).
WAIT_S = 1.0


class Held:
    """`target` with the methods named in `held` waiting, while closed, until opened (a
    database that does not answer); every other attribute is the target's own."""

    def __init__(self, target: Any, *held: str) -> None:
        self._target = target
        self._held = frozenset(held)
        self._open = threading.Event()
        self._open.set()
        self.waited = 0

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name not in self._held:
            return attr

        def held(*args: Any, **kwargs: Any) -> Any:
            if not self._open.is_set():
                self.waited += 1
                self._open.wait(30)
            return attr(*args, **kwargs)

        return held


@pytest.fixture
def opened() -> Iterator[list[Held]]:
    """Every Held of a test is opened at its end (its threads finish)."""
    made: list[Held] = []
    yield made
    for one in made:
        one.open()


async def refused_then_served(held: Held, call: Callable[[], Any], what: str) -> None:
    held.close()
    started = time.monotonic()
    with pytest.raises(Unavailable) as refused:
        await call()
    waited = time.monotonic() - started
    assert refused.value.reason == "DATABASE_UNAVAILABLE"
    assert f"did not answer {what} within {WAIT_S:g}s" in refused.value.message
    assert "TOOLMESH_DB_WAIT_S" in refused.value.message
    assert WAIT_S <= waited < 5, waited
    assert held.waited == 1
    held.open()
    await call()  # the database answers again: no restart, no retry needed


def surface(store: SqlSurfaceStore | Held, models: ModelConfigStore | Held) -> SurfaceCore:
    """A surface core over these stores (either one Held), waiting WAIT_S for the database."""
    return SurfaceCore(
        store,  # type: ignore[arg-type]
        models,  # type: ignore[arg-type]
        None,
        catalog_ttl_s=0.0,
        db_wait_s=WAIT_S,
    )


async def test_the_registry_answers_unavailable_when_a_tool_definition_read_does_not_return(
    sessions: sessionmaker[Session], opened: list[Held]
) -> None:
    repo = Held(SqlToolRepository(sessions), "get")
    opened.append(repo)
    registry = Registry(repo, cache_ttl_s=0.0, db_wait_s=WAIT_S)  # type: ignore[arg-type]
    registry.seed_system_tools()
    await refused_then_served(
        repo, lambda: registry.lookup("ping", "t1"), "a tool definition's read"
    )


async def test_a_handler_database_call_is_bounded_by_the_settings_wait(
    sessions: sessionmaker[Session], opened: list[Held]
) -> None:
    store = Held(ModelConfigStore(sessions), "list")
    opened.append(store)
    context = ToolContext(
        "a_tool", "t1", settings=Settings.from_env({"TOOLMESH_DB_WAIT_S": str(WAIT_S)})
    )
    await refused_then_served(
        store, lambda: context.db("the model list", store.list), "the model list"
    )


async def test_the_surface_answers_unavailable_when_a_working_set_read_does_not_return(
    sessions: sessionmaker[Session], opened: list[Held]
) -> None:
    store = Held(SqlSurfaceStore(sessions), "working_set")
    opened.append(store)
    core = surface(store, ModelConfigStore(sessions))
    try:
        await refused_then_served(
            store, lambda: core.working_set("conv", "", "t1"), "the working set's read"
        )
    finally:
        await core.close()


async def test_the_surface_answers_unavailable_when_the_model_configurations_do_not_come_back(
    sessions: sessionmaker[Session], opened: list[Held]
) -> None:
    models = Held(ModelConfigStore(sessions), "list")
    opened.append(models)
    core = surface(SqlSurfaceStore(sessions), models)
    try:
        await refused_then_served(models, core.list_models, "the model configurations' read")
    finally:
        await core.close()


async def test_the_bridge_answers_unavailable_when_the_stored_connections_do_not_come_back(
    sessions: sessionmaker[Session], opened: list[Held]
) -> None:
    """A reconnect of a connection this bridge does not run reads the stored ones."""
    store = Held(SqlConnectionStore(sessions), "load")
    opened.append(store)
    bridge = McpBridge(
        store,  # type: ignore[arg-type]
        RepositorySink(SqlToolRepository(sessions)),
        db_wait_s=WAIT_S,
    )

    async def reconnect() -> None:
        with pytest.raises(NotFound):  # answered: none stored by that name
            await bridge.reconnect("nowhere")

    try:
        store.close()
        started = time.monotonic()
        with pytest.raises(Unavailable, match=r"did not answer the connections' read"):
            await bridge.reconnect("nowhere")
        assert WAIT_S <= time.monotonic() - started < 5
        store.open()
        await reconnect()
    finally:
        await bridge.stop()
