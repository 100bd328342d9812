"""The self-extending tool pipeline: a queued `tool_jobs` row becomes a custom tool.

    queued ──claim──▶ building (ToolBuilder asks the LLM for name, schema, code, tests)
           ──▶ testing (ToolAuditor runs every test in the sandbox, then asks the LLM to review)
           ──▶ approved | rejected (bad output, failing tests, a reject verdict)
             | failed (no LLM, the database or the sandbox is down)

An LLM call that fails transiently (rate limit, overload, timeout, a broken or malformed
response: already retried by shared.llm within its deadline) puts the job back in the queue
after a backoff while it has claims left (`max_attempts`); after its last claim, or at once on a
permanent failure (credentials, unknown model, prompt too long), the job is `failed` with the
reason, the stage and the attempts. Every LLM reply is priced into the job's `cost_usd` (also
when the reply turns out unusable) and recorded in `usage_log` under the job's tenant.

Workers claim jobs safely when several run at once (see SqlSandboxRepository.claim_job). A
claim is a lease the worker renews while it works (every third of `lease_s`); a job whose worker
died is claimed again once its lease expires, at most `max_attempts` times, then `failed`. A
worker that finds its lease taken over stops work on the job at once and writes nothing more to
it. The LLM is reached through shared.llm (model and max_output_tokens from the role's config)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.sandbox.admission import Origin
from services.sandbox.core import NAME_RE, Sandbox, validate_definition
from services.sandbox.repository import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    CustomTool,
    Job,
    Lease,
    LeaseLost,
    SqlSandboxRepository,
)
from shared.errors import (
    DeadlineExceeded,
    InvalidArgument,
    ResourceExhausted,
    ToolmeshError,
    Unavailable,
)
from shared.llm.client import LLMClient, LLMReply, LLMSpend, charge_billed
from shared.llm.config import ROLE_TOOL_AUDITOR, ROLE_TOOL_BUILDER
from shared.llm.prompts import TOOL_AUDITOR_SYSTEM, TOOL_BUILDER_SYSTEM
from shared.telemetry.tracing import tracer
from shared.telemetry.usage import UsageEntry, UsageLog

logger = logging.getLogger(__name__)

MAX_TESTS = 6
LlmForRole = Callable[[str], LLMClient]
# Waiting before a job whose LLM call failed transiently is queued again: this times 2^(claim-1),
# at most MAX_RETRY_BACKOFF_S, or the provider's retry-after when it is longer (within the cap).
DEFAULT_RETRY_BACKOFF_S = 5.0
MAX_RETRY_BACKOFF_S = 60.0


class BuildRejected(Exception):
    """The built tool is not acceptable; the message is the rejection reason."""


class LlmStageFailed(Exception):
    """An LLM call of a job's stage failed (after shared.llm's own retries)."""

    def __init__(self, stage: str, error: ToolmeshError) -> None:
        super().__init__(f"{stage}: {error.message}")
        self.stage = stage
        self.error = error

    @property
    def transient(self) -> bool:
        return isinstance(self.error, Unavailable | DeadlineExceeded | ResourceExhausted)


@dataclass
class JobSpend:
    """What a job's LLM calls cost, counted as each reply arrives (and recorded once)."""

    job: Job | None = None
    usage: UsageLog | None = None
    usd: float = 0.0
    calls: int = 0

    async def add(self, spend: LLMSpend, role: str) -> None:
        """Count what one LLM call was billed for — a failed call's broken attempts too."""
        self.usd += spend.cost_usd
        self.calls += 1
        if self.usage is None or self.job is None:
            return
        entry = UsageEntry.of_llm_spend(
            spend,
            tenant_id=self.job.tenant_id,
            tool_name=role,
            conversation_id=self.job.conversation_id or "",
            tool_use_id=f"job:{self.job.id}",
        )
        try:
            await asyncio.to_thread(self.usage.record, entry)
        except ToolmeshError as exc:  # the job still reports it in its cost_usd
            logger.warning("build job %s: cannot record LLM usage: %s", self.job.id, exc.message)


async def _ask(
    llm: LlmForRole,
    role: str,
    stage: str,
    spend: JobSpend,
    messages: list[dict[str, Any]],
    system: str,
) -> LLMReply:
    """One LLM call of a stage: priced into `spend` the moment it answers; a refused or cut
    answer is a rejection that says so; a failed call an LlmStageFailed."""
    try:
        reply = await llm(role).complete(messages, system=system)
    except (ToolmeshError, asyncio.CancelledError) as exc:  # cancelled: the worker stops
        await charge_billed(exc, lambda billed: spend.add(billed, role))  # or lost the lease
        if isinstance(exc, ToolmeshError):
            raise LlmStageFailed(stage, exc) from exc
        raise
    await spend.add(reply.spend, role)
    if reply.refused:
        raise BuildRejected(f"the {stage} model refused the request (stop_reason refusal)")
    if reply.truncated:
        raise BuildRejected(
            f"the {stage} model's answer was cut short (stop_reason {reply.stop_reason} after "
            f"{reply.usage.output_tokens} output tokens); raise the role's max_output_tokens "
            "or ask for a smaller tool"
        )
    return reply


