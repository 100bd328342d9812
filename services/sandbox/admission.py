"""Admission of executions to the worker pool: how many run at once, in all and per tenant, how
long one may wait for a slot, and no wait that could never end.

A custom tool that calls tools (call_tool → the registry → sandbox.Execute again) holds its slot
while the nested execution waits for one of its own. Left to a plain semaphore, two recursive
chains held every slot of the sandbox until their wall clocks killed them, stalling every tenant.
So:

- at most `total` executions run at once, and at most `per_tenant` of one tenant's (nested ones
  included): one tenant saturating its share leaves the rest to the others;
- a wait for a slot ends at `wait_s`, at the Execute RPC's deadline, and — for a nested
  execution — when its calling execution's wall clock ends, whichever comes first; then the
  call is refused with a message naming the limit;
- a nested execution whose wait could only end by a timeout is refused at once: when every slot
  it could get is held by executions that themselves wait, through their nested calls, on
  waiting executions (its own callers, for a plain recursion), no slot will ever come free.

The call tree of an execution is the `tool_use_id` of its root call, which every nested call
keeps (its `depth` grows by one a level); an execution of the same tenant and tree at a lower
depth that is running is one of its callers. That is only known for executions in this process:
a chain that crosses sandbox replicas is bounded by the wait deadline alone."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

TOTAL_SETTING = "TOOLMESH_SANDBOX_MAX_CONCURRENT"
TENANT_SETTING = "TOOLMESH_SANDBOX_TENANT_MAX_CONCURRENT"
WAIT_SETTING = "TOOLMESH_SANDBOX_SLOT_WAIT_S"


@dataclass(frozen=True)
class Origin:
    """Who an execution runs for and where it sits in its call tree."""

    tenant: str = ""
    tree: str = ""  # the root call's tool_use_id ("" = unknown: no callers are recognised)
    depth: int = 0
    deadline: float | None = None  # event-loop time the caller gives up (its RPC deadline)


class SlotRefused(Exception):
    """No slot for this execution; the message names the limit."""


@dataclass(eq=False)
class _Ticket:
    origin: Origin
    seq: int
    future: asyncio.Future[None] = field(repr=False)
    wall_s: float = 0.0
    ends: float = 0.0  # while running: when its wall clock ends
    admitted: bool = False


class Admission:
    def __init__(self, *, total: int = 16, per_tenant: int = 4, wait_s: float = 10.0) -> None:
        self.total = max(1, total)
        self.per_tenant = max(1, min(per_tenant, self.total)) if per_tenant > 0 else self.total
        self.wait_s = max(0.0, wait_s)
        self._running: list[_Ticket] = []
        self._waiting: list[_Ticket] = []
        self._seq = itertools.count()

    @property
    def running(self) -> int:
        return len(self._running)

    def running_for(self, tenant: str) -> int:
        return sum(1 for t in self._running if t.origin.tenant == tenant)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @contextlib.asynccontextmanager
    async def slot(self, origin: Origin, wall_s: float) -> AsyncIterator[None]:
        """Hold a slot for one execution of at most `wall_s` seconds (SlotRefused when none)."""
        ticket = await self._acquire(origin, wall_s)
        try:
            yield
        finally:
            self._release(ticket)

    # --- the bookkeeping (all on the event loop's thread: no locks) ---

    def _is_caller(self, running: _Ticket, of: _Ticket) -> bool:
        a, b = running.origin, of.origin
        return bool(a.tree) and a.tenant == b.tenant and a.tree == b.tree and a.depth < b.depth

    def _callers(self, ticket: _Ticket) -> list[_Ticket]:
        return [r for r in self._running if self._is_caller(r, ticket)]

    def _tenant_full(self, tenant: str) -> bool:
        return self.running_for(tenant) >= self.per_tenant

    def _fits(self, ticket: _Ticket) -> bool:
        return len(self._running) < self.total and not self._tenant_full(ticket.origin.tenant)

    def _admit(self, ticket: _Ticket) -> None:
        ticket.admitted = True
        ticket.ends = asyncio.get_running_loop().time() + ticket.wall_s
        self._running.append(ticket)

    async def _acquire(self, origin: Origin, wall_s: float) -> _Ticket:
        loop = asyncio.get_running_loop()
        ticket = _Ticket(origin, next(self._seq), loop.create_future(), wall_s)
        if self._fits(ticket):  # nobody who fits is ever left waiting (see _pump)
            self._admit(ticket)
            return ticket
        now = loop.time()
        deadline, why = now + self.wait_s, f"the sandbox's slot wait limit ({WAIT_SETTING})"
        if origin.deadline is not None and origin.deadline < deadline:
            deadline, why = origin.deadline, "the call's deadline"
        callers = self._callers(ticket)
        if callers and min(c.ends for c in callers) < deadline:
            deadline = min(c.ends for c in callers)
            why = "the wall clock of the custom tool that called it"
        waited = max(0.0, deadline - now)
        self._waiting.append(ticket)

        def expire() -> None:
            if not ticket.future.done():
                self._waiting.remove(ticket)
                ticket.future.set_exception(
                    SlotRefused(
                        f"no sandbox slot within {waited:.3g}s ({why}): {self._why(ticket)}"
                    )
                )
                self._break_deadlocks()

        timer = loop.call_later(waited, expire)
        self._break_deadlocks()
        try:
            await ticket.future
        except asyncio.CancelledError:
            if ticket.admitted:
                self._release(ticket)
            elif ticket in self._waiting:
                self._waiting.remove(ticket)
                self._break_deadlocks()
            raise
        finally:
            timer.cancel()
        return ticket

    def _release(self, ticket: _Ticket) -> None:
        if ticket in self._running:
            self._running.remove(ticket)
            self._pump()

    def _pump(self) -> None:
        """Admit every waiter that fits: nested executions first (their callers hold slots and
        finish only when they do), then in arrival order; a waiter whose tenant is at its cap
        does not hold up another tenant's."""
        order = sorted(self._waiting, key=lambda t: (not self._callers(t), t.seq))
        for ticket in order:
            if self._fits(ticket):
                self._waiting.remove(ticket)
                self._admit(ticket)
                ticket.future.set_result(None)
        self._break_deadlocks()

    def _hopeless(self) -> set[_Ticket]:
        """Waiters no release can ever reach: every execution whose end would let them in is a
        caller of a waiter that is itself hopeless."""
        stuck = set(self._waiting)
        changed = True
        while changed:
            changed = False
            blocked = {r for r in self._running if any(self._is_caller(r, w) for w in stuck)}
            for waiter in list(stuck):
                tenant = waiter.origin.tenant
                if self._tenant_full(tenant):  # only one of its tenant's ending lets it in
                    freeing = [r for r in self._running if r.origin.tenant == tenant]
                else:
                    freeing = self._running
                if self._fits(waiter) or any(r not in blocked for r in freeing):
                    stuck.discard(waiter)
                    changed = True
        return stuck

    def _break_deadlocks(self) -> None:
        """Refuse, newest first, the nested waiters whose wait could only end by a timeout (a
        waiter with no caller here makes no one wait on it, so refusing the nested ones ends
        every such cycle: their callers get the refusal and go on)."""
        while True:
            nested = [w for w in self._hopeless() if self._callers(w)]
            if not nested:
                return
            ticket = max(nested, key=lambda t: t.seq)
            self._waiting.remove(ticket)
            ticket.future.set_exception(
                SlotRefused(
                    f"nested call refused: {self._why(ticket)}, and every one of them is held "
                    "by a custom tool waiting on its own nested calls (this call's callers "
                    "among them), so no slot would ever come free; nest custom tools less deeply"
                )
            )

    def _why(self, ticket: _Ticket) -> str:
        tenant = ticket.origin.tenant
        if self._tenant_full(tenant):
            return (
                f"tenant {tenant!r} runs the {self.per_tenant} custom-tool executions it may run "
                f"at once ({TENANT_SETTING})"
            )
        return f"all {self.total} sandbox execution slots are busy ({TOTAL_SETTING})"
