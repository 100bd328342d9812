"""The `toolmesh` command line: start the mesh, list and call tools, read the log and traces."""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import grpc

from shared import convert
from shared.cli import (
    EXIT_RPC_ERROR,
    JSON_SOURCE_HELP,
    UsageError,
    guardrails,
    json_argument,
    limit,
    mcp,
    port,
    seconds,
    service_channel,
    stats,
)
from shared.cli import export as export_cli
from shared.cli import sandbox as sandbox_cli
from shared.cli import surface as surface_cli
from shared.cli.render import echo, echo_json, print_log, print_tools, print_trace, rpc_failure
from shared.config import DEFAULT_COLLECTOR_PORT, MAX_RETENTION_DAYS, Settings
from shared.errors import ToolmeshError
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

EXIT_OK = 0
EXIT_TOOL_ERROR = 1
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a process killed by SIGPIPE
EXIT_INTERRUPTED = 128 + 2  # what a shell reports for a process stopped by SIGINT (Ctrl-C)
# What a gRPC header value may hold (HTTP/2 field values: visible ASCII and inner spaces).
_HEADER_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")


def _channel(settings: Settings, service: str, override: str | None) -> grpc.Channel:
    address = override or settings.address(service)
    return service_channel(service, address)


def cmd_call(args: argparse.Namespace, settings: Settings) -> int:
    input_json = json_argument(args.input, "--input", max_bytes=settings.max_input_bytes)
    address = args.dispatcher or settings.address("dispatcher")
    stub = dispatcher_pb2_grpc.DispatcherServiceStub(_channel(settings, "dispatcher", address))
    request = dpb.DispatchToolCallRequest(
        tool_use=pb.ToolUse(id=args.tool_use_id or "", name=args.name, input_json=input_json),
        context=pb.CallContext(
            tenant_id=args.tenant,
            user_id=args.user,
            conversation_id=args.conversation,
            capabilities=args.capability or [],
            model=args.model,
        ),
    )
    try:
        if args.progress:
            streamed = _streamed_call(stub, request, args.timeout)
            if streamed is None:
                echo(
                    f"error: the dispatcher at {address} ended the stream without a result",
                    file=sys.stderr,
                )
                return EXIT_RPC_ERROR
            response = streamed
        else:
            response = stub.DispatchToolCall(request, timeout=args.timeout)
    except grpc.RpcError as exc:
        return rpc_failure(exc, "dispatcher", address)
    if args.json:
        from google.protobuf import json_format

        echo_json(json_format.MessageToJson(response))
    else:
        echo(response.result.content)
        for warning in response.warnings:
            echo(warning)
        if response.replayed:
            echo(
                f"(tool_use {response.tool_use_id} was answered before: this is that answer; "
                "the tool did not run again)",
                file=sys.stderr,
            )
    kind = response.result.envelope.WhichOneof("kind")
    return EXIT_TOOL_ERROR if kind == "err" or (kind is None and response.result.error) else EXIT_OK


def _streamed_call(
    stub: dispatcher_pb2_grpc.DispatcherServiceStub,
    request: dpb.DispatchToolCallRequest,
    timeout: float,
) -> dpb.DispatchToolCallResponse | None:
    """The call over DispatchToolCallStream, each progress report and export notice written
    to stderr as it arrives (stdout keeps only the result, as without --progress)."""
    stream = stub.DispatchToolCallStream(
        dpb.DispatchToolCallStreamRequest(tool_use=request.tool_use, context=request.context),
        timeout=timeout,
    )
    for message in stream:
        kind = message.WhichOneof("event")
        if kind == "progress":
            update = message.progress
            done = f" ({update.fraction:.0%})" if update.HasField("fraction") else ""
            echo(f"… {update.message}{done}", file=sys.stderr, flush=True)
        elif kind == "export_ready":
            ready = message.export_ready
            echo(f"export ready: {ready.filename} ({ready.file_id})", file=sys.stderr, flush=True)
        elif kind == "result":
            return message.result
    return None  # the stream ended without its result (a dispatcher that broke its contract)


