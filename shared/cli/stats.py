"""`toolmesh stats`: the Uniform Tool Contract counters of a registry process — per tool, how many
calls answered Ok, Hint and Err, with hint_kind / err_kind tallies, contract violations and
legacy returns coerced to an envelope. Counters are per registry process (the one the address
reaches), counted since it started."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence

import grpc
from google.protobuf import json_format

from shared.config import Settings
from shared.rpc_errors import from_rpc_error
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc

EXIT_OK = 0
EXIT_RPC_ERROR = 2
HEADERS = ("tool", "ok", "hint", "err", "violations", "coerced", "hint kinds", "err kinds")


def add_subcommands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `stats` to the `toolmesh` sub-command parsers."""
    p = sub.add_parser(
        "stats",
        help="contract envelope counters per tool (Ok/Hint/Err) of one registry process",
    )
    p.add_argument("--tool", help="only this tool")
    p.add_argument("--json", action="store_true", help="print the whole response as JSON")
    p.add_argument("--registry", help="registry address (default: from config)")
    p.add_argument("--timeout", type=float, default=30.0, help="RPC deadline in seconds")
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


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    """Fetch GetContractStats from the registry and print it."""
    address = args.registry or settings.address("registry")
    if not address:
        print("error: no registry address (set TOOLMESH_REGISTRY_ADDR)", file=sys.stderr)
        return EXIT_RPC_ERROR
    with grpc.insecure_channel(address) as channel:
        stub = registry_pb2_grpc.RegistryServiceStub(channel)
        try:
            response = stub.GetContractStats(
                rpb.GetContractStatsRequest(tool_name=args.tool or ""), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            print(f"error: {err.code} ({err.reason}): {err.message}", file=sys.stderr)
            if err.code == "UNAVAILABLE":
                print(
                    f"is the mesh running? (registry at {address}; start it with `make up`)",
                    file=sys.stderr,
                )
            return EXIT_RPC_ERROR
    if args.json:
        print(json.dumps(json_format.MessageToDict(response), indent=2))
    else:
        print("\n".join(format_stats(response)))
    return EXIT_OK
