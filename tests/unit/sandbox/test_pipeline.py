"""The build pipeline against a real worker pool, a real database (SQLite and PostgreSQL) and the
real `anthropic` SDK talking to a local fake Messages API: a request becomes an approved tool,
a tool whose tests fail is rejected with its results recorded, no LLM is a failed job, and
concurrent claimants never take the same job. A claim is a lease: a job whose worker died is
claimed again (a bounded number of times), and a worker whose lease was taken over lets the job
go. Also the cancellation of an execution."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.sandbox.core import Sandbox
from services.sandbox.host import Limits, WorkerPool
from services.sandbox.pipeline import JobPipeline, parse_json_reply
from services.sandbox.repository import CustomTool, LeaseLost, SqlSandboxRepository
from shared.errors import AlreadyExists, NotFound
from shared.llm.client import LLMClient, create_llm_client_for_role
from tests.support.fake_anthropic import FakeAnthropic, Reply

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


class Clock:
    """UTC now, moved by hand."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def test_a_job_whose_worker_stopped_renewing_its_lease_is_claimed_again_and_fenced(
    sessions: sessionmaker[Session],
) -> None:
    clock = Clock()
    repo = SqlSandboxRepository(sessions, clock=clock)
    job = repo.create_job(tenant_id="t", tool_name="", spec={})
    first = repo.claim_job("a", lease_s=60)
    assert first is not None and first.id == job.id
    assert (first.attempts, first.claimed_by, first.status) == (1, "a", "building")
    repo.update_job(job.id, lease=first.lease, status="testing", progress_pct=60)
    clock.advance(45)
    assert repo.heartbeat(first.lease)
    clock.advance(45)  # 45 s after the last renewal: still held
    assert repo.claim_job("b", lease_s=60) is None
    clock.advance(16)  # 61 s: worker a is presumed dead
    second = repo.claim_job("b", lease_s=60)
    assert second is not None and second.id == job.id
    assert (second.attempts, second.claimed_by, second.status) == (2, "b", "building")
    assert not repo.heartbeat(first.lease)
    with pytest.raises(LeaseLost) as info:
        repo.update_job(job.id, lease=first.lease, status="approved", progress_pct=100)
    assert info.value.reason == "JOB_LEASE_LOST"
    done = repo.update_job(job.id, lease=second.lease, status="approved", progress_pct=100)
    assert done.status == "approved" and done.claimed_by == "b"
    clock.advance(3600)
    assert repo.claim_job("c", lease_s=60) is None  # a finished job is never claimed again


def test_a_job_abandoned_max_attempts_times_is_failed_with_a_clear_reason(
    sessions: sessionmaker[Session],
) -> None:
    clock = Clock()
    repo = SqlSandboxRepository(sessions, clock=clock)
    stuck = repo.create_job(tenant_id="t", tool_name="", spec={})
    for worker in ("a", "b"):
        claimed = repo.claim_job(worker, lease_s=60, max_attempts=2)
        assert claimed is not None and claimed.id == stuck.id
        clock.advance(61)
    fresh = repo.create_job(tenant_id="t", tool_name="", spec={})
    claimed = repo.claim_job("c", lease_s=60, max_attempts=2)
    # The stuck job is failed, and the same call goes on to the next claimable one.
    assert claimed is not None and claimed.id == fresh.id
    failed = repo.get_job(stuck.id, "t")
    assert failed.status == "failed" and failed.progress_pct == 100 and failed.result is not None
    assert failed.result["reason"] == "JOB_ABANDONED" and failed.result["attempts"] == 2
    assert "by b" in failed.result["error"], failed.result  # names the last worker


def test_concurrent_claimants_reclaim_each_stale_job_exactly_once(
    sessions: sessionmaker[Session],
) -> None:
    clock = Clock()
    repo = SqlSandboxRepository(sessions, clock=clock)
    ids = {repo.create_job(tenant_id="t", tool_name="", spec={}).id for _ in range(6)}
    while repo.claim_job("dead", lease_s=60) is not None:
        pass
    clock.advance(61)
    claimed: list[tuple[str, int]] = []

    async def claimant(name: str) -> None:
        while True:
            job = await asyncio.to_thread(repo.claim_job, name, lease_s=60)
            if job is None:
                return
            claimed.append((job.id, job.attempts))

    async def main() -> None:
        await asyncio.gather(*(claimant(f"w{i}") for i in range(4)))

    asyncio.run(main())
    assert sorted(claimed) == sorted((i, 2) for i in ids)


