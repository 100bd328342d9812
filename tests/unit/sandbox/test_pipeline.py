"""The build pipeline against a real worker pool, a real database (SQLite and PostgreSQL) and the
real `anthropic` SDK talking to a local fake Messages API: a request becomes an approved tool,
a tool whose tests fail is rejected with its results recorded, no LLM is a failed job, and
concurrent claimants never take the same job. Also the cancellation of an execution."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import pytest_asyncio
from sqlalchemy.orm import Session, sessionmaker

from services.sandbox.core import Sandbox
from services.sandbox.host import Limits, WorkerPool
from services.sandbox.pipeline import JobPipeline, parse_json_reply
from services.sandbox.repository import CustomTool, SqlSandboxRepository
from shared.errors import AlreadyExists
from shared.llm.client import LLMClient, create_llm_client_for_role
from tests.support.fake_anthropic import FakeAnthropic, Reply, running_fake

ASYNC = pytest.mark.asyncio(loop_scope="module")

GOOD_BUILD = {
    "name": "word_count",
    "description": "Counts the words of a text.",
    "input_schema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
    "code": "result = len(inputs['text'].split())",
    "tests": [
        {"inputs": {"text": "a b c"}, "expect": "3"},
        {"inputs": {"text": ""}, "expect": "0"},
    ],
}


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
    """Clients of the fake, closed after the test."""
    env = {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": fake.base_url}
    made: list[LLMClient] = []

    def for_role(role: str) -> LLMClient:
        made.append(create_llm_client_for_role(role, None, env=env, max_retries=0))
        return made[-1]

    yield for_role
    for client in made:
        await client.aclose()


def pipeline(
    sessions: sessionmaker[Session], pool: WorkerPool, llm: Callable[[str], LLMClient]
) -> tuple[JobPipeline, SqlSandboxRepository]:
    repo = SqlSandboxRepository(sessions)
    return JobPipeline(repo, Sandbox(pool), llm), repo


@ASYNC
async def test_a_request_becomes_an_approved_tool(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    fake: FakeAnthropic,
    llm: Callable[[str], LLMClient],
) -> None:
    pipe, repo = pipeline(sessions, pool, llm)
    fake.script(
        Reply(text="```json\n" + json.dumps(GOOD_BUILD) + "\n```"),
        Reply(text='{"verdict": "approve", "reason": "counts words"}'),
    )
    job = repo.create_job(tenant_id="t1", tool_name="", spec={"request": "count words"})
    assert job.status == "queued"
    done = await pipe.run_once()
    assert done is not None and done.id == job.id
    assert done.status == "approved" and done.progress_pct == 100, done.result
    assert done.result is not None and done.result["test_results"]["passed"] == 2
    tool = repo.get("word_count")
    assert tool is not None and tool.status == "approved" and tool.tenant_id == "t1"
    assert tool.created_by == "builder_agent" and tool.test_results is not None
    builder_request = fake.requests[-2].body
    assert builder_request["max_tokens"] > 0 and "count words" in json.dumps(builder_request)
    assert await pipe.run_once() is None  # the queue is empty


@ASYNC
async def test_failing_tests_reject_the_tool_with_results(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    fake: FakeAnthropic,
    llm: Callable[[str], LLMClient],
) -> None:
    pipe, repo = pipeline(sessions, pool, llm)
    wrong = {**GOOD_BUILD, "name": "bad_count", "code": "result = 42"}
    fake.script(Reply(text=json.dumps(wrong)))
    repo.create_job(tenant_id="t1", tool_name="", spec={"request": "count words"})
    done = await pipe.run_once()
    assert done is not None and done.status == "rejected"
    assert "tests failed" in done.result["error"]  # type: ignore[index]
    tool = repo.get("bad_count")
    assert tool is not None and tool.status == "rejected" and tool.rejection_reason
    assert tool.test_results is not None and tool.test_results["passed"] == 0


@ASYNC
async def test_unusable_model_output_is_rejected_and_no_llm_is_a_failed_job(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    fake: FakeAnthropic,
    llm: Callable[[str], LLMClient],
) -> None:
    pipe, repo = pipeline(sessions, pool, llm)
    fake.script(Reply(text="I cannot do that."))
    repo.create_job(tenant_id="t1", tool_name="x", spec={"request": "?"})
    done = await pipe.run_once()
    assert done is not None and done.status == "rejected"
    offline = JobPipeline(
        repo, Sandbox(pool), lambda role: create_llm_client_for_role(role, None, env={})
    )
    repo.create_job(tenant_id="t1", tool_name="y", spec={"request": "?"})
    failed = await offline.run_once()
    assert failed is not None and failed.status == "failed"
    assert failed.result is not None and failed.result["reason"] == "LLM_NOT_CONFIGURED"


def test_concurrent_claimants_never_take_the_same_job(sessions: sessionmaker[Session]) -> None:
    repo = SqlSandboxRepository(sessions)
    ids = {repo.create_job(tenant_id="t", tool_name="", spec={}).id for _ in range(6)}
    claimed: list[str] = []

    async def claimant() -> None:
        while True:
            job = await asyncio.to_thread(repo.claim_job)
            if job is None:
                return
            claimed.append(job.id)

    async def main() -> None:
        await asyncio.gather(*(claimant() for _ in range(4)))

    asyncio.run(main())
    assert sorted(claimed) == sorted(ids)


def test_registration_bumps_the_version_and_guards_names(sessions: sessionmaker[Session]) -> None:
    repo = SqlSandboxRepository(sessions)
    first = repo.register(CustomTool(name="mine", implementation="result = 1", tenant_id="t1"))
    repo.record_audit("mine", status="approved", test_results=None, rejection_reason=None)
    second = repo.register(CustomTool(name="mine", implementation="result = 2", tenant_id="t1"))
    assert (first.version, second.version) == (1, 2)
    assert second.status == "draft" and second.implementation == "result = 2"
    with pytest.raises(AlreadyExists):
        repo.register(CustomTool(name="mine", implementation="result = 3", tenant_id="t2"))
    assert repo.list_jobs("nobody") == []


@ASYNC
async def test_a_cancelled_execution_kills_its_worker_at_once(pool: WorkerPool) -> None:
    task = asyncio.ensure_future(
        pool.run(
            code="while True:\n    pass",
            inputs={},
            tool_name="spin",
            limits=Limits(wall_seconds=60, cpu_seconds=60),
        )
    )
    await asyncio.sleep(0.5)
    running = [w for w in pool._workers.values() if not w.exited.done()]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    busy = [w for w in running if w.pidfd < 0]  # the one that ran: closed after the kill
    assert busy, "the running worker was not found"
    deadline = asyncio.get_running_loop().time() + 5
    while not all(w.exited.done() for w in busy):
        assert asyncio.get_running_loop().time() < deadline, "worker still alive after cancel"
        await asyncio.sleep(0.05)
    assert all(w.exited.result()[1] == 9 for w in busy)  # SIGKILL


def test_json_replies_are_found_in_prose_or_fences() -> None:
    assert parse_json_reply('Sure!\n{"a": 1}\nDone.') == {"a": 1}
    assert parse_json_reply('```json\n{"b": [1]}\n```') == {"b": [1]}
