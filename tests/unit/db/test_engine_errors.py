"""How database failures reach callers: UNAVAILABLE with a message naming the cause."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from shared.db.engine import make_engine, translate_db_errors
from shared.errors import Unavailable


def test_an_exhausted_connection_pool_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    engine = create_engine(
        f"sqlite:///{tmp_path}/t.db", pool_size=1, max_overflow=0, pool_timeout=0.05
    )
    held = engine.connect()
    try:
        with (
            pytest.raises(Unavailable, match="no free connection") as raised,
            translate_db_errors(),
            engine.connect() as conn,
        ):
            conn.execute(text("SELECT 1"))
        assert raised.value.reason == "DATABASE_UNAVAILABLE"
    finally:
        held.close()
        engine.dispose()


def test_a_sqlite_engine_has_room_for_the_registrys_handler_threads(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/t.db")
    try:
        held = [engine.connect() for _ in range(16 + 6)]  # handler threads + default executor
        for conn in held:
            conn.close()
    finally:
        engine.dispose()


def test_an_in_memory_sqlite_engine_still_opens() -> None:
    for url in ("sqlite://", "sqlite:///:memory:"):
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                assert conn.execute(text("SELECT 1")).scalar() == 1
        finally:
            engine.dispose()


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_database_not_migrated_yet_is_unavailable_schema_not_ready(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    """A dispatcher started before the registry migrated a fresh database: on PostgreSQL its
    reads failed INTERNAL (an undefined table is a ProgrammingError); now both backends answer
    UNAVAILABLE, retryable, saying how to migrate."""
    if backend == "postgres":
        from tests.support.postgres import create_database

        admin = request.getfixturevalue("postgres_admin_url")
        url = create_database(admin, f"unmigrated_{uuid.uuid4().hex[:12]}")
    else:
        url = f"sqlite:///{tmp_path}/fresh.db"
    engine = make_engine(url)
    try:
        for sql in ("SELECT count(*) FROM tool_execution_log", "SELECT no_such_column FROM x"):
            with (
                pytest.raises(Unavailable, match="toolmesh db upgrade") as raised,
                translate_db_errors(),
                engine.connect() as conn,
            ):
                conn.execute(text(sql))
            assert raised.value.reason == "SCHEMA_NOT_READY"
    finally:
        engine.dispose()
