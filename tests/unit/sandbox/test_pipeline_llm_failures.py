"""The build pipeline when its LLM calls fail or answer badly (the real SDK against the loopback
fake Messages API, a real database): transient failures queue the job again per its attempts
policy and then fail it with the reason; permanent ones fail it at once; a refused, cut or
unusable answer is a rejection that says so; every reply is priced into the job and logged in
usage_log once — also when the reply turned out unusable."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.sandbox.core import Sandbox
from services.sandbox.host import WorkerPool
from services.sandbox.pipeline import JobPipeline
from services.sandbox.repository import SqlSandboxRepository
from shared.llm.client import LLMClient, Usage, cost_usd
from shared.llm.config import DEFAULT_MODEL_CONFIGS
from shared.telemetry.usage import UsageEntry
from tests.support.fake_anthropic import FakeAnthropic, Reply, overloaded

ASYNC = pytest.mark.asyncio(loop_scope="module")
SONNET, HAIKU = DEFAULT_MODEL_CONFIGS

GOOD_BUILD = {
    "name": "shout",
    "description": "Upper-cases a text.",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
    "code": "result = inputs['text'].upper()",
    "tests": [{"inputs": {"text": "ab"}, "expect": "AB"}],
}


class MemoryUsage:
    def __init__(self) -> None:
        self.entries: list[UsageEntry] = []

    def record(self, entry: UsageEntry) -> None:
        self.entries.append(entry)

    def conversation_spent(self, tenant_id: str, conversation_id: str) -> float:
        return sum(e.cost_usd for e in self.entries)


def pipeline(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    llm: Callable[[str], LLMClient],
    usage: MemoryUsage,
    max_attempts: int = 2,
) -> tuple[JobPipeline, SqlSandboxRepository]:
    repo = SqlSandboxRepository(sessions)
    pipe = JobPipeline(
        repo, Sandbox(pool), llm, max_attempts=max_attempts, usage=usage, retry_backoff_s=0
    )
    return pipe, repo


@ASYNC
async def test_a_transient_llm_failure_queues_the_job_again_then_fails_it_with_the_reason(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    fake: FakeAnthropic,
    llm: Callable[[str], LLMClient],
) -> None:
    pipe, repo = pipeline(sessions, pool, llm, MemoryUsage(), max_attempts=2)
    job = repo.create_job(tenant_id="t1", tool_name="", spec={"request": "shout"})
    fake.script(overloaded())
    first = await pipe.run_once()
    assert first is not None and first.id == job.id
    assert first.status == "queued" and first.attempts == 1, first.result
    assert first.result is not None and first.result["reason"] == "LLM_UNAVAILABLE"
    fake.script(Reply(status=429, error_type="rate_limit_error"))
    last = await pipe.run_once()
    assert last is not None and last.status == "failed" and last.attempts == 2
    assert last.result is not None and last.result["reason"] == "LLM_RATE_LIMITED"
    assert last.result["stage"] == "build" and "gave up after 2 attempt(s)" in last.result["error"]


@ASYNC
@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (
            Reply(status=404, error_type="not_found_error", error_message="model: x"),
            "LLM_MODEL_NOT_FOUND",
        ),
        (
            Reply(
                status=400,
                error_type="invalid_request_error",
                error_message="prompt is too long: 300000 tokens > 200000 maximum",
            ),
            "LLM_PROMPT_TOO_LONG",
        ),
        (Reply(status=401, error_type="authentication_error"), "LLM_AUTH"),
    ],
)
async def test_a_permanent_llm_failure_fails_the_job_at_once_with_the_reason(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    fake: FakeAnthropic,
    llm: Callable[[str], LLMClient],
    reply: Reply,
    reason: str,
) -> None:
    pipe, repo = pipeline(sessions, pool, llm, MemoryUsage(), max_attempts=3)
    repo.create_job(tenant_id="t1", tool_name="", spec={"request": "shout"})
    fake.script(reply)
    done = await pipe.run_once()
    assert done is not None and done.status == "failed" and done.attempts == 1, done
    assert done.result is not None and done.result["reason"] == reason
    assert done.result["stage"] == "build" and "LLM call failed" in done.result["error"]


@ASYNC
async def test_malformed_responses_fail_the_job_with_a_reason_not_an_internal_error(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    fake: FakeAnthropic,
    llm: Callable[[str], LLMClient],
) -> None:
    pipe, repo = pipeline(sessions, pool, llm, MemoryUsage(), max_attempts=1)
    repo.create_job(tenant_id="t1", tool_name="", spec={"request": "shout"})
    fake.script(Reply(raw=b'{"id": "msg_1", "content": [{"ty'))
    done = await pipe.run_once()
    assert done is not None and done.status == "failed"
    assert done.result is not None and done.result["reason"] == "LLM_BAD_RESPONSE"


@ASYNC
async def test_an_unusable_answer_is_rejected_saying_why_and_its_cost_is_kept_and_logged(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    fake: FakeAnthropic,
    llm: Callable[[str], LLMClient],
) -> None:
    usage = MemoryUsage()
    pipe, repo = pipeline(sessions, pool, llm, usage)
    job = repo.create_job(tenant_id="t9", tool_name="", spec={"request": "shout"})
    fake.script(Reply(text="I would rather not.", input_tokens=1000, output_tokens=100))
    prose = await pipe.run_once()
    paid = cost_usd(Usage(1000, 100), SONNET)
    assert prose is not None and prose.status == "rejected"
    assert prose.result is not None and prose.result["cost_usd"] == pytest.approx(paid)
    (entry,) = usage.entries
    assert (entry.tenant_id, entry.tool_name, entry.input_tokens) == ("t9", "tool_builder", 1000)
    assert entry.tool_use_id == f"job:{job.id}"
    cut = json.dumps(GOOD_BUILD)[:40]
    repo.create_job(tenant_id="t9", tool_name="", spec={"request": "shout"})
    fake.script(Reply(text=cut, stop_reason="max_tokens"))
    truncated = await pipe.run_once()
    assert truncated is not None and truncated.status == "rejected"
    assert truncated.result is not None and "cut short" in truncated.result["error"]
    repo.create_job(tenant_id="t9", tool_name="", spec={"request": "shout"})
    fake.script(Reply(text="", stop_reason="refusal"))
    refused = await pipe.run_once()
    assert refused is not None and refused.status == "rejected"
    assert refused.result is not None and "refused" in refused.result["error"]
    assert len(usage.entries) == 3


@ASYNC
async def test_a_review_that_fails_keeps_the_builds_cost_and_names_its_stage(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    fake: FakeAnthropic,
    llm: Callable[[str], LLMClient],
) -> None:
    usage = MemoryUsage()
    pipe, repo = pipeline(sessions, pool, llm, usage, max_attempts=1)
    repo.create_job(tenant_id="t1", tool_name="", spec={"request": "shout"})
    fake.script(
        Reply(text=json.dumps(GOOD_BUILD), input_tokens=200, output_tokens=300),
        overloaded(),
    )
    done = await pipe.run_once()
    assert done is not None and done.status == "failed", done.result
    assert done.result is not None and done.result["stage"] == "review"
    assert done.result["cost_usd"] == pytest.approx(cost_usd(Usage(200, 300), SONNET))
    assert [e.tool_name for e in usage.entries] == ["tool_builder"]


@ASYNC
async def test_a_build_whose_answer_broke_off_keeps_what_it_was_billed_for(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    fake: FakeAnthropic,
    llm: Callable[[str], LLMClient],
) -> None:
    """The provider bills an answer it began even when its stream then fails: the job's
    cost_usd and usage_log count the input the broken attempt reported."""
    usage = MemoryUsage()
    pipe, repo = pipeline(sessions, pool, llm, usage, max_attempts=1)
    repo.create_job(tenant_id="t1", tool_name="", spec={"request": "shout"})
    fake.script(Reply(text="x" * 200, input_tokens=700, stream_error="overloaded_error"))
    done = await pipe.run_once()
    assert done is not None and done.status == "failed", done.result
    assert done.result is not None and done.result["reason"] == "LLM_UNAVAILABLE"
    billed = cost_usd(Usage(700, 0), SONNET)
    assert done.result["cost_usd"] == pytest.approx(billed)
    (entry,) = usage.entries
    assert (entry.tool_name, entry.input_tokens, entry.output_tokens) == ("tool_builder", 700, 0)
    assert entry.cost_usd == pytest.approx(billed)


@ASYNC
async def test_a_worker_stopped_mid_answer_still_logs_what_the_answer_was_billed_for(
    sessions: sessionmaker[Session],
    pool: WorkerPool,
    fake: FakeAnthropic,
    llm: Callable[[str], LLMClient],
) -> None:
    usage = MemoryUsage()
    pipe, repo = pipeline(sessions, pool, llm, usage)
    repo.create_job(tenant_id="t1", tool_name="", spec={"request": "shout"})
    fake.script(Reply(text=json.dumps(GOOD_BUILD), input_tokens=800, pace_s=0.2))
    run = asyncio.ensure_future(pipe.run_once())
    await fake.requested()
    await asyncio.sleep(1.0)  # message_start (with its usage) came 0.2 s after the request
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    (entry,) = usage.entries
    assert (entry.tool_name, entry.input_tokens) == ("tool_builder", 800)
