"""`toolmesh export list|get`: the files tools produced for download. `list` shows a
conversation's (or a tenant's) registered exports, newest first (ListExports); `get` downloads
one by its file id through the dispatcher's streaming GetExport, to a file or to stdout."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import grpc
from google.protobuf import json_format

from shared.cli import EXIT_RPC_ERROR, limit, seconds, service_channel
from shared.cli.render import echo, echo_json, rpc_failure
from shared.config import Settings
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc

EXIT_OK = 0
EXIT_USAGE = 1


def add_subcommands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `export` to the `toolmesh` sub-command parsers."""
    p = sub.add_parser("export", help="list or download files tools produced")
    export_sub = p.add_subparsers(dest="export_command", required=True)

    ls = export_sub.add_parser("list", help="registered exports, newest first")
    ls.add_argument("--conversation", default="", help="only this conversation")
    ls.add_argument("--tenant", default="default", help="tenant id (default: default)")
    ls.add_argument("--limit", type=limit, default=50, help="rows (default 50; at most 1000)")
    ls.add_argument("--json", action="store_true", help="print the exports as JSON")
    ls.add_argument("--dispatcher", help="dispatcher address (default: from config)")
    ls.add_argument("--timeout", type=seconds, default=30.0, help="RPC deadline in seconds")
    ls.set_defaults(func=cmd_list)

    get = export_sub.add_parser("get", help="download an export by its file id")
    get.add_argument("file_id", help="the export's file id (see `toolmesh export list`)")
    get.add_argument("--tenant", default="default", help="tenant id (default: default)")
    get.add_argument(
        "-o",
        "--output",
        help="where to write it: a file, a directory (keeps the export's filename) or - for "
        "stdout (default: the export's filename in the current directory)",
    )
    get.add_argument("--force", action="store_true", help="overwrite an existing file")
    get.add_argument("--dispatcher", help="dispatcher address (default: from config)")
    get.add_argument("--timeout", type=seconds, default=300.0, help="RPC deadline in seconds")
    get.set_defaults(func=cmd_get)


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    address = args.dispatcher or settings.address("dispatcher")
    stub = dispatcher_pb2_grpc.DispatcherServiceStub(service_channel("dispatcher", address))
    try:
        response = stub.ListExports(
            dpb.ListExportsRequest(
                conversation_id=args.conversation, tenant_id=args.tenant, limit=args.limit
            ),
            timeout=args.timeout,
        )
    except grpc.RpcError as exc:
        return rpc_failure(exc, "dispatcher", address)
    if args.json:
        echo_json(
            json.dumps([json_format.MessageToDict(e) for e in response.exports], ensure_ascii=False)
        )
        return EXIT_OK
    if not response.exports:
        echo("(no exports)")
        return EXIT_OK
    for e in response.exports:
        created = e.created_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")
        echo(
            f"{e.file_id}  {e.size_bytes:>10}  {created}  {e.filename}  "
            f"({e.mime_type or '?'}, {e.source_tool or '?'}, conversation {e.conversation_id})"
        )
    return EXIT_OK


def _target(output: str | None, filename: str) -> Path:
    safe = Path(filename).name or "export"
    if not output:
        return Path.cwd() / safe
    path = Path(output)
    return path / safe if path.is_dir() else path


def cmd_get(args: argparse.Namespace, settings: Settings) -> int:
    address = args.dispatcher or settings.address("dispatcher")
    stub = dispatcher_pb2_grpc.DispatcherServiceStub(service_channel("dispatcher", address))
    stream = stub.GetExport(
        dpb.GetExportRequest(file_id=args.file_id, tenant_id=args.tenant), timeout=args.timeout
    )
    to_stdout = args.output == "-"
    tmp: Path | None = None
    try:
        first = next(iter(stream), None)
        if first is None or first.WhichOneof("part") != "info":
            echo("error: the dispatcher sent no export metadata", file=sys.stderr)
            return EXIT_RPC_ERROR
        info = first.info
        if to_stdout:
            for message in stream:
                sys.stdout.buffer.write(message.chunk)
            sys.stdout.buffer.flush()
            return EXIT_OK
        target = _target(args.output, info.filename)
        if target.exists() and not args.force:
            echo(f"error: {target} exists (use --force to overwrite)", file=sys.stderr)
            stream.cancel()
            return EXIT_USAGE
        try:
            fd, name = tempfile.mkstemp(prefix=".export-", dir=target.parent)
        except OSError as exc:
            echo(f"error: cannot write {target}: {exc.strerror}", file=sys.stderr)
            stream.cancel()
            return EXIT_RPC_ERROR
        tmp = Path(name)
        size = 0
        with os.fdopen(fd, "wb") as out:
            for message in stream:
                out.write(message.chunk)
                size += len(message.chunk)
        if size != info.size_bytes:
            echo(f"error: received {size} bytes, the export has {info.size_bytes}", file=sys.stderr)
            return EXIT_RPC_ERROR
        tmp.replace(target)
        tmp = None
        echo(f"{target} ({size} bytes, {info.mime_type or 'unknown type'})")
        return EXIT_OK
    except grpc.RpcError as exc:
        return rpc_failure(exc, "dispatcher", address)
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
