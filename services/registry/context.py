"""ToolContext: what a system tool handler receives besides its inputs — who is calling, the
conversation's datasets, settings, and a way to compose other tools through the registry."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pandas as pd
from sqlalchemy.orm import Session, sessionmaker

from shared.config import DEFAULT_DB_WAIT_S, Settings
from shared.costs import BudgetExceeded, CostAccount
from shared.db.engine import db_thread
from shared.errors import ToolmeshError
from shared.llm.client import LLMSpend, charge_billed, spend_of
from shared.telemetry import metrics
from shared.telemetry.usage import UsageEntry, UsageLog

if TYPE_CHECKING:
    from shared.contract import ContractRecorder, ToolResult
    from shared.llm.client import LLMClient, LLMReply

logger = logging.getLogger(__name__)


T = TypeVar("T")


@dataclass(frozen=True)
class DatasetInfo:
    """Metadata of a stored conversation dataset."""

    name: str
    rows: int
    columns: list[dict[str, Any]]
    source: str


class DatasetStore(Protocol):
    """Conversation-scoped named tables, persisted so any replica can serve the next call.
    Blocking methods: call them from sync handlers (which run in worker threads) or wrap them in
    asyncio.to_thread from async handlers."""

    def save(
        self, scope: DatasetScope, name: str, df: pd.DataFrame, source: str = ""
    ) -> DatasetInfo: ...

    def load(self, scope: DatasetScope, name: str) -> pd.DataFrame:
        """Raises KeyError when the conversation has no dataset of that name."""
        ...

    def list(self, scope: DatasetScope) -> Sequence[DatasetInfo]: ...


@dataclass(frozen=True)
class DatasetScope:
    """Which conversation's datasets: tenant, conversation and namespace."""

    tenant_id: str
    conversation_id: str
    namespace_id: str = ""


class ToolCaller(Protocol):
    """Executes a tool by name with a context; the registry's gRPC client implements it."""

    async def call_tool(
        self, name: str, inputs: Mapping[str, Any], context: ToolContext
    ) -> ToolResult: ...


# The cancellation of the call a sync handler's thread works for: set by the registry when the
# call is cancelled (the caller went away, the conversation was cancelled), read by long work
# in that thread (a query's watchdog, a file's reader) through raise_if_cancelled. A ContextVar,
# because asyncio.to_thread runs the handler in a copy of the caller's context.
_CANCELLED: ContextVar[threading.Event | None] = ContextVar("toolmesh_call_cancelled", default=None)


class CallCancelled(Exception):
    """The call this work belongs to was cancelled: stop and let it go."""


def call_cancellation() -> threading.Event | None:
    """The current call's cancellation event, None outside a sync handler's thread."""
    return _CANCELLED.get()


def raise_if_cancelled() -> None:
    """Raise CallCancelled when the current call was cancelled."""
    event = _CANCELLED.get()
    if event is not None and event.is_set():
        raise CallCancelled("the call was cancelled")


def cancellable(event: threading.Event) -> Token[threading.Event | None]:
    """Make `event` the current call's cancellation (returns the token to reset)."""
    return _CANCELLED.set(event)


def reset_cancellation(token: Token[threading.Event | None]) -> None:
    _CANCELLED.reset(token)


