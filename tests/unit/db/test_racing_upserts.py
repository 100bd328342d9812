"""Rows written as "insert if missing, else update" by writers that may run at once — on two
replicas, or two requests of one — on both backends: every writer succeeds and the row holds
one writer's value. A read-then-insert made all but one fail on the key."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.orm import Session, sessionmaker

from services.mcp_bridge.model import ServerConfig
from services.mcp_bridge.store import SqlConnectionStore
from shared.llm.config import ModelConfig, ModelConfigStore

WRITERS = 8


def race(write: Callable[[int], None]) -> None:
    """`write(n)` by WRITERS threads released together; re-raises the first failure."""
    start = threading.Barrier(WRITERS)

    def one(n: int) -> None:
        start.wait(10)
        write(n)

    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(one, range(WRITERS)))


def test_bridges_saving_one_new_connection_at_once_all_succeed(
    sessions: sessionmaker[Session],
) -> None:
    def save(n: int) -> None:
        SqlConnectionStore(sessions).save(
            ServerConfig(name="shared", transport="stdio", command=f"server-{n}")
        )

    race(save)
    (stored,) = SqlConnectionStore(sessions).load()
    assert stored.name == "shared" and stored.command in {f"server-{n}" for n in range(WRITERS)}


def test_admins_adding_one_new_model_at_once_all_succeed(sessions: sessionmaker[Session]) -> None:
    def upsert(n: int) -> None:
        ModelConfigStore(sessions).upsert(
            ModelConfig(
                model="new-model", provider="anthropic", max_output_tokens=100 + n, roles=()
            )
        )

    race(upsert)
    stored = ModelConfigStore(sessions).get("new-model")
    assert 100 <= stored.max_output_tokens < 100 + WRITERS