@dataclass
class Built:
    """What ToolBuilder produced."""

    name: str
    description: str
    input_schema: dict[str, Any]
    code: str
    tests: list[dict[str, Any]]


def parse_json_reply(text: str) -> dict[str, Any]:
    """The one JSON object of a model reply (code fences and prose around it tolerated)."""
    fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", text, re.DOTALL)
    candidate = fenced.group(1) if fenced else text[text.find("{") : text.rfind("}") + 1]
    try:
        obj = json.loads(candidate)
    except json.JSONDecodeError as exc:
        raise BuildRejected(f"the model's reply is not a JSON object: {exc.msg}") from None
    if not isinstance(obj, dict):
        raise BuildRejected("the model's reply is not a JSON object")
    return obj


def parse_built(obj: dict[str, Any], proposed_name: str) -> Built:
    name = proposed_name or str(obj.get("name") or "")
    code, schema = obj.get("code"), obj.get("input_schema") or {"type": "object"}
    tests = obj.get("tests") or []
    if not NAME_RE.match(name):
        raise BuildRejected(f"the tool name {name!r} is not valid ([a-zA-Z0-9_-]{{1,64}})")
    if not isinstance(code, str) or not code.strip():
        raise BuildRejected("the build has no code")
    if not isinstance(schema, dict):
        raise BuildRejected("input_schema is not a JSON object")
    if not isinstance(tests, list) or not tests:
        raise BuildRejected("the build has no tests")
    clean: list[dict[str, Any]] = []
    for test in tests[:MAX_TESTS]:
        if not isinstance(test, dict) or not isinstance(test.get("inputs", {}), dict):
            raise BuildRejected("every test needs an `inputs` object")
        clean.append({"inputs": test.get("inputs") or {}, "expect": str(test.get("expect", ""))})
    return Built(name, str(obj.get("description") or ""), schema, code, clean)


class ToolBuilder:
    """Asks the tool_builder model for a tool."""

    def __init__(self, llm: LlmForRole) -> None:
        self._llm = llm

    async def build(
        self, request: str, proposed_name: str, spend: JobSpend | None = None
    ) -> tuple[Built, float]:
        spend = JobSpend() if spend is None else spend
        before = spend.usd
        ask = f"Build this tool: {request}"
        if proposed_name:
            ask += f"\nName it {proposed_name!r}."
        reply = await _ask(
            self._llm,
            ROLE_TOOL_BUILDER,
            "build",
            spend,
            [{"role": "user", "content": ask}],
            TOOL_BUILDER_SYSTEM,
        )
        return parse_built(parse_json_reply(reply.text), proposed_name), spend.usd - before


class ToolAuditor:
    """Runs a built tool's tests in the sandbox, then asks the tool_auditor model to review."""

    def __init__(self, sandbox: Sandbox, llm: LlmForRole) -> None:
        self._sandbox = sandbox
        self._llm = llm

    async def run_tests(self, built: Built, tenant_id: str = "") -> dict[str, Any]:
        limits = self._sandbox.caps.resolve()
        origin = Origin(tenant=tenant_id)  # its tests count against the job's tenant's cap
        outcomes = []
        for test in built.tests:
            execution = await self._sandbox.execute(
                tool_name=built.name,
                code=built.code,
                inputs=test["inputs"],
                limits=limits,
                origin=origin,
            )
            content, error = execution.result.content, execution.result.error
            passed = error is None and test["expect"] in content
            if error is None and not passed:
                error = f"expected the result to contain {test['expect']!r}"
            outcomes.append(
                {
                    "inputs": test["inputs"],
                    "expect": test["expect"],
                    "passed": passed,
                    "output": content[:2000],
                    "error": error,
                }
            )
        passed_count = sum(1 for o in outcomes if o["passed"])
        return {"tests": outcomes, "passed": passed_count, "total": len(outcomes)}

    async def review(
        self, request: str, built: Built, results: dict[str, Any], spend: JobSpend | None = None
    ) -> tuple[str, str, float]:
        spend = JobSpend() if spend is None else spend
        before = spend.usd
        summary = json.dumps(
            {
                "request": request,
                "name": built.name,
                "description": built.description,
                "input_schema": built.input_schema,
                "code": built.code,
                "test_results": results,
            }
        )
        reply = await _ask(
            self._llm,
            ROLE_TOOL_AUDITOR,
            "review",
            spend,
            [{"role": "user", "content": summary}],
            TOOL_AUDITOR_SYSTEM,
        )
        verdict = parse_json_reply(reply.text)
        decision = str(verdict.get("verdict", "")).lower()
        return decision, str(verdict.get("reason", ""))[:2000], spend.usd - before


