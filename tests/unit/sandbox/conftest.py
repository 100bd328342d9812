"""Fixtures the sandbox's unit tests share: a worker pool per module, and the fake Messages API
with clients of it for the build pipeline's roles. A module that needs another pool (limits,
environment) defines its own `pool`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import pytest_asyncio

from services.sandbox.host import WorkerPool
from shared.llm.client import LLMClient, create_llm_client_for_role
from tests.support.fake_anthropic import FakeAnthropic, running_fake


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool() -> AsyncIterator[WorkerPool]:
    pool = WorkerPool(size=2)
    await pool.start()
    yield pool
    await pool.close()


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeAnthropic]:
    with running_fake() as f:
        yield f


@pytest_asyncio.fixture(loop_scope="module")
async def llm(fake: FakeAnthropic) -> AsyncIterator[Callable[[str], LLMClient]]:
    """Clients of the fake by role (no retries), closed after the test."""
    env = {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": fake.base_url}
    made: list[LLMClient] = []

    def for_role(role: str) -> LLMClient:
        made.append(create_llm_client_for_role(role, None, env=env, max_retries=0))
        return made[-1]

    yield for_role
    for client in made:
        await client.aclose()
