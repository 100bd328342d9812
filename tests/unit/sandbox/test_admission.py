"""Slots of the sandbox: one tenant (or one recursive custom tool) cannot take every slot of the
pool, a wait for a slot always ends, and a nested call that could only wait for ever on its own
callers is refused at once, with an Err naming the limit.

The first tests run the real worker pool, with call_tool re-entering it the way the registry's
route does (one level deeper, the same call tree); the rest drive the admission alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from services.sandbox.admission import Admission, Origin, SlotRefused
from services.sandbox.host import Limits, RunOutcome, WorkerPool

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOTAL, PER_TENANT = 6, 2
LIMITS = Limits(wall_seconds=60, cpu_seconds=10, memory_bytes=256 << 20)
GENEROUS = 60.0  # a deadline on waiting for a condition, never a timing assertion


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool() -> AsyncIterator[WorkerPool]:
    pool = WorkerPool(
        size=2, max_concurrent=TOTAL, tenant_max_concurrent=PER_TENANT, slot_wait_s=GENEROUS
    )
    await pool.start()
    yield pool
    await pool.close()


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until `condition` holds (a generous deadline, no sleeping)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + GENEROUS
    while not condition():
        assert loop.time() < give_up, "condition never held"
        await asyncio.sleep(0)


async def run(pool: WorkerPool, code: str, origin: Origin, on_call_tool: Any = None) -> RunOutcome:
    return await pool.run(
        code=code,
        inputs={},
        tool_name="t",
        limits=LIMITS,
        on_call_tool=on_call_tool,
        origin=origin,
    )


async def test_a_recursive_custom_tool_gets_an_err_naming_the_tenant_limit_not_a_stall(
    pool: WorkerPool,
) -> None:
    """Each level holds a slot while its nested call waits for one: with every one of the
    tenant's slots held by the chain itself, the next level can never start. It is refused at
    once (no wait for the slot deadline, here a minute), and the chain unwinds with that Err."""
    code = (
        "r = call_tool('recurse', {})\n"
        "result = r['content'] if r['ok'] else 'ERR ' + str(r['error'])"
    )
    depths: list[int] = []

    def at(tree: str, depth: int) -> Any:
        """call_tool as the registry routes it: the same tenant and call tree, one deeper."""

        async def on_call_tool(name: str, inputs: dict[str, Any]) -> tuple[dict[str, Any], None]:
            depths.append(depth + 1)
            origin = Origin("tenant-r", tree, depth + 1)
            nested = await run(pool, code, origin, at(tree, depth + 1))
            if nested.ok:
                return {"ok": True, "kind": "ok", "content": nested.content, "error": None}, None
            return {"ok": False, "kind": "err", "content": "", "error": nested.message}, None

        return on_call_tool

    chains = [run(pool, code, Origin("tenant-r", tree, 0), at(tree, 0)) for tree in ("x", "y")]
    # Two chains, one tenant: they share its two slots, yet neither waits for ever.
    outcomes = await asyncio.wait_for(asyncio.gather(*chains), GENEROUS / 2)
    for outcome in outcomes:
        assert outcome.ok, outcome
        assert outcome.content.startswith("ERR nested call refused: tenant 'tenant-r' runs the 2")
        assert "TOOLMESH_SANDBOX_TENANT_MAX_CONCURRENT" in outcome.content
    assert max(depths) <= PER_TENANT
    assert pool.admission.running == 0 and pool.admission.waiting == 0


async def test_another_tenant_runs_while_one_floods_the_pool(pool: WorkerPool) -> None:
    """Tenant A starts as many executions as the pool has slots, each parked in a call_tool;
    only its cap of them run, and tenant B's execution still runs at once."""
    release = asyncio.Event()
    entered: list[int] = []

    async def parked(name: str, inputs: dict[str, Any]) -> tuple[dict[str, Any], None]:
        entered.append(1)
        await release.wait()
        return {"ok": True, "kind": "ok", "content": "done", "error": None}, None

    code = "r = call_tool('park', {})\nresult = r['content']"
    flood = [
        asyncio.ensure_future(run(pool, code, Origin("tenant-a", f"toolu_a{n}"), parked))
        for n in range(TOTAL)
    ]
    try:
        await until(lambda: len(entered) == PER_TENANT and pool.admission.waiting == TOTAL - 2)
        assert pool.admission.running_for("tenant-a") == PER_TENANT
        other = await asyncio.wait_for(
            run(pool, "result = 40 + 2", Origin("tenant-b", "toolu_b")), GENEROUS
        )
        assert other.ok and other.content == "42", other
    finally:
        release.set()
    done = await asyncio.wait_for(asyncio.gather(*flood), GENEROUS)
    assert [o.content for o in done] == ["done"] * TOTAL, done
    assert pool.admission.running == 0 and pool.admission.waiting == 0


# --- the admission alone ------------------------------------------------------------------


class Holder:
    """An execution holding a slot until released."""

    def __init__(self, admission: Admission, origin: Origin, wall_s: float = 60.0) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.task = asyncio.ensure_future(self._hold(admission, origin, wall_s))

    async def _hold(self, admission: Admission, origin: Origin, wall_s: float) -> None:
        async with admission.slot(origin, wall_s):
            self.entered.set()
            await self.release.wait()

    async def done(self) -> None:
        self.release.set()
        await asyncio.wait_for(self.task, GENEROUS)


