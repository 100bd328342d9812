"""The worker pool keeps its configured number of idle workers, however wide the bursts of
executions: a call that finds the pool empty starts its worker on the spot and takes nothing
from the pool, so nothing is added back for it."""

from __future__ import annotations

import asyncio
import time

from services.sandbox.host import Limits, WorkerPool


async def settled(pool: WorkerPool) -> None:
    deadline = time.monotonic() + 30
    while pool._refill_tasks:
        assert time.monotonic() < deadline, "the pool's refills never ended"
        await asyncio.sleep(0.02)


async def test_bursts_wider_than_the_pool_do_not_grow_it() -> None:
    pool = WorkerPool(size=2, max_concurrent=8, tenant_max_concurrent=8)
    await pool.start()
    try:
        for _ in range(4):
            outcomes = await asyncio.gather(
                *(
                    pool.run(code="result = 1", inputs={}, tool_name="t", limits=Limits())
                    for _ in range(8)
                )
            )
            assert all(o.ok for o in outcomes), [o.message for o in outcomes]
            await settled(pool)
            assert pool._ready.qsize() == 2
        # Still a full pool of fresh workers: the next call takes one at once.
        outcome = await pool.run(code="result = 2", inputs={}, tool_name="t", limits=Limits())
        assert outcome.ok
        await settled(pool)
        assert pool._ready.qsize() == 2
    finally:
        await pool.close()
