"""`toolmesh stats`: operational statistics from the shared logs — calls, error rate, p50/p95
duration and cost per tool, tenant, user or conversation over a window (GetUsageStats; any
registry replica answers the same). `toolmesh stats --contract` prints instead the Uniform Tool
Contract counters of one registry process — per tool, how many calls answered Ok, Hint and Err,
with hint_kind / err_kind tallies, contract violations and legacy returns coerced to an
envelope — counted since that process started."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import grpc
from google.protobuf import json_format

from shared.cli import seconds, service_channel
from shared.cli.render import echo, echo_json
from shared.config import Settings
from shared.rpc_errors import from_rpc_error
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc

EXIT_OK = 0
EXIT_USAGE = 1
EXIT_RPC_ERROR = 2
HEADERS = ("tool", "ok", "hint", "err", "violations", "coerced", "hint kinds", "err kinds")


def add_subcommands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `stats` to the `toolmesh` sub-command parsers."""
    p = sub.add_parser(
        "stats",
        help="calls, error rates, p50/p95 and cost from the logs (or --contract counters)",
    )
    p.add_argument(
        "--by",
        choices=("tool", "tenant", "user", "conversation", "model"),
        default="tool",
        help="group by (default tool)",
    )
    p.add_argument(
        "--since",
        default="24h",
        help="window start: a duration back from now (30m, 24h, 7d) or an ISO date/time",
    )
    p.add_argument("--tenant", help="only this tenant")
    p.add_argument(
        "--contract",
        action="store_true",
        help="the contract envelope counters (Ok/Hint/Err) of one registry process instead",
    )
    p.add_argument("--tool", help="only this tool")
    p.add_argument("--json", action="store_true", help="print the whole response as JSON")
    p.add_argument("--registry", help="registry address (default: from config)")
    p.add_argument("--timeout", type=seconds, default=30.0, help="RPC deadline in seconds")
    p.set_defaults(func=cmd_stats)


def _tally(kinds: Mapping[str, int]) -> str:
    return " ".join(f"{kind}={count}" for kind, count in sorted(kinds.items())) or "-"


def format_stats(response: rpb.GetContractStatsResponse) -> list[str]:
    """The counters as an aligned table, headed by which process counted and since when."""
    since = (
        response.counting_since.ToDatetime().strftime("%Y-%m-%d %H:%M:%S UTC")
        if response.HasField("counting_since")
        else "?"
    )
    lines = [f"contract envelopes counted by registry {response.instance or '?'} since {since}"]
    if not response.stats:
        lines.append("(no calls recorded)")
        return lines
    rows: list[Sequence[str]] = [HEADERS]
    for s in response.stats:
        rows.append(
            (
                s.tool_name,
                str(s.ok_count),
                str(s.hint_count),
                str(s.err_count),
                str(s.contract_violation_count),
                str(s.coerced_count),
                _tally(s.hint_kinds),
                _tally(s.err_kinds),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    for row in rows:
        cells = [
            cell.ljust(w) if i in (0, 6, 7) else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.append(f"({len(response.stats)} tools)")
    return lines


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """ "30m", "24h", "7d" back from now, or an ISO date / date-time (UTC when naive)."""
    now = now or datetime.now(UTC)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text or "")
    if match:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[match.group(2)]
        try:
            return now - timedelta(seconds=float(match.group(1)) * unit)
        except (OverflowError, ValueError):  # further back than datetime goes (year 1)
            raise ValueError(f"--since {text!r}: that is before year 1") from None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(
            f"--since {text!r}: give a duration like 30m, 24h, 7d or an ISO date"
        ) from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


USAGE_HEADERS = ("calls", "errors", "err%", "p50 ms", "p95 ms", "llm", "tokens", "cost $")


def format_usage(response: rpb.GetUsageStatsResponse, group_by: str) -> list[str]:
    since = response.since.ToDatetime().strftime("%Y-%m-%d %H:%M:%S UTC")
    lines = [f"tool calls and cost since {since}, by {group_by}"]
    if not response.stats:
        lines.append("(no calls recorded)")
        return lines
    rows: list[Sequence[str]] = [(group_by, *USAGE_HEADERS)]
    for s in response.stats:
        rows.append(
            (
                s.key or "-",
                str(s.calls),
                str(s.errors),
                f"{s.error_rate * 100:.1f}",
                f"{s.p50_ms:.1f}",
                f"{s.p95_ms:.1f}",
                str(s.llm_calls),
                str(s.tokens),
                f"{s.cost_usd:.6f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.append(f"total cost ${response.total_cost_usd:.6f}")
    return lines


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    """`toolmesh stats`: GetUsageStats, or GetContractStats with --contract."""
    if not args.contract:
        return cmd_usage(args, settings)
    address = args.registry or settings.address("registry")
    if not address:
        echo("error: no registry address (set TOOLMESH_REGISTRY_ADDR)", file=sys.stderr)
        return EXIT_RPC_ERROR
    with service_channel("registry", address) as channel:
        stub = registry_pb2_grpc.RegistryServiceStub(channel)
        try:
            response = stub.GetContractStats(
                rpb.GetContractStatsRequest(tool_name=args.tool or ""), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            echo(f"error: {err.code} ({err.reason}): {err.message}", file=sys.stderr)
            if err.code == "UNAVAILABLE":
                echo(
                    f"is the mesh running? (registry at {address}; start it with `make up`)",
                    file=sys.stderr,
                )
            return EXIT_RPC_ERROR
    if args.json:
        echo_json(json.dumps(json_format.MessageToDict(response), indent=2))
    else:
        echo("\n".join(format_stats(response)))
    return EXIT_OK


def cmd_usage(args: argparse.Namespace, settings: Settings) -> int:
    address = args.registry or settings.address("registry")
    try:
        since = parse_since(args.since)
    except ValueError as exc:
        echo(f"error: {exc}", file=sys.stderr)
        return EXIT_RPC_ERROR  # a usage error, as argparse's own
    request = rpb.GetUsageStatsRequest(
        group_by=args.by, tool_name=args.tool or "", tenant_id=args.tenant or ""
    )
    request.since.FromDatetime(since)
    with service_channel("registry", address) as channel:
        stub = registry_pb2_grpc.RegistryServiceStub(channel)
        try:
            response = stub.GetUsageStats(request, timeout=args.timeout)
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            echo(f"error: {err.code} ({err.reason}): {err.message}", file=sys.stderr)
            if err.code == "UNAVAILABLE":
                echo(
                    f"is the mesh running? (registry at {address}; start it with `make up`)",
                    file=sys.stderr,
                )
            return EXIT_RPC_ERROR
    if args.json:
        echo_json(json.dumps(json_format.MessageToDict(response), indent=2))
    else:
        echo("\n".join(format_usage(response, args.by)))
    return EXIT_OK