def cmd_tools(args: argparse.Namespace, settings: Settings) -> int:
    # `tools` and `tools list` take the same options, given before or after `list`; their
    # defaults are left unset (argparse.SUPPRESS) so that `list` keeps the ones given before
    # it, and are applied here.
    tenant = getattr(args, "tenant", None) or "default"
    address = getattr(args, "registry", None) or settings.address("registry")
    stub = registry_pb2_grpc.RegistryServiceStub(_channel(settings, "registry", address))
    try:
        if getattr(args, "all", False):
            listed = stub.ListTools(rpb.ListToolsRequest(tenant_id=tenant), timeout=30)
            tools = [
                {
                    "name": t.name,
                    "type": pb.ToolType.Name(t.tool_type).removeprefix("TOOL_TYPE_").lower(),
                    "status": pb.ToolStatus.Name(t.status).removeprefix("TOOL_STATUS_").lower(),
                    "category": t.category,
                    "description": t.description,
                    "annotations": convert.annotations_from_pb(t.annotations)
                    if t.HasField("annotations")
                    else None,
                    "required_capabilities": list(t.required_capabilities),
                }
                for t in listed.tools
            ]
        else:
            response = stub.GetToolsForLLM(rpb.GetToolsForLLMRequest(tenant_id=tenant), timeout=30)
            tools = [
                {
                    "name": t.name,
                    "description": t.description,
                    "input_schema": json.loads(t.input_schema_json),
                }
                for t in response.tools
            ]
    except grpc.RpcError as exc:
        return rpc_failure(exc, "registry", address)
    print_tools(tools, as_json=getattr(args, "json", False))
    return EXIT_OK


def cmd_log(args: argparse.Namespace, settings: Settings) -> int:
    address = args.dispatcher or settings.address("dispatcher")
    stub = dispatcher_pb2_grpc.DispatcherServiceStub(_channel(settings, "dispatcher", address))
    try:
        response = stub.ListExecutionLog(
            dpb.ListExecutionLogRequest(
                tool_name=args.tool or "",
                tenant_id=args.tenant or "",
                conversation_id=args.conversation or "",
                model=args.model or "",
                limit=args.limit,
            ),
            timeout=30,
        )
    except grpc.RpcError as exc:
        return rpc_failure(exc, "dispatcher", address)
    print_log(list(response.entries), as_json=args.json)
    return EXIT_OK


def cmd_seed(args: argparse.Namespace, settings: Settings) -> int:
    address = args.registry or settings.address("registry")
    stub = registry_pb2_grpc.RegistryServiceStub(_channel(settings, "registry", address))
    try:
        report = stub.SeedSystemTools(rpb.SeedSystemToolsRequest(), timeout=60)
    except grpc.RpcError as exc:
        return rpc_failure(exc, "registry", address)
    for field in ("created", "updated", "unchanged", "retired", "unknown"):
        names = list(getattr(report, field))
        echo(f"{field:>9}: {len(names):3d}  {', '.join(names)}")
    return EXIT_OK


def cmd_db(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "prune":
        return _prune(args, settings)
    if args.older_than is not None or args.dry_run:
        raise UsageError("--older-than and --dry-run go with `db prune`")
    from shared.db.engine import upgrade

    upgrade(settings.database_url)
    echo(f"database at head: {settings.database_url}")
    return EXIT_OK


def _prune(args: argparse.Namespace, settings: Settings) -> int:
    """`db prune`: one retention sweep against the configured database, as a dispatcher with
    TOOLMESH_RETENTION_DAYS runs it (services/dispatcher/retention.py)."""
    days = args.older_than if args.older_than is not None else settings.retention_days
    if not 0 < days <= MAX_RETENTION_DAYS:  # NaN fails too
        raise UsageError(
            f"db prune needs --older-than DAYS (more than 0, at most {MAX_RETENTION_DAYS}) "
            "or TOOLMESH_RETENTION_DAYS"
            + (f"; got {days!r}" if args.older_than is not None else "")
        )
    from services.dispatcher.retention import LogRetention, cutoff_for
    from shared.db.engine import make_engine

    engine = make_engine(settings.database_url)
    try:
        retention = LogRetention(engine, data_dir=settings.data_dir)
        report = retention.prune(cutoff_for(days), dry_run=args.dry_run)
    finally:
        engine.dispose()
    echo(report.describe(dry_run=args.dry_run))
    return EXIT_OK


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    if args.collector_port is None:  # read here, not when building the parser of every command
        raw = os.environ.get("TOOLMESH_COLLECTOR_PORT") or str(DEFAULT_COLLECTOR_PORT)
        try:
            args.collector_port = port(raw)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"TOOLMESH_COLLECTOR_PORT {exc}") from None
    from shared.cli.up import run_up  # imports the database stack: only for `up`

    return run_up(args, settings)


TRACE_ID = re.compile(r"[0-9a-f]{32}")


