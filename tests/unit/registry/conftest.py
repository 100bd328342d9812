"""Fixtures of the analysis tool tests: a data root holding people.csv and orders.csv, a
migrated SQLite database with dataset stores on it (each on its own engine, as replicas are),
and a tool context over both."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from services.registry.context import ToolContext
from services.registry.datasets import SqlDatasetStore
from shared.db.engine import make_engine, session_factory
from shared.db.models import Base

from .analysis_support import ORDERS_CSV, PEOPLE_CSV, make_context


@pytest.fixture
def files(tmp_path: Path) -> Path:
    root = tmp_path / "files"
    root.mkdir()
    (root / "people.csv").write_text(PEOPLE_CSV, encoding="utf-8")
    (root / "orders.csv").write_text(ORDERS_CSV, encoding="utf-8")
    return root


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/t.db"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
    return url


@pytest.fixture
def make_store(db_url: str) -> Iterator[Callable[[], SqlDatasetStore]]:
    """Builds stores on their own engines, like separate registry replicas."""
    engines: list[Engine] = []

    def build() -> SqlDatasetStore:
        engines.append(make_engine(db_url))
        return SqlDatasetStore(session_factory(engines[-1]))

    yield build
    for engine in engines:
        engine.dispose()


@pytest.fixture
def store(make_store: Callable[[], SqlDatasetStore]) -> SqlDatasetStore:
    return make_store()


@pytest.fixture
def ctx(tmp_path: Path, files: Path, store: SqlDatasetStore) -> ToolContext:
    return make_context(tmp_path, store)
