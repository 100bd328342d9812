"""The throw-away PostgreSQL server used by the postgres-marked tests starts, serves SQL,
creates extra databases, and is gone after the context exits."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.support.postgres import create_database, postgres_server

pytestmark = pytest.mark.postgres


def _select_one(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("select 1")).scalar_one())
    finally:
        engine.dispose()


def test_server_serves_sql_creates_databases_and_stops() -> None:
    with postgres_server() as url:
        parsed = make_url(url)
        assert parsed.drivername == "postgresql+psycopg"
        assert parsed.host == "127.0.0.1"
        assert parsed.database == "toolmesh"
        assert _select_one(url) == 1

        second = create_database(url, "toolmesh_second")
        assert make_url(second).database == "toolmesh_second"
        assert make_url(second).port == parsed.port
        assert _select_one(second) == 1

    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(
            host="127.0.0.1",
            port=parsed.port,
            user="toolmesh",
            dbname="toolmesh",
            connect_timeout=2,
        ).close()


def test_database_names_are_validated() -> None:
    with pytest.raises(ValueError, match="database name"):
        create_database("postgresql+psycopg://toolmesh@127.0.0.1:1/x", "bad name; drop")
