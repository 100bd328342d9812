"""Benchmark: what the dispatcher's policy checks cost per call. The internal `ping` tool
through dispatcher -> registry, first with no policy rules, then with 10 active rules that all
apply to the call (every rule kind, a rate limit included) and none of which fires, measured in
one run against one mesh; printed as ratios (rules / none).

    python -m bench.guardrails_overhead [--n 1000] [--duration 3] [--concurrency 32]

Each call has distinct arguments (a counter) so the loop guard never refuses, and conversations
are spread over the in-flight calls the way independent conversations would be.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
from pathlib import Path

import grpc

from bench.dispatch_overhead import start_mesh
from bench.measure import (
    LatencyStats,
    machine_load,
    measure_latency,
    measure_throughput,
    ratio_line,
)
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

TENANT = "bench"
USER = "bench-user"


def ten_rules() -> list[dpb.PolicyRule]:
    """Ten rules that apply to `ping` for the bench tenant and pass for its calls."""

    def rule(name: str, kind: int, params: dict[str, object], tool: str = "ping") -> dpb.PolicyRule:
        return dpb.PolicyRule(
            tenant_id=TENANT,
            name=name,
            kind=kind,
            tool_name=tool,
            mode=dpb.POLICY_MODE_BLOCKING,
            params_json=json.dumps(params),
        )

    constraint = dpb.POLICY_RULE_KIND_ARG_CONSTRAINT
    return [
        rule("rate", dpb.POLICY_RULE_KIND_RATE_LIMIT, {"max_calls": 10**9, "window_seconds": 60}),
        rule("deny-intruder", dpb.POLICY_RULE_KIND_DENY_TOOL, {"user_ids": ["intruder"]}),
        rule("deny-guest", dpb.POLICY_RULE_KIND_DENY_TOOL, {"user_ids": ["guest"]}),
        rule("ops-only", dpb.POLICY_RULE_KIND_DENY_TOOL, {"unless_capability": "ops"}, "*"),
        rule(
            "compose-first", dpb.POLICY_RULE_KIND_REQUIRE_PRIOR_TOOL, {"prior_tool": "compose_ping"}
        ),
        rule(
            "preview-first", dpb.POLICY_RULE_KIND_REQUIRE_PRIOR_TOOL, {"prior_tool": "compose_ping"}
        ),
        rule(
            "no-drop", constraint, {"path": "$.echo.q", "pattern": "(?i)drop", "must_match": False}
        ),
        rule(
            "no-secret", constraint, {"path": "$.echo.q", "pattern": "secret", "must_match": False}
        ),
        rule(
            "numeric-n", constraint, {"path": "$.echo.n", "pattern": "^[0-9]+$", "must_match": True}
        ),
        rule("any-echo", constraint, {"path": "$.echo", "pattern": ".", "must_match": True}, "*"),
    ]


async def measure_calls(
    stub: dispatcher_pb2_grpc.DispatcherServiceStub,
    n: int,
    duration: float,
    concurrency: int,
) -> tuple[LatencyStats, float]:
    counter = itertools.count()

    async def call() -> None:
        i = next(counter)
        request = dpb.DispatchToolCallRequest(
            tool_use=pb.ToolUse(name="ping", input_json=json.dumps({"echo": {"n": i, "q": "x"}})),
            context=pb.CallContext(
                tenant_id=TENANT,
                user_id=USER,
                conversation_id=f"bench-{i % concurrency}",
                capabilities=["ops"],
            ),
        )
        response = await stub.DispatchToolCall(request)
        if response.result.error or response.warnings:
            raise RuntimeError(response.result.error or response.warnings[0])

    latency = await measure_latency(call, n=n, warmup=min(300, n))
    throughput = await measure_throughput(call, concurrency=concurrency, duration_s=duration)
    return latency, throughput


async def main_async(n: int, duration: float, concurrency: int) -> None:
    with tempfile.TemporaryDirectory(prefix="toolmesh-bench-") as tmp:
        processes = start_mesh(Path(tmp), tracing=False, collector_port=0)
        try:
            async with grpc.aio.insecure_channel(processes[1].address) as channel:
                stub = dispatcher_pb2_grpc.DispatcherServiceStub(channel)
                for c in range(concurrency):  # satisfies the require_prior_tool rules
                    await stub.DispatchToolCall(
                        dpb.DispatchToolCallRequest(
                            tool_use=pb.ToolUse(name="compose_ping", input_json="{}"),
                            context=pb.CallContext(
                                tenant_id=TENANT, user_id=USER, conversation_id=f"bench-{c}"
                            ),
                        )
                    )
                none_lat, none_tp = await measure_calls(stub, n, duration, concurrency)
                for rule in ten_rules():
                    await stub.AddPolicyRule(dpb.AddPolicyRuleRequest(rule=rule))
                rules_lat, rules_tp = await measure_calls(stub, n, duration, concurrency)
        finally:
            for proc in reversed(processes):
                proc.stop()
    print("ping through dispatcher -> registry: 10 active policy rules vs none (tracing off)")
    print(f"  no rules:  {none_lat}; {none_tp:.0f} calls/s at {concurrency} in flight")
    print(f"  10 rules:  {rules_lat}; {rules_tp:.0f} calls/s")
    print("  " + ratio_line("p50", rules_lat.p50_ms, none_lat.p50_ms, "ms"))
    print("  " + ratio_line("p99", rules_lat.p99_ms, none_lat.p99_ms, "ms"))
    print("  " + ratio_line(f"throughput@{concurrency}", rules_tp, none_tp, "calls/s"))
    print(f"  added per call (p50): {rules_lat.p50_ms - none_lat.p50_ms:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=1000, help="sequential calls for latency")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of throughput load")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    with machine_load():
        asyncio.run(main_async(args.n, args.duration, args.concurrency))


if __name__ == "__main__":
    main()
