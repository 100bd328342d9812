"""SubmitBuildJob's idempotency key, at the repository on both backends: a submission repeated
with the same request_id (a retry after UNAVAILABLE, a lost answer, two replicas racing) gets
the job the first one queued, never a second build to pay for."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from services.sandbox.repository import Job, SqlSandboxRepository, keyed_job_id
from shared.db.models import ToolJobRow
from shared.errors import AlreadyExists

SPEC = {"request": "sum two numbers", "tool_name": "adder"}


def job_count(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        return int(s.scalar(select(func.count()).select_from(ToolJobRow)) or 0)


def submit(
    repo: SqlSandboxRepository, key: str, tenant: str = "t1", **spec: str
) -> tuple[Job, bool]:
    return repo.create_keyed_job(
        request_id=key,
        tenant_id=tenant,
        tool_name=spec.get("tool_name", SPEC["tool_name"]),
        spec={**SPEC, **spec},
        conversation_id="c1",
    )


def test_a_repeated_key_returns_the_first_job_and_queues_nothing(
    sessions: sessionmaker[Session],
) -> None:
    repo = SqlSandboxRepository(sessions)
    first, replayed = submit(repo, "build-42")
    assert not replayed and first.status == "queued"
    assert first.id == keyed_job_id("t1", "build-42")
    assert first.spec["request_id"] == "build-42"
    claimed = repo.claim_job("worker-1")  # the first job moved on: a retry still gets it
    assert claimed is not None and claimed.id == first.id
    again, replayed = submit(repo, "build-42")
    assert replayed and again.id == first.id and again.status == "building"
    assert job_count(sessions) == 1


def test_keys_are_per_tenant_and_a_new_key_is_a_new_job(sessions: sessionmaker[Session]) -> None:
    repo = SqlSandboxRepository(sessions)
    a, _ = submit(repo, "k")
    b, replayed_b = submit(repo, "k", tenant="t2")
    c, replayed_c = submit(repo, "k2")
    plain = repo.create_job(tenant_id="t1", tool_name="adder", spec=dict(SPEC))
    assert not replayed_b and not replayed_c
    assert len({a.id, b.id, c.id, plain.id}) == 4 and b.tenant_id == "t2"
    assert job_count(sessions) == 4


@pytest.mark.parametrize("changed", [{"request": "multiply"}, {"tool_name": "other"}])
def test_a_key_reused_for_another_request_is_refused(
    sessions: sessionmaker[Session], changed: dict[str, str]
) -> None:
    repo = SqlSandboxRepository(sessions)
    first, _ = submit(repo, "k")
    with pytest.raises(AlreadyExists) as refused:
        submit(repo, "k", **changed)
    assert refused.value.reason == "REQUEST_ID_REUSED"
    assert first.id in refused.value.message and "new request_id" in refused.value.message
    assert job_count(sessions) == 1


def test_submissions_racing_with_one_key_make_one_job(sessions: sessionmaker[Session]) -> None:
    """As two replicas retrying the same submission would: one inserts, the others read it."""
    repo = SqlSandboxRepository(sessions)
    start = threading.Barrier(6)

    def racer(_: int) -> tuple[str, bool]:
        start.wait(10)
        job, replayed = submit(repo, "race")
        return job.id, replayed

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(racer, range(6)))
    assert len({job_id for job_id, _ in results}) == 1
    assert sorted(replayed for _, replayed in results) == [False] + [True] * 5
    assert job_count(sessions) == 1
