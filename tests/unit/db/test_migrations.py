"""The Alembic migrations build exactly the schema the models declare, on SQLite and PostgreSQL;
upgrading an up-to-date database is a no-op; and SQLite engines run in WAL mode."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Engine, Integer, MetaData, inspect, text

from shared.db.engine import alembic_config, make_engine, session_factory, upgrade
from shared.db.models import Base
from shared.errors import FailedPrecondition


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision(database_url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()


def test_the_migrations_and_the_models_agree(engine: Engine) -> None:
    with engine.connect() as conn:
        differences = compare_metadata(
            MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
        )
    assert differences == []


def test_the_comparison_would_notice_a_model_change_the_migrations_lack(engine: Engine) -> None:
    changed = MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.tables.values():
        table.to_metadata(changed)
    changed.tables["tool_execution_log"].append_column(Column("not_migrated", Integer))
    with engine.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn), changed)
    assert [(d[0], d[2], d[3].name) for d in differences] == [
        ("add_column", "tool_execution_log", "not_migrated")
    ]


def test_the_database_is_at_the_head_revision_with_every_model_table(
    engine: Engine, database_url: str
) -> None:
    assert current_revision(engine) == head_revision(database_url)
    assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())


def test_upgrading_an_up_to_date_database_is_a_no_op(engine: Engine, database_url: str) -> None:
    before = set(inspect(engine).get_table_names())

    upgrade(database_url)
    upgrade(database_url)

    assert current_revision(engine) == head_revision(database_url)
    assert set(inspect(engine).get_table_names()) == before
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_upgrade_creates_a_fresh_sqlite_database_and_its_directory(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new/dir/toolmesh.db"

    upgrade(url)

    engine = make_engine(url)
    try:
        assert current_revision(engine) == head_revision(url)
    finally:
        engine.dispose()


def test_a_sqlite_file_is_left_in_wal_mode_by_its_migration(tmp_path: Path) -> None:
    """Before any service connects: the first connections of services started together no
    longer race to switch the file's journal mode (one of two at once was refused)."""
    path = tmp_path / "toolmesh.db"
    upgrade(f"sqlite:///{path}")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_sqlite_engines_run_in_wal_mode_on_every_connection(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/wal.db")
    try:
        with engine.connect() as first, engine.connect() as second:
            for conn in (first, second):
                assert conn.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
                assert conn.execute(text("PRAGMA foreign_keys")).scalar_one() == 1
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("url", "shown", "why"),
    [
        ("nonsense://x", "nonsense://x", "Can't load plugin"),
        ("mysql://u:secret@db/x", "mysql://u:***@db/x", "No module named"),
        ("::::", "(unparsable)", "Could not parse"),
    ],
)
def test_a_database_url_that_cannot_be_opened_is_refused_by_name(
    url: str, shown: str, why: str
) -> None:
    for open_it in (make_engine, upgrade):
        with pytest.raises(FailedPrecondition) as caught:
            open_it(url)
        assert caught.value.reason == "DATABASE_URL_INVALID"
        assert f"TOOLMESH_DATABASE_URL {shown} cannot be opened: {why}" in caught.value.message
        assert "secret" not in caught.value.message


def test_tool_annotations_are_added_empty_to_existing_tools_and_removed_on_downgrade(
    engine: Engine, database_url: str
) -> None:
    """0009: a tool stored before it keeps its row (and its pinned hash), with NULL annotations
    that the MCP bridge fills in on its next listing."""
    from alembic import command

    from services.registry.repository import SqlToolRepository

    config = alembic_config(database_url)
    command.downgrade(config, "0008")
    assert "annotations" not in {c["name"] for c in inspect(engine).get_columns("tool_definitions")}
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO tool_definitions (name, description, input_schema, implementation,"
                " tool_type, status, enabled, category, large_output, dependencies, version,"
                " tenant_id, created_by, required_capabilities, definition_hash, created_at,"
                " updated_at) VALUES ('mcp_old_t', 'd', '{}', 'mcp:old:t', 'mcp', 'approved',"
                " true, 'mcp', false, '[]', 1, '*', 'mcp:old', '[]', :digest,"
                " CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            ),
            {"digest": "a" * 64},
        )

    command.upgrade(config, "head")

    old = SqlToolRepository(session_factory(engine)).get("mcp_old_t")
    assert old is not None and old.annotations is None and old.definition_hash == "a" * 64
    assert current_revision(engine) == head_revision(database_url)
