"""The custom-tool commands of `toolmesh`:

    toolmesh tools add --code FILE --schema FILE   register (or update) a custom tool as a draft
    toolmesh tools approve|reject NAME             the sandbox's SetCustomToolStatus (a system or
                                                   MCP tool: the registry's SetToolStatus)
    toolmesh jobs build "…" [--request-id K] | list | show ID
                                                   the sandbox's tool-building jobs

Every call sends TOOLMESH_API_KEY, when set, as a bearer token (shared.clients.cli_channel); a
sandbox with API keys configured then acts for the key's tenant, which is also the default
`--tenant` (without a key: "default").

`add_tools_subcommands(tools_parser)` hangs add/approve/reject (and `list`, the plain listing)
under the existing `tools` parser; `add_subcommands(sub)` adds `jobs`. Each command's func is
`(args, settings) -> exit code` (0 ok, 1 a rejected/failed job, 2 an RPC or input failure)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from shared.cli import EXIT_RPC_ERROR, UsageError, limit, service_channel, wait_seconds
from shared.cli.render import echo, echo_json, rpc_failure
from shared.config import Settings
from shared.rpc_errors import from_rpc_error
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.sandbox.v1 import sandbox_pb2 as spb
from toolmesh.sandbox.v1 import sandbox_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

EXIT_OK = 0
EXIT_JOB_FAILED = 1
FINAL_JOB_STATES = (spb.JOB_STATUS_APPROVED, spb.JOB_STATUS_REJECTED, spb.JOB_STATUS_FAILED)

Command = Callable[[argparse.Namespace, Settings], int]
TENANT_DEFAULT = "default: the API key's tenant with TOOLMESH_API_KEY, else 'default'"


def _sandbox_address(args: argparse.Namespace, settings: Settings) -> str:
    return str(getattr(args, "sandbox", None) or settings.address("sandbox"))


def _no_listing_options(args: argparse.Namespace) -> None:
    """`tools --all approve X`: the listing flags given before a verb they do not apply to are
    refused, not silently ignored."""
    given = [flag for flag in ("all", "json") if getattr(args, flag, False)]
    if given:
        flags = " and ".join(f"--{flag}" for flag in given)
        raise UsageError(f"{flags} list tools; `tools {args.tools_command}` does not take them")


def _registry_address(args: argparse.Namespace, settings: Settings) -> str:
    return str(getattr(args, "registry", None) or settings.address("registry"))


def _tenant(args: argparse.Namespace, open_default: str = "default") -> str:
    """--tenant; else, with an API key, empty (the sandbox takes the key's tenant); else
    `open_default`."""
    tenant = getattr(args, "tenant", None)
    if tenant is not None:
        return str(tenant)
    return "" if os.environ.get("TOOLMESH_API_KEY") else open_default


def _read(path: str, what: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        echo(f"error: cannot read the {what} file {path}: {exc}", file=sys.stderr)
        return None


def _tool_meta(doc: dict[str, Any], path: str) -> dict[str, Any]:
    """The tool document's fields checked for their types, so that a wrong one is named
    instead of failing on the way into the request."""
    # Either a tool document {"name", "description", "input_schema", ...} or a bare schema.
    meta: dict[str, Any] = doc if "input_schema" in doc else {"input_schema": doc}
    for key in ("name", "description", "category"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise UsageError(f"{path}: {key} must be a string")
    capabilities = meta.get("required_capabilities")
    if capabilities is not None and not (
        isinstance(capabilities, list) and all(isinstance(c, str) for c in capabilities)
    ):
        raise UsageError(f"{path}: required_capabilities must be a list of strings")
    timeout = meta.get("timeout_seconds")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 <= timeout <= 1e9  # also refuses NaN
    ):
        raise UsageError(f"{path}: timeout_seconds must be a number of seconds, 0 or more")
    return meta


def cmd_tools_add(args: argparse.Namespace, settings: Settings) -> int:
    _no_listing_options(args)
    code = _read(args.code, "code")
    schema_text = _read(args.schema, "schema")
    if code is None or schema_text is None:
        return EXIT_RPC_ERROR
    try:
        doc = json.loads(schema_text)
    except json.JSONDecodeError as exc:
        echo(f"error: {args.schema} is not JSON: {exc}", file=sys.stderr)
        return EXIT_RPC_ERROR
    if not isinstance(doc, dict):
        echo(f"error: {args.schema} must hold a JSON object", file=sys.stderr)
        return EXIT_RPC_ERROR
    meta = _tool_meta(doc, args.schema)
    name = args.name or meta.get("name") or Path(args.code).stem
    tool = pb.ToolDefinition(
        name=str(name),
        description=str(args.description or meta.get("description") or ""),
        input_schema_json=json.dumps(meta["input_schema"]),
        implementation=code,
        tool_type=pb.TOOL_TYPE_CUSTOM,
        tenant_id=_tenant(args),
        category=str(meta.get("category") or "general"),
        required_capabilities=[str(c) for c in meta.get("required_capabilities") or []],
        timeout_seconds=float(meta.get("timeout_seconds") or 0.0),
        created_by="cli",
    )
    address = _sandbox_address(args, settings)
    try:
        with service_channel("sandbox", address) as channel:
            stored = (
                sandbox_pb2_grpc.SandboxServiceStub(channel)
                .RegisterCustomTool(spb.RegisterCustomToolRequest(tool=tool), timeout=30)
                .tool
            )
    except grpc.RpcError as exc:
        return rpc_failure(exc, "sandbox", address)
    status = pb.ToolStatus.Name(stored.status).removeprefix("TOOL_STATUS_").lower()
    echo(
        f"registered {stored.name} v{stored.version} ({status}) for tenant {stored.tenant_id}; "
        f"approve it with `toolmesh tools approve {stored.name}`"
    )
    return EXIT_OK


def _set_status(args: argparse.Namespace, settings: Settings, status: int) -> int:
    """A custom tool is reviewed by the sandbox (tenant-checked); a system or MCP tool (a
    pinned MCP definition held in testing, say) by the registry."""
    _no_listing_options(args)
    address = _sandbox_address(args, settings)
    try:
        with service_channel("sandbox", address) as channel:
            tool = (
                sandbox_pb2_grpc.SandboxServiceStub(channel)
                .SetCustomToolStatus(
                    spb.SetCustomToolStatusRequest(
                        name=args.name,
                        tenant_id=_tenant(args, open_default=""),
                        status=status,
                        reason=args.reason,
                    ),
                    timeout=30,
                )
                .tool
            )
    except grpc.RpcError as exc:
        if from_rpc_error(exc).reason != "NOT_A_CUSTOM_TOOL":
            return rpc_failure(exc, "sandbox", address)
        address = _registry_address(args, settings)
        try:
            with service_channel("registry", address) as channel:
                tool = (
                    registry_pb2_grpc.RegistryServiceStub(channel)
                    .SetToolStatus(
                        rpb.SetToolStatusRequest(name=args.name, status=status, reason=args.reason),
                        timeout=30,
                    )
                    .tool
                )
        except grpc.RpcError as registry_exc:
            return rpc_failure(registry_exc, "registry", address)
    state = pb.ToolStatus.Name(tool.status).removeprefix("TOOL_STATUS_").lower()
    echo(f"{tool.name} v{tool.version} is {state}")
    return EXIT_OK


def cmd_tools_approve(args: argparse.Namespace, settings: Settings) -> int:
    return _set_status(args, settings, pb.TOOL_STATUS_APPROVED)


def cmd_tools_reject(args: argparse.Namespace, settings: Settings) -> int:
    return _set_status(args, settings, pb.TOOL_STATUS_REJECTED)


def _job_line(job: spb.Job) -> str:
    status = spb.JobStatus.Name(job.status).removeprefix("JOB_STATUS_").lower()
    request = json.loads(job.spec_json or "{}").get("request", "")
    return (
        f"{job.id}  {status:<9} {job.progress_pct:>3}%  {job.tool_name or '-':<24} {request[:60]}"
    )


def _print_job(job: spb.Job, as_json: bool) -> None:
    if as_json:
        echo_json(json_format.MessageToJson(job))
        return
    echo(_job_line(job))
    if job.result_json:
        echo(json.dumps(json.loads(job.result_json), indent=2))


def cmd_jobs_build(args: argparse.Namespace, settings: Settings) -> int:
    address = _sandbox_address(args, settings)
    try:
        with service_channel("sandbox", address) as channel:
            stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
            submitted = stub.SubmitBuildJob(
                spb.SubmitBuildJobRequest(
                    request=args.request,
                    tool_name=args.name or "",
                    context=pb.CallContext(tenant_id=_tenant(args), user_id="cli"),
                    request_id=args.request_id or "",
                ),
                timeout=30,
            )
            job = submitted.job
            if submitted.replayed:
                echo(
                    f"request id {args.request_id!r} was submitted before: its job {job.id}",
                    file=sys.stderr,
                )
            deadline = time.monotonic() + args.wait
            while args.wait > 0 and job.status not in FINAL_JOB_STATES:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
                job = stub.GetJob(
                    spb.GetJobRequest(id=job.id, tenant_id=job.tenant_id), timeout=30
                ).job
    except grpc.RpcError as exc:
        return rpc_failure(exc, "sandbox", address)
    _print_job(job, args.json)
    failed = job.status in (spb.JOB_STATUS_REJECTED, spb.JOB_STATUS_FAILED)
    return EXIT_JOB_FAILED if failed else EXIT_OK


def cmd_jobs_list(args: argparse.Namespace, settings: Settings) -> int:
    address = _sandbox_address(args, settings)
    try:
        with service_channel("sandbox", address) as channel:
            jobs = (
                sandbox_pb2_grpc.SandboxServiceStub(channel)
                .ListJobs(
                    spb.ListJobsRequest(tenant_id=_tenant(args), limit=args.limit), timeout=30
                )
                .jobs
            )
    except grpc.RpcError as exc:
        return rpc_failure(exc, "sandbox", address)
    if args.json:
        echo_json(json.dumps([json.loads(json_format.MessageToJson(j)) for j in jobs], indent=2))
    else:
        for job in jobs:
            echo(_job_line(job))
    return EXIT_OK


def cmd_jobs_show(args: argparse.Namespace, settings: Settings) -> int:
    address = _sandbox_address(args, settings)
    try:
        with service_channel("sandbox", address) as channel:
            job = (
                sandbox_pb2_grpc.SandboxServiceStub(channel)
                .GetJob(spb.GetJobRequest(id=args.id, tenant_id=_tenant(args)), timeout=30)
                .job
            )
    except grpc.RpcError as exc:
        return rpc_failure(exc, "sandbox", address)
    _print_job(job, args.json)
    return EXIT_OK


def add_listing_options(p: argparse.ArgumentParser) -> None:
    """The options of `tools` and `tools list`. Their defaults are left unset: a subcommand's
    defaults overwrite what was parsed before it, so `tools --all list` would list without
    --all and `tools --registry ADDR list` ask the configured registry instead. The listing
    applies them (main.cmd_tools)."""
    unset = argparse.SUPPRESS
    p.add_argument("--tenant", default=unset, help="tenant (default: default)")
    p.add_argument(
        "--all", action="store_true", default=unset, help="every stored tool, internal included"
    )
    p.add_argument("--json", action="store_true", default=unset, help="print JSON")
    p.add_argument("--registry", default=unset, help="registry address (default: from config)")


def add_tools_subcommands(tools: argparse.ArgumentParser, list_tools: Command) -> None:
    """`toolmesh tools` keeps listing; `tools list|add|approve|reject` act. An option the
    `tools` parser shares with a subcommand (--tenant, --registry) may be given before or after
    the verb: the subcommands leave it unset unless given (argparse.SUPPRESS)."""
    unset = argparse.SUPPRESS
    sub = tools.add_subparsers(dest="tools_command", required=False, metavar="{list,add,...}")
    p = sub.add_parser("list", help="list the tools a model sees (or --all stored tools)")
    add_listing_options(p)
    p.set_defaults(func=list_tools)

    p = sub.add_parser("add", help="register or update a custom tool (as a draft)")
    p.add_argument("--code", required=True, help="Python file of the tool (assigns `result`)")
    p.add_argument(
        "--schema",
        required=True,
        help="JSON file: the input schema, or {name, description, input_schema, ...}",
    )
    p.add_argument("--name", help="tool name (default: from the schema file or the code file)")
    p.add_argument("--description", help="what the tool does, for the model")
    p.add_argument(
        "--tenant",
        default=unset,
        help=f"owning tenant ('*' for every tenant; {TENANT_DEFAULT})",
    )
    p.add_argument("--sandbox", help="sandbox address (default: from config)")
    p.set_defaults(func=cmd_tools_add)

    for verb, func in (("approve", cmd_tools_approve), ("reject", cmd_tools_reject)):
        p = sub.add_parser(verb, help=f"{verb} a custom tool (or a pinned MCP definition)")
        p.add_argument("name")
        p.add_argument("--reason", default="", help="recorded with the status change")
        p.add_argument(
            "--tenant",
            default=unset,
            help="the tool's tenant (default: the API key's with TOOLMESH_API_KEY, else any)",
        )
        p.add_argument("--sandbox", help="sandbox address (default: from config)")
        p.add_argument(
            "--registry", default=unset, help="registry address, for a system or MCP tool"
        )
        p.set_defaults(func=func)


def add_subcommands(sub: Any) -> None:
    """`toolmesh jobs build|list|show`."""
    jobs = sub.add_parser("jobs", help="tool-building jobs (ToolBuilder / ToolAuditor)")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True)
    p = jobs_sub.add_parser("build", help="queue a natural-language tool build")
    p.add_argument("request", help="what the tool should do")
    p.add_argument("--name", help="proposed tool name")
    p.add_argument(
        "--request-id",
        help="idempotency key: submitting again with it returns the first submission's job",
    )
    p.add_argument(
        "--wait", type=wait_seconds, default=0.0, help="seconds to wait for a final state"
    )
    p.set_defaults(func=cmd_jobs_build)
    p = jobs_sub.add_parser("list", help="the tenant's jobs, newest first")
    p.add_argument("--limit", type=limit, default=20)
    p.set_defaults(func=cmd_jobs_list)
    p = jobs_sub.add_parser("show", help="one job with its result")
    p.add_argument("id")
    p.set_defaults(func=cmd_jobs_show)
    for parser in (jobs_sub.choices["build"], jobs_sub.choices["list"], jobs_sub.choices["show"]):
        parser.add_argument("--tenant", help=TENANT_DEFAULT)
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--sandbox", help="sandbox address (default: from config)")
