"""Fixtures shared by the whole suite: the database backends every storage test runs on
(SQLite, and PostgreSQL started by the test setup), and an engine on a fresh database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from shared.db.engine import make_engine, session_factory, upgrade
from tests.support.postgres import create_database, postgres_server


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    """One throw-away PostgreSQL server for the whole session."""
    with postgres_server() as url:
        yield url


def fresh_database_url(request: pytest.FixtureRequest, backend: str, tmp_dir: str) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_dir}/toolmesh.db"
    admin = request.getfixturevalue("postgres_admin_url")
    return create_database(admin, f"tm_{uuid.uuid4().hex[:12]}")


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh, migrated database on each backend."""
    url = fresh_database_url(request, request.param, str(tmp_path_factory.mktemp("db")))
    upgrade(url)
    return url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = make_engine(database_url)
    yield eng
    eng.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)
