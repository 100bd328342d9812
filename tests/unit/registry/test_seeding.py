"""seed_system_tools on both databases: upsert semantics, retirement, unknown rows."""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from services.registry.repository import SqlToolRepository
from shared.db.engine import make_engine, session_factory
from shared.db.models import ToolDefinitionRow


def tools() -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "description": f"the {name} tool, for tests",
            "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "category": "test",
            "handler_path": f"pkg.mod.{name}",
            "status_message": f"Running {name}",
        }
        for name in ("alpha", "beta", "gamma")
    ]


def row(sessions: sessionmaker[Session], name: str) -> ToolDefinitionRow:
    with sessions() as s:
        r = s.scalar(select(ToolDefinitionRow).where(ToolDefinitionRow.name == name))
        assert r is not None
        return r


def test_first_seed_creates_and_second_seed_changes_nothing(
    sessions: sessionmaker[Session],
) -> None:
    repo = SqlToolRepository(sessions)
    first = repo.seed(tools(), retired=())
    assert first.created == ["alpha", "beta", "gamma"]
    second = repo.seed(tools(), retired=())
    assert second.unchanged == ["alpha", "beta", "gamma"]
    assert not (second.created or second.updated or second.retired or second.unknown)
    alpha = row(sessions, "alpha")
    assert (alpha.tool_type, alpha.status, alpha.tenant_id) == ("system", "approved", "*")
    assert alpha.implementation == "system:alpha"


def test_replicas_seeding_at_once_all_start_and_create_each_tool_once(database_url: str) -> None:
    """Registry replicas started together seed the same empty table at the same moment."""
    engines = [make_engine(database_url) for _ in range(6)]
    repos = [SqlToolRepository(session_factory(e)) for e in engines]
    barrier = threading.Barrier(len(repos))

    def seed(repo: SqlToolRepository) -> list[str]:
        barrier.wait()
        return repo.seed(tools(), retired=()).created

    try:
        with ThreadPoolExecutor(len(repos)) as pool:
            created = [name for names in pool.map(seed, repos) for name in names]
        assert sorted(created) == ["alpha", "beta", "gamma"]
        assert sorted(repos[0].names()) == ["alpha", "beta", "gamma"]
    finally:
        for e in engines:
            e.dispose()


def test_a_changed_description_updates_bumps_the_version_and_clears_the_embedding(
    sessions: sessionmaker[Session],
) -> None:
    repo = SqlToolRepository(sessions)
    repo.seed(tools(), retired=())
    with sessions.begin() as s:
        s.execute(update(ToolDefinitionRow).values(embedding=b"\x00\x01"))
    changed = copy.deepcopy(tools())
    changed[0]["description"] = "alpha, described better"
    changed[1]["input_schema"] = {"type": "object"}
    report = repo.seed(changed, retired=())
    assert report.updated == ["alpha", "beta"]
    assert report.unchanged == ["gamma"]
    assert row(sessions, "alpha").embedding is None
    assert row(sessions, "alpha").version == 2
    assert row(sessions, "beta").embedding == b"\x00\x01"  # description unchanged: kept


def test_seeding_never_overwrites_tool_type_or_status(sessions: sessionmaker[Session]) -> None:
    repo = SqlToolRepository(sessions)
    repo.seed(tools(), retired=())
    with sessions.begin() as s:
        s.execute(
            update(ToolDefinitionRow)
            .where(ToolDefinitionRow.name == "beta")
            .values(status="testing", enabled=False)
        )
    changed = copy.deepcopy(tools())
    changed[1]["description"] = "beta v2"
    repo.seed(changed, retired=())
    beta = row(sessions, "beta")
    assert (beta.status, beta.tool_type, beta.enabled) == ("testing", "system", False)
    assert beta.description == "beta v2"


def test_retired_names_are_soft_deleted_once(sessions: sessionmaker[Session]) -> None:
    repo = SqlToolRepository(sessions)
    repo.seed(tools(), retired=())
    report = repo.seed(tools()[:2], retired=("gamma",))
    assert report.retired == ["gamma"]
    assert report.unknown == []
    assert row(sessions, "gamma").deleted_at is not None
    assert repo.seed(tools()[:2], retired=("gamma",)).retired == []


def test_live_rows_the_code_does_not_know_are_reported_and_left_alone(
    sessions: sessionmaker[Session],
) -> None:
    repo = SqlToolRepository(sessions)
    repo.seed(tools(), retired=())
    report = repo.seed(tools()[:1], retired=())
    assert report.unknown == ["beta", "gamma"]
    assert row(sessions, "beta").deleted_at is None
    assert row(sessions, "gamma").deleted_at is None


def test_unknown_reporting_ignores_custom_and_mcp_tools(sessions: sessionmaker[Session]) -> None:
    repo = SqlToolRepository(sessions)
    with sessions.begin() as s:
        s.add(ToolDefinitionRow(name="mine", tool_type="custom", description="x", input_schema={}))
    assert repo.seed(tools(), retired=()).unknown == []
