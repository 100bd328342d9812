"""The sandbox's background job workers outlive a failure of any kind: a claim that raises an
unexpected error is logged with its traceback and retried after a poll, never the end of the
worker (only toolmesh errors were caught: any other ended the task silently)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from services.sandbox.pipeline import JobWorkers


class Flaky:
    """A pipeline whose first claims fail as a bug would, then run one job, then find none."""

    def __init__(self) -> None:
        self.claims = 0
        self.ran = asyncio.Event()

    async def run_once(self) -> Any:
        self.claims += 1
        if self.claims <= 2:
            raise KeyError("a bug in claiming")
        if self.claims == 3:
            self.ran.set()
            return object()
        return None


async def test_a_worker_survives_an_unexpected_failure(caplog: pytest.LogCaptureFixture) -> None:
    pipeline = Flaky()
    workers = JobWorkers(pipeline, count=1, poll_s=0.01)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="services.sandbox.pipeline"):
        workers.start()
        try:
            await asyncio.wait_for(pipeline.ran.wait(), 5)
        finally:
            await workers.stop()
    assert pipeline.claims >= 3
    failures = [r for r in caplog.records if "unexpected failure" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info for r in failures)