def cmd_trace(args: argparse.Namespace, settings: Settings) -> int:
    trace_id = args.trace_id
    if trace_id is not None:
        if args.last:
            raise UsageError("give a trace id or --last, not both")
        trace_id = trace_id.strip().lower()
        if not TRACE_ID.fullmatch(trace_id):
            raise UsageError(f"{args.trace_id!r} is not a trace id (32 hex digits)")
    return print_trace(settings, trace_id, last=args.last)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolmesh", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("up", help="start every implemented service (Ctrl-C stops them)")
    p.add_argument(
        "--collector-port",
        type=port,
        default=None,
        help="port of the local OTLP span store (default TOOLMESH_COLLECTOR_PORT, else 4317; "
        "0 picks a free one; ignored when OTEL_EXPORTER_OTLP_ENDPOINT is set)",
    )
    p.add_argument("--quiet", action="store_true", help="do not echo service logs")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("call", help="dispatch one tool call and print the rendered result")
    p.add_argument("name", help="tool name")
    p.add_argument(
        "--input",
        default="{}",
        metavar="JSON",
        help=f"tool input as a JSON object; {JSON_SOURCE_HELP}",
    )
    p.add_argument("--conversation", default="cli", help="conversation id (default: cli)")
    p.add_argument("--tenant", default="default", help="tenant id (default: default)")
    p.add_argument("--user", default="cli", help="user id (default: cli)")
    p.add_argument("--capability", action="append", help="caller capability (repeatable)")
    p.add_argument("--model", default="", help="conversation's model (a model config's name)")
    p.add_argument(
        "--tool-use-id",
        default="",
        help="tool_use id (default: generated); a call again with the same id and input in the "
        "conversation is answered with the first call's response, not run again",
    )
    p.add_argument("--timeout", type=seconds, default=330.0, help="RPC deadline in seconds")
    p.add_argument("--json", action="store_true", help="print the whole response as JSON")
    p.add_argument(
        "--progress",
        action="store_true",
        help="stream the call: print the tool's progress reports to stderr as they come",
    )
    p.add_argument("--dispatcher", help="dispatcher address (default: from config)")
    p.set_defaults(func=cmd_call)

    p = sub.add_parser("tools", help="list the tools a model sees (or --all stored tools)")
    sandbox_cli.add_listing_options(p)
    p.set_defaults(func=cmd_tools)
    sandbox_cli.add_tools_subcommands(p, cmd_tools)

    p = sub.add_parser("log", help="show the tool execution log, newest first")
    p.add_argument("--tool", help="only this tool")
    p.add_argument("--tenant", help="only this tenant")
    p.add_argument("--conversation", help="only this conversation")
    p.add_argument("--model", help="only calls whose context named this model")
    p.add_argument("--limit", type=limit, default=20, help="rows (default 20; at most 1000)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--dispatcher", help="dispatcher address (default: from config)")
    p.set_defaults(func=cmd_log)

    p = sub.add_parser("seed", help="re-seed the system tools and print the report")
    p.add_argument("--registry", help="registry address (default: from config)")
    p.set_defaults(func=cmd_seed)

    p = sub.add_parser("db", help="database maintenance")
    p.add_argument(
        "action",
        choices=["upgrade", "prune"],
        help="upgrade: apply migrations up to head; prune: delete the call log's rows, "
        "events and usage older than --older-than days (default TOOLMESH_RETENTION_DAYS) and "
        "the state of conversations idle for as long",
    )
    p.add_argument("--older-than", type=float, metavar="DAYS", help="prune: the age to keep")
    p.add_argument("--dry-run", action="store_true", help="prune: count, delete nothing")
    p.set_defaults(func=cmd_db)

    stats.add_subcommands(sub)
    export_cli.add_subcommands(sub)
    guardrails.add_subcommands(sub)
    mcp.add_subcommands(sub)
    sandbox_cli.add_subcommands(sub)
    surface_cli.add_subcommands(sub)

    p = sub.add_parser("trace", help="print a call's span tree from the local span store")
    p.add_argument("trace_id", nargs="?", help="32-hex trace id (see `toolmesh log --json`)")
    p.add_argument("--last", action="store_true", help="the most recent tool call's trace")
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser("keys", help="API keys of an authenticating dispatcher")
    keys_sub = p.add_subparsers(dest="keys_command", required=True)
    k = keys_sub.add_parser("hash", help="print the SHA-256 digest of a key for the keys file")
    k.add_argument("key", help="the API key (use a long random string)")
    k.set_defaults(func=cmd_keys_hash)
    return parser


def cmd_keys_hash(args: argparse.Namespace, settings: Settings) -> int:
    echo(hashlib.sha256(args.key.encode("utf-8")).hexdigest())
    return EXIT_OK


