"""The registry applies the contract at handler registration: a spec-only handler is wrapped (a
dispatched call gets coercion, validation and telemetry) while a direct call of the function
still returns its ToolResult; a source-decorated handler is not wrapped twice. Its counters,
including the envelopes the registry answers itself, are served by GetContractStats and printed
by `toolmesh stats` (against an in-process server on loopback)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine

from services.registry.context import ToolContext
from services.registry.core import Registry
from services.registry.repository import SqlToolRepository
from services.registry.servicer import RegistryServicer
from services.registry.tools import analysis, internal
from shared.cli import stats as stats_cli
from shared.config import Settings
from shared.contract import Hint, Ok, ToolResult, is_contract_wrapped
from shared.db.engine import make_engine, session_factory, upgrade
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.registry.v1 import registry_pb2_grpc


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path}/toolmesh.db"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


@pytest.fixture
def registry(engine: Engine) -> Registry:
    reg = Registry(SqlToolRepository(session_factory(engine)), cache_ttl_s=0.0)
    reg.seed_system_tools()
    assert reg.auto_register_handlers() == {}
    return reg


def ctx() -> ToolContext:
    return ToolContext(tool_name="", tenant_id="t1", conversation_id="c1")


def test_spec_only_handlers_are_wrapped_and_decorated_ones_kept_as_they_are(
    registry: Registry,
) -> None:
    handlers = registry._handlers
    assert is_contract_wrapped(handlers["ping"]) and handlers["ping"] is not internal.ping
    assert handlers["describe_entry"] is analysis.describe_entry  # not wrapped twice
    assert all(is_contract_wrapped(h) for h in handlers.values())


def test_a_direct_caller_of_a_spec_only_handler_still_gets_its_toolresult() -> None:
    result = asyncio.run(internal.ping({"echo": 1}, ctx()))

    assert isinstance(result, ToolResult)
    assert isinstance(result.envelope, Ok) and result.envelope.data == {"pong": True, "echo": 1}


async def test_a_dispatched_legacy_return_is_coerced_validated_and_counted(
    registry: Registry,
) -> None:
    registry.register_handler("preview_data", lambda i, c: ToolResult(content="a legacy text"))

    result = (await registry.execute("preview_data", {"name": "people"}, ctx())).result

    assert isinstance(result.envelope, Ok)
    assert result.content == (
        "✓ ok.\na legacy text\n⚠ contract: preview_data is tabular but returned an empty schema"
    )
    [stats] = registry.contract_stats.snapshot("preview_data")
    assert (stats.ok, stats.coerced, stats.contract_violations) == (1, 1, 1)


async def test_a_handler_registered_for_a_tool_without_a_spec_is_left_legacy(
    engine: Engine,
) -> None:
    def untyped(inputs: dict[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult(content="raw content")

    registry = Registry(SqlToolRepository(session_factory(engine)), specs=lambda name: None)
    registry.seed_system_tools()
    registry.register_handler("ping", untyped)

    result = (await registry.execute("ping", {}, ctx())).result

    assert result.content == "raw content" and result.envelope is None
    assert registry.contract_stats.snapshot() == []


async def test_the_counters_include_hints_and_errs_the_registry_answers_itself(
    registry: Registry,
) -> None:
    await registry.execute("ping", {}, ctx())
    await registry.execute("ping", {"fail": "hint"}, ctx())
    await registry.execute("ping", {"fail": "raise"}, ctx())
    await registry.execute("ping", {"delay_ms": -5}, ctx())  # input validation: no handler run
    refused = ToolContext(tool_name="", tenant_id="t1", depth=99)
    await registry.execute("ping", {}, refused)

    [stats] = registry.contract_stats.snapshot("ping")
    assert (stats.ok, stats.hint, stats.err) == (1, 2, 2)
    assert stats.hint_kinds == {"fetch": 1, "schema": 1}
    assert stats.err_kinds == {"PingFailure": 1, "max_depth_exceeded": 1}


async def test_a_decorated_handler_dispatched_through_the_registry_counts_there(
    registry: Registry,
) -> None:
    def empty_store() -> Any:
        class Store:
            def list(self, scope: Any) -> list[Any]:
                return []

        return Store()

    context = ctx()
    context.datasets = empty_store()
    result = (await registry.execute("describe_entry", {"name": "people"}, context)).result

    assert isinstance(result.envelope, Hint) and result.envelope.hint_kind == "schema"
    [stats] = registry.contract_stats.snapshot("describe_entry")
    assert stats.hint_kinds == {"schema": 1} and stats.coerced == 0


async def test_get_contract_stats_serves_the_counters_and_toolmesh_stats_prints_them(
    registry: Registry, capsys: pytest.CaptureFixture[str]
) -> None:
    await registry.execute("ping", {}, ctx())
    await registry.execute("ping", {"fail": "error"}, ctx())
    await registry.execute("compose_ping", {}, ctx())  # its inner call has no caller: an Err
    server = grpc.aio.server()
    registry_pb2_grpc.add_RegistryServiceServicer_to_server(
        RegistryServicer(registry, max_input_bytes=1024), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = registry_pb2_grpc.RegistryServiceStub(channel)
            everything = await stub.GetContractStats(rpb.GetContractStatsRequest())
            only_ping = await stub.GetContractStats(rpb.GetContractStatsRequest(tool_name="ping"))
            unknown = await stub.GetContractStats(rpb.GetContractStatsRequest(tool_name="nope"))
        args = argparse.Namespace(
            tool="ping", json=False, registry=f"127.0.0.1:{port}", timeout=10, contract=True
        )
        code = await asyncio.to_thread(stats_cli.cmd_stats, args, Settings.from_env({}))
    finally:
        await server.stop(None)

    assert [s.tool_name for s in everything.stats] == ["compose_ping", "ping"]
    [ping] = only_ping.stats
    assert (ping.ok_count, ping.hint_count, ping.err_count) == (1, 0, 1)
    assert dict(ping.err_kinds) == {"legacy": 1} and ping.coerced_count == 1  # the legacy error
    assert everything.HasField("counting_since") and "/" in everything.instance
    assert list(unknown.stats) == []
    assert code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("contract envelopes counted by registry ")
    assert out[1].split() == list(
        ("tool", "ok", "hint", "err", "violations", "coerced", "hint", "kinds", "err", "kinds")
    )
    assert out[2].split() == ["ping", "1", "0", "1", "0", "1", "-", "legacy=1"]
    assert out[-1] == "(1 tools)"


def test_toolmesh_stats_reports_an_unreachable_registry(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(
        tool=None, json=False, registry="127.0.0.1:1", timeout=2, contract=True
    )

    assert stats_cli.cmd_stats(args, Settings.from_env({})) == stats_cli.EXIT_RPC_ERROR
    assert "UNAVAILABLE" in capsys.readouterr().err


def test_toolmesh_stats_registers_its_subcommand() -> None:
    parser = argparse.ArgumentParser()
    stats_cli.add_subcommands(parser.add_subparsers(dest="command"))

    args = parser.parse_args(["stats", "--tool", "query", "--json"])

    assert args.func is stats_cli.cmd_stats and args.tool == "query" and args.json
    assert not args.contract and args.by == "tool" and args.since == "24h"
    args = parser.parse_args(["stats", "--contract", "--by", "tenant", "--since", "7d"])
    assert args.contract and args.by == "tenant" and args.since == "7d"
