"""ToolContext: what a system tool handler receives besides its inputs — who is calling, the
conversation's datasets, settings, and a way to compose other tools through the registry."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pandas as pd

from shared.config import Settings

if TYPE_CHECKING:
    from shared.contract import ContractRecorder, ToolResult


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
    settings: Settings | None = None
    datasets: DatasetStore | None = None
    caller: ToolCaller | None = None
    loop: asyncio.AbstractEventLoop | None = None
    # Where the contract boundary counts this call's envelope (the registry's counters).
    contract_recorder: ContractRecorder | None = None
    extras: dict[str, Any] = field(default_factory=dict)

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
