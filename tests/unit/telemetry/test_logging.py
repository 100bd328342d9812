"""setup_logging: a service's log lines on stderr, without alembic's start-up chatter."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from shared.db.engine import upgrade
from shared.telemetry.tracing import setup_logging


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_migrated_database_starts_without_alembic_lines_but_a_migration_is_named(
    tmp_path, capsys, restore_root
) -> None:
    setup_logging("registry", "INFO")
    url = f"sqlite:///{tmp_path}/t.db"
    upgrade(url)  # applies every migration: one "Running upgrade" line each
    first = capsys.readouterr().err
    assert "Running upgrade" in first
    assert "setup plugin" not in first and "Context impl" not in first
    upgrade(url)  # nothing to apply: nothing said
    assert "alembic" not in capsys.readouterr().err
    logging.getLogger("services.registry").info("catalog loaded")
    assert "INFO registry services.registry [trace=-] catalog loaded" in capsys.readouterr().err


def test_debug_keeps_every_alembic_line(tmp_path, capsys, restore_root) -> None:
    setup_logging("registry", "DEBUG")
    upgrade(f"sqlite:///{tmp_path}/t.db")
    assert "Context impl SQLiteImpl" in capsys.readouterr().err
