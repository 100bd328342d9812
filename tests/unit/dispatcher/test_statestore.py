"""The guardrail state in the database, on SQLite and PostgreSQL: rules are stored, listed and
disabled; one snapshot read returns the loop guard, the cancellation epoch, failed attempts,
observations and prior tools; the state writes ride the call log's group-commit transaction;
rate-limit counters are atomic per window; cancellation epochs are shared."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from services.dispatcher.guardrails import LoopState, PolicyRule, validate_rule
from services.dispatcher.logstore import CallRecord, SqlCallLog, StateWrite
from services.dispatcher.statestore import (
    FailedApproachWrite,
    LoopStateWrite,
    ObservationWrite,
    SqlGuardrailStore,
)
from shared.db.models import ObservationRow
from shared.errors import NotFound
from tests.support.call_records import call_record


@pytest.fixture
def store(engine: Engine) -> SqlGuardrailStore:
    return SqlGuardrailStore(engine)


@pytest.fixture
def log(sessions: sessionmaker[Session]) -> Iterator[SqlCallLog]:
    call_log = SqlCallLog(sessions)
    yield call_log
    call_log.close()


def a_rule(tenant: str = "t1", **kw: object) -> PolicyRule:
    fields: dict[str, object] = {
        "id": 0,
        "tenant_id": tenant,
        "name": "describe-first",
        "kind": "require_prior_tool",
        "tool_name": "query",
        "mode": "blocking",
        "params": {"prior_tool": "describe_entry"},
    }
    fields.update(kw)
    return validate_rule(PolicyRule(**fields))  # type: ignore[arg-type]


def record(
    tool: str, *, success: bool = True, writes: list[StateWrite] | None = None
) -> CallRecord:
    return call_record(
        f"toolu_{tool}",
        tool_name=tool,
        args_hash="0" * 16,
        output_summary="",
        success=success,
        error=None if success else "boom",
        trace_id="",
        state_writes=writes or [],
    )


def test_rules_are_stored_listed_per_tenant_and_disabled(store: SqlGuardrailStore) -> None:
    mine = store.add_rule(a_rule("t1"))
    everyone = store.add_rule(a_rule("*", name="global"))
    store.add_rule(a_rule("t2", name="theirs"))
    assert mine.id > 0 and mine.enabled and mine.created_at is not None
    assert [r.name for r in store.list_rules("t1", False)] == ["describe-first", "global"]
    assert len(store.list_rules("", False)) == 3
    disabled = store.disable_rule(everyone.id)
    assert not disabled.enabled
    assert [r.id for r in store.list_rules("t1", False)] == [mine.id]
    assert [r.id for r in store.list_rules("t1", True)] == [mine.id, everyone.id]
    assert store.list_rules("t1", False)[0].params == {"prior_tool": "describe_entry"}


def test_disabling_an_unknown_rule_is_not_found(store: SqlGuardrailStore) -> None:
    with pytest.raises(NotFound):
        store.disable_rule(4242)


def test_an_unknown_conversation_has_an_empty_snapshot(store: SqlGuardrailStore) -> None:
    snap = store.snapshot("t1", "nope", [("query", "h1")], ["describe_entry"])
    assert not snap.known
    assert snap.loop == LoopState()
    assert (snap.cancel_epoch, snap.failed, snap.prior_tools) == (0, {}, set())
    assert store.observation_counts("t1", "u1", [1]) == {}


async def test_state_writes_commit_with_the_log_and_come_back_in_one_snapshot(
    store: SqlGuardrailStore, log: SqlCallLog
) -> None:
    rule = store.add_rule(a_rule())
    await log.write(record("describe_entry"))
    for reason in ("boom 1", "boom 2"):
        await log.write(
            record(
                "query",
                success=False,
                writes=[
                    LoopStateWrite("t1", "c1", LoopState(2, "h1", 2)),
                    FailedApproachWrite("t1", "c1", "query", "h1", reason),
                    ObservationWrite("t1", "u1", rule.id, "query"),
                ],
            )
        )
    snap = store.snapshot("t1", "c1", [("query", "h1"), ("query", "h2")], ["describe_entry", "x"])
    assert snap.known
    assert snap.loop == LoopState(2, "h1", 2)
    assert snap.failed == {("query", "h1"): (2, "boom 2")}
    assert snap.prior_tools == {"describe_entry"}
    assert store.observation_counts("t1", "u1", [rule.id, rule.id + 1]) == {rule.id: 2}


async def test_the_loop_reads_the_same_snapshot_at_once_on_sqlite_only(
    store: SqlGuardrailStore, log: SqlCallLog, engine: Engine
) -> None:
    calls, prior = [("query", "h1"), ("query", "h2")], ["describe_entry", "x"]
    if engine.dialect.name != "sqlite":
        assert store.snapshot_now("t1", "c1", calls, prior) is None  # a thread reads it
        return
    assert store.snapshot_now("t1", "c1", calls, prior) == store.snapshot("t1", "c1", calls, prior)
    await log.write(record("describe_entry"))
    await log.write(
        record(
            "query",
            success=False,
            writes=[
                LoopStateWrite("t1", "c1", LoopState(2, "h1", 2)),
                FailedApproachWrite("t1", "c1", "query", "h1", "boom"),
            ],
        )
    )
    now = store.snapshot_now("t1", "c1", calls, prior)
    assert now == store.snapshot("t1", "c1", calls, prior)
    assert now is not None and now.failed == {("query", "h1"): (1, "boom")}
    assert now.prior_tools == {"describe_entry"} and now.loop == LoopState(2, "h1", 2)


async def test_a_snapshot_of_more_calls_than_one_statement_can_hold_reads_them_all(
    store: SqlGuardrailStore, log: SqlCallLog, engine: Engine
) -> None:
    # 1,500 distinct calls and 700 prior tools: over SQLite's 2000 result columns and
    # PostgreSQL's 1664 target entries in one statement (before: UNAVAILABLE, "too many
    # columns in result set").
    await log.write(record("prior_650"))
    await log.write(
        record(
            "query",
            success=False,
            writes=[
                LoopStateWrite("t1", "c1", LoopState(3, "h1", 1)),
                FailedApproachWrite("t1", "c1", "query", "h1400", "late in the batch"),
            ],
        )
    )
    calls = [("query", f"h{i}") for i in range(1500)]
    prior = [f"prior_{i}" for i in range(700)]
    snap = store.snapshot("t1", "c1", calls, prior)
    assert snap.known and snap.loop == LoopState(3, "h1", 1)
    assert snap.failed == {("query", "h1400"): (1, "late in the batch")}
    assert snap.prior_tools == {"prior_650"}
    if engine.dialect.name == "sqlite":
        assert store.snapshot_now("t1", "c1", calls, prior) == snap


async def test_a_loop_state_write_older_than_the_stored_one_changes_nothing(
    store: SqlGuardrailStore, log: SqlCallLog
) -> None:
    await log.write(record("ping", writes=[LoopStateWrite("t1", "c1", LoopState(5, "new", 3))]))
    await log.write(record("ping", writes=[LoopStateWrite("t1", "c1", LoopState(4, "old", 2))]))
    assert store.snapshot("t1", "c1", [], []).loop == LoopState(5, "new", 3)


async def test_observations_are_per_user(
    store: SqlGuardrailStore, log: SqlCallLog, engine: Engine
) -> None:
    rule = store.add_rule(a_rule())
    await log.write(record("query", writes=[ObservationWrite("t1", "u1", rule.id, "query")]))
    await log.write(record("query", writes=[ObservationWrite("t1", "u2", rule.id, "query")]))
    await log.write(record("query", writes=[ObservationWrite("t1", "u1", rule.id, "query")]))
    with engine.connect() as conn:
        rows = conn.execute(
            select(ObservationRow.user_id, ObservationRow.count).order_by(ObservationRow.user_id)
        ).all()
    assert [tuple(r) for r in rows] == [("u1", 2), ("u2", 1)]
    assert store.observation_counts("t1", "u2", [rule.id]) == {rule.id: 1}


def test_rate_counters_count_per_window_tenant_and_tool(store: SqlGuardrailStore) -> None:
    rule = store.add_rule(
        a_rule(kind="rate_limit", params={"max_calls": 2, "window_seconds": 60}, name="rl")
    )
    counts = [store.count_calls("t1", "query", [rule], 120.0 + i)[rule.id] for i in range(3)]
    assert counts == [1, 2, 3]
    assert store.count_calls("t2", "query", [rule], 125.0) == {rule.id: 1}
    assert store.count_calls("t1", "preview_data", [rule], 125.0) == {rule.id: 1}
    assert store.count_calls("t1", "query", [rule], 180.0) == {rule.id: 1}  # next window


def test_a_conversation_is_touched_on_the_loop_on_sqlite_only(
    store: SqlGuardrailStore, engine: Engine
) -> None:
    touched = store.touch_conversation_now("t1", "c9")
    assert touched is (engine.dialect.name == "sqlite")
    if not touched:
        store.touch_conversation("t1", "c9")
    assert store.snapshot("t1", "c9", [], []).known
    assert store.bump_cancel_epoch("t1", "c9") == 1
    store.touch_conversation("t1", "c9")  # idempotent
    assert store.touch_conversation_now("t1", "c9") is touched
    assert store.cancel_epoch("t1", "c9") == 1


def test_rate_counts_made_on_the_loop_continue_those_made_in_threads(
    store: SqlGuardrailStore, engine: Engine
) -> None:
    rule = store.add_rule(
        a_rule(kind="rate_limit", params={"max_calls": 2, "window_seconds": 60}, name="rl")
    )
    if engine.dialect.name != "sqlite":
        assert store.count_calls_now("t1", "query", [rule], 120.0) is None  # a thread counts
        return
    assert store.count_calls("t1", "query", [rule], 120.0) == {rule.id: 1}
    assert store.count_calls_now("t1", "query", [rule], 121.0) == {rule.id: 2}
    assert store.count_calls("t1", "query", [rule], 122.0) == {rule.id: 3}
    assert store.count_calls_now("t1", "query", [rule], 180.0) == {rule.id: 1}  # next window
    other = sqlite3.connect(str(engine.url.database), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock: no waiting on the loop
    started = time.monotonic()
    assert store.count_calls_now("t1", "query", [rule], 181.0) is None
    assert time.monotonic() - started < 1
    other.execute("ROLLBACK")
    other.close()
    assert store.count_calls_now("t1", "query", [rule], 182.0) == {rule.id: 2}


async def test_concurrent_rate_counts_never_repeat_a_number(store: SqlGuardrailStore) -> None:
    rule = store.add_rule(
        a_rule(kind="rate_limit", params={"max_calls": 2, "window_seconds": 60}, name="rl")
    )
    counts = await asyncio.gather(
        *(asyncio.to_thread(store.count_calls, "t1", "q", [rule], 60.0) for _ in range(16))
    )
    assert sorted(c[rule.id] for c in counts) == list(range(1, 17))


def test_cancel_epochs_are_shared_and_an_unknown_conversation_is_left_alone(
    store: SqlGuardrailStore, engine: Engine
) -> None:
    assert store.bump_cancel_epoch("t1", "fresh") is None
    assert store.snapshot("t1", "fresh", [], []).known is False
    store.touch_conversation("t1", "fresh")
    store.touch_conversation("t1", "fresh")  # idempotent
    assert store.bump_cancel_epoch("t1", "fresh") == 1
    other_replica = SqlGuardrailStore(engine)
    assert other_replica.cancel_epoch("t1", "fresh") == 1
    assert other_replica.bump_cancel_epoch("t1", "fresh") == 2
    assert store.cancel_epoch("t1", "fresh") == 2
    assert store.cancel_epoch("t2", "fresh") == 0