class JobPipeline:
    """Processes claimed jobs end to end, each under a lease it keeps renewing."""

    def __init__(
        self,
        repo: SqlSandboxRepository,
        sandbox: Sandbox,
        llm: LlmForRole,
        *,
        worker_id: str = "",
        lease_s: float = DEFAULT_LEASE_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        usage: UsageLog | None = None,
        retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_S,
    ) -> None:
        self._repo = repo
        self._usage = usage
        self._retry_backoff_s = max(0.0, retry_backoff_s)
        self._builder = ToolBuilder(llm)
        self._auditor = ToolAuditor(sandbox, llm)
        self._worker = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._lease_s = lease_s
        self._max_attempts = max(1, max_attempts)

    async def run_once(self) -> Job | None:
        """Claim one job (queued, or abandoned by a dead worker) and take it to a final state;
        None when there was none, or when another worker took it over meanwhile."""
        job = await asyncio.to_thread(
            self._repo.claim_job,
            self._worker,
            lease_s=self._lease_s,
            max_attempts=self._max_attempts,
        )
        if job is None:
            return None
        lease = job.lease
        with tracer().start_as_current_span(
            "sandbox.build_job",
            attributes={"toolmesh.job.id": job.id, "toolmesh.job.attempt": lease.attempt},
        ):
            lost = asyncio.Event()
            work = asyncio.ensure_future(self._run(job, lease))
            keeper = asyncio.ensure_future(self._keep_lease(lease, work, lost))
            try:
                return await work
            except LeaseLost:
                pass
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not lost.is_set() or (task is not None and task.cancelling()):
                    raise  # this worker is stopping
            finally:
                keeper.cancel()
            logger.warning(
                "build job %s: another worker claimed it after this worker's lease expired; "
                "letting it go",
                job.id,
            )
            return None

    async def _keep_lease(
        self, lease: Lease, work: asyncio.Future[Job], lost: asyncio.Event
    ) -> None:
        """Renew the lease until the work is done; cancel the work when the lease is lost."""
        while not work.done():
            await asyncio.sleep(self._lease_s / 3)
            try:
                held = await asyncio.to_thread(self._repo.heartbeat, lease)
            except ToolmeshError as exc:  # the database is away: the lease may lapse meanwhile
                logger.warning("build job %s: cannot renew its lease: %s", lease.job_id, exc)
                continue
            if not held and not work.done():
                lost.set()
                work.cancel()
                return

    async def _run(self, job: Job, lease: Lease) -> Job:
        try:
            return await self._process(job, lease)
        except LeaseLost:
            raise
        except Exception as exc:  # a job never stays claimed by a bug
            logger.exception("build job %s failed unexpectedly", job.id)
            return await self._update(
                lease,
                status="failed",
                progress_pct=100,
                result={"error": f"internal error: {type(exc).__name__}"},
            )

    async def _process(self, job: Job, lease: Lease) -> Job:
        request = str(job.spec.get("request", ""))
        spend = JobSpend(job, self._usage)
        built: Built | None = None
        # The tool this job registered: the only one whose audit it may record (a name the
        # model chose may be another tenant's tool, which register refused).
        registered: CustomTool | None = None
        try:
            built, _ = await self._builder.build(request, job.tool_name, spend)
            validate_definition(built.name, built.code, built.input_schema, job.tenant_id)
            tool = await asyncio.to_thread(
                self._repo.register,
                CustomTool(
                    name=built.name,
                    implementation=built.code,
                    tenant_id=job.tenant_id,
                    description=built.description,
                    input_schema=built.input_schema,
                    created_by="builder_agent",
                ),
            )
            registered = tool
            await self._update(lease, status="testing", progress_pct=60, tool_name=tool.name)
            await asyncio.to_thread(
                self._repo.record_audit,
                tool.name,
                tenant_id=job.tenant_id,
                status="testing",
                test_results=None,
                rejection_reason=None,
            )
            results = await self._auditor.run_tests(built, job.tenant_id)
            if results["passed"] != results["total"]:
                raise BuildRejected(
                    f"{results['total'] - results['passed']} of {results['total']} tests failed",
                    results,
                )
            decision, reason, _ = await self._auditor.review(request, built, results, spend)
            if decision != "approve":
                raise BuildRejected(f"the auditor rejected the tool: {reason}", results)
            await asyncio.to_thread(
                self._repo.record_audit,
                tool.name,
                tenant_id=job.tenant_id,
                status="approved",
                test_results=results,
                rejection_reason=None,
            )
            return await self._update(
                lease,
                status="approved",
                progress_pct=100,
                result={
                    "tool_name": built.name,
                    "description": built.description,
                    "test_results": results,
                    "review": reason,
                    "cost_usd": spend.usd,
                },
            )
        except LeaseLost:
            raise
        except LlmStageFailed as exc:
            return await self._llm_failed(job, lease, exc, spend)
        except (BuildRejected, InvalidArgument) as exc:
            reason = exc.message if isinstance(exc, ToolmeshError) else str(exc.args[0])
            failed_results: dict[str, Any] | None = (
                exc.args[1] if isinstance(exc, BuildRejected) and len(exc.args) > 1 else None
            )
            if registered is not None:
                with contextlib.suppress(ToolmeshError):
                    await asyncio.to_thread(
                        self._repo.record_audit,
                        registered.name,
                        tenant_id=job.tenant_id,
                        status="rejected",
                        test_results=failed_results,
                        rejection_reason=reason,
                    )
            return await self._update(
                lease,
                status="rejected",
                progress_pct=100,
                result={"error": reason, "test_results": failed_results, "cost_usd": spend.usd},
            )
        except ToolmeshError as exc:
            logger.warning("build job %s failed: %s", job.id, exc.message)
            return await self._update(
                lease,
                status="failed",
                progress_pct=100,
                result={"error": exc.message, "reason": exc.reason, "cost_usd": spend.usd},
            )

    async def _llm_failed(
        self, job: Job, lease: Lease, failure: LlmStageFailed, spend: JobSpend
    ) -> Job:
        """A transient LLM failure with claims left: wait, then queue the job again (its next
        claim is its next attempt). Otherwise the job fails, saying why."""
        error = failure.error
        result: dict[str, Any] = {
            "error": f"the {failure.stage} stage's LLM call failed: {error.message}",
            "reason": error.reason,
            "stage": failure.stage,
            "attempt": lease.attempt,
            "max_attempts": self._max_attempts,
            "cost_usd": spend.usd,
        }
        if failure.transient and lease.attempt < self._max_attempts:
            wait = self._backoff(lease.attempt, error)
            logger.warning(
                "build job %s: attempt %d of %d: %s; queued again in %.1fs",
                job.id,
                lease.attempt,
                self._max_attempts,
                error.message,
                wait,
            )
            await self._update(lease, result={**result, "retry_in_s": wait})
            await asyncio.sleep(wait)  # the lease is kept meanwhile
            return await self._update(
                lease, status="queued", progress_pct=0, claimed_by=None, result=result
            )
        if failure.transient:
            result["error"] = (
                f"gave up after {lease.attempt} attempt(s): the {failure.stage} stage's LLM "
                f"call kept failing; last: {error.message}"
            )
        logger.warning("build job %s failed: %s", job.id, result["error"])
        return await self._update(lease, status="failed", progress_pct=100, result=result)

    def _backoff(self, attempt: int, error: ToolmeshError) -> float:
        wait = self._retry_backoff_s * 2 ** (attempt - 1)
        with contextlib.suppress(ValueError):
            wait = max(wait, float(error.metadata.get("retry_after_s", 0)))
        return min(wait, MAX_RETRY_BACKOFF_S)

    async def _update(self, lease: Lease, **values: Any) -> Job:
        """Write the job while this worker's lease holds (LeaseLost otherwise)."""
        return await asyncio.to_thread(self._repo.update_job, lease.job_id, lease=lease, **values)


class JobWorkers:
    """Background workers of one sandbox process: claim and run jobs until stopped; woken at
    once by a submission in this process, else polling for other replicas' submissions."""

    def __init__(self, pipeline: JobPipeline, *, count: int = 1, poll_s: float = 2.0) -> None:
        self._pipeline = pipeline
        self._count = count
        self._poll_s = poll_s
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._loop()) for _ in range(self._count)]

    def wake(self) -> None:
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            try:
                job = await self._pipeline.run_once()
            except ToolmeshError as exc:
                logger.warning("job worker: %s", exc.message)
                job = None
            except Exception:  # a bug must not end the worker for good
                # Logged with its traceback; the worker waits a poll before it claims again.
                logger.exception("job worker: unexpected failure; claiming again after a poll")
                job = None
            if job is not None:
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll_s)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
