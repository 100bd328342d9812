"""The dispatcher's guardrails with two replicas on one database, as two processes have it: each
replica its own engine (on SQLite, its own connections to the same WAL file), its own call log,
guardrail store and usage log, and calls arriving on both at once (asyncio.gather). The promise
under test (shared/ARCHITECTURE.md): conversation state lives in the database, so any replica
serves any call — rate limits count across replicas, the loop guard, failed approaches and
require_prior_tool see calls made through the other replica, a Cancel on one stops calls on
both, and the conversation budget overshoots by no more than the documented bound."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import Engine

from services.dispatcher import statestore
from services.dispatcher.core import Dispatcher
from services.dispatcher.guardrails import PolicyRule
from services.dispatcher.logstore import SqlCallLog
from services.dispatcher.statestore import SqlGuardrailStore
from shared import convert
from shared.contract import Ok, envelope_to_tool_result
from shared.costs import BudgetExceeded, CostAccount
from shared.db.engine import make_engine, session_factory
from shared.telemetry.usage import SqlUsageLog, UsageEntry
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb

CEILING = 1.0  # the conversation budget of the replicas, USD


@dataclass
class FakeRegistry:
    """`sleep` (delay_ms, fail, echo) and `spend` (charges `step` USD `steps` times, a usage_log
    row per charge, under the call's budget as the registry's CostAccount enforces it)."""

    usage: SqlUsageLog
    started: dict[str, asyncio.Event] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)
    limits: list[float] = field(default_factory=list)

    def started_event(self, tool_use_id: str) -> asyncio.Event:
        return self.started.setdefault(tool_use_id, asyncio.Event())

    async def execute(
        self, request: rpb.ExecuteToolRequest, timeout: float
    ) -> rpb.ExecuteToolResponse:
        inputs = json.loads(request.input_json)
        ctx = request.context
        self.started_event(ctx.tool_use_id).set()
        try:
            if request.name == "spend":
                return await self._spend(ctx, inputs)
            await asyncio.sleep(inputs.get("delay_ms", 0) / 1000)
        except asyncio.CancelledError:
            self.cancelled.append(ctx.tool_use_id)
            raise
        if inputs.get("fail"):
            return rpb.ExecuteToolResponse(
                result=convert.error_result_pb("asked to fail", "test_failure")
            )
        ok = envelope_to_tool_result(Ok(data={"echo": inputs.get("echo")}))
        return rpb.ExecuteToolResponse(result=convert.tool_result_to_pb(ok))

    async def _spend(self, ctx: pb.CallContext, inputs: dict[str, Any]) -> rpb.ExecuteToolResponse:
        limit = ctx.budget.limit_usd or None
        if limit is not None:
            self.limits.append(limit)
        account = CostAccount(limit=limit, spent_before=ctx.budget.spent_usd)
        for _ in range(int(inputs["steps"])):
            await asyncio.sleep(0.02)
            step = float(inputs["step"])
            entry = UsageEntry(
                ctx.tenant_id, "spend", "tool", step, ctx.user_id, ctx.conversation_id
            )
            await asyncio.to_thread(self.usage.record, entry)
            try:
                account.charge_leaf(step, "spend")
            except BudgetExceeded as exc:
                return rpb.ExecuteToolResponse(
                    result=convert.error_result_pb(str(exc), "budget_exceeded")
                )
        ok = envelope_to_tool_result(Ok(data={"spent": account.total}))
        return rpb.ExecuteToolResponse(result=convert.tool_result_to_pb(ok))

    async def tool_timeout(self, name: str, tenant_id: str) -> float | None:
        return None


@dataclass
class Replica:
    core: Dispatcher
    registry: FakeRegistry
    log: SqlCallLog
    store: SqlGuardrailStore
    usage: SqlUsageLog
    engine: Engine
    clock: list[float]  # the replica's wall clock, settable by a test


@pytest.fixture
async def make_replicas(database_url: str) -> AsyncIterator[Callable[[int], list[Replica]]]:
    made: list[Replica] = []

    def make(n: int = 2) -> list[Replica]:
        for _ in range(n):
            engine = make_engine(database_url)  # one per replica: a process of its own
            sessions = session_factory(engine)
            usage = SqlUsageLog(sessions)
            registry = FakeRegistry(usage)
            log = SqlCallLog(sessions)
            store = SqlGuardrailStore(engine)
            clock = [time.time()]
            core = Dispatcher(
                registry,
                log,
                store,
                poll_interval_s=0.05,
                usage=usage,
                conversation_budget_usd=CEILING,
                wall_clock=lambda c=clock: c[0],  # type: ignore[misc]
            )
            made.append(Replica(core, registry, log, store, usage, engine, clock))
        return made[-n:]

    yield make
    for r in made:
        await r.core.close()
        await asyncio.to_thread(r.log.close)
        r.engine.dispose()


@pytest.fixture
def replicas(make_replicas: Callable[[int], list[Replica]]) -> tuple[Replica, Replica]:
    a, b = make_replicas(2)
    return a, b


def ctx(conversation: str = "c1", user: str = "u1") -> pb.CallContext:
    return pb.CallContext(tenant_id="t1", user_id=user, conversation_id=conversation)


def use(tool_use_id: str = "", name: str = "sleep", **inputs: Any) -> pb.ToolUse:
    return pb.ToolUse(id=tool_use_id, name=name, input_json=json.dumps(inputs))


def kind(result: pb.ToolResult) -> str:
    env = result.envelope
    return env.err.err_kind if env.WhichOneof("kind") == "err" else str(env.WhichOneof("kind"))


def rate_rule(tool: str, max_calls: int, window_s: int) -> PolicyRule:
    return PolicyRule(
        0,
        "t1",
        f"rate-{tool}",
        "rate_limit",
        tool,
        "blocking",
        {"max_calls": max_calls, "window_seconds": window_s},
    )


# --- rate limits --------------------------------------------------------------------------------


async def test_a_rate_limit_allows_exactly_max_calls_across_replicas_under_a_race(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    await a.core.add_rule(rate_rule("sleep", 7, 3600))
    for r in replicas:
        r.clock[0] = 3600 * 500_000 + 10.0  # well inside one window on both replicas
    calls = [
        (a, b)[i % 2].core.dispatch(use(f"r{i}", echo=i), ctx(f"conv{i}", f"user{i % 3}"))
        for i in range(40)
    ]
    outcomes = await asyncio.gather(*calls)
    kinds = [kind(o.result) for o in outcomes]
    assert kinds.count("ok") == 7
    assert kinds.count("policy_violation") == 33


async def test_at_a_window_boundary_each_window_allows_max_calls_across_replicas(
    replicas: tuple[Replica, Replica],
) -> None:
    """Fixed windows: calls racing across the boundary count in the window their replica's
    clock is in, at most max_calls in each (here the replicas' clocks straddle it)."""
    a, b = replicas
    await a.core.add_rule(rate_rule("sleep", 5, 60))
    boundary = 60.0 * 30_000_000
    a.clock[0], b.clock[0] = boundary - 0.001, boundary
    outcomes = await asyncio.gather(
        *((a, b)[i % 2].core.dispatch(use(f"w{i}", echo=i), ctx(f"conv{i}")) for i in range(24))
    )
    ok_on = {"a": 0, "b": 0}
    for i, outcome in enumerate(outcomes):
        if kind(outcome.result) == "ok":
            ok_on["ab"[i % 2]] += 1
    assert ok_on == {"a": 5, "b": 5}


async def test_a_prune_for_one_rule_never_resets_another_rules_current_window(
    replicas: tuple[Replica, Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a call under a short-window rule (1 s) sometimes deleted every counter older
    than two of ITS windows — the current hour of a 3600-s rule included — so that rule let
    max_calls more through, on any replica."""
    a, b = replicas
    await a.core.add_rule(rate_rule("sleep", 3, 3600))
    await a.core.add_rule(rate_rule("fast", 1000, 1))
    for r in replicas:
        r.clock[0] = 3600 * 400_000 + 1800.0  # half-way through the hour
    for i in range(3):
        assert kind((await a.core.dispatch(use(f"s{i}", echo=i), ctx())).result) == "ok"
    monkeypatch.setattr(statestore, "PRUNE_PROBABILITY", 1.0)
    await b.core.dispatch(use("f", name="fast", echo=0), ctx())  # prunes (always, here)
    over = await b.core.dispatch(use("s3", echo=3), ctx())
    assert kind(over.result) == "policy_violation"


async def test_a_prune_still_deletes_a_rules_windows_long_past(
    replicas: tuple[Replica, Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = replicas
    rule = await a.core.add_rule(rate_rule("sleep", 5, 60))
    a.clock[0] = 60.0 * 1_000_000
    await a.core.dispatch(use("old", echo=0), ctx())
    monkeypatch.setattr(statestore, "PRUNE_PROBABILITY", 1.0)
    a.clock[0] += 3600
    await a.core.dispatch(use("new", echo=1), ctx())
    with a.engine.connect() as conn:
        windows = conn.exec_driver_sql(
            "SELECT window_start FROM rate_limit_counters WHERE rule_id = " + str(rule.id)
        ).all()
    assert [w for (w,) in windows] == [int(a.clock[0] // 60 * 60)]


# --- loop guard, failed approaches, require_prior_tool ------------------------------------------


async def test_the_loop_guard_and_failure_hint_count_calls_answered_by_the_other_replica(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    # Other conversations keep both replicas busy meanwhile.
    noise = asyncio.gather(
        *(
            (a, b)[i % 2].core.dispatch(use(f"n{i}", delay_ms=5, echo=i), ctx(f"other{i}"))
            for i in range(30)
        )
    )
    kinds, warnings = [], []
    for i in range(5):
        outcome = await (a, b)[i % 2].core.dispatch(
            use(f"l{i}", fail=True, reasoning=str(i)), ctx()
        )
        kinds.append(kind(outcome.result))
        warnings.append(len(outcome.warnings))
    await noise
    assert kinds == ["test_failure"] * 3 + ["loop_guard"] * 2
    assert warnings[:3] == [0, 0, 1]


async def test_require_prior_tool_sees_the_prior_tool_run_on_the_other_replica(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    rule = PolicyRule(
        0, "t1", "describe-first", "require_prior_tool", "sleep", "blocking", {"prior_tool": "fast"}
    )
    await a.core.add_rule(rule)
    await b.core.add_rule(rule)  # b's rule cache sees it at once (else within its TTL)
    first = await b.core.dispatch(use("q0", echo=0), ctx())
    assert kind(first.result) == "policy_violation"
    assert kind((await a.core.dispatch(use("d", name="fast", echo=1), ctx())).result) == "ok"
    outcomes = await asyncio.gather(
        *((a, b)[i % 2].core.dispatch(use(f"q{i + 1}", echo=i), ctx()) for i in range(6))
    )
    assert [kind(o.result) for o in outcomes] == ["ok"] * 6


# --- cancellation -------------------------------------------------------------------------------


async def test_a_cancel_stops_every_call_in_flight_on_both_replicas(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    tasks = [
        asyncio.create_task(
            (a, b)[i % 2].core.dispatch(use(f"k{i}", delay_ms=30_000, echo=i), ctx())
        )
        for i in range(10)
    ]
    for i in range(10):
        await asyncio.wait_for((a, b)[i % 2].registry.started_event(f"k{i}").wait(), 10)
    # A cancel on each replica at once, and new calls racing them.
    racing = [
        asyncio.create_task((a, b)[i % 2].core.dispatch(use(f"x{i}", echo=i), ctx()))
        for i in range(6)
    ]
    cancels = await asyncio.gather(a.core.cancel("t1", "c1"), b.core.cancel("t1", "c1"))
    # Uncancelled, each call would run 30 s; the watchers poll every 0.1 s. No tighter bound
    # than this: a timing assertion fails on a loaded machine, and proves nothing more.
    outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert [kind(o.result) for o in outcomes] == ["cancelled"] * 10
    assert sorted(a.registry.cancelled + b.registry.cancelled) == sorted(f"k{i}" for i in range(10))
    assert all(c.known_conversation for c in cancels)
    # A racing call either ran to completion or was cancelled: none hangs.
    raced = await asyncio.wait_for(asyncio.gather(*racing), 5)
    assert {kind(o.result) for o in raced} <= {"ok", "cancelled"}
    after = await b.core.dispatch(use("after", delay_ms=150, echo=1), ctx())
    assert kind(after.result) == "ok"


# --- the conversation budget ----------------------------------------------------------------------


async def test_a_conversation_over_budget_is_refused_on_every_replica(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    spent = await a.core.dispatch(use("s0", name="spend", step=0.3, steps=4), ctx())
    assert kind(spent.result) == "budget_exceeded"  # the 4th charge crossed 1.0
    refused = await asyncio.gather(
        *(
            (a, b)[i % 2].core.dispatch(
                use(f"s{i + 1}", name="spend", step=0.1, steps=1, n=i), ctx()
            )  # told apart (`n`), or the 4th would be the loop guard's
            for i in range(4)
        )
    )
    assert [kind(o.result) for o in refused] == ["budget_exceeded"] * 4
    assert b.registry.limits == [] and a.registry.limits == [1.0]


async def test_concurrent_costly_calls_overshoot_the_ceiling_by_at_most_the_documented_bound(
    replicas: tuple[Replica, Replica],
) -> None:
    """k calls of one conversation running at once, on any replicas, may each spend what was
    left when it started, plus the charge that crossed its own limit: the conversation ends
    at most (k - 1) × that remainder (+ each call's last charge) over its ceiling."""
    a, b = replicas
    await a.core.dispatch(use("pre", name="spend", step=0.4, steps=1), ctx())
    left = CEILING - 0.4
    k, step = 6, 0.07
    outcomes = await asyncio.gather(
        *(
            (a, b)[i % 2].core.dispatch(use(f"p{i}", name="spend", step=step, steps=40), ctx())
            for i in range(k)
        )
    )
    assert [kind(o.result) for o in outcomes] == ["budget_exceeded"] * k
    # Each call that ran got at most what was left when it started (a call that started after
    # the others had spent it all was refused before running), and spent at most that plus the
    # charge that crossed it.
    limits = a.registry.limits[1:] + b.registry.limits
    assert 2 <= len(limits) <= k and all(limit <= left + 1e-9 for limit in limits)
    total = a.usage.conversation_spent("t1", "c1")
    assert total <= 0.4 + sum(limits) + len(limits) * step + 1e-9
    assert total <= CEILING + (k - 1) * left + k * step + 1e-9
    if sorted(limits)[-2] == pytest.approx(left):  # two started together (the usual case)
        assert total > CEILING + left / 2  # so it does overshoot: by more than one call's share
