"""The dispatcher's domain core: the dispatch path of one call and of a batch — validation,
args_hash, the guardrails (policy rules, loop guard, failed approaches), execution through the
registry raced against cancellation and a per-tool timeout, and durable logging of the call,
its `decision` / `outcome` / `policy_violation` events and the guardrail state it changes.

Imports no grpc: the registry is reached through the RegistryGateway seam and the guardrail
state through the GuardrailStore seam."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry import context as otel_context
from opentelemetry import trace

from services.dispatcher.cancellation import InflightCall, InflightCalls
from services.dispatcher.effects import CallEffects, EffectsStore, ResultEffects
from services.dispatcher.guardrails import (
    LOOP_GUARD_THRESHOLD,
    NARRATION_KEYS,
    CallFacts,
    Check,
    FailedApproach,
    LoopState,
    PolicyDecision,
    PolicyRule,
    RecentLoops,
    args_hash,
    call_hashes,
    check_policies,
    escalate,
    loop_guard_message,
    record_failed_approach,
    refusal_message,
    repeat_failure_hint,
    validate_rule,
)
from services.dispatcher.logstore import (
    CallLog,
    CallRecord,
    ComingWrites,
    StateWrite,
    summarize,
)
from services.dispatcher.statestore import (
    FailedApproachWrite,
    GuardrailStore,
    LoopStateWrite,
    ObservationWrite,
    Snapshot,
    rate_rules,
)
from shared import convert
from shared.config import DEFAULT_DB_WAIT_S
from shared.contract.effects import DisplayHandle, Effect
from shared.contract.effects_cards import finalize_turn_cards
from shared.db.engine import bounded_db_wait, db_thread
from shared.errors import DeadlineExceeded, InvalidArgument, ToolmeshError
from shared.lru import ExpiringCache
from shared.telemetry.tracing import current_trace_id, span_attributes, with_call_baggage
from shared.telemetry.usage import UsageLog
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb

__all__ = ["NARRATION_KEYS", "DispatchOutcome", "Dispatcher", "RegistryGateway", "args_hash"]

T = TypeVar("T")
logger = logging.getLogger(__name__)

RULE_CACHE_TTL_S = 2.0
TEXT_CHUNK = 1024  # characters per text_delta chunk of a streamed result
TOOL_TIMEOUT_CACHE_TTL_S = 30.0
# (tenant, tool) pairs whose timeouts are cached (the oldest go first past it).
MAX_CACHED_TIMEOUTS = 4096
# How much of a rejected call's raw input its log row and events keep.
REJECTED_INPUT_CHARS = 64 * 1024
# Registered tool names match [a-zA-Z0-9_-]{1,64} (services/registry/model.py).
MAX_TOOL_NAME_CHARS = 64
MAX_CAPABILITIES = 256
# The calls of one DispatchToolCalls (one assistant turn): they run concurrently, so a batch is
# bounded like an input is; a model emits a handful.
MAX_BATCH_CALLS = 1024
# How long a call's response answers a retry of it (same tool_use id, tool and input in the
# conversation); 0 turns replay off.
DEFAULT_REPLAY_WINDOW_S = 24 * 3600.0


def new_tool_use_id() -> str:
    """An id for a call that came without one, shaped like the Messages API's (toolu_ and 24
    hex digits: 96 random bits; os.urandom directly, a quarter of uuid4's cost)."""
    return f"toolu_{os.urandom(12).hex()}"


class RegistryGateway(Protocol):
    """Executes a tool in the registry (over gRPC in the service, in-process in unit tests)."""

    async def execute(
        self, request: rpb.ExecuteToolRequest, timeout: float
    ) -> rpb.ExecuteToolResponse: ...

    async def tool_timeout(self, name: str, tenant_id: str) -> float | None:
        """The tool's own timeout_seconds, None when it has none."""
        ...


class StreamingRegistryGateway(RegistryGateway, Protocol):
    """A gateway that can also run a tool while relaying its progress (ExecuteToolStream)."""

    async def execute_stream(
        self,
        request: rpb.ExecuteToolRequest,
        timeout: float,
        on_progress: Callable[[Mapping[str, Any]], None],
    ) -> rpb.ExecuteToolResponse: ...


@dataclass
class DispatchOutcome:
    result: pb.ToolResult
    duration_ms: float
    args_hash: str
    tool_use_id: str
    warnings: list[str] = field(default_factory=list)
    # The call's effects in emission order (what replay re-applies).
    effects: list[Effect] = field(default_factory=list)
    # The response of an earlier call with this tool_use id, tool and input (a retry).
    replayed: bool = False
    # The call was answered (not cancelled, no RPC error): a retry of it gets this response.
    final: bool = False

    def to_pb(self) -> dpb.DispatchToolCallResponse:
        return dpb.DispatchToolCallResponse(
            result=self.result,
            duration_ms=self.duration_ms,
            warnings=self.warnings,
            args_hash=self.args_hash,
            tool_use_id=self.tool_use_id,
            replayed=self.replayed,
        )

    def replay(self) -> DispatchOutcome:
        """This outcome as the answer to a retry of its call (a copy)."""
        return DispatchOutcome.answering(self.to_pb())

    @classmethod
    def from_stored(cls, response: bytes) -> DispatchOutcome:
        """A logged response, as the answer to a retry (DecodeError if it is not one)."""
        return cls.answering(dpb.DispatchToolCallResponse.FromString(response))

    @classmethod
    def answering(cls, response: dpb.DispatchToolCallResponse) -> DispatchOutcome:
        """`response` (the outcome's own, no one else's) as the answer to a retry."""
        return cls(
            result=response.result,
            duration_ms=response.duration_ms,
            args_hash=response.args_hash,
            tool_use_id=response.tool_use_id,
            warnings=list(response.warnings),
            replayed=True,
            final=True,
        )


# (tenant_id, conversation_id, tool_use_id) of a call the client named.
AnswerKey = tuple[str, str, str]


@dataclass
class _Answering:
    """A named call being answered on this replica: a retry of it that comes meanwhile waits
    for its outcome instead of running the tool a second time."""

    tool_name: str
    args_hash: str
    outcome: asyncio.Future[DispatchOutcome]

    def serves(self, tool_name: str, hashed: str) -> bool:
        """Whether a call of `tool_name` with input `hashed` is this one (a retry of it)."""
        return (self.tool_name, self.args_hash) == (tool_name, hashed)


def finalize_turn(outcomes: Sequence[DispatchOutcome]) -> None:
    """Cards at the end of a response (one assistant turn): a singleton card type kept once,
    in the result where it last appeared; maps of one display_id merged there."""
    if sum(1 for o in outcomes if o.result.cards) < 2:
        return  # each result's cards were finalised when it was dispatched
    groups = [[json_format.MessageToDict(c) for c in o.result.cards] for o in outcomes]
    for outcome, cards in zip(outcomes, finalize_turn_cards(groups), strict=True):
        del outcome.result.cards[:]
        for card in cards:
            outcome.result.cards.add().update(card)


