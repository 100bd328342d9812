"""A dispatcher with TOOLMESH_RETENTION_DAYS sweeps the call log while it serves: rows older
than the retention go (with their events), the calls it just served stay, on SQLite and
PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Table, func, select, update

from shared.db.engine import make_engine
from shared.db.models import ConversationEventRow, ToolExecutionLogRow
from shared.telemetry.collector import MemorySpanSink
from tests.conftest import BACKENDS
from tests.integration.conftest import Mesh, backend_mesh
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

_LOG: Table = ToolExecutionLogRow.__table__  # type: ignore[assignment]
_EVENTS: Table = ConversationEventRow.__table__  # type: ignore[assignment]


@pytest.fixture(params=BACKENDS)
def swept_mesh(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
) -> Iterator[Mesh]:
    env = {"TOOLMESH_RETENTION_DAYS": "1", "TOOLMESH_RETENTION_INTERVAL_S": "0.2"}
    with backend_mesh(request, tmp_path_factory, collector, "retention", env) as mesh:
        yield mesh


def test_the_dispatcher_sweeps_what_is_older_than_the_retention(swept_mesh: Mesh) -> None:
    for i in range(3):
        assert not swept_mesh.call(
            "ping", f'{{"echo": {i}}}', tool_use_id=f"toolu_{i}"
        ).result.error
    engine = make_engine(swept_mesh.database_url)
    try:

        def rows(table: Table) -> list[str]:
            with engine.connect() as conn:
                return [
                    r[0]
                    for r in conn.execute(
                        select(table.c.tool_use_id).distinct().order_by(table.c.tool_use_id)
                    )
                ]

        # The first two calls are made two days old: the next sweep deletes them.
        old = datetime.now(UTC) - timedelta(days=2)
        with engine.begin() as conn:
            for table in (_LOG, _EVENTS):
                conn.execute(
                    update(table)
                    .where(table.c.tool_use_id.in_(["toolu_0", "toolu_1"]))
                    .values(created_at=old)
                )
        wait_for(lambda: rows(_LOG) == ["toolu_2"], timeout=30, what="the old log rows to go")
        wait_for(lambda: rows(_EVENTS) == ["toolu_2"], timeout=30, what="the old events to go")
        # The mesh goes on serving and logging.
        assert not swept_mesh.call("ping", '{"echo": 9}', tool_use_id="toolu_9").result.error
        with engine.connect() as conn:
            count = conn.execute(select(func.count()).select_from(_LOG)).scalar_one()
        assert count == 2
    finally:
        engine.dispose()
