"""A retry is answered, not run again: a call the client named (tool_use id, in a conversation)
gets the response of the earlier call with that id, tool and input — from the log on any
replica, or by waiting for it while it still runs on this one — with real storage (SQLite and
PostgreSQL) and an in-process registry that counts the tool's runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from services.dispatcher.core import Dispatcher
from services.dispatcher.guardrails import PolicyRule
from services.dispatcher.logstore import SqlCallLog
from services.dispatcher.statestore import SqlGuardrailStore
from shared.errors import Unavailable
from tests.unit.dispatcher.test_core import CTX, InProcessRegistry, kind, use
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb


class FlakyRegistry(InProcessRegistry):
    """Answers UNAVAILABLE to the first `failures` runs (after starting them)."""

    def __init__(self, failures: int = 0) -> None:
        super().__init__()
        self.failures = failures

    async def execute(
        self, request: rpb.ExecuteToolRequest, timeout: float
    ) -> rpb.ExecuteToolResponse:
        if self.failures > 0:
            self.failures -= 1
            self.started_event(request.context.tool_use_id).set()
            raise Unavailable("registry went away mid-call")
        return await super().execute(request, timeout)


class Mesh:
    """Dispatchers over one database, made on demand (each a replica)."""

    def __init__(self, engine: Engine, sessions: sessionmaker[Session]) -> None:
        self.engine, self.sessions = engine, sessions
        self.made: list[tuple[Dispatcher, SqlCallLog]] = []

    def replica(
        self, registry: InProcessRegistry | None = None, **options: Any
    ) -> tuple[Dispatcher, InProcessRegistry]:
        registry = registry or InProcessRegistry()
        log = SqlCallLog(self.sessions)
        core = Dispatcher(registry, log, SqlGuardrailStore(self.engine), **options)
        self.made.append((core, log))
        return core, registry

    def events(self, tool_use_id: str) -> list[str]:
        with self.engine.connect() as conn:
            return [
                str(kind)
                for (kind,) in conn.execute(
                    text(
                        "SELECT event_type FROM conversation_events WHERE tool_use_id = :u "
                        "ORDER BY id"
                    ),
                    {"u": tool_use_id},
                )
            ]

    def log_rows(self, tool_use_id: str) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT COUNT(*) FROM tool_execution_log WHERE tool_use_id = :u"),
                    {"u": tool_use_id},
                ).scalar_one()
            )

    async def close(self) -> None:
        for core, log in self.made:
            await core.close()
            await asyncio.to_thread(log.close)


@pytest.fixture
async def mesh(engine: Engine, sessions: sessionmaker[Session]) -> AsyncIterator[Mesh]:
    made = Mesh(engine, sessions)
    yield made
    await made.close()


def runs(registry: InProcessRegistry, tool_use_id: str) -> int:
    return registry.finished.count(tool_use_id) + registry.cancelled.count(tool_use_id)


async def test_a_retry_gets_the_first_response_and_the_tool_runs_once(mesh: Mesh) -> None:
    core, registry = mesh.replica()
    first = await core.dispatch(use("toolu_a", echo="hello"), CTX)
    again = await core.dispatch(use("toolu_a", echo="hello"), CTX)
    assert runs(registry, "toolu_a") == 1 and mesh.log_rows("toolu_a") == 1
    assert not first.replayed and again.replayed
    assert again.to_pb().result == first.to_pb().result
    assert (again.duration_ms, again.args_hash, again.tool_use_id) == (
        first.duration_ms,
        first.args_hash,
        "toolu_a",
    )
    # Its reasoning is narration, not input: a retry that words it anew is the same call.
    worded = await core.dispatch(use("toolu_a", echo="hello", reasoning="once more"), CTX)
    assert worded.replayed and runs(registry, "toolu_a") == 1
    # Each retry leaves a `replayed` event after the call's own (and no log row).
    assert mesh.events("toolu_a") == [
        "tool_call",
        "decision",
        "tool_result",
        "outcome",
        "replayed",
        "replayed",
    ]
    assert mesh.log_rows("toolu_a") == 1


async def test_another_replica_answers_a_retry_from_the_log(mesh: Mesh) -> None:
    a, ran_a = mesh.replica()
    b, ran_b = mesh.replica()
    first = await a.dispatch(use("toolu_b", echo=[1, 2]), CTX)
    again = await b.dispatch(use("toolu_b", echo=[1, 2]), CTX)
    assert again.replayed and again.result == first.result
    assert runs(ran_a, "toolu_b") == 1 and runs(ran_b, "toolu_b") == 0


async def test_a_retry_while_the_call_runs_waits_for_its_answer(mesh: Mesh) -> None:
    core, registry = mesh.replica()
    first = asyncio.create_task(core.dispatch(use("toolu_c", delay_ms=300, echo=1), CTX))
    await asyncio.wait_for(registry.started_event("toolu_c").wait(), 5)
    retries = [
        asyncio.create_task(core.dispatch(use("toolu_c", delay_ms=300, echo=1), CTX)),
        asyncio.create_task(core.dispatch_many([use("toolu_c", delay_ms=300, echo=1)], CTX)),
    ]
    answered = await first
    single, (in_batch,) = await asyncio.gather(*retries)
    assert runs(registry, "toolu_c") == 1 and mesh.log_rows("toolu_c") == 1
    assert mesh.events("toolu_c").count("replayed") == 2
    assert single.replayed and in_batch.replayed and not answered.replayed
    assert single.result == answered.result == in_batch.result


async def test_a_retry_of_a_call_whose_caller_went_away_runs_it(mesh: Mesh) -> None:
    core, registry = mesh.replica()
    first = asyncio.create_task(core.dispatch(use("toolu_d", delay_ms=5000), CTX))
    await asyncio.wait_for(registry.started_event("toolu_d").wait(), 5)
    first.cancel()  # the caller went away: the call is logged as cancelled, not answered
    with pytest.raises(asyncio.CancelledError):
        await first
    registry.started["toolu_d"].clear()
    retry = asyncio.create_task(core.dispatch(use("toolu_d", delay_ms=5000), CTX))
    await asyncio.wait_for(registry.started_event("toolu_d").wait(), 5)  # it runs again
    retry.cancel()
    with pytest.raises(asyncio.CancelledError):
        await retry
    assert registry.cancelled == ["toolu_d", "toolu_d"] and mesh.log_rows("toolu_d") == 2


async def test_a_waiting_retry_runs_itself_when_the_call_it_waited_for_is_cancelled(
    mesh: Mesh,
) -> None:
    core, registry = mesh.replica()
    first = asyncio.create_task(core.dispatch(use("toolu_e", delay_ms=5000), CTX))
    await asyncio.wait_for(registry.started_event("toolu_e").wait(), 5)
    retry = asyncio.create_task(core.dispatch(use("toolu_e", delay_ms=5000), CTX))
    await asyncio.sleep(0.05)
    registry.started["toolu_e"].clear()
    first.cancel()
    await asyncio.wait_for(registry.started_event("toolu_e").wait(), 5)  # the retry's run
    assert registry.cancelled == ["toolu_e"]
    retry.cancel()
    with pytest.raises(asyncio.CancelledError):
        await retry


async def test_a_call_that_failed_at_the_rpc_level_runs_again(mesh: Mesh) -> None:
    core, registry = mesh.replica(FlakyRegistry(failures=1))
    with pytest.raises(Unavailable):
        await core.dispatch(use("toolu_f", echo=3), CTX)
    again = await core.dispatch(use("toolu_f", echo=3), CTX)
    assert not again.replayed and kind(again.result) == "ok"
    assert registry.finished == ["toolu_f"]
    assert mesh.log_rows("toolu_f") == 2  # both logged; only the answered one replays
    assert (await core.dispatch(use("toolu_f", echo=3), CTX)).replayed


async def test_the_same_id_with_another_input_or_tool_runs_as_a_call_of_its_own(
    mesh: Mesh,
) -> None:
    core, registry = mesh.replica()
    await core.dispatch(use("call_0", echo=1), CTX)
    other = await core.dispatch(use("call_0", echo=2), CTX)
    assert not other.replayed and runs(registry, "call_0") == 2
    # ...and each of them is then answered once.
    assert (await core.dispatch(use("call_0", echo=1), CTX)).replayed
    assert (await core.dispatch(use("call_0", echo=2), CTX)).replayed
    assert runs(registry, "call_0") == 2


async def test_calls_without_an_id_or_conversation_always_run(mesh: Mesh) -> None:
    core, registry = mesh.replica()
    for _ in range(2):
        assert not (await core.dispatch(use("", echo=1), CTX)).replayed
    no_conversation = pb.CallContext(tenant_id="t1", user_id="u1")
    for _ in range(2):
        assert not (await core.dispatch(use("toolu_g", echo=1), no_conversation)).replayed
    assert runs(registry, "toolu_g") == 2 and len(registry.finished) == 4


async def test_other_conversations_and_tenants_do_not_share_answers(mesh: Mesh) -> None:
    core, registry = mesh.replica()
    for tenant, conversation in (("t1", "c1"), ("t1", "c2"), ("t2", "c1")):
        ctx = pb.CallContext(tenant_id=tenant, user_id="u1", conversation_id=conversation)
        assert not (await core.dispatch(use("toolu_h", echo=1), ctx)).replayed
    assert runs(registry, "toolu_h") == 3


async def test_replay_off_or_past_its_window_runs_the_call_again(mesh: Mesh) -> None:
    off, registry = mesh.replica(replay_window_s=0)
    await off.dispatch(use("toolu_i", echo=1), CTX)
    assert not (await off.dispatch(use("toolu_i", echo=1), CTX)).replayed
    assert runs(registry, "toolu_i") == 2
    later, registry = mesh.replica(replay_window_s=60, wall_clock=lambda: time.time() + 61)
    assert not (await later.dispatch(use("toolu_i", echo=1), CTX)).replayed
    assert runs(registry, "toolu_i") == 1


async def test_a_refusal_is_replayed_and_retries_do_not_feed_the_guardrails(mesh: Mesh) -> None:
    core, registry = mesh.replica()
    await core.add_rule(
        PolicyRule(0, "t1", "no-denied", "deny_tool", "denied", "blocking", {}, "", True, "t")
    )
    refused = await core.dispatch(pb.ToolUse(id="toolu_j", name="denied", input_json="{}"), CTX)
    again = await core.dispatch(pb.ToolUse(id="toolu_j", name="denied", input_json="{}"), CTX)
    assert kind(refused.result) == "policy_violation" and again.replayed
    assert again.result == refused.result
    # The same call retried many times is one call to the loop guard (it refuses the fourth
    # identical call in a row), and the retries of a failing call are one failure.
    outcomes = [await core.dispatch(use("toolu_k", echo="same"), CTX) for _ in range(5)]
    assert [o.replayed for o in outcomes] == [False, True, True, True, True]
    assert {kind(o.result) for o in outcomes} == {"ok"} and runs(registry, "toolu_k") == 1
    for tool_use_id in ("toolu_l", "toolu_l2"):
        assert kind((await core.dispatch(use(tool_use_id, echo="same"), CTX)).result) == "ok"
    assert kind((await core.dispatch(use("toolu_l3", echo="same"), CTX)).result) == "loop_guard"
    failures = [await core.dispatch(use("toolu_m", fail=True), CTX) for _ in range(4)]
    assert [o.replayed for o in failures] == [False, True, True, True]
    assert all(o.warnings == failures[0].warnings for o in failures)
    with mesh.engine.connect() as conn:
        attempts = conn.execute(
            text("SELECT attempts FROM failed_approaches WHERE tool_name = 'sleep'")
        ).scalar_one()
    assert attempts == 1


async def test_a_batch_retried_is_answered_whole_and_new_calls_in_it_run(mesh: Mesh) -> None:
    core, registry = mesh.replica()
    batch = [use("toolu_n1", echo=1), use("toolu_n2", echo=2)]
    first = await core.dispatch_many(batch, CTX)
    again = await core.dispatch_many([*batch, use("toolu_n3", echo=3)], CTX)
    assert [o.replayed for o in again] == [True, True, False]
    assert [o.result for o in again[:2]] == [o.result for o in first]
    assert sorted(registry.finished) == ["toolu_n1", "toolu_n2", "toolu_n3"]


async def test_the_stored_response_is_the_one_sent_including_warnings(mesh: Mesh) -> None:
    core, _ = mesh.replica()
    await core.add_rule(
        PolicyRule(0, "t1", "careful", "deny_tool", "sleep", "advisory", {}, "", True, "t")
    )
    first = await core.dispatch(use("toolu_o", echo={"nested": [1, "two", None]}), CTX)
    assert first.warnings
    b, _ = mesh.replica()
    again = await b.dispatch(use("toolu_o", echo={"nested": [1, "two", None]}), CTX)
    expected = first.to_pb()
    expected.replayed = True
    assert again.to_pb() == expected