@dataclass(frozen=True)
class CancelOutcome:
    cancelled_tool_use_ids: list[str]
    known_conversation: bool
    cancel_epoch: int
    message: str


def _kind_of_error(error: ToolmeshError) -> str:
    return error.reason.lower() if error.reason else error.code.lower()


def _error_text(error: ToolmeshError) -> str:
    return f"{error.code}: {error.message}"


def _rpc_error_result(
    tool_name: str, tool_use_id: str, error: ToolmeshError, elapsed_ms: float
) -> dict[str, Any]:
    """The `tool_result` event of a call that failed at the RPC level."""
    return {
        "tool_name": tool_name,
        "tool_use_id": tool_use_id,
        "content": "",
        "envelope": "rpc_error",
        "error": _error_text(error),
        "status": error.code,
        "reason": error.reason,
        "duration_ms": elapsed_ms,
    }


def _context_record(context: pb.CallContext, fx: CallEffects, **fields: Any) -> CallRecord:
    """The record of a call that ran no tool (refused before it ran, or a retry answered from
    the log), its ids from `context` and its events from `fx`."""
    return CallRecord(
        tenant_id=context.tenant_id,
        user_id=context.user_id,
        conversation_id=context.conversation_id,
        execution_ms=0.0,
        trace_id=current_trace_id(),
        events=list(fx.events),
        model=context.model,
        **fields,
    )


def _within(created_at: datetime | None, now_s: float, window_s: float) -> bool:
    """Whether a row written at `created_at` (UTC; naive as SQLite returns it) is at most
    `window_s` old at `now_s`."""
    if created_at is None:
        return False
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    return now_s - created_at.timestamp() <= window_s


def _outcome(
    tool_name: str,
    tool_use_id: str,
    status: str,
    elapsed_ms: float,
    attempts: int,
    warnings: list[str],
    err_kind: str = "",
) -> dict[str, Any]:
    """The `outcome` event of a call."""
    return {
        "tool_name": tool_name,
        "tool_use_id": tool_use_id,
        "status": status,
        "err_kind": err_kind,
        "duration_ms": elapsed_ms,
        "failed_attempts": attempts,
        "warnings": warnings,
    }


class RuleCache:
    """Enabled policy rules, re-read at most every `ttl_s` (and at once after a change made
    through this replica), so a call with no rule changes costs no database round trip."""

    def __init__(
        self,
        store: GuardrailStore,
        ttl_s: float = RULE_CACHE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        db_wait_s: float = DEFAULT_DB_WAIT_S,
    ) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self._clock = clock
        self._db_wait_s = db_wait_s
        self._expires = float("-inf")
        self._by_tenant: dict[str, list[PolicyRule]] = {}
        self._rules: list[PolicyRule] = []
        self._lock = asyncio.Lock()

    def invalidate(self) -> None:
        self._expires = float("-inf")

    async def for_tenant(self, tenant_id: str) -> list[PolicyRule]:
        if self._clock() >= self._expires:
            async with self._lock:
                if self._clock() >= self._expires:
                    rules = await db_thread(
                        self._db_wait_s,
                        "a query of the policy rules",
                        self._store.list_rules,
                        "",
                        False,
                    )
                    self._rules = rules
                    self._by_tenant = {}
                    self._expires = self._clock() + self._ttl_s
        cached = self._by_tenant.get(tenant_id)
        if cached is None:
            cached = [r for r in self._rules if r.tenant_id in ("*", tenant_id)]
            self._by_tenant[tenant_id] = cached
        return cached


class ToolTimeouts:
    """Per-tool timeouts from the registry's definitions (GetTool), cached for `ttl_s`; the
    default when a tool sets none or cannot be looked up.

    An ExpiringCache of at most `max_entries`: keyed by (tenant, tool name) as callers send
    them, unknown names included, an unbounded one kept every pair it ever saw."""

    def __init__(
        self,
        registry: RegistryGateway,
        default_s: float,
        ttl_s: float = TOOL_TIMEOUT_CACHE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = MAX_CACHED_TIMEOUTS,
    ) -> None:
        self._registry = registry
        self._default_s = default_s
        self._clock = clock
        # (tenant, tool) -> timeout
        self._cache: ExpiringCache[tuple[str, str], float] = ExpiringCache(
            ttl_s, max(1, max_entries)
        )

    def __len__(self) -> int:
        return len(self._cache)

    def cached(self, name: str, tenant_id: str) -> float | None:
        return self._cache.get((tenant_id, name), self._clock())

    async def get(self, name: str, tenant_id: str) -> float:
        key = (tenant_id, name)
        now = self._clock()
        hit = self._cache.get(key, now)
        if hit is not None:
            return hit
        try:
            own = await self._registry.tool_timeout(name, tenant_id)
        except ToolmeshError:
            own = None  # unknown tool or registry trouble: ExecuteTool reports it properly
        value = own if own is not None and own > 0 else self._default_s
        self._cache.put(key, value, now)
        return value


@dataclass
class _Plan:
    """One call after its guardrails were evaluated, ready to run (or to be refused)."""

    tool_use: pb.ToolUse
    inputs: dict[str, Any]
    ctx: pb.CallContext
    args_hash: str
    identity: str
    loop: LoopState
    decision: PolicyDecision
    start_epoch: int
    timeout_s: float
    refusal: tuple[str, str] | None = None  # (err_kind, message)
    warnings: list[str] = field(default_factory=list)
    fx: CallEffects = field(default_factory=CallEffects)
    writes: list[StateWrite] = field(default_factory=list)
    # Set by a streaming caller: resolving it stops the call (the client went away).
    stop: asyncio.Future[str] | None = None
    log_token: int = 0  # its mark in Dispatcher.coming_writes while it runs
    # Named by the client (tool_use id, conversation): its response is logged for a retry.
    replayable: bool = False

    @property
    def tool_use_id(self) -> str:
        return self.ctx.tool_use_id


