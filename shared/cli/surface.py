"""The `toolmesh surface show|derive|eval` and `toolmesh models [list|set]` commands: the tool
surface a call would get, the Tier-0 derivation, the offline search evaluation, and the model
configs. `add_subcommands(sub)` adds them to the `toolmesh` parser; each command's func is
`(args, settings) -> exit code` (0 ok, 1 a failed evaluation input, 2 an RPC failure)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import grpc

from shared.cli import INT32_MAX, int_between, service_channel
from shared.cli.render import echo, echo_json, rpc_failure
from shared.config import Settings
from shared.errors import ToolmeshError
from toolmesh.surface.v1 import surface_pb2 as spb
from toolmesh.surface.v1 import surface_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

EXIT_OK = 0
EXIT_BAD_INPUT = 1
MODES = {"chat": pb.MODE_CHAT, "agentic": pb.MODE_AGENTIC, "delegate": pb.MODE_DELEGATE}


def _rpc(args: argparse.Namespace, settings: Settings, method: str, request: Any) -> Any:
    with service_channel("surface", _address(args, settings)) as channel:
        stub = surface_pb2_grpc.SurfaceServiceStub(channel)
        return getattr(stub, method)(request, timeout=60)


def _address(args: argparse.Namespace, settings: Settings) -> str:
    return str(args.surface or settings.address("surface"))


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    request = spb.AssembleToolsRequest(
        tenant_id=args.tenant,
        capabilities=args.capability or [],
        conversation_id=args.conversation,
        namespace_id=args.namespace,
        mode=MODES[args.mode],
        model=args.model,
    )
    try:
        response = _rpc(args, settings, "AssembleTools", request)
    except grpc.RpcError as exc:
        return rpc_failure(exc, "surface", _address(args, settings))
    if args.json:
        fmt = "openai_json" if args.format == "openai" else "anthropic_json"
        echo_json(json.dumps([json.loads(getattr(t, fmt)) for t in response.tools], indent=2))
        return EXIT_OK
    echo(f"{len(response.tools)} tools ({args.mode}, floor: {response.floor_source})")
    for tool in response.tools:
        echo(f"  {'resident' if tool.resident else 'paged in':<9} {tool.name}")
    if response.filtered:
        echo(f"filtered by model capabilities: {', '.join(response.filtered)}")
    if response.skipped:
        echo(f"skipped (not in the registry for this caller): {', '.join(response.skipped)}")
    return EXIT_OK


def cmd_derive(args: argparse.Namespace, settings: Settings) -> int:
    try:
        response = _rpc(args, settings, "DeriveTier0", spb.DeriveTier0Request())
    except grpc.RpcError as exc:
        return rpc_failure(exc, "surface", _address(args, settings))
    echo(f"{len(response.names)} tools: {', '.join(response.names)}")
    if response.warning:
        echo(f"warning: {response.warning}")
    return EXIT_OK


def cmd_eval(args: argparse.Namespace, settings: Settings) -> int:
    from services.surface.embedding import load_embedder
    from services.surface.evaluate import evaluate

    embedder = None if args.lexical_only else load_embedder()
    try:
        result = evaluate(Path(args.catalog), Path(args.queries), embedder)
    except ToolmeshError as exc:
        echo(f"error: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    echo(result.lexical.line("bm25"))
    if result.hybrid is not None:
        echo(result.hybrid.line("hybrid"))
    else:
        echo("hybrid   unavailable: the embedding model package is not installed")
    return EXIT_OK


def _model_line(c: spb.ModelConfig) -> str:
    return (
        f"{c.model:<24} {c.provider:<16} {c.max_output_tokens:>7}  "
        f"{','.join(c.roles) or '-':<28} {','.join(c.capabilities) or '-':<24} "
        f"${c.input_price_per_mtok:g}/${c.output_price_per_mtok:g} per Mtok"
    )


def cmd_models_list(args: argparse.Namespace, settings: Settings) -> int:
    try:
        response = _rpc(args, settings, "ListModelConfigs", spb.ListModelConfigsRequest())
    except grpc.RpcError as exc:
        return rpc_failure(exc, "surface", _address(args, settings))
    echo(
        f"{'model':<24} {'provider':<16} {'max out':>7}  {'roles':<28} {'capabilities':<24} prices"
    )
    for config in response.configs:
        echo(_model_line(config))
    return EXIT_OK


def cmd_models_set(args: argparse.Namespace, settings: Settings) -> int:
    config = spb.ModelConfig(
        model=args.model,
        provider=args.provider,
        max_output_tokens=args.max_output_tokens,
        roles=args.role or [],
        capabilities=args.capability or [],
        input_price_per_mtok=args.input_price,
        output_price_per_mtok=args.output_price,
        cache_read_price_per_mtok=args.cache_read_price,
        cache_write_price_per_mtok=args.cache_write_price,
    )
    try:
        response = _rpc(
            args, settings, "UpsertModelConfig", spb.UpsertModelConfigRequest(config=config)
        )
    except grpc.RpcError as exc:
        return rpc_failure(exc, "surface", _address(args, settings))
    echo(_model_line(response.config))
    return EXIT_OK


def add_subcommands(sub: Any) -> None:
    """Add `surface` (show | derive | eval) and `models` (list | set) to the subparsers."""
    surface = sub.add_parser("surface", help="the tool surface a model sees; search evaluation")
    actions = surface.add_subparsers(dest="surface_command", required=True)

    p = actions.add_parser("show", help="the tools a call of a conversation would be offered")
    p.add_argument("--conversation", default="", help="conversation id (its working set)")
    p.add_argument("--namespace", default="", help="namespace inside the conversation")
    p.add_argument("--mode", choices=sorted(MODES), default="chat")
    p.add_argument("--tenant", default="default", help="tenant of the call")
    p.add_argument("--capability", action="append", help="caller capability (repeatable)")
    p.add_argument("--model", default="", help="model config name (capability filtering)")
    p.add_argument("--json", action="store_true", help="print the provider tool array")
    p.add_argument("--format", choices=["anthropic", "openai"], default="anthropic")
    p.add_argument("--surface", help="surface address (default: from config)")
    p.set_defaults(func=cmd_show)

    p = actions.add_parser("derive", help="re-derive and store the Tier-0 floor now")
    p.add_argument("--surface", help="surface address (default: from config)")
    p.set_defaults(func=cmd_derive)

    p = actions.add_parser(
        "eval", help="recall@1, recall@5 and MRR of tool search on a catalog (offline)"
    )
    p.add_argument(
        "--catalog", required=True, help="JSON list of {name, description, input_schema}"
    )
    p.add_argument("--queries", required=True, help="JSON list of {query, expected: [names]}")
    p.add_argument("--lexical-only", action="store_true", help="skip the embedding model")
    p.set_defaults(func=cmd_eval)

    models = sub.add_parser("models", help="model configs: list (default) or set")
    models.add_argument("--surface", help="surface address (default: from config)")
    models.set_defaults(func=cmd_models_list)
    margs = models.add_subparsers(dest="models_command")
    p = margs.add_parser("list", help="list the model configs")
    p.add_argument("--surface", help="surface address (default: from config)")
    p.set_defaults(func=cmd_models_list)
    p = margs.add_parser("set", help="create or update a model config")
    p.add_argument("model")
    p.add_argument("--provider", required=True)
    p.add_argument("--max-output-tokens", type=int_between(1, INT32_MAX), required=True)
    p.add_argument("--role", action="append", help="role the model serves (repeatable)")
    p.add_argument("--capability", action="append", help="native capability (repeatable)")
    p.add_argument("--input-price", type=float, default=0.0, help="USD per million input tokens")
    p.add_argument("--output-price", type=float, default=0.0, help="USD per million output tokens")
    p.add_argument("--cache-read-price", type=float, default=0.0)
    p.add_argument("--cache-write-price", type=float, default=0.0)
    p.add_argument("--surface", help="surface address (default: from config)")
    p.set_defaults(func=cmd_models_set)
