"""Cancellation of in-flight calls. Each call registers while it runs, with the conversation's
cancellation epoch at its start. A Cancel on this replica trips the conversation's calls at once;
calls on other replicas learn of it from the epoch in the database, which one poller per replica
reads every `poll_interval_s` for every conversation with calls in flight (one query, and only
while calls are in flight). A tripped call's task is cancelled by the core, which cancels its
registry RPC and so the handler's task downstream."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from shared.errors import ToolmeshError

logger = logging.getLogger(__name__)

ConversationKey = tuple[str, str]  # (tenant_id, conversation_id)
EpochReader = Callable[[list[ConversationKey]], Awaitable[dict[ConversationKey, int]]]

POLL_INTERVAL_S = 0.1


@dataclass(eq=False)
class InflightCall:
    """One running call; `tripped` resolves (with the reason) when it must stop."""

    tool_use_id: str
    start_epoch: int
    tripped: asyncio.Future[str] = field(repr=False, default_factory=asyncio.Future)

    def trip(self, reason: str) -> bool:
        if self.tripped.done():
            return False
        self.tripped.set_result(reason)
        return True


class InflightCalls:
    """The calls in flight on this replica, by conversation, and their epoch pollers."""

    def __init__(self, read_epochs: EpochReader, *, poll_interval_s: float = POLL_INTERVAL_S):
        self._read_epochs = read_epochs
        self._interval = poll_interval_s
        self._calls: dict[ConversationKey, set[InflightCall]] = {}
        self._poller: asyncio.Task[None] | None = None

    def register(self, key: ConversationKey, tool_use_id: str, start_epoch: int) -> InflightCall:
        call = InflightCall(tool_use_id, start_epoch)
        self._calls.setdefault(key, set()).add(call)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="cancel-poller")
        return call

    def unregister(self, key: ConversationKey, call: InflightCall) -> None:
        calls = self._calls.get(key)
        if calls is None:
            return
        calls.discard(call)
        if not calls:
            del self._calls[key]

    def active(self, key: ConversationKey) -> int:
        return len(self._calls.get(key, ()))

    def cancel(self, key: ConversationKey, reason: str) -> list[str]:
        """Trip every call of the conversation on this replica; their tool_use ids."""
        return sorted(c.tool_use_id for c in list(self._calls.get(key, ())) if c.trip(reason))

    async def _poll(self) -> None:
        """Until no call is in flight: every interval, read the epochs of the conversations
        with calls in flight and trip the calls that started before a newer epoch."""
        while self._calls:
            await asyncio.sleep(self._interval)
            keys = list(self._calls)
            if not keys:
                break
            try:
                epochs = await self._read_epochs(keys)
            except ToolmeshError as exc:  # the database is away: keep the calls, retry
                logger.warning("reading cancellation flags failed: %s", exc.message)
                continue
            for key in keys:
                epoch = epochs.get(key, 0)
                for call in list(self._calls.get(key, ())):
                    if epoch > call.start_epoch:
                        call.trip(f"conversation cancelled (epoch {epoch})")

    async def close(self) -> None:
        poller, self._poller = self._poller, None
        if poller is not None and not poller.done():
            poller.cancel()
            await asyncio.wait({poller})