async def test_the_wait_for_a_slot_ends_at_its_deadline_with_the_limit_named() -> None:
    admission = Admission(total=4, per_tenant=1, wait_s=0.2)
    held = Holder(admission, Origin("a"))
    await held.entered.wait()
    with pytest.raises(SlotRefused) as info:
        async with admission.slot(Origin("a"), 60.0):
            pass
    message = str(info.value)
    assert "within 0.2s" in message and "TOOLMESH_SANDBOX_SLOT_WAIT_S" in message
    assert "tenant 'a' runs the 1 custom-tool executions" in message
    busy = Admission(total=1, per_tenant=1, wait_s=60.0)
    other = Holder(busy, Origin("b"))
    await other.entered.wait()
    loop = asyncio.get_running_loop()
    with pytest.raises(SlotRefused) as info:  # the RPC's own deadline comes first
        async with busy.slot(Origin("a", deadline=loop.time() + 0.2), 60.0):
            pass
    assert "the call's deadline" in str(info.value)
    assert "all 1 sandbox execution slots are busy (TOOLMESH_SANDBOX_MAX_CONCURRENT)" in str(
        info.value
    )
    await held.done()
    await other.done()
    assert admission.running == admission.waiting == busy.running == busy.waiting == 0


async def test_a_nested_wait_ends_with_its_callers_wall_clock() -> None:
    """Another of the tenant's executions may still free a slot, so the nested call waits —
    but no longer than the custom tool that called it has left to run."""
    admission = Admission(total=8, per_tenant=2, wait_s=60.0)
    caller = Holder(admission, Origin("a", "toolu_x", 0), wall_s=0.3)
    independent = Holder(admission, Origin("a", "toolu_y", 0))
    await caller.entered.wait()
    await independent.entered.wait()
    with pytest.raises(SlotRefused) as info:
        async with admission.slot(Origin("a", "toolu_x", 1), 60.0):
            pass
    assert "the wall clock of the custom tool that called it" in str(info.value)
    await caller.done()
    await independent.done()


async def test_chains_that_wait_on_each_other_are_broken_and_the_rest_proceeds() -> None:
    """Two chains of one tenant hold its two slots and each wants a third: a deadlock. The
    newest waiter is refused; its caller then ends, and the other chain gets that slot."""
    admission = Admission(total=8, per_tenant=2, wait_s=60.0)
    x0 = Holder(admission, Origin("a", "toolu_x", 0))
    y0 = Holder(admission, Origin("a", "toolu_y", 0))
    await x0.entered.wait()
    await y0.entered.wait()
    x1 = Holder(admission, Origin("a", "toolu_x", 1))
    await until(lambda: admission.waiting == 1)
    assert not x1.entered.is_set()  # y0 may still end: x1 waits
    y1 = Holder(admission, Origin("a", "toolu_y", 1))
    with pytest.raises(SlotRefused, match="nested call refused"):
        await asyncio.wait_for(y1.task, GENEROUS)
    assert not x1.entered.is_set()
    await y0.done()  # y0 got the refusal and finished
    await asyncio.wait_for(x1.entered.wait(), GENEROUS)
    await x1.done()
    await x0.done()
    assert admission.running == admission.waiting == 0


async def test_nested_waiters_go_first_and_other_tenants_are_not_held_up() -> None:
    admission = Admission(total=2, per_tenant=2, wait_s=60.0)
    x0 = Holder(admission, Origin("a", "toolu_x", 0))
    b0 = Holder(admission, Origin("b", "toolu_b", 0))
    await x0.entered.wait()
    await b0.entered.wait()
    root = Holder(admission, Origin("c", "toolu_c", 0))
    await until(lambda: admission.waiting == 1)
    nested = Holder(admission, Origin("a", "toolu_x", 1))
    await until(lambda: admission.waiting == 2)
    await b0.done()
    await asyncio.wait_for(nested.entered.wait(), GENEROUS)
    assert not root.entered.is_set()
    await nested.done()
    await asyncio.wait_for(root.entered.wait(), GENEROUS)
    await root.done()
    await x0.done()
    # A waiter whose tenant is at its cap does not keep another tenant's from a free slot.
    capped = Admission(total=4, per_tenant=1, wait_s=60.0)
    a0 = Holder(capped, Origin("a"))
    await a0.entered.wait()
    a1 = Holder(capped, Origin("a"))
    await until(lambda: capped.waiting == 1)
    b = Holder(capped, Origin("b"))
    await asyncio.wait_for(b.entered.wait(), GENEROUS)
    await b.done()
    await a0.done()
    await asyncio.wait_for(a1.entered.wait(), GENEROUS)
    await a1.done()


async def test_a_cancelled_waiter_or_holder_gives_its_place_back() -> None:
    admission = Admission(total=1, per_tenant=1, wait_s=60.0)
    held = Holder(admission, Origin("a"))
    await held.entered.wait()
    waiter = Holder(admission, Origin("b"))
    await until(lambda: admission.waiting == 1)
    waiter.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter.task
    assert admission.waiting == 0
    held.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held.task
    assert admission.running == 0
    again = Holder(admission, Origin("b"))
    await asyncio.wait_for(again.entered.wait(), GENEROUS)
    await again.done()