@ASYNC
async def test_a_job_left_in_testing_by_a_dead_worker_is_finished_by_another(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    fake: FakeAnthropic,
    llm: Callable[[str], LLMClient],
) -> None:
    clock = Clock()
    repo = SqlSandboxRepository(sessions, clock=clock)
    job = repo.create_job(tenant_id="t1", tool_name="", spec={"request": "count words"})
    dead = repo.claim_job("dead", lease_s=60)
    assert dead is not None
    repo.update_job(job.id, lease=dead.lease, status="testing", progress_pct=60)
    pipe = JobPipeline(repo, Sandbox(pool), llm, worker_id="alive", lease_s=60)
    assert await pipe.run_once() is None  # its lease is still live
    clock.advance(61)
    fake.script(
        Reply(text=json.dumps(GOOD_BUILD)), Reply(text='{"verdict": "approve", "reason": "ok"}')
    )
    done = await pipe.run_once()
    assert done is not None and done.id == job.id and done.status == "approved", done
    assert (done.attempts, done.claimed_by) == (2, "alive")


@ASYNC
async def test_a_worker_renews_its_lease_and_lets_the_job_go_when_it_is_taken_over(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    fake: FakeAnthropic,
    llm: Callable[[str], LLMClient],
) -> None:
    repo = SqlSandboxRepository(sessions)
    job = repo.create_job(tenant_id="t1", tool_name="", spec={"request": "count words"})
    hold = threading.Event()  # the builder's model answers only when the test says so
    fake.script(Reply(text=json.dumps(GOOD_BUILD), hold=hold))
    pipe = JobPipeline(repo, Sandbox(pool), llm, worker_id="a", lease_s=1.5)
    run = asyncio.ensure_future(pipe.run_once())
    loop = asyncio.get_running_loop()
    try:
        deadline = loop.time() + 15
        claimed_at = None
        while True:  # until the lease was renewed more than a whole lease after the claim
            current = repo.get_job(job.id, "t1")
            if current.claimed_at is not None:
                claimed_at = claimed_at or current.claimed_at
                if current.claimed_at - claimed_at > timedelta(seconds=1.6):
                    break
            assert loop.time() < deadline, "the lease was never renewed"
            await asyncio.sleep(0.05)
        assert repo.claim_job("b", lease_s=1.5) is None  # renewed, so not stale
        later = SqlSandboxRepository(sessions, clock=lambda: datetime.now(UTC) + timedelta(hours=1))
        stolen = later.claim_job("b", lease_s=1.5)  # as if worker a had stopped renewing
        assert stolen is not None and stolen.id == job.id and stolen.attempts == 2
        assert await asyncio.wait_for(run, 10) is None  # a let it go
    finally:
        hold.set()
        if not run.done():
            run.cancel()
    after = repo.get_job(job.id, "t1")
    assert (after.status, after.claimed_by, after.attempts) == ("building", "b", 2)
    assert repo.get("word_count") is None  # a wrote nothing after losing the lease


@ASYNC
async def test_a_job_whose_model_names_another_tenants_tool_never_touches_it(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    fake: FakeAnthropic,
    llm: Callable[[str], LLMClient],
) -> None:
    """A rejected build recorded its rejection on whatever custom tool bore the name the model
    chose: a request steering the model to another tenant's tool name rejected that tool."""
    pipe, repo = pipeline(sessions, pool, llm)
    theirs = repo.register(
        CustomTool(name="word_count", implementation="result = 1", tenant_id="t2")
    )
    repo.record_audit(
        theirs.name, tenant_id="t2", status="approved", test_results=None, rejection_reason=None
    )
    for code in ("result = (", GOOD_BUILD["code"]):  # refused as invalid, then as taken
        fake.script(Reply(text=json.dumps({**GOOD_BUILD, "code": code})))
        repo.create_job(tenant_id="t1", tool_name="", spec={"request": "count words"})
        done = await pipe.run_once()
        assert done is not None and done.status in ("rejected", "failed"), done
    after = repo.get("word_count")
    assert after is not None and (after.tenant_id, after.status) == ("t2", "approved")
    assert after.rejection_reason is None and after.implementation == "result = 1"
    with pytest.raises(NotFound):
        repo.record_audit(
            "word_count", tenant_id="t1", status="rejected", test_results=None, rejection_reason="x"
        )


def test_registration_bumps_the_version_and_guards_names(sessions: sessionmaker[Session]) -> None:
    repo = SqlSandboxRepository(sessions)
    first = repo.register(CustomTool(name="mine", implementation="result = 1", tenant_id="t1"))
    repo.record_audit(
        "mine", tenant_id="t1", status="approved", test_results=None, rejection_reason=None
    )
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
