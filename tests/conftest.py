"""Fixtures shared by the whole suite: the database backends every storage test runs on
(SQLite, and PostgreSQL started by the test setup), and an engine on a fresh database.

A fresh database is a copy of one migrated once per session (a file copy on SQLite, `CREATE
DATABASE ... TEMPLATE` on PostgreSQL): running the migrations costs 0.2-0.3 s, and some 300
fixtures ask for a fresh database. The migrations themselves are tested in tests/unit/db."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from shared.db.engine import make_engine, session_factory, upgrade
from tests.support.postgres import create_database, postgres_server

TEMPLATE_DB = "tm_template"


@pytest.fixture(autouse=True)
def _environment_kept() -> Iterator[None]:
    """A test that changes os.environ and leaves it changed fails (and the environment is put
    back): the change would reach every later test in the same process, and every service
    they start, which tests run in parallel workers make order-dependent failures of."""
    own = "PYTEST_CURRENT_TEST"  # pytest's own, set for each phase of a test
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = sorted(
        k for k in before.keys() | after.keys() if k != own and before.get(k) != after.get(k)
    )
    if not changed:
        return
    before[own] = after.get(own, "")
    os.environ.clear()
    os.environ.update(before)
    pytest.fail(f"the test left os.environ changed ({', '.join(changed)}): use monkeypatch.setenv")


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    """One throw-away PostgreSQL server for the whole session."""
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head, copied for each fresh database."""
    path = tmp_path_factory.mktemp("template") / "toolmesh.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_template(postgres_admin_url: str) -> str:
    """The name of a PostgreSQL database migrated to head, the template of fresh ones (the
    migrations run on a NullPool engine, so no connection to it is left open)."""
    upgrade(create_database(postgres_admin_url, TEMPLATE_DB))
    return TEMPLATE_DB


def fresh_database_url(request: pytest.FixtureRequest, backend: str, tmp_dir: str) -> str:
    """The URL of a new database on `backend`, already migrated to head."""
    if backend == "sqlite":
        path = Path(tmp_dir) / "toolmesh.db"
        template = request.getfixturevalue("sqlite_template")
        with (
            contextlib.closing(sqlite3.connect(template)) as src,
            contextlib.closing(sqlite3.connect(path)) as dst,
        ):
            src.backup(dst)
        return f"sqlite:///{path}"
    admin = request.getfixturevalue("postgres_admin_url")
    template = request.getfixturevalue("postgres_template")
    return create_database(admin, f"tm_{uuid.uuid4().hex[:12]}", template=template)


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh, migrated database on each backend."""
    return fresh_database_url(request, request.param, str(tmp_path_factory.mktemp("db")))


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = make_engine(database_url)
    yield eng
    eng.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)
