"""Assembling a surface logs each name it skips (a tool paged in, then deleted) once, and what
it remembers of those names stays bounded however many tools come and go."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.surface import core as surface_core
from services.surface.core import Caller, SurfaceCore
from services.surface.store import SqlSurfaceStore
from shared.llm.config import ModelConfigStore


class DeletedToolsStore(SqlSurfaceStore):
    """Each conversation's working set names a tool that no longer exists."""

    def working_set(
        self, conversation_id: str, namespace_id: str, tenant_id: str | None = None
    ) -> list[str]:
        return [f"gone_{conversation_id}"]


async def test_skipped_names_are_logged_once_and_remembered_within_a_bound(
    sessions: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(surface_core, "MAX_LOGGED_MISSING", 50)
    core = SurfaceCore(DeletedToolsStore(sessions), ModelConfigStore(sessions), None)
    caplog.set_level(logging.INFO, logger=surface_core.__name__)
    for i in range(300):
        surface = await core.assemble(Caller("tenant", conversation_id=f"c{i}"))
        assert f"gone_c{i}" in surface.skipped
        assert len(core._state.logged_missing) <= 50
    await core.assemble(Caller("tenant", conversation_id="c299"))
    logged = [r.getMessage() for r in caplog.records if "skips names" in r.getMessage()]
    # Each once: the repeat of c299 was not logged again.
    assert [sum(f"'gone_c{i}'" in m for m in logged) for i in range(300)] == [1] * 300
