"""The sandbox's gRPC servicer: converts requests, awaits the core, converts responses; and the
per-execution registry channel that a custom tool's call_tool goes through.

With API keys configured (TOOLMESH_API_KEYS_FILE, shared.auth), the administrative RPCs —
RegisterCustomTool, SetCustomToolStatus, SubmitBuildJob, GetJob, ListJobs — need a key allowed
for the tenant they name (UNAUTHENTICATED without a valid key, PERMISSION_DENIED for another
tenant's); a request that names none acts for the key's tenant. Execute is the registry's
internal call (the registry has already resolved the caller's tenant and tool) and stays
unauthenticated: keep the sandbox on the mesh's private network."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import pandas as pd

from services.sandbox.admission import Origin
from services.sandbox.core import NAME_RE, Sandbox, validate_definition
from services.sandbox.repository import CustomTool, Job, SqlSandboxRepository
from shared import convert
from shared.arrow_ipc import ipc_to_dataframe
from shared.auth import ApiKeys
from shared.clients import open_channel, traced_call
from shared.config import DEFAULT_DB_WAIT_S
from shared.contract import Err, Ok, ToolResult, envelope_to_tool_result
from shared.db.engine import db_thread
from shared.errors import AlreadyExists, InvalidArgument
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.sandbox.v1 import sandbox_pb2 as spb
from toolmesh.sandbox.v1 import sandbox_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

T = TypeVar("T")
logger = logging.getLogger(__name__)

MAX_INPUT_BYTES = 4 * 1024 * 1024
MAX_REQUEST_ID_CHARS = 128  # a SubmitBuildJob idempotency key
JOB_STATUS_VALUES = {
    "queued": spb.JOB_STATUS_QUEUED,
    "building": spb.JOB_STATUS_BUILDING,
    "testing": spb.JOB_STATUS_TESTING,
    "approved": spb.JOB_STATUS_APPROVED,
    "rejected": spb.JOB_STATUS_REJECTED,
    "failed": spb.JOB_STATUS_FAILED,
}
JOB_TYPE_VALUES = {
    "build": spb.JOB_TYPE_BUILD,
    "audit": spb.JOB_TYPE_AUDIT,
    "rebuild": spb.JOB_TYPE_REBUILD,
}


async def result_to_pb(tool_name: str, result: ToolResult) -> pb.ToolResult:
    """A custom tool's result on the wire: a table is encoded in a thread (its cost grows with
    its cells), and a result that cannot be encoded at all (a card holding an int of 400
    digits) is an Err `bad_result`, not a failed RPC."""
    try:
        if _has_table(result):
            return await asyncio.to_thread(convert.tool_result_to_pb, result)
        return convert.tool_result_to_pb(result)
    except Exception as exc:  # noqa: BLE001 - everything in the result came from the tool
        logger.info("custom tool %s returned a result that cannot be sent: %s", tool_name, exc)
        return convert.tool_result_to_pb(
            envelope_to_tool_result(
                Err(
                    f"custom tool {tool_name!r} returned a bad result: it cannot be sent "
                    f"({type(exc).__name__}: {str(exc)[:200]})",
                    "bad_result",
                )
            )
        )


def _has_table(result: ToolResult) -> bool:
    env = result.envelope
    return bool(result.datasets) or (isinstance(env, Ok) and isinstance(env.data, pd.DataFrame))


class RegistryChannel:
    """call_tool of one execution: the caller's context (tenant, user, conversation,
    capabilities) one level deeper, on a channel opened on first use and closed when the
    execution ends. The worker never sees or chooses the context."""

    def __init__(self, address: str, context: pb.CallContext, tracing: bool) -> None:
        self._address = address
        self._context = context
        self._tracing = tracing
        self._channel: grpc.aio.Channel | None = None

    async def __call__(self, name: str, inputs: dict[str, Any]) -> ToolResult:
        if self._channel is None:
            self._channel = open_channel(self._address)
        stub = registry_pb2_grpc.RegistryServiceStub(self._channel)
        ctx = pb.CallContext()
        ctx.CopyFrom(self._context)
        ctx.depth = self._context.depth + 1
        ctx.parent_tool_use_id = self._context.tool_use_id
        ctx.reasoning = ""
        response = await traced_call(
            stub.ExecuteTool,
            rpb.ExecuteToolRequest(name=name, input_json=convert.dumps(inputs), context=ctx),
            span_name="toolmesh.registry.v1.RegistryService/ExecuteTool",
            peer_service="registry",
            tracing=self._tracing,
        )
        return convert.tool_result_from_pb(response.result)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


def tool_to_pb(t: CustomTool) -> pb.ToolDefinition:
    msg = pb.ToolDefinition(
        id=t.id,
        name=t.name,
        description=t.description,
        input_schema_json=convert.dumps(t.input_schema),
        implementation=t.implementation,
        tool_type=pb.TOOL_TYPE_CUSTOM,
        status=convert.STATUS_VALUES.get(t.status, pb.TOOL_STATUS_UNSPECIFIED),
        enabled=t.enabled,
        category=t.category,
        dependencies=list(t.dependencies),
        version=t.version,
        tenant_id=t.tenant_id,
        created_by=t.created_by,
        rejection_reason=t.rejection_reason or "",
        test_results_json=convert.dumps(t.test_results) if t.test_results else "",
        required_capabilities=list(t.required_capabilities),
        timeout_seconds=t.timeout_seconds or 0.0,
    )
    for name, value in (("created_at", t.created_at), ("updated_at", t.updated_at)):
        ts = convert.to_timestamp(value)
        if ts is not None:
            getattr(msg, name).CopyFrom(ts)
    return msg


def job_to_pb(j: Job) -> spb.Job:
    msg = spb.Job(
        id=j.id,
        tool_name=j.tool_name,
        job_type=JOB_TYPE_VALUES.get(j.job_type, spb.JOB_TYPE_UNSPECIFIED),
        status=JOB_STATUS_VALUES.get(j.status, spb.JOB_STATUS_UNSPECIFIED),
        spec_json=convert.dumps(j.spec),
        result_json=convert.dumps(j.result) if j.result is not None else "",
        progress_pct=j.progress_pct,
        tenant_id=j.tenant_id,
        conversation_id=j.conversation_id or "",
    )
    for name, value in (("created_at", j.created_at), ("updated_at", j.updated_at)):
        ts = convert.to_timestamp(value)
        if ts is not None:
            getattr(msg, name).CopyFrom(ts)
    return msg


class SandboxServicer(sandbox_pb2_grpc.SandboxServiceServicer):
    def __init__(
        self,
        core: Sandbox,
        repo: SqlSandboxRepository,
        *,
        registry_address: str,
        tracing: bool,
        on_job_submitted: Any = None,
        auth: ApiKeys | None = None,
        db_wait_s: float = DEFAULT_DB_WAIT_S,
    ) -> None:
        """`db_wait_s`: how long one database operation of a call may take before the call
        answers UNAVAILABLE (shared.db.engine.bounded_db_wait; TOOLMESH_DB_WAIT_S)."""
        self._core = core
        self._db_wait_s = db_wait_s
        self._repo = repo
        self._registry_address = registry_address
        self._tracing = tracing
        self._on_job_submitted = on_job_submitted
        self._auth = auth

    async def _db(self, what: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return await db_thread(self._db_wait_s, what, fn, *args, **kwargs)

    def _tenant(
        self,
        context: grpc.aio.ServicerContext,
        requested: str,
        what: str,
        *,
        every_when_omitted: bool = False,
    ) -> str:
        """The tenant an administrative call acts for. Without API keys: `requested`, as given.
        With them: the caller's key must be valid and allowed for `requested`; an omitted
        tenant is the key's own (for an admin key reading, `every_when_omitted`: "" = all)."""
        if self._auth is None:
            return requested
        principal = self._auth.authenticate(context.invocation_metadata())
        if not requested:
            return "" if every_when_omitted and principal.admin else principal.tenant_id
        principal.require_tenant(requested, what)
        return requested

    async def Execute(
        self, request: spb.ExecuteRequest, context: grpc.aio.ServicerContext
    ) -> spb.ExecuteResponse:
        if len(request.input_json) > MAX_INPUT_BYTES:
            raise InvalidArgument(
                f"input_json is over the {MAX_INPUT_BYTES}-byte limit",
                reason="INPUT_TOO_LARGE",
                field_violations=[("input_json", "too large")],
            )
        inputs = convert.parse_json_object(request.input_json or "{}", "input_json")
        convert.check_ids(convert.context_ids(request.context))
        df = None
        if request.HasField("df") and request.df.arrow_ipc:
            try:
                df = await asyncio.to_thread(ipc_to_dataframe, request.df.arrow_ipc)
            except Exception as exc:  # noqa: BLE001 - any failure is the bytes' (metadata too)
                raise InvalidArgument(
                    f"df is not an Arrow IPC stream: {str(exc)[:200]}",
                    field_violations=[("df.arrow_ipc", "not Arrow IPC")],
                ) from None
        lim = request.limits
        limits = self._core.caps.resolve(
            lim.wall_seconds,
            lim.cpu_seconds,
            lim.memory_bytes,
            lim.output_bytes,
            lim.max_tool_calls,
        )
        caller = (
            RegistryChannel(self._registry_address, request.context, self._tracing)
            if self._registry_address
            else None
        )
        # Who it runs for and where in its call tree (every nested call keeps the root call's
        # tool_use_id, one level deeper): the pool's per-tenant cap and its wait for a slot.
        remaining = context.time_remaining()
        origin = Origin(
            tenant=request.context.tenant_id,
            tree=request.context.tool_use_id,
            depth=request.context.depth,
            deadline=None if remaining is None else asyncio.get_running_loop().time() + remaining,
        )
        try:
            execution = await self._core.execute(
                tool_name=request.tool_name,
                code=request.code,
                inputs=inputs,
                limits=limits,
                df=df,
                caller=caller,
                origin=origin,
            )
        finally:
            if caller is not None:
                await caller.close()
        response = spb.ExecuteResponse(
            execution_ms=execution.execution_ms, tool_calls=execution.tool_calls
        )
        response.result.CopyFrom(await result_to_pb(request.tool_name, execution.result))
        return response

    async def RegisterCustomTool(
        self, request: spb.RegisterCustomToolRequest, context: grpc.aio.ServicerContext
    ) -> spb.RegisterCustomToolResponse:
        m = request.tool
        tenant = self._tenant(context, m.tenant_id, "registering a custom tool")
        if m.tool_type not in (pb.TOOL_TYPE_UNSPECIFIED, pb.TOOL_TYPE_CUSTOM):
            raise InvalidArgument(
                "RegisterCustomTool registers custom tools only",
                field_violations=[("tool.tool_type", "must be TOOL_TYPE_CUSTOM")],
            )
        schema = convert.parse_json_object(
            m.input_schema_json or '{"type": "object"}', "tool.input_schema_json"
        )
        validate_definition(m.name, m.implementation, schema, tenant)
        tool = CustomTool(
            name=m.name,
            implementation=m.implementation,
            tenant_id=tenant,
            description=m.description,
            input_schema=schema,
            enabled=True,
            category=m.category or "general",
            created_by=m.created_by or "user",
            required_capabilities=list(m.required_capabilities),
            timeout_seconds=m.timeout_seconds or None,
            dependencies=list(m.dependencies),
        )
        try:
            stored = await self._db("the custom tool's write", self._repo.register, tool)
        except AlreadyExists as exc:
            # One answer whoever holds the name: whether it is a system or MCP tool, or another
            # tenant's custom tool, is not the caller's to learn.
            raise AlreadyExists(
                f"the tool name {m.name!r} is taken; choose another name",
                reason=exc.reason,
                metadata={"tool": m.name},
            ) from None
        return spb.RegisterCustomToolResponse(tool=tool_to_pb(stored))

    async def SetCustomToolStatus(
        self, request: spb.SetCustomToolStatusRequest, context: grpc.aio.ServicerContext
    ) -> spb.SetCustomToolStatusResponse:
        tenant = self._tenant(context, request.tenant_id, "reviewing a custom tool")
        status = convert.STATUSES.get(request.status)
        violations = []
        if not request.name:
            violations.append(("name", "required"))
        if status is None:
            violations.append(("status", "one of approved, rejected, testing, draft"))
        if violations or status is None:
            raise InvalidArgument(
                "invalid review: " + "; ".join(f"{f} {d}" for f, d in violations),
                field_violations=violations,
            )
        tool = await self._db(
            "the custom tool status's write",
            self._repo.set_status,
            request.name,
            tenant or None,
            status,
            request.reason,
        )
        return spb.SetCustomToolStatusResponse(tool=tool_to_pb(tool))

    async def SubmitBuildJob(
        self, request: spb.SubmitBuildJobRequest, context: grpc.aio.ServicerContext
    ) -> spb.SubmitBuildJobResponse:
        tenant = self._tenant(context, request.context.tenant_id, "submitting a build job")
        violations = []
        if not request.request.strip():
            violations.append(("request", "describe the tool to build"))
        if len(request.request) > 8000:
            violations.append(("request", "at most 8000 characters"))
        if not tenant:
            violations.append(("context.tenant_id", "required"))
        if request.tool_name and not NAME_RE.match(request.tool_name):
            violations.append(("tool_name", "must match [a-zA-Z0-9_-]{1,64}"))
        if len(request.request_id) > MAX_REQUEST_ID_CHARS or not request.request_id.isprintable():
            violations.append(
                ("request_id", f"at most {MAX_REQUEST_ID_CHARS} printable characters")
            )
        if violations:
            raise InvalidArgument(
                "invalid build job: " + "; ".join(f"{f} {d}" for f, d in violations),
                field_violations=violations,
            )
        if request.tool_name:
            # A job records its audit on the tool of its name: a name held by another tenant's
            # (or the shared) custom tool is refused here, with the answer RegisterCustomTool
            # gives, so a job can never review a tool that is not its tenant's.
            held = await self._db("the custom tool's read", self._repo.get, request.tool_name)
            if held is not None and held.tenant_id != tenant:
                raise AlreadyExists(
                    f"the tool name {request.tool_name!r} is taken; choose another name",
                    reason="TOOL_NAME_TAKEN",
                    metadata={"tool": request.tool_name},
                )
        spec = {"request": request.request, "tool_name": request.tool_name}
        replayed = False
        if request.request_id:
            job, replayed = await self._db(
                "the build job's write",
                self._repo.create_keyed_job,
                request_id=request.request_id,
                tenant_id=tenant,
                tool_name=request.tool_name,
                spec=spec,
                conversation_id=request.context.conversation_id,
            )
        else:
            job = await self._db(
                "the build job's write",
                self._repo.create_job,
                tenant_id=tenant,
                tool_name=request.tool_name,
                spec=spec,
                conversation_id=request.context.conversation_id,
            )
        if self._on_job_submitted is not None and not replayed:
            self._on_job_submitted()
        return spb.SubmitBuildJobResponse(job=job_to_pb(job), replayed=replayed)

    async def GetJob(
        self, request: spb.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> spb.GetJobResponse:
        tenant = self._tenant(
            context, request.tenant_id, "reading build jobs", every_when_omitted=True
        )
        if not request.id:
            raise InvalidArgument("id is required", field_violations=[("id", "empty")])
        job = await self._db("the build job's read", self._repo.get_job, request.id, tenant)
        return spb.GetJobResponse(job=job_to_pb(job))

    async def ListJobs(
        self, request: spb.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> spb.ListJobsResponse:
        tenant = self._tenant(
            context, request.tenant_id, "listing build jobs", every_when_omitted=True
        )
        jobs = await self._db(
            "the build jobs' read", self._repo.list_jobs, tenant, request.limit or 50
        )
        return spb.ListJobsResponse(jobs=[job_to_pb(j) for j in jobs])