class Dispatcher:
    def __init__(
        self,
        registry: RegistryGateway,
        log: CallLog,
        store: GuardrailStore,
        *,
        timeout_s: float = 300.0,
        max_input_bytes: int = 4 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rule_cache_ttl_s: float = RULE_CACHE_TTL_S,
        poll_interval_s: float = 0.1,
        store_threads: int = 2,
        usage: UsageLog | None = None,
        conversation_budget_usd: float = 0.0,
        data_dir: Path | None = None,
        effects_store: EffectsStore | None = None,
        db_wait_s: float = DEFAULT_DB_WAIT_S,
        replay_window_s: float = DEFAULT_REPLAY_WINDOW_S,
    ) -> None:
        """`db_wait_s`: how long a call waits for one of the guardrail store's operations
        before it answers UNAVAILABLE (shared.db.engine.bounded_db_wait). `replay_window_s`:
        how long a call's response answers a retry of it (0: a retry runs again)."""
        self._registry = registry
        self._replay_window_s = replay_window_s
        self._answering: dict[AnswerKey, _Answering] = {}
        self._db_wait_s = db_wait_s
        self._usage = usage
        self._conversation_budget_usd = conversation_budget_usd
        self._log = log
        self._store = store
        self._timeout_s = timeout_s
        self._max_input_bytes = max_input_bytes
        self._clock = clock
        self._wall_clock = wall_clock
        self._rules = RuleCache(store, rule_cache_ttl_s, clock, db_wait_s)
        self._recent_loops = RecentLoops()
        self._timeouts = ToolTimeouts(registry, timeout_s, clock=clock)
        self._store_pool = ThreadPoolExecutor(store_threads, thread_name_prefix="guardrail-store")
        self._inflight = InflightCalls(self._read_epochs, poll_interval_s=poll_interval_s)
        self._poll_interval_s = poll_interval_s
        self._effects = ResultEffects((data_dir or Path(".toolmesh")).resolve(), effects_store)
        # Calls running toward their log write (a call log may group its commits by them).
        self.coming_writes = ComingWrites(clock)

    async def _run_store(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking store call on the store's few threads (a handful of threads keep the
        connection pool and the GIL uncontended under load; measured: at 32 calls in flight,
        the default executor's threads cost about twice the CPU per read), waiting for it at
        most `db_wait_s`."""
        operation = asyncio.get_running_loop().run_in_executor(self._store_pool, fn, *args)
        what = f"a {getattr(fn, '__name__', 'guardrail store')} query"
        return await bounded_db_wait(operation, self._db_wait_s, what)

    async def _read_epochs(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
        return await self._run_store(self._store.cancel_epochs, keys)

    async def close(self) -> None:
        await self._inflight.close()
        self._store_pool.shutdown(wait=False)

    # --- input ------------------------------------------------------------------------------

    def parse_input(self, tool_use: pb.ToolUse) -> dict[str, Any]:
        if not tool_use.name:
            raise InvalidArgument(
                "tool_use.name is required", field_violations=[("tool_use.name", "empty")]
            )
        if convert.has_control(tool_use.name):
            raise InvalidArgument(
                f"tool_use.name {convert.printable(tool_use.name)!r} holds control characters; "
                f"a tool name matches [a-zA-Z0-9_-]{{1,{MAX_TOOL_NAME_CHARS}}}",
                reason="NAME_INVALID",
                field_violations=[("tool_use.name", "control characters")],
            )
        if len(tool_use.name) > MAX_TOOL_NAME_CHARS:
            raise InvalidArgument(
                f"tool_use.name is {len(tool_use.name)} characters; a tool name is at most "
                f"{MAX_TOOL_NAME_CHARS} ([a-zA-Z0-9_-]{{1,{MAX_TOOL_NAME_CHARS}}})",
                reason="NAME_TOO_LONG",
                field_violations=[("tool_use.name", "too long")],
            )
        size = len(tool_use.input_json.encode("utf-8"))
        if size > self._max_input_bytes:
            raise InvalidArgument(
                f"tool_use.input_json is {size} bytes, over the {self._max_input_bytes}-byte limit",
                reason="INPUT_TOO_LARGE",
                field_violations=[("tool_use.input_json", "too large")],
            )
        return convert.parse_json_object(tool_use.input_json, "tool_use.input_json")

    @staticmethod
    def check_identifiers(context: pb.CallContext, tool_uses: Sequence[pb.ToolUse]) -> None:
        """Identifiers that go into the log's columns (128 characters each, in every database:
        PostgreSQL refuses a longer value, so the call could not be logged) and capabilities
        within bounds: INVALID_ARGUMENT naming the field otherwise. Checked before anything
        else, so nothing is logged for such a request."""
        fields = convert.context_ids(context)
        fields += [
            ("tool_use.id" if len(tool_uses) == 1 else f"tool_uses[{i}].id", tu.id)
            for i, tu in enumerate(tool_uses)
        ]
        convert.check_ids(fields)
        caps = context.capabilities
        if len(caps) > MAX_CAPABILITIES or any(len(c) > convert.MAX_ID_CHARS for c in caps):
            raise InvalidArgument(
                f"context.capabilities holds {len(caps)} entries; at most {MAX_CAPABILITIES} "
                f"of at most {convert.MAX_ID_CHARS} characters each",
                reason="CAPABILITIES_TOO_LARGE",
                field_violations=[("context.capabilities", "too many or too long")],
            )
        if context.HasField("budget"):
            budget = context.budget
            for name, value in (("limit_usd", budget.limit_usd), ("spent_usd", budget.spent_usd)):
                if not 0 <= value < math.inf:  # NaN compares false: it disabled the budget
                    raise InvalidArgument(
                        f"context.budget.{name} must be a finite number of USD, 0 or more "
                        f"(got {value!r})",
                        reason="BUDGET_INVALID",
                        field_violations=[(f"context.budget.{name}", "not a finite amount >= 0")],
                    )

    # --- dispatch ---------------------------------------------------------------------------

    async def dispatch(
        self,
        tool_use: pb.ToolUse,
        context: pb.CallContext,
        *,
        display: DisplayHandle | None = None,
        stop: asyncio.Future[str] | None = None,
    ) -> DispatchOutcome:
        """Dispatch one call. RPC-level errors (unknown tool, bad input, registry down) are
        logged and re-raised; tool failures and guardrail refusals come back as Err results.
        With a `display`, the call's progress, cards, text and export notices are streamed to
        it as they happen; resolving `stop` cancels the call like Cancel does."""
        self.check_identifiers(context, [tool_use])
        try:
            inputs = self.parse_input(tool_use)
        except InvalidArgument as error:
            await self._log_rejected(tool_use, context, error)
            raise
        return await self._dispatch_parsed(
            tool_use, inputs, context, display=display, stop=stop, raise_rpc_errors=True
        )

    # --- retries: a call the client named is answered once ----------------------------------

    def _answer_key(self, context: pb.CallContext, tool_use: pb.ToolUse) -> AnswerKey | None:
        """The key under which a call is answered once: a call the client named by its
        tool_use id, in a conversation (replay on)."""
        if not tool_use.id or not context.conversation_id or self._replay_window_s <= 0:
            return None
        return (context.tenant_id, context.conversation_id, tool_use.id)

    async def _running_answer(
        self, key: AnswerKey, tool_name: str, hashed: str
    ) -> DispatchOutcome | None:
        """The outcome of the same call running on this replica under `key` (waited for), as
        the answer to this retry of it; None when no such call runs, or the one that ran was
        not answered (an RPC error, cancelled): then this call runs."""
        while (running := self._answering.get(key)) is not None:
            if not running.serves(tool_name, hashed):
                return None  # another call under a reused id: it runs on its own
            await asyncio.wait({running.outcome})
            if not running.outcome.cancelled():
                return running.outcome.result().replay()
        return None

    def _begin_answering(self, key: AnswerKey, tool_name: str, hashed: str) -> _Answering | None:
        """Mark the call as being answered under `key` (None when another call holds it)."""
        if key in self._answering:
            return None
        answering = _Answering(tool_name, hashed, asyncio.get_running_loop().create_future())
        self._answering[key] = answering
        return answering

    def _end_answering(
        self, key: AnswerKey, answering: _Answering, outcome: DispatchOutcome | None
    ) -> None:
        """Release `key`, handing the outcome to retries that waited (or, when the call was
        not answered, letting the first of them run)."""
        if self._answering.get(key) is answering:
            del self._answering[key]
        if answering.outcome.done():
            return
        if outcome is not None and outcome.final:
            answering.outcome.set_result(outcome.replay())
        else:
            answering.outcome.cancel()

    async def _record_replay(
        self, context: pb.CallContext, tool_use: pb.ToolUse, outcome: DispatchOutcome
    ) -> DispatchOutcome:
        """A retry answered with an earlier call's response: said on the span, in the service
        log and by a `replayed` event in the conversation's events (no log row: no tool ran)."""
        trace.get_current_span().set_attributes(
            {"toolmesh.replayed": True, "gen_ai.tool.call.id": outcome.tool_use_id}
        )
        logger.info(
            "tool_use %s answered with its earlier response (a retry): the tool did not run again",
            outcome.tool_use_id,
        )
        fx = CallEffects()
        fx.event(
            "replayed",
            {
                "tool_name": tool_use.name,
                "tool_use_id": outcome.tool_use_id,
                "args_hash": outcome.args_hash,
                "envelope": convert.envelope_kind(outcome.result),
                "answered_in_ms": outcome.duration_ms,
                "user_id": context.user_id,
            },
            outcome.tool_use_id,
        )
        record = _context_record(
            context,
            fx,
            tool_name=tool_use.name,
            tool_use_id=outcome.tool_use_id,
            args_hash=outcome.args_hash,
            input_data=None,
            output_summary="",
            success=True,
            error=None,
            log_row=False,
        )
        await self._write_best_effort(record, f"the replay of {outcome.tool_use_id}")
        return outcome

    async def _write_best_effort(self, record: CallRecord, what: str) -> None:
        """Log a record whose caller gets its answer whatever becomes of the write."""
        try:
            await self._log.write(record)
        except ToolmeshError as exc:
            logger.warning("%s could not be logged: %s", what, exc.message)

    async def _dispatch_parsed(
        self,
        tool_use: pb.ToolUse,
        inputs: dict[str, Any],
        context: pb.CallContext,
        *,
        display: DisplayHandle | None = None,
        stop: asyncio.Future[str] | None = None,
        raise_rpc_errors: bool,
    ) -> DispatchOutcome:
        """Dispatch one call whose input was taken; a retry of a call answered before (on
        any replica, within the replay window) or running on this replica gets its response."""
        key = self._answer_key(context, tool_use)
        hashes = call_hashes(tool_use.name, inputs)
        answering: _Answering | None = None
        if key is not None:
            earlier = await self._running_answer(key, tool_use.name, hashes[0])
            if earlier is not None:
                return await self._record_replay(context, tool_use, earlier)
            answering = self._begin_answering(key, tool_use.name, hashes[0])
        outcome: DispatchOutcome | None = None
        try:
            approaches: dict[tuple[str, str], FailedApproach] = {}
            (planned,) = await self._plan(
                context,
                [(tool_use, inputs)],
                [hashes],
                approaches,
                display,
                [answering is not None],
            )
            if isinstance(planned, DispatchOutcome):
                outcome = await self._record_replay(context, tool_use, planned)
            else:
                planned.stop = stop
                outcome = await self._run(planned, approaches, raise_rpc_errors=raise_rpc_errors)
            return outcome
        finally:
            if key is not None and answering is not None:
                self._end_answering(key, answering, outcome)

    async def dispatch_many(
        self, tool_uses: Sequence[pb.ToolUse], context: pb.CallContext
    ) -> list[DispatchOutcome]:
        """The calls of one assistant turn: guardrails evaluated in input order, then the calls
        run concurrently; results in input order. A call that fails at the RPC level gets an Err
        result in its own slot."""
        if len(tool_uses) > MAX_BATCH_CALLS:
            raise InvalidArgument(
                f"{len(tool_uses)} tool_uses in one batch; at most {MAX_BATCH_CALLS} run together "
                "(send the rest in further batches)",
                reason="BATCH_TOO_LARGE",
                field_violations=[("tool_uses", "too many")],
            )
        self.check_identifiers(context, tool_uses)
        seen: set[str] = set()
        for i, tu in enumerate(tool_uses):
            if tu.id and tu.id in seen:
                raise InvalidArgument(
                    f"duplicate tool_use id {tu.id!r}",
                    reason="DUPLICATE_TOOL_USE_ID",
                    field_violations=[(f"tool_uses[{i}].id", "duplicate")],
                )
            seen.add(tu.id)
        # A call whose input cannot be taken (not JSON, too large, no name) is logged and
        # answered with an Err in its own slot; the others run.
        valid: list[tuple[pb.ToolUse, dict[str, Any]]] = []
        rejected: dict[int, DispatchOutcome] = {}
        for i, tu in enumerate(tool_uses):
            try:
                valid.append((tu, self.parse_input(tu)))
            except InvalidArgument as error:
                tool_use_id = await self._log_rejected(tu, context, error)
                where = f"tool_uses[{i}]" + (f" ({tu.id})" if tu.id else "")
                message = error.message.replace("tool_use.", f"{where}.", 1)
                rejected[i] = DispatchOutcome(
                    result=convert.error_result_pb(message, _kind_of_error(error)),
                    duration_ms=0.0,
                    args_hash="",
                    tool_use_id=tool_use_id,
                )
        if not tool_uses:
            return []
        # Calls the client named: a retry of one running on this replica waits for it (its
        # slot follows it); the others are marked as being answered.
        hashes = [call_hashes(tu.name, inputs) for tu, inputs in valid]
        follow: dict[int, AnswerKey] = {}
        answering: dict[int, tuple[AnswerKey, _Answering]] = {}
        to_plan: list[int] = []
        for j, (tu, _) in enumerate(valid):
            key = self._answer_key(context, tu)
            if key is not None:
                running = self._answering.get(key)
                if running is not None and running.serves(tu.name, hashes[j][0]):
                    follow[j] = key
                    continue
                held = self._begin_answering(key, tu.name, hashes[j][0])
                if held is not None:
                    answering[j] = (key, held)
            to_plan.append(j)
        approaches: dict[tuple[str, str], FailedApproach] = {}
        try:
            planned = (
                await self._plan(
                    context,
                    [valid[j] for j in to_plan],
                    [hashes[j] for j in to_plan],
                    approaches,
                    replayable=[j in answering for j in to_plan],
                )
                if to_plan
                else []
            )
        except BaseException:
            for key, held in answering.values():
                self._end_answering(key, held, None)
            raise

        def rpc_error_outcome(
            error: ToolmeshError, args_hash: str, tool_use_id: str
        ) -> DispatchOutcome:
            return DispatchOutcome(
                result=convert.error_result_pb(error.message, _kind_of_error(error)),
                duration_ms=0.0,
                args_hash=args_hash,
                tool_use_id=tool_use_id,
            )

        async def one(j: int, plan: _Plan | DispatchOutcome) -> DispatchOutcome:
            outcome: DispatchOutcome | None = None
            try:
                if isinstance(plan, DispatchOutcome):
                    outcome = await self._record_replay(context, valid[j][0], plan)
                else:
                    try:
                        outcome = await self._run(plan, approaches, raise_rpc_errors=False)
                    except ToolmeshError as error:  # the call could not be logged
                        outcome = rpc_error_outcome(error, plan.args_hash, plan.tool_use_id)
                return outcome
            finally:
                if j in answering:
                    self._end_answering(*answering[j], outcome)

        async def after(j: int) -> DispatchOutcome:
            (tu, inputs), hashed = valid[j], hashes[j][0]
            outcome = await self._running_answer(follow[j], tu.name, hashed)
            if outcome is not None:
                return await self._record_replay(context, tu, outcome)
            try:  # the call it waited for was not answered: it runs itself
                return await self._dispatch_parsed(tu, inputs, context, raise_rpc_errors=False)
            except ToolmeshError as error:
                return rpc_error_outcome(error, hashed, tu.id)

        by_slot = dict(zip(to_plan, planned, strict=True))
        ran = iter(
            await asyncio.gather(
                *(one(j, by_slot[j]) if j in by_slot else after(j) for j in range(len(valid)))
            )
        )
        outcomes = [rejected[i] if i in rejected else next(ran) for i in range(len(tool_uses))]
        finalize_turn(outcomes)
        return outcomes

    async def _log_rejected(
        self, tool_use: pb.ToolUse, context: pb.CallContext, error: InvalidArgument
    ) -> str:
        """Log a call refused before anything ran (its input is not acceptable JSON, too large,
        or it names no tool) and return its tool_use_id: a failed tool_execution_log row and
        its tool_call / tool_result / outcome events, with the raw input (its first
        REJECTED_INPUT_CHARS characters) as it came. Best effort: if the log cannot take it,
        the caller still gets the real error."""
        tool_use_id = tool_use.id or new_tool_use_id()
        text = tool_use.input_json
        raw = {
            "input_json": text[:REJECTED_INPUT_CHARS],
            "input_chars": len(text),
            "truncated": len(text) > REJECTED_INPUT_CHARS,
        }
        err_text = _error_text(error)
        fx = CallEffects()
        # Fits the log's column, and says how long it was.
        name = convert.clip(convert.printable(tool_use.name), MAX_TOOL_NAME_CHARS)
        call = {"tool_name": name, "tool_use_id": tool_use_id, "input": raw}
        fx.event("tool_call", {**call, "user_id": context.user_id}, tool_use_id)
        fx.event("tool_result", _rpc_error_result(name, tool_use_id, error, 0.0), tool_use_id)
        outcome = _outcome(name, tool_use_id, "rejected", 0.0, 0, [], _kind_of_error(error))
        fx.event("outcome", outcome, tool_use_id)
        record = _context_record(
            context,
            fx,
            tool_name=name,
            tool_use_id=tool_use_id,
            args_hash="",
            input_data=raw,
            output_summary=summarize(err_text),
            success=False,
            error=err_text,
        )
        await self._write_best_effort(record, f"a rejected call of {name!r}")
        return tool_use_id

    # --- guardrails (before execution) ------------------------------------------------------

    async def _plan(
        self,
        context: pb.CallContext,
        items: Sequence[tuple[pb.ToolUse, dict[str, Any]]],
        hashes: Sequence[tuple[str, str]],
        approaches: dict[tuple[str, str], FailedApproach],
        display: DisplayHandle | None = None,
        replayable: Sequence[bool] = (),
    ) -> list[_Plan | DispatchOutcome]:
        """The calls' plans in input order (`hashes`: each one's call_hashes); a call answered
        before (`replayable` marks the calls the client named, see _answer_key) gets that
        answer in its place instead, and the guardrails do not count it."""
        tenant, conversation, user = context.tenant_id, context.conversation_id, context.user_id
        rules = await self._rules.for_tenant(tenant)
        identities = [identity for _, identity in hashes]
        replayable = list(replayable) or [False] * len(items)
        answers = [
            (tu.id, tu.name, hashed)
            for (tu, _), (hashed, _), named in zip(items, hashes, replayable, strict=True)
            if named
        ]
        applicable = [[r for r in rules if r.applies_to(tenant, tu.name)] for tu, _ in items]
        prior = sorted(
            {r.prior_tool for rs in applicable for r in rs if r.kind == "require_prior_tool"}
        )
        calls = [(tu.name, ident) for (tu, _), ident in zip(items, identities, strict=True)]
        names = sorted({tu.name for tu, _ in items})

        async def snapshot() -> Snapshot:
            if not conversation:
                return Snapshot()  # no conversation, no conversation state
            snap = self._store.snapshot_now(tenant, conversation, calls, prior, answers)
            if snap is not None:
                return snap
            return await self._run_store(
                self._store.snapshot, tenant, conversation, calls, prior, answers
            )

        cached = [self._timeouts.cached(n, tenant) for n in names]
        if all(t is not None for t in cached):  # the usual case: no GetTool, no extra tasks
            snap, timeouts = await snapshot(), [t or self._timeout_s for t in cached]
        else:
            snap, timeouts = await asyncio.gather(
                snapshot(), asyncio.gather(*(self._timeouts.get(n, tenant) for n in names))
            )
        # Once per conversation (see touch_conversation): on the loop when that never waits.
        if (
            conversation
            and not snap.known
            and not self._store.touch_conversation_now(tenant, conversation)
        ):
            await self._run_store(self._store.touch_conversation, tenant, conversation)
        replays = await self._stored_answers(context, items, hashes, replayable, snap)
        if len(replays) == len(items):
            return [replays[i] for i in range(len(items))]
        await self._log.ensure_available()  # never run a tool whose call cannot be logged
        timeout_of = dict(zip(names, timeouts, strict=True))
        for call, (attempts, reason) in snap.failed.items():
            approaches[call] = FailedApproach(call[0], call[1], reason, attempts)

        # The loop guard, in input order, from the latest state this replica knows (no await
        # from reading it to remembering the result: concurrent calls count each other).
        loops = [LoopState()] * len(items)
        if conversation:
            key, now = (tenant, conversation), self._clock()
            loop = self._recent_loops.latest(key, snap.loop, now)
            for i, identity in enumerate(identities):
                if i not in replays:
                    loop = loops[i] = loop.advance(identity)
            self._recent_loops.remember(key, loop, now)

        # Pass 1, in input order: every rule's check (rate limits count here).
        checked: list[tuple[LoopState, list[Check]]] = []
        for i, ((tu, inputs), loop, rules_here) in enumerate(
            zip(items, loops, applicable, strict=True)
        ):
            if i in replays:
                checked.append((loop, []))
                continue
            limited = rate_rules(rules_here)
            counts: dict[int, int] = {}
            if limited:
                now_s = self._wall_clock()
                now_counts = self._store.count_calls_now(tenant, tu.name, limited, now_s)
                counts = (
                    now_counts
                    if now_counts is not None
                    else await self._run_store(
                        self._store.count_calls, tenant, tu.name, limited, now_s
                    )
                )
            checks = check_policies(
                rules_here,
                CallFacts(tu.name, inputs, tenant, user, frozenset(context.capabilities)),
                prior_tools=snap.prior_tools,
                rate_counts=counts,
            )
            checked.append((loop, checks))

        # Pass 2: escalate the violations in order (observations are read only if any fired).
        fired = sorted({c.rule.id for _, checks in checked for c in checks if c.fired})
        observations = (
            await self._run_store(self._store.observation_counts, tenant, user, fired)
            if fired
            else {}
        )
        plans: list[_Plan | DispatchOutcome] = []
        for i, ((tu, inputs), (hashed, identity), (loop_after, checks)) in enumerate(
            zip(items, hashes, checked, strict=True)
        ):
            if i in replays:
                plans.append(replays[i])
                continue
            ctx = pb.CallContext()
            ctx.CopyFrom(context)
            ctx.tool_use_id = tu.id or new_tool_use_id()
            plan = _Plan(
                tool_use=tu,
                inputs=inputs,
                ctx=ctx,
                args_hash=hashed,
                identity=identity,
                loop=loop_after,
                decision=escalate(checks, observations),
                start_epoch=snap.cancel_epoch,
                timeout_s=timeout_of[tu.name],
                fx=CallEffects(display),
                replayable=replayable[i],
            )
            self._decide(plan)
            plans.append(plan)
        return plans

    async def _stored_answers(
        self,
        context: pb.CallContext,
        items: Sequence[tuple[pb.ToolUse, dict[str, Any]]],
        hashes: Sequence[tuple[str, str]],
        replayable: Sequence[bool],
        snap: Snapshot,
    ) -> dict[int, DispatchOutcome]:
        """The logged responses answering calls of `items` (by position): those the snapshot
        found, still within the replay window."""
        replays: dict[int, DispatchOutcome] = {}
        if not snap.answered:
            return replays
        now = self._wall_clock()
        for i, ((tu, _), (hashed, _), named) in enumerate(
            zip(items, hashes, replayable, strict=True)
        ):
            row_id = snap.answered.get((tu.id, tu.name, hashed)) if named else None
            if row_id is None:
                continue
            stored = await self._run_store(
                functools.partial(
                    self._log.stored_answer,
                    tenant_id=context.tenant_id,
                    conversation_id=context.conversation_id,
                    row_id=row_id,
                )
            )
            if stored is None or not _within(stored.created_at, now, self._replay_window_s):
                continue
            try:
                replays[i] = DispatchOutcome.from_stored(stored.response)
            except DecodeError:
                logger.warning(
                    "the logged response of tool_use %s (row %d) cannot be read: the call runs",
                    tu.id,
                    row_id,
                )
        return replays

    def _decide(self, plan: _Plan) -> None:
        """Choose to run or refuse, and record the decision's events and state writes."""
        name, ctx, decision = plan.tool_use.name, plan.ctx, plan.decision
        if decision.blocking:
            plan.refusal = ("policy_violation", refusal_message(name, decision.blocking))
        elif plan.loop.refuses:
            plan.refusal = ("loop_guard", loop_guard_message(name, plan.loop.run_length))
        plan.warnings.extend(text for _, _, text in decision.advisory)
        plan.fx.event(
            "tool_call",
            {
                "tool_name": name,
                "tool_use_id": plan.tool_use_id,
                "input": plan.inputs,
                "reasoning": plan.inputs.get("reasoning"),
                "args_hash": plan.args_hash,
                "identity_hash": plan.identity,
                "user_id": ctx.user_id,
            },
            plan.tool_use_id,
        )
        plan.fx.event(
            "decision",
            {
                "tool_name": name,
                "tool_use_id": plan.tool_use_id,
                "action": "refuse" if plan.refusal else "execute",
                "refused_by": plan.refusal[0] if plan.refusal else None,
                "loop_guard": {
                    "run_length": plan.loop.run_length,
                    "threshold": LOOP_GUARD_THRESHOLD,
                    "fired": plan.loop.refuses,
                },
                "policies": [
                    {
                        "rule_id": c.rule.id,
                        "name": c.rule.name,
                        "kind": c.rule.kind,
                        "mode": c.rule.mode,
                        "fired": c.fired,
                        "detail": c.detail,
                    }
                    for c in decision.checks
                ],
                "cancel_epoch": plan.start_epoch,
                "timeout_s": plan.timeout_s,
            },
            plan.tool_use_id,
        )
        for check, count, text in decision.violations:
            plan.fx.event(
                "policy_violation",
                {
                    "rule_id": check.rule.id,
                    "rule_name": check.rule.name,
                    "kind": check.rule.kind,
                    "mode": check.rule.mode,
                    "tool_name": name,
                    "tool_use_id": plan.tool_use_id,
                    "user_id": ctx.user_id,
                    "detail": check.detail,
                    "count": count,
                    "message": text,
                },
                plan.tool_use_id,
            )
            plan.writes.append(ObservationWrite(ctx.tenant_id, ctx.user_id, check.rule.id, name))
        if ctx.conversation_id:
            plan.writes.append(LoopStateWrite(ctx.tenant_id, ctx.conversation_id, plan.loop))

    # --- execution and logging --------------------------------------------------------------

    async def _run(
        self,
        plan: _Plan,
        approaches: dict[tuple[str, str], FailedApproach],
        *,
        raise_rpc_errors: bool,
    ) -> DispatchOutcome:
        """Run a planned call and log it. Cancelled from outside before it was logged (the
        caller's deadline passed, or the caller went away: gRPC cancels the handler, which
        cancels the registry call and so the tool), it is still logged, as cancelled, and the
        cancellation goes on."""
        started = self._clock()
        logged: list[bool] = []
        plan.log_token = self.coming_writes.begin()
        try:
            return await self._run_logged(plan, approaches, started, logged, raise_rpc_errors)
        except asyncio.CancelledError:
            if not logged:
                elapsed = (self._clock() - started) * 1000
                result = convert.error_result_pb(
                    f"{plan.tool_use.name} was cancelled after {elapsed:.0f} ms: the caller "
                    "stopped waiting for it (its deadline passed, or it cancelled the call)",
                    "cancelled",
                )
                record = self._result_record(
                    plan, elapsed, result, "cancelled", 0, list(plan.warnings)
                )
                try:
                    await self._write_log(plan, record)  # shielded: commits even if cancelled again
                except ToolmeshError as error:
                    logger.warning("a cancelled call could not be logged: %s", error.message)
            raise
        finally:
            self.coming_writes.end(plan.log_token)

    async def _write_log(self, plan: _Plan, record: CallRecord) -> None:
        """Hand the call's record to the log (its write is no longer to come: see
        ComingWrites) and wait for the commit."""
        self.coming_writes.end(plan.log_token)
        await self._log.write(record)

    async def _run_logged(
        self,
        plan: _Plan,
        approaches: dict[tuple[str, str], FailedApproach],
        started: float,
        logged: list[bool],
        raise_rpc_errors: bool,
    ) -> DispatchOutcome:
        status = "refused"
        if plan.refusal is None:
            await self._apply_conversation_budget(plan)
        if plan.refusal is not None:
            result = convert.error_result_pb(plan.refusal[1], plan.refusal[0])
        else:
            try:
                result, status = await self._execute(plan)
            except ToolmeshError as error:
                elapsed = (self._clock() - started) * 1000
                logged.append(True)  # queued before the first await: committed from here on
                await self._write_log(plan, self._error_record(plan, elapsed, error))
                if raise_rpc_errors:
                    raise
                return DispatchOutcome(
                    result=convert.error_result_pb(error.message, _kind_of_error(error)),
                    duration_ms=elapsed,
                    args_hash=plan.args_hash,
                    tool_use_id=plan.tool_use_id,
                    warnings=list(plan.warnings),
                    effects=plan.fx.effects,
                )
            if status in ("ok", "hint", "err"):
                result = await self._effects.apply(
                    result, plan.ctx, plan.tool_use.name, plan.fx, plan.writes
                )
                status = convert.envelope_kind(result)
        self._stream_text(plan, result)
        warnings = list(plan.warnings)
        attempts = 0
        if status in ("ok", "hint", "err", "timeout") and convert.envelope_kind(result) == "err":
            reason = result.error or result.envelope.err.message
            approach = record_failed_approach(approaches, plan.tool_use.name, plan.identity, reason)
            attempts = approach.attempts
            if plan.ctx.conversation_id:
                plan.writes.append(
                    FailedApproachWrite(
                        plan.ctx.tenant_id,
                        plan.ctx.conversation_id,
                        plan.tool_use.name,
                        plan.identity,
                        reason,
                    )
                )
            hint = repeat_failure_hint(approach)
            if hint is not None:
                warnings.append(hint)
        elapsed = (self._clock() - started) * 1000
        record = self._result_record(plan, elapsed, result, status, attempts, warnings)
        outcome = DispatchOutcome(
            result=result,
            duration_ms=elapsed,
            args_hash=plan.args_hash,
            tool_use_id=plan.tool_use_id,
            warnings=warnings,
            effects=plan.fx.effects,
            final=status != "cancelled",  # a cancelled call was not answered by its tool
        )
        if plan.replayable and outcome.final:
            record.response = outcome.to_pb().SerializeToString()
        logged.append(True)
        await self._write_log(plan, record)
        return outcome

    def _stream_text(self, plan: _Plan, result: pb.ToolResult) -> None:
        """The model-facing text of the result, as text_delta chunks of one StreamChunks."""
        if not plan.fx.streaming or not result.content:
            return
        text = result.content
        plan.fx.stream(
            *(
                ("text_delta", {"tool_use_id": plan.tool_use_id, "text": text[i : i + TEXT_CHUNK]})
                for i in range(0, len(text), TEXT_CHUNK)
            )
        )

    async def _apply_conversation_budget(self, plan: _Plan) -> None:
        """The per-conversation ceiling: refuse a call once the conversation's usage_log total
        reaches it, otherwise narrow the call's budget to what is left (the registry stops a
        handler at the charge that crosses it).

        The bound is per call, not reserved: what a running call will spend is not known when
        it starts, so calls of a conversation running at once — in one batch, or on several
        replicas — are each granted what was left when they started. With k of them running
        from a total S, the conversation ends at most (k - 1) × (ceiling - S) over its ceiling,
        plus the last charge of each call (the one that crossed its limit); once the total
        reaches the ceiling, every replica refuses the next call. Tested in
        tests/unit/dispatcher/test_replicas_concurrency.py."""
        ceiling = self._conversation_budget_usd
        ctx = plan.ctx
        if ceiling <= 0 or self._usage is None or not ctx.conversation_id:
            return
        spent = await self._run_store(
            self._usage.conversation_spent, ctx.tenant_id, ctx.conversation_id
        )
        left = ceiling - spent
        if left <= 0:
            plan.refusal = (
                "budget_exceeded",
                f"conversation {ctx.conversation_id!r} has spent ${spent:.6f} of its "
                f"${ceiling:.6f} budget; {plan.tool_use.name} was not run",
            )
            return
        limit = ctx.budget.limit_usd - ctx.budget.spent_usd if ctx.budget.limit_usd else left
        ctx.budget.limit_usd = min(limit, left)
        ctx.budget.spent_usd = 0.0

    async def _execute(self, plan: _Plan) -> tuple[pb.ToolResult, str]:
        """Run the call in the registry, raced against the conversation's cancellation. A
        cancelled call's task is cancelled, which cancels its gRPC call and so the handler."""
        request = rpb.ExecuteToolRequest(
            name=plan.tool_use.name, input_json=plan.tool_use.input_json or "{}", context=plan.ctx
        )
        key = (plan.ctx.tenant_id, plan.ctx.conversation_id)
        inflight: InflightCall | None = None
        if plan.ctx.conversation_id:
            inflight = self._inflight.register(key, plan.tool_use_id, plan.start_epoch)
        # Tenant and conversation travel on as W3C baggage set here, from the call this
        # dispatcher serves (a client's own baggage was dropped at the door).
        trace.get_current_span().set_attributes(
            span_attributes(
                toolmesh__tenant__id=plan.ctx.tenant_id,
                gen_ai__conversation__id=plan.ctx.conversation_id,
                gen_ai__tool__name=plan.tool_use.name,
                gen_ai__tool__call__id=plan.tool_use_id,
            )
        )
        # The call runs in this task, not a task of its own (measured: a task and
        # asyncio.wait cost ~17 µs a call and a loop iteration); the conversation's
        # cancellation or `stop` cancels this task while it waits, which cancels the gRPC call
        # and so the handler, and is told apart from any other cancellation by `stopped_by`.
        task = asyncio.current_task()
        assert task is not None
        stopped_by: list[str] = []
        waiting = True

        def stop(reason: asyncio.Future[Any]) -> None:
            if waiting and not stopped_by and not reason.cancelled():
                stopped_by.append(str(reason.result()))
                task.cancel()

        waiters = [w for w in (inflight.tripped if inflight else None, plan.stop) if w is not None]
        for waiter in waiters:
            if waiter.done() and not waiter.cancelled():  # cancelled before it could start
                if inflight is not None:
                    self._inflight.unregister(key, inflight)
                return (
                    convert.error_result_pb(
                        f"{plan.tool_use.name} was cancelled: {waiter.result()}", "cancelled"
                    ),
                    "cancelled",
                )
        for waiter in waiters:
            waiter.add_done_callback(stop)
        token = otel_context.attach(with_call_baggage(plan.ctx.tenant_id, plan.ctx.conversation_id))
        try:
            response = await self._call_registry(plan, request)
        except asyncio.CancelledError:
            if not stopped_by or task.uncancel() > 0:
                raise  # cancelled from outside (the caller went away): not ours to answer
            return (
                convert.error_result_pb(
                    f"{plan.tool_use.name} was cancelled: {stopped_by[0]}", "cancelled"
                ),
                "cancelled",
            )
        except DeadlineExceeded:
            return (
                convert.error_result_pb(
                    f"{plan.tool_use.name} did not finish within {plan.timeout_s:g}s", "timeout"
                ),
                "timeout",
            )
        finally:
            waiting = False
            otel_context.detach(token)
            for waiter in waiters:
                waiter.remove_done_callback(stop)
            if inflight is not None:
                self._inflight.unregister(key, inflight)
        return response.result, convert.envelope_kind(response.result)

    async def _call_registry(
        self, plan: _Plan, request: rpb.ExecuteToolRequest
    ) -> rpb.ExecuteToolResponse:
        """ExecuteTool; for a streamed call ExecuteToolStream, each progress report becomes a
        `progress` event and display chunk as it arrives."""
        streaming = getattr(self._registry, "execute_stream", None)
        if not plan.fx.streaming or streaming is None:
            return await self._registry.execute(request, plan.timeout_s)

        def on_progress(data: Mapping[str, Any]) -> None:
            plan.fx.report_progress(plan.tool_use_id, data)

        gateway: StreamingRegistryGateway = self._registry  # type: ignore[assignment]
        return await gateway.execute_stream(request, plan.timeout_s, on_progress)

    def _base_record(self, plan: _Plan, elapsed_ms: float) -> dict[str, Any]:
        ctx = plan.ctx
        return {
            "tool_name": plan.tool_use.name,
            "tenant_id": ctx.tenant_id,
            "user_id": ctx.user_id,
            "conversation_id": ctx.conversation_id,
            "tool_use_id": plan.tool_use_id,
            "args_hash": plan.args_hash,
            "input_data": plan.inputs,
            "execution_ms": elapsed_ms,
            "trace_id": current_trace_id(),
            "model": ctx.model,
        }

    def _outcome_event(
        self,
        plan: _Plan,
        status: str,
        elapsed_ms: float,
        attempts: int,
        warnings: list[str],
        err_kind: str = "",
    ) -> None:
        data = _outcome(
            plan.tool_use.name, plan.tool_use_id, status, elapsed_ms, attempts, warnings, err_kind
        )
        plan.fx.event("outcome", data, plan.tool_use_id)

    def _result_record(
        self,
        plan: _Plan,
        elapsed_ms: float,
        result: pb.ToolResult,
        status: str,
        attempts: int,
        warnings: list[str],
    ) -> CallRecord:
        kind = convert.envelope_kind(result)
        err_text = result.error or None
        result_data: dict[str, Any] = {
            "tool_name": plan.tool_use.name,
            "tool_use_id": plan.tool_use_id,
            "content": result.content,
            "envelope": kind,
            "error": err_text,
            "cost_usd": result.cost_usd,
            "duration_ms": elapsed_ms,
            "datasets": [d.name for d in result.datasets],
            "exports": [e.filename for e in result.exports],
        }
        err_kind = result.envelope.err.err_kind if kind == "err" else ""
        plan.fx.event("tool_result", result_data, plan.tool_use_id)
        self._outcome_event(plan, status, elapsed_ms, attempts, warnings, err_kind)
        return CallRecord(
            **self._base_record(plan, elapsed_ms),
            output_summary=summarize(result.content or (err_text or "")),
            success=kind != "err",
            error=err_text,
            events=list(plan.fx.events),
            state_writes=list(plan.writes),
        )

    def _error_record(self, plan: _Plan, elapsed_ms: float, error: ToolmeshError) -> CallRecord:
        err_text = _error_text(error)
        result_data = _rpc_error_result(plan.tool_use.name, plan.tool_use_id, error, elapsed_ms)
        plan.fx.event("tool_result", result_data, plan.tool_use_id)
        self._outcome_event(
            plan, "rpc_error", elapsed_ms, 0, list(plan.warnings), _kind_of_error(error)
        )
        return CallRecord(
            **self._base_record(plan, elapsed_ms),
            output_summary=summarize(err_text),
            success=False,
            error=err_text,
            events=list(plan.fx.events),
            state_writes=list(plan.writes),
        )

    # --- cancellation -----------------------------------------------------------------------

    async def cancel(self, tenant_id: str, conversation_id: str) -> CancelOutcome:
        """Raise the conversation's cancellation epoch in the database (every replica's calls
        started before it stop within a poll interval), then stop this replica's calls at once."""
        if not conversation_id:
            raise InvalidArgument(
                "conversation_id is required", field_violations=[("conversation_id", "empty")]
            )
        epoch = await self._run_store(self._store.bump_cancel_epoch, tenant_id, conversation_id)
        ids = self._inflight.cancel((tenant_id, conversation_id), "cancelled on request")
        if ids:
            message = f"cancelled {len(ids)} in-flight call(s) of conversation {conversation_id}"
        elif epoch is not None:
            message = (
                f"no active calls for conversation {conversation_id} on this replica; calls in "
                f"flight on other replicas stop within {self._poll_interval_s:g}s"
            )
        else:
            message = (
                f"no active calls for conversation {conversation_id}: unknown conversation, "
                "nothing to cancel"
            )
        known = epoch is not None or bool(ids)
        return CancelOutcome(ids, known, epoch or 0, message)

    # --- policy rules -----------------------------------------------------------------------

    async def add_rule(self, rule: PolicyRule) -> PolicyRule:
        stored = await self._run_store(self._store.add_rule, validate_rule(rule))
        self._rules.invalidate()
        return stored

    async def list_rules(self, tenant_id: str, include_disabled: bool) -> list[PolicyRule]:
        return await self._run_store(self._store.list_rules, tenant_id, include_disabled)

    async def disable_rule(self, rule_id: int) -> PolicyRule:
        rule = await self._run_store(self._store.disable_rule, rule_id)
        self._rules.invalidate()
        return rule
