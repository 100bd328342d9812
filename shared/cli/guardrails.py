"""The `toolmesh policy add|list|disable` and `toolmesh cancel` commands: the dispatcher's policy
rules and the cancellation of a conversation's in-flight calls. `add_subcommands(sub)` adds them
to the `toolmesh` parser; each command's func is `(args, settings) -> exit code` (0 ok, 2 an RPC
failure)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import grpc
from google.protobuf import json_format

from shared.cli import INT64_MAX, JSON_SOURCE_HELP, int_between, json_argument, service_channel
from shared.cli.render import echo, echo_json, rpc_failure
from shared.config import Settings
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc

EXIT_OK = 0

KINDS = {
    "deny_tool": dpb.POLICY_RULE_KIND_DENY_TOOL,
    "require_prior_tool": dpb.POLICY_RULE_KIND_REQUIRE_PRIOR_TOOL,
    "arg_constraint": dpb.POLICY_RULE_KIND_ARG_CONSTRAINT,
    "rate_limit": dpb.POLICY_RULE_KIND_RATE_LIMIT,
}
KIND_NAMES = {v: k for k, v in KINDS.items()}
MODES = {"blocking": dpb.POLICY_MODE_BLOCKING, "advisory": dpb.POLICY_MODE_ADVISORY}

PARAMS_HELP = (
    "kind parameters as a JSON object: deny_tool {} or {'user_ids': [..]} / "
    "{'unless_capability': 'cap'}; require_prior_tool {'prior_tool': 'describe_entry'}; "
    "arg_constraint {'path': '$.sql', 'pattern': 'regex', 'must_match': false}; "
    "rate_limit {'max_calls': 10, 'window_seconds': 60}"
)


def _rpc(args: argparse.Namespace, settings: Settings, method: str, request: Any) -> Any:
    """Call one dispatcher RPC on a channel closed afterwards; grpc.RpcError propagates."""
    with service_channel("dispatcher", _address(args, settings)) as channel:
        stub = dispatcher_pb2_grpc.DispatcherServiceStub(channel)
        return getattr(stub, method)(request, timeout=30)


def _address(args: argparse.Namespace, settings: Settings) -> str:
    return str(args.dispatcher or settings.address("dispatcher"))


def _rule_line(rule: dpb.PolicyRule) -> str:
    mode = "advisory" if rule.mode == dpb.POLICY_MODE_ADVISORY else "blocking"
    state = "" if rule.enabled else "  (disabled)"
    return (
        f"{rule.id:>5}  {rule.tenant_id:<16} {rule.name:<24} {KIND_NAMES.get(rule.kind, '?'):<19}"
        f" {rule.tool_name:<16} {mode:<9} {rule.params_json}{state}"
    )


def _print_rules(rules: list[dpb.PolicyRule], as_json: bool) -> None:
    if as_json:
        echo_json(json.dumps([json.loads(json_format.MessageToJson(r)) for r in rules], indent=2))
        return
    echo(f"{'id':>5}  {'tenant':<16} {'name':<24} {'kind':<19} {'tool':<16} {'mode':<9} params")
    for rule in rules:
        echo(_rule_line(rule))


def cmd_policy_add(args: argparse.Namespace, settings: Settings) -> int:
    rule = dpb.PolicyRule(
        tenant_id=args.tenant,
        name=args.name,
        kind=KINDS[args.kind],
        tool_name=args.tool,
        mode=MODES[args.mode],
        params_json=json_argument(args.params, "--params", max_bytes=settings.max_input_bytes),
        message=args.message or "",
        created_by=args.created_by,
    )
    try:
        stored = _rpc(args, settings, "AddPolicyRule", dpb.AddPolicyRuleRequest(rule=rule)).rule
    except grpc.RpcError as exc:
        return rpc_failure(exc, "dispatcher", _address(args, settings))
    _print_rules([stored], args.json)
    return EXIT_OK


def cmd_policy_list(args: argparse.Namespace, settings: Settings) -> int:
    request = dpb.ListPolicyRulesRequest(tenant_id=args.tenant or "", include_disabled=args.all)
    try:
        rules = list(_rpc(args, settings, "ListPolicyRules", request).rules)
    except grpc.RpcError as exc:
        return rpc_failure(exc, "dispatcher", _address(args, settings))
    _print_rules(rules, args.json)
    return EXIT_OK


def cmd_policy_disable(args: argparse.Namespace, settings: Settings) -> int:
    request = dpb.DisablePolicyRuleRequest(id=args.id)
    try:
        rule = _rpc(args, settings, "DisablePolicyRule", request).rule
    except grpc.RpcError as exc:
        return rpc_failure(exc, "dispatcher", _address(args, settings))
    echo(f"disabled policy rule {rule.id} ({rule.name})")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    request = dpb.CancelRequest(conversation_id=args.conversation, tenant_id=args.tenant)
    try:
        response = _rpc(args, settings, "Cancel", request)
    except grpc.RpcError as exc:
        return rpc_failure(exc, "dispatcher", _address(args, settings))
    if args.json:
        echo_json(json_format.MessageToJson(response))
    else:
        echo(response.message)
        for tool_use_id in response.cancelled_tool_use_ids:
            echo(f"  cancelled {tool_use_id}")
    return EXIT_OK


def add_subcommands(sub: Any) -> None:
    """Add `policy` (add | list | disable) and `cancel` to the `toolmesh` subparsers."""
    policy = sub.add_parser("policy", help="dispatcher policy rules: add, list, disable")
    actions = policy.add_subparsers(dest="policy_command", required=True)

    p = actions.add_parser("add", help="create a policy rule (checked before every call)")
    p.add_argument("--tenant", required=True, help="tenant the rule applies to ('*': all)")
    p.add_argument("--name", required=True, help="short name the model is shown")
    p.add_argument("--kind", required=True, choices=sorted(KINDS))
    p.add_argument("--tool", required=True, help="tool the rule guards ('*': every tool)")
    p.add_argument("--mode", choices=sorted(MODES), default="blocking")
    p.add_argument(
        "--params", default="{}", metavar="JSON", help=f"{PARAMS_HELP}; {JSON_SOURCE_HELP}"
    )
    p.add_argument("--message", help="what the model is told (default: generated)")
    p.add_argument("--created-by", default="cli")
    p.add_argument("--json", action="store_true")
    p.add_argument("--dispatcher", help="dispatcher address (default: from config)")
    p.set_defaults(func=cmd_policy_add)

    p = actions.add_parser("list", help="list policy rules, oldest first")
    p.add_argument("--tenant", help="only rules that apply to this tenant")
    p.add_argument("--all", action="store_true", help="include disabled rules")
    p.add_argument("--json", action="store_true")
    p.add_argument("--dispatcher", help="dispatcher address (default: from config)")
    p.set_defaults(func=cmd_policy_list)

    p = actions.add_parser("disable", help="disable a policy rule by id")
    p.add_argument("id", type=int_between(1, INT64_MAX), help="the rule's id (policy list)")
    p.add_argument("--dispatcher", help="dispatcher address (default: from config)")
    p.set_defaults(func=cmd_policy_disable)

    p = sub.add_parser("cancel", help="cancel the in-flight calls of a conversation")
    p.add_argument("conversation", help="conversation id")
    p.add_argument("--tenant", default="default", help="tenant id (default: default)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--dispatcher", help="dispatcher address (default: from config)")
    p.set_defaults(func=cmd_cancel)