def _option_names(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """dest -> how the user writes it (`--input`, `name`), over the parsers from the one of the
    command chosen up to the top one (found by its func: a subcommand's dest may be overwritten
    by an option of the same name, as `mcp connect --command`)."""

    def path_to(current: argparse.ArgumentParser) -> list[argparse.ArgumentParser] | None:
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    found = path_to(child)
                    if found is not None:
                        return [current, *found]
        return [current] if current._defaults.get("func") is args.func else None

    names: dict[str, str] = {}
    for current in reversed(path_to(parser) or [parser]):
        for action in current._actions:
            if action.dest not in names and not isinstance(action, argparse._SubParsersAction):
                names[action.dest] = (
                    max(action.option_strings, key=len) if action.option_strings else action.dest
                )
    return names


# Arguments that name files: any bytes are a valid Linux path, so these may be non-UTF-8.
PATH_ARGUMENTS = frozenset({"output", "code", "schema", "catalog", "queries"})
# Arguments read by json_argument: a file name when given as @PATH (its contents are checked).
JSON_ARGUMENTS = frozenset({"input", "params"})


def _check_text(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every argument must be Unicode text. Python hands bytes that are not valid UTF-8 (a
    Latin-1 file name, a truncated paste) over as lone surrogates, which no protobuf string,
    gRPC header or JSON document can carry: name the argument instead of failing deep inside."""

    def bad(value: Any) -> bool:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(value, list | tuple):
            return any(bad(v) for v in value)
        return False

    for dest, value in vars(args).items():
        if dest in JSON_ARGUMENTS and isinstance(value, str) and value.startswith("@"):
            continue
        if dest not in PATH_ARGUMENTS and bad(value):
            name = _option_names(parser, args).get(dest, dest)
            raise UsageError(f"argument {name}: not valid UTF-8 text ({value!r})")


def _check_api_key() -> None:
    key = os.environ.get("TOOLMESH_API_KEY", "")
    if key and not _HEADER_VALUE.fullmatch(key):
        raise UsageError(
            "TOOLMESH_API_KEY holds characters an HTTP/2 header cannot carry (use printable "
            "ASCII, no leading or trailing space)"
        )


def _silence_stdout() -> None:
    """Point the stdout file descriptor at /dev/null, so that the interpreter's flush at exit
    does not fail a second time on a pipe that is gone or a disk that is full."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no stdout, or one captured in memory
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # The command reports what went wrong itself ("error: ..."); library warnings on the way
    # (the database layer's, say) would otherwise print as bare lines above it, twice said.
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.ERROR, format="%(levelname)s: %(name)s: %(message)s")
    if sys.stdout is None and args.func is not cmd_up:
        # Started with stdout closed (`toolmesh call x >&-`): refuse before calling anything,
        # rather than run a tool and lose what it answered.
        echo("error: standard output is closed; nowhere to print the result", file=sys.stderr)
        return EXIT_RPC_ERROR
    if sys.stdout is not None and sys.stdout is sys.__stdout__:
        # A file name made of bytes that are not UTF-8 (`export get -o`) prints back as the
        # same bytes, as other Unix tools print it, instead of failing after the work is done.
        with contextlib.suppress(AttributeError, ValueError):
            sys.stdout.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        echo(f"configuration error: {exc}", file=sys.stderr)
        return EXIT_RPC_ERROR
    try:
        _check_text(parser, args)
        _check_api_key()
        code = int(args.func(args, settings))
        if sys.stdout is not None:
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except UsageError as exc:
        echo(f"error: {exc}", file=sys.stderr)
        return EXIT_RPC_ERROR
    except ToolmeshError as exc:  # e.g. `db upgrade` or `seed` on a database it cannot open
        echo(f"error: {exc.message}", file=sys.stderr)
        return EXIT_RPC_ERROR
    except BrokenPipeError:
        # The reader went away (`toolmesh log | head`): stop quietly, as Unix tools do. Python
        # would otherwise fail again flushing stdout at exit.
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        # Ctrl-C: the process exits, which cancels an RPC in flight (the dispatcher logs the
        # call as cancelled); no traceback of where the main thread happened to wait.
        echo("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:
        # Output that cannot be written (a full disk: ENOSPC) and the like. The interpreter
        # would fail again flushing the same buffer at exit.
        if exc.filename is None and exc.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT):
            _silence_stdout()
            echo(f"error: cannot write the output: {exc.strerror}", file=sys.stderr)
        else:
            where = f": {exc.filename}" if exc.filename else ""
            echo(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_RPC_ERROR
    except Exception as exc:  # noqa: BLE001 - a bug: one line, the traceback when asked for
        if settings.log_level == "DEBUG":
            traceback.print_exc()
        echo(
            f"error: unexpected {type(exc).__name__}: {exc} "
            "(TOOLMESH_LOG_LEVEL=debug prints the traceback)",
            file=sys.stderr,
        )
        return EXIT_RPC_ERROR


if __name__ == "__main__":
    sys.exit(main())
