"""The dispatch path with real storage (SQLite and PostgreSQL) and an in-process registry at the
RegistryGateway seam: cancellation stops the handler's work on this replica and, through the
epoch in the database, on another replica; the loop guard and the repeat-failure hint; a batch
is checked in input order and runs concurrently; every call logs decision and outcome."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from services.dispatcher.core import MAX_BATCH_CALLS, Dispatcher
from services.dispatcher.logstore import SqlCallLog
from services.dispatcher.statestore import SqlGuardrailStore
from shared import convert
from shared.contract import Ok, envelope_to_tool_result
from shared.errors import InvalidArgument
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb


@dataclass
class InProcessRegistry:
    """Runs a `sleep`-style tool on the event loop and records what became of each run."""

    started: dict[str, asyncio.Event] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    timeouts: dict[str, float] = field(default_factory=dict)

    def started_event(self, tool_use_id: str) -> asyncio.Event:
        return self.started.setdefault(tool_use_id, asyncio.Event())

    async def execute(
        self, request: rpb.ExecuteToolRequest, timeout: float
    ) -> rpb.ExecuteToolResponse:
        inputs = json.loads(request.input_json)
        call_id = request.context.tool_use_id
        self.started_event(call_id).set()
        try:
            await asyncio.sleep(inputs.get("delay_ms", 0) / 1000)
        except asyncio.CancelledError:
            self.cancelled.append(call_id)
            raise
        self.finished.append(call_id)
        if inputs.get("fail"):
            result = convert.error_result_pb("asked to fail", "test_failure")
        else:
            result = convert.tool_result_to_pb(
                envelope_to_tool_result(Ok(data={"echo": inputs.get("echo")}))
            )
        return rpb.ExecuteToolResponse(result=result)

    async def tool_timeout(self, name: str, tenant_id: str) -> float | None:
        return self.timeouts.get(name)


@dataclass
class Replica:
    core: Dispatcher
    registry: InProcessRegistry
    log: SqlCallLog


@pytest.fixture
async def replicas(
    engine: Engine, sessions: sessionmaker[Session]
) -> AsyncIterator[tuple[Replica, Replica]]:
    made = []
    for _ in range(2):
        registry = InProcessRegistry()
        log = SqlCallLog(sessions)
        core = Dispatcher(registry, log, SqlGuardrailStore(engine), poll_interval_s=0.05)
        made.append(Replica(core, registry, log))
    yield made[0], made[1]
    for r in made:
        await r.core.close()
        await asyncio.to_thread(r.log.close)


CTX = pb.CallContext(tenant_id="t1", user_id="u1", conversation_id="c1")


def use(tool_use_id: str = "", **inputs: Any) -> pb.ToolUse:
    return pb.ToolUse(id=tool_use_id, name="sleep", input_json=json.dumps(inputs))


def kind(result: pb.ToolResult) -> str:
    env = result.envelope
    return env.err.err_kind if env.WhichOneof("kind") == "err" else str(env.WhichOneof("kind"))


async def test_a_cancel_on_the_same_replica_stops_the_handler_at_once(
    replicas: tuple[Replica, Replica],
) -> None:
    a, _ = replicas
    call = asyncio.create_task(a.core.dispatch(use("slow", delay_ms=5000), CTX))
    await asyncio.wait_for(a.registry.started_event("slow").wait(), 5)
    began = time.monotonic()
    cancelled = await a.core.cancel("t1", "c1")
    outcome = await asyncio.wait_for(call, 1)
    assert time.monotonic() - began < 1
    assert cancelled.cancelled_tool_use_ids == ["slow"] and cancelled.known_conversation
    assert kind(outcome.result) == "cancelled"
    assert a.registry.cancelled == ["slow"] and a.registry.finished == []


async def test_a_cancel_on_another_replica_stops_the_call_through_the_database(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    call = asyncio.create_task(a.core.dispatch(use("slow", delay_ms=5000), CTX))
    await asyncio.wait_for(a.registry.started_event("slow").wait(), 5)
    cancelled = await b.core.cancel("t1", "c1")
    assert cancelled.cancelled_tool_use_ids == []  # nothing in flight on b itself
    assert cancelled.known_conversation  # the conversation's first call is in flight on a
    outcome = await asyncio.wait_for(call, 1)
    assert kind(outcome.result) == "cancelled"
    assert a.registry.cancelled == ["slow"]


async def test_calls_started_after_a_cancel_run_normally(replicas: tuple[Replica, Replica]) -> None:
    a, _ = replicas
    await a.core.dispatch(use(echo=1), CTX)
    await a.core.cancel("t1", "c1")
    outcome = await a.core.dispatch(use(delay_ms=150, echo=2), CTX)
    assert kind(outcome.result) == "ok"


async def test_a_cancel_of_an_unknown_conversation_says_so(
    replicas: tuple[Replica, Replica],
) -> None:
    outcome = await replicas[0].core.cancel("t1", "never-seen")
    assert outcome.cancelled_tool_use_ids == [] and not outcome.known_conversation
    assert "unknown conversation" in outcome.message


async def test_the_registrys_per_tool_timeout_is_the_deadline_of_the_call(
    replicas: tuple[Replica, Replica],
) -> None:
    a, _ = replicas
    a.registry.timeouts["sleep"] = 0.2

    async def bounded(request: rpb.ExecuteToolRequest, timeout: float) -> Any:
        assert timeout == 0.2
        return await InProcessRegistry.execute(a.registry, request, timeout)

    a.registry.execute = bounded  # type: ignore[method-assign]
    outcome = await a.core.dispatch(use(echo=1), CTX)
    assert kind(outcome.result) == "ok"


async def test_the_loop_guard_and_the_repeat_failure_hint(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    outcomes = []
    for i in range(4):  # alternate replicas: the state is in the database
        core = (a, b)[i % 2].core
        outcomes.append(await core.dispatch(use(fail=True, reasoning=f"try {i}"), CTX))
    kinds = [kind(o.result) for o in outcomes]
    assert kinds == ["test_failure", "test_failure", "test_failure", "loop_guard"]
    assert [len(o.warnings) for o in outcomes[:3]] == [0, 0, 1]
    assert "3 times" in outcomes[2].warnings[0]
    changed = await a.core.dispatch(use(fail=True, other=1), CTX)
    assert kind(changed.result) == "test_failure"


async def test_identical_calls_sent_at_once_as_separate_rpcs_meet_the_loop_guard(
    replicas: tuple[Replica, Replica],
) -> None:
    """An agent that runs a turn's calls concurrently sends them as separate RPCs: each reads
    the conversation's state before the others have logged theirs, yet the replica counts them
    in the order it planned them — three run, the rest are refused, each with its place."""
    a, b = replicas
    outcomes = await asyncio.gather(
        *(a.core.dispatch(use(f"p{i}", delay_ms=100, echo="same"), CTX) for i in range(12))
    )
    kinds = [kind(o.result) for o in outcomes]
    assert sorted(kinds) == ["loop_guard"] * 9 + ["ok"] * 3, kinds
    places = sorted(
        int(o.result.error.split("this is call ")[1].split()[0])
        for o in outcomes
        if kind(o.result) == "loop_guard"
    )
    assert places == list(range(4, 13))
    # The other replica reads the state the twelve logged: the 13th in a row.
    after = await b.core.dispatch(use("p12", delay_ms=100, echo="same"), CTX)
    assert kind(after.result) == "loop_guard" and "call 13 in a row" in after.result.error
    assert kind((await b.core.dispatch(use("q", echo="other"), CTX)).result) == "ok"


async def test_a_batch_is_guarded_in_order_and_runs_concurrently(
    replicas: tuple[Replica, Replica],
) -> None:
    a, _ = replicas
    uses = [use(f"b{i}", delay_ms=300, echo=i) for i in range(10)]
    uses += [use(f"same{i}", echo="same") for i in range(4)]
    began = time.monotonic()
    outcomes = await a.core.dispatch_many(uses, CTX)
    assert time.monotonic() - began < 2
    assert [o.tool_use_id for o in outcomes] == [u.id for u in uses]
    assert [kind(o.result) for o in outcomes[10:]] == ["ok", "ok", "ok", "loop_guard"]
    page = a.log.page_events(tenant_id="t1", conversation_id="c1", event_type="", limit=500)
    events = page.entries
    per_call = [e.event_type for e in events if e.tool_use_id == "b0"]
    assert per_call == ["tool_call", "decision", "tool_result", "outcome"]
    refused = next(
        json.loads(e.data_json)
        for e in events
        if e.tool_use_id == "same3" and e.event_type == "decision"
    )
    assert refused["action"] == "refuse" and refused["refused_by"] == "loop_guard"
    assert not a.core.coming_writes.any_recent(1e9)  # every call's mark cleared


async def test_grouped_commits_log_every_call_of_a_busy_loop(
    replicas: tuple[Replica, Replica],
) -> None:
    """With group commit on and the loop taken for saturated, concurrent calls share commits
    (on SQLite, where commits run on the loop), and every call is logged."""
    a, _ = replicas
    a.log.group_commits(a.core.coming_writes, 0.05)
    a.log._loop_lag_s = 1.0
    before = a.log._inline_commits
    uses = [use(f"g{i}", delay_ms=i % 5, echo=i) for i in range(40)]
    outcomes = await a.core.dispatch_many(uses, CTX)
    assert [kind(o.result) for o in outcomes] == ["ok"] * 40
    page = a.log.page_log(tool_name="sleep", tenant_id="t1", conversation_id="c1", limit=100)
    assert sorted(e.tool_use_id for e in page.entries) == sorted(u.id for u in uses)
    if a.log._loop_db is not None:
        assert 0 < a.log._inline_commits - before < 20
    assert not a.core.coming_writes.any_recent(1e9)


async def test_a_batch_of_many_distinct_calls_runs_and_is_logged(
    replicas: tuple[Replica, Replica],
) -> None:
    a, _ = replicas
    uses = [use(f"m{i}", echo=i) for i in range(MAX_BATCH_CALLS)]
    outcomes = await a.core.dispatch_many(uses, CTX)
    assert [kind(o.result) for o in outcomes] == ["ok"] * MAX_BATCH_CALLS
    page = a.log.page_log(tool_name="sleep", tenant_id="t1", conversation_id="c1", limit=2000)
    assert len(page.entries) == MAX_BATCH_CALLS


async def test_a_malformed_call_in_a_batch_fails_in_its_own_slot_and_the_others_run(
    replicas: tuple[Replica, Replica],
) -> None:
    """Before, one input that was not JSON failed the whole batch with INVALID_ARGUMENT naming
    `tool_use.input_json`: the valid calls never ran, and were not logged."""
    a, _ = replicas
    bad = pb.ToolUse(id="bad", name="sleep", input_json='{"echo": 3')
    nameless = pb.ToolUse(name="", input_json="{}")
    uses = [use("ok1", echo=1), bad, use("ok2", echo=2), nameless]
    outcomes = await a.core.dispatch_many(uses, CTX)
    kinds = [kind(o.result) for o in outcomes]
    assert kinds == ["ok", "input_not_json", "ok", "invalid_argument"]
    assert "tool_uses[1] (bad).input_json" in outcomes[1].result.envelope.err.message
    assert "tool_uses[3].name" in outcomes[3].result.envelope.err.message
    assert outcomes[1].tool_use_id == "bad" and outcomes[3].tool_use_id.startswith("toolu_")
    page = a.log.page_log(tool_name="", tenant_id="t1", conversation_id="c1", limit=100)
    logged = {e.tool_use_id: e.success for e in page.entries}
    assert logged["ok1"] and logged["ok2"]
    assert logged["bad"] is False and logged[outcomes[3].tool_use_id] is False


async def test_a_batch_over_the_limit_is_refused_before_anything_runs(
    replicas: tuple[Replica, Replica],
) -> None:
    a, _ = replicas
    uses = [use(f"x{i}", echo=i) for i in range(MAX_BATCH_CALLS + 1)]
    with pytest.raises(InvalidArgument) as refused:
        await a.core.dispatch_many(uses, CTX)
    assert refused.value.reason == "BATCH_TOO_LARGE"
    assert a.registry.started == {}


@pytest.mark.parametrize("batch", [False, True])
async def test_a_call_whose_caller_stops_waiting_is_still_logged_as_cancelled(
    replicas: tuple[Replica, Replica], batch: bool
) -> None:
    """gRPC cancels the handler when the caller's deadline passes or it cancels the call; the
    tool is stopped, and the call is logged with its events before the cancellation goes on."""
    a, _ = replicas
    ctx = pb.CallContext(tenant_id="t1", user_id="u1", conversation_id="gone")
    if batch:
        call = asyncio.create_task(a.core.dispatch_many([use("left", delay_ms=30_000)], ctx))
    else:
        call = asyncio.create_task(a.core.dispatch(use("left", delay_ms=30_000), ctx))
    await asyncio.wait_for(a.registry.started_event("left").wait(), 10)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert a.registry.cancelled == ["left"]  # the tool itself was stopped
    assert not a.core.coming_writes.any_recent(1e9)
    page = a.log.page_log(tool_name="sleep", tenant_id="t1", conversation_id="gone", limit=10)
    (entry,) = page.entries
    assert entry.tool_use_id == "left" and not entry.success
    assert entry.error is not None and "cancelled" in entry.error
    assert "stopped waiting" in entry.error
    for event_type in ("tool_call", "tool_result"):
        events = a.log.page_events(
            tenant_id="t1", conversation_id="gone", event_type=event_type, limit=10
        ).entries
        assert [e.tool_use_id for e in events] == ["left"], event_type
    (result,) = a.log.page_events(
        tenant_id="t1", conversation_id="gone", event_type="tool_result", limit=10
    ).entries
    assert "cancelled" in result.data_json