@dataclass
class ToolContext:
    """The context payload of the spec, typed. Handlers receive (inputs, context)."""

    tool_name: str
    tenant_id: str
    user_id: str = ""
    conversation_id: str = ""
    namespace_id: str = ""
    capabilities: frozenset[str] = frozenset()
    mode: str = "chat"
    tool_use_id: str = ""
    parent_tool_use_id: str = ""
    reasoning: str | None = None
    user_message: str = ""
    dataset_id: str = ""
    budget_limit: float | None = None
    budget_spent: float = 0.0
    depth: int = 0
    # The conversation's model as the agent back end names it (a model config's name); empty
    # when the caller did not say. search_tools passes it on for capability filtering.
    model: str = ""
    settings: Settings | None = None
    datasets: DatasetStore | None = None
    caller: ToolCaller | None = None
    loop: asyncio.AbstractEventLoop | None = None
    # Where the contract boundary counts this call's envelope (the registry's counters).
    contract_recorder: ContractRecorder | None = None
    # What this call has spent (LLM calls, nested tools) against its budget.
    cost: CostAccount = field(default_factory=CostAccount)
    usage: UsageLog | None = None
    # The database, for tools that read the shared logs (query_telemetry).
    sessions: sessionmaker[Session] | None = None
    llm_clients: Callable[[str], LLMClient] | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    # Where progress reports go (a streaming caller's queue); None when nobody listens.
    progress_sink: Callable[[Mapping[str, Any]], None] | None = None

    def __post_init__(self) -> None:
        fresh = self.cost.limit is None and not self.cost.spent_before and not self.cost.total
        if fresh and (self.budget_limit is not None or self.budget_spent):
            self.cost = CostAccount(limit=self.budget_limit, spent_before=self.budget_spent)

    async def db(self, what: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)`, a blocking database operation (`what` it is), in a thread,
        waited for at most TOOLMESH_DB_WAIT_S: past it the call answers UNAVAILABLE
        (DATABASE_UNAVAILABLE) instead of waiting on a database that does not answer."""
        wait_s = self.settings.db_wait_s if self.settings is not None else DEFAULT_DB_WAIT_S
        return await db_thread(wait_s, what, fn, *args, **kwargs)

    @property
    def scope(self) -> DatasetScope:
        return DatasetScope(self.tenant_id, self.conversation_id, self.namespace_id)

    def _store(self) -> DatasetStore:
        if self.datasets is None:
            raise RuntimeError("this context has no dataset store")
        return self.datasets

    def save_dataset(self, name: str, df: pd.DataFrame, source: str = "") -> DatasetInfo:
        return self._store().save(self.scope, name, df, source)

    def load_dataset(self, name: str) -> pd.DataFrame:
        return self._store().load(self.scope, name)

    def list_datasets(self) -> Sequence[DatasetInfo]:
        return self._store().list(self.scope)

    def report_progress(self, message: str, *, fraction: float | None = None, **data: Any) -> None:
        """Tell a streaming caller what the handler is doing: a message, an optional fraction
        done in [0, 1] and JSON-able details. A no-op when the call is not streamed; safe from
        sync handlers (worker threads) and async ones."""
        if self.progress_sink is None:
            return
        report: dict[str, Any] = {"message": str(message)}
        if fraction is not None:
            value = float(fraction)
            if math.isfinite(value):
                report["fraction"] = min(1.0, max(0.0, value))
        if data:
            report["data"] = data
        self.progress_sink(report)

    async def call_tool(self, name: str, inputs: Mapping[str, Any]) -> ToolResult:
        """Compose another tool: re-enters the registry over gRPC with this context (one trace)."""
        if self.caller is None:
            raise RuntimeError("this context cannot call tools")
        return await self.caller.call_tool(name, inputs, self)

    def call_tool_blocking(self, name: str, inputs: Mapping[str, Any]) -> ToolResult:
        """call_tool for sync handlers, which run in worker threads: hands the call to the
        service's event loop and waits for it (never a second event loop)."""
        if self.loop is None:
            raise RuntimeError("this context has no event loop to call tools on")
        future = asyncio.run_coroutine_threadsafe(self.call_tool(name, inputs), self.loop)
        return future.result()

    async def llm(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        role: str = "call_llm",
        system: str | None = None,
        max_output_tokens: int | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> LLMReply:
        """One LLM call on the model of `role`, charged to this call: refused when the budget
        is already spent, recorded in usage_log, and BudgetExceeded when it crosses the limit
        (the cost is recorded either way — it was incurred)."""
        if self.llm_clients is None:
            raise RuntimeError("this context cannot call an LLM")
        self.cost.check(f"before an LLM call for {self.tool_name}")
        client = await self.db("the model configuration's read", self.llm_clients, role)

        def writing(chars: int) -> None:  # a streaming caller sees a long answer being written
            self.report_progress(
                f"the model is writing its answer: {chars:,} characters so far",
                chars=chars,
                role=role,
            )

        try:
            reply = await client.complete(
                messages,
                system=system,
                max_output_tokens=max_output_tokens,
                tools=tools,
                on_text=writing if self.progress_sink is not None else None,
            )
        except (ToolmeshError, asyncio.CancelledError) as error:
            # Broken attempts were billed: charged (a cancelled call's too), the error kept.
            try:
                await charge_billed(error, self._charge_llm)
            except (ToolmeshError, BudgetExceeded) as also:
                logger.warning(
                    "%s: the cost of a failed LLM call, $%.6f, was charged but: %s",
                    self.tool_name,
                    getattr(spend_of(error), "cost_usd", 0.0),
                    also,
                )
            raise
        await self._charge_llm(reply.spend)
        return reply

    async def _charge_llm(self, spend: LLMSpend) -> None:
        """Record what an LLM call was billed for in usage_log and charge it to this call
        (BudgetExceeded when it takes the call over its limit; recorded either way)."""
        entry = UsageEntry.of_llm_spend(
            spend,
            tenant_id=self.tenant_id,
            tool_name=self.tool_name,
            user_id=self.user_id,
            conversation_id=self.conversation_id,
            tool_use_id=self.tool_use_id,
        )
        if self.usage is not None:
            await self.db("the usage log's write", self.usage.record, entry)
        metrics.record_cost(self.tenant_id, self.tool_name, spend.cost_usd)
        self.cost.charge_leaf(spend.cost_usd, f"LLM call for {self.tool_name}")
