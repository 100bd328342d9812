"""The surface service through the real mesh (registry, dispatcher and two surface replicas as
processes, real gRPC, SQLite and PostgreSQL): composition by mode, the static and the derived
floor, search_tools paging tools into a working set that every replica sees, the surface budget,
capability filtering with its double guard, surface-miss telemetry feeding the derivation,
embeddings cleared on a description change and recomputed, model configs, and bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from sqlalchemy import select

from services.surface.assembly import MAX_TOOL_SURFACE
from services.surface.tier0 import ANCHORS
from shared.db.engine import make_engine, session_factory
from shared.db.models import ModelConfigRow, ToolDefinitionRow, ToolExecutionLogRow
from shared.launcher import service_env, start_services
from shared.rpc_errors import from_rpc_error
from shared.telemetry.collector import MemorySpanSink
from tests.conftest import BACKENDS, fresh_database_url
from tests.integration.conftest import Mesh, free_ports
from tests.support.waiting import wait_for
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.surface.v1 import surface_pb2 as spb
from toolmesh.surface.v1 import surface_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration

EVAL_CATALOG = Path(__file__).parent.parent / "data" / "surface_eval" / "catalog.json"
CATALOG_SAMPLE = 32  # slack, github, jira, linear and stripe tools
BULK_GROUPS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")
BULK_PER_GROUP = 20


class SurfaceMesh(Mesh):
    def surface(self, replica: int = 1) -> surface_pb2_grpc.SurfaceServiceStub:
        return surface_pb2_grpc.SurfaceServiceStub(self._channel(f"surface{replica}"))


def _custom(
    name: str, description: str, schema: dict[str, object], **extra: object
) -> pb.ToolDefinition:
    return pb.ToolDefinition(
        name=name,
        description=description,
        input_schema_json=json.dumps(schema),
        tool_type=pb.TOOL_TYPE_CUSTOM,
        status=pb.TOOL_STATUS_APPROVED,
        enabled=True,
        implementation="def run(inputs):\n    return {}\n",
        tenant_id="*",
        created_by="surface-test",
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module", params=BACKENDS)
def smesh(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
) -> Iterator[SurfaceMesh]:
    tmp = tmp_path_factory.mktemp(f"surface-{request.param}")
    url = fresh_database_url(request, request.param, str(tmp))
    sink, port = collector
    data_dir = tmp / "data"
    (data_dir / "files").mkdir(parents=True)
    env = service_env(
        TOOLMESH_DATA_DIR=str(data_dir),
        TOOLMESH_DATABASE_URL=url,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"127.0.0.1:{port}",
        TOOLMESH_TRACING="1",
        TOOLMESH_SHUTDOWN_GRACE_S="2",
        TOOLMESH_SURFACE_FLOOR_TTL_S="0.3",
        TOOLMESH_TOOL_CACHE_TTL_S="0.3",
        OTEL_BSP_SCHEDULE_DELAY="200",
    )
    for key in ("TOOLMESH_REGISTRY_ADDR", "TOOLMESH_DISPATCHER_ADDR", "TOOLMESH_SURFACE_ADDR"):
        env.pop(key, None)
    mesh = SurfaceMesh(request.param, url, data_dir, data_dir / "files", env, sink)
    surface_port, registry_port = free_ports(2)
    env["TOOLMESH_SURFACE_ADDR"] = f"127.0.0.1:{surface_port}"
    env["TOOLMESH_REGISTRY_ADDR"] = f"127.0.0.1:{registry_port}"
    try:
        wanted = {
            "surface1": ("surface", surface_port),
            "surface2": ("surface", 0),
            "registry": ("registry", registry_port),
            "dispatcher": ("dispatcher", 0),
        }
        started = start_services(list(wanted.values()), env=env)
        for key, proc in zip(wanted, started, strict=True):
            mesh.processes[key] = proc
        catalog = json.loads(EVAL_CATALOG.read_text())[:CATALOG_SAMPLE]
        tools = [_custom(t["name"], t["description"], t["input_schema"]) for t in catalog]
        tools.append(
            _custom(
                "web_search",
                "Search the web and return result snippets with links.",
                {"type": "object", "properties": {"q": {"type": "string"}}},
                replaced_by_model_capability="web_search",
            )
        )
        mesh.registry.UpsertTools(rpb.UpsertToolsRequest(tools=tools), timeout=60)
        wait_for(lambda: unembedded(mesh) == 0, timeout=120, what="the tools' embeddings")
        yield mesh
    finally:
        mesh.close()


def unembedded(mesh: Mesh) -> int:
    """Live tools without a stored embedding (any call makes a replica embed them)."""
    assemble(mesh, "warm-up")  # type: ignore[arg-type]
    engine, sessions = db(mesh)
    try:
        with sessions() as s:
            rows = s.scalars(
                select(ToolDefinitionRow.name).where(
                    ToolDefinitionRow.embedding.is_(None), ToolDefinitionRow.deleted_at.is_(None)
                )
            )
            return len(list(rows))
    finally:
        engine.dispose()


def db(mesh: Mesh):  # type: ignore[no-untyped-def]
    engine = make_engine(mesh.database_url)
    return engine, session_factory(engine)


def assemble(
    mesh: SurfaceMesh,
    conversation: str,
    *,
    mode: int = pb.MODE_CHAT,
    model: str = "",
    replica: int = 1,
    capabilities: tuple[str, ...] = (),
    tenant: str = "tenant-a",
) -> spb.AssembleToolsResponse:
    return mesh.surface(replica).AssembleTools(
        spb.AssembleToolsRequest(
            tenant_id=tenant,
            capabilities=list(capabilities),
            conversation_id=conversation,
            mode=mode,
            model=model,
        ),
        timeout=30,
    )


def search(
    mesh: SurfaceMesh,
    query: str,
    conversation: str,
    *,
    limit: int = 0,
    replica: int = 1,
    model: str = "",
) -> spb.SearchToolsResponse:
    return mesh.surface(replica).SearchTools(
        spb.SearchToolsRequest(
            query=query,
            limit=limit,
            model=model,
            context=pb.CallContext(tenant_id="tenant-a", conversation_id=conversation),
        ),
        timeout=30,
    )


def names(response: spb.AssembleToolsResponse) -> list[str]:
    return [t.name for t in response.tools]


def rpc_error(exc: grpc.RpcError):  # type: ignore[no-untyped-def]
    return from_rpc_error(exc)


def test_chat_surface_is_the_static_floor_intersected_with_the_registry(smesh: SurfaceMesh) -> None:
    response = assemble(smesh, "conv-static")
    got = names(response)
    assert response.floor_source == "static"
    for name in ("search_tools", "load_dataset", "preview_data", "describe_entry", "query"):
        assert name in got
    assert "ping" not in got  # internal
    assert "plan" not in got and "plan" not in response.skipped  # agentic-only, never composed
    assert "generate_document" in response.skipped  # a floor name the registry lacks
    assert all(t.resident for t in response.tools)
    tool = response.tools[got.index("query")]
    anthropic = json.loads(tool.anthropic_json)
    openai = json.loads(tool.openai_json)
    assert anthropic["name"] == "query" and "reasoning" in anthropic["input_schema"]["required"]
    assert openai["type"] == "function"
    assert openai["function"]["parameters"]["properties"]["reasoning"]["type"] == "string"


def test_agentic_mode_is_the_pm_allowlist_not_the_floor(smesh: SurfaceMesh) -> None:
    got = names(assemble(smesh, "conv-agentic", mode=pb.MODE_AGENTIC))
    assert "search_tools" in got and "describe_entry" in got and "preview_data" in got
    assert "query" not in got and "load_dataset" not in got  # floor tools outside _PM_ALLOWED


def test_search_tools_pages_a_tool_in_and_every_replica_keeps_it(smesh: SurfaceMesh) -> None:
    conversation = "conv-page"
    before = names(assemble(smesh, conversation, replica=2))
    assert "slack_send_message" not in before
    response = smesh.call(
        "search_tools",
        json.dumps({"query": "let my colleagues in the team chat know lunch is here"}),
        conversation=conversation,
    )
    assert response.result.envelope.WhichOneof("kind") == "ok", response.result.content
    assert "slack_send_message" in response.result.content
    ws = smesh.surface(2).GetWorkingSet(
        spb.GetWorkingSetRequest(conversation_id=conversation), timeout=10
    )
    assert "slack_send_message" in ws.names
    for replica in (1, 2):
        after = assemble(smesh, conversation, replica=replica)
        paged = {t.name: t.resident for t in after.tools}
        assert paged.get("slack_send_message") is False  # present, paged in (not resident)
    assert "slack_send_message" not in names(assemble(smesh, "conv-other"))
    # Searching again does not page twice; the tool is reported as already available.
    again = search(smesh, "post a message to a slack channel", conversation, replica=2)
    assert "slack_send_message" in again.already_available
    assert "slack_send_message" not in again.paged_in


def test_search_ranks_paraphrases_with_embeddings(smesh: SurfaceMesh) -> None:
    response = search(smesh, "file a bug report about the login crash in our repo", "conv-rank")
    assert response.hybrid
    assert response.matches[0].name in {"github_create_issue", "jira_create_issue"}
    assert response.matches[0].score >= response.matches[-1].score


def test_surface_budget_refuses_pages_beyond_it(smesh: SurfaceMesh) -> None:
    # Enough tools to fill a surface; they rank lexically until their embeddings are stored.
    bulk = [
        _custom(
            f"bulk_{group}_{i}",
            f"Bulk {group} widget operation number {i}.",
            {"type": "object", "properties": {"widget": {"type": "string"}}},
        )
        for group in BULK_GROUPS
        for i in range(BULK_PER_GROUP)
    ]
    smesh.registry.UpsertTools(rpb.UpsertToolsRequest(tools=bulk), timeout=60)
    wait_for(
        lambda: any(
            m.name.startswith("bulk_") for m in search(smesh, "bulk widget", "probe").matches
        ),
        what="the surface to see the new tools",
    )
    conversation = "conv-budget"
    refusals = []
    for group in BULK_GROUPS:
        response = search(smesh, f"bulk {group} widget operation", conversation, limit=20)
        if response.refusal:
            refusals.append(response.refusal)
    assert refusals, "the budget was never reached"
    surface = assemble(smesh, conversation)
    assert len(surface.tools) == MAX_TOOL_SURFACE


def test_capability_filter_needs_model_claim_and_provider_support(smesh: SurfaceMesh) -> None:
    engine, sessions = db(smesh)
    with sessions.begin() as s:
        s.merge(
            ModelConfigRow(
                model="gpt-test",
                provider="openai_responses",
                capabilities=["web_search"],
                max_output_tokens=1000,
                roles=[],
            )
        )
    filtered = assemble(smesh, "conv-cap", model="gpt-test")
    assert "web_search" in filtered.filtered and "web_search" not in names(filtered)
    # The default Anthropic model claims web_search, but nothing delivers it: the tool stays.
    kept = assemble(smesh, "conv-cap", model="claude-sonnet-4-5")
    assert "web_search" in names(kept) and not kept.filtered
    # A tool the model paged in is never filtered.
    found = search(smesh, "search the web for snippets", "conv-cap-paged", model="gpt-test")
    assert "web_search" in found.paged_in
    paged = assemble(smesh, "conv-cap-paged", model="gpt-test")
    assert "web_search" in names(paged)
    engine.dispose()


def test_derive_tier0_from_usage_and_surface_misses(smesh: SurfaceMesh) -> None:
    engine, sessions = db(smesh)
    now = datetime.now(UTC)
    with sessions.begin() as s:
        for age_days, tool, count in (
            (1, "jira_search_issues", 5),
            (200, "github_search_code", 40),
        ):
            for _ in range(count):
                s.add(
                    ToolExecutionLogRow(
                        tool_name=tool,
                        tenant_id="tenant-a",
                        input_data={},
                        success=True,
                        created_at=now - timedelta(days=age_days),
                    )
                )
    for i in range(3):  # three conversations needed a tool outside the floor: 3 misses
        search(smesh, "give the customer their money back", f"conv-miss-{i}")
    derived = smesh.surface(2).DeriveTier0(spb.DeriveTier0Request(), timeout=30)
    got = list(derived.names)
    assert got[: len(ANCHORS)] == list(ANCHORS)
    # 5 recent calls x 3.0 = 15 beat 40 old calls x 0.2 = 8; 3 recent misses x 2.0 x 3.0 = 18
    # beat the old calls too (and the bulk tools earlier tests paged in once each: 6).
    assert got.index("jira_search_issues") < got.index("github_search_code")
    assert got.index("stripe_refund_charge") < got.index("github_search_code")
    assert len(got) == 30 and not derived.warning
    response = wait_for(
        lambda: (r := assemble(smesh, "conv-derived")).floor_source == "derived" and r,
        what="the derived floor",
    )
    assert "jira_search_issues" in names(response)
    engine.dispose()


def test_changed_description_clears_and_recomputes_the_embedding(smesh: SurfaceMesh) -> None:
    engine, sessions = db(smesh)

    def embedding() -> bytes | None:
        with sessions() as s:
            return s.scalar(
                select(ToolDefinitionRow.embedding).where(
                    ToolDefinitionRow.name == "slack_list_channels"
                )
            )

    assemble(smesh, "conv-embed")
    wait_for(embedding, what="the first embedding")
    tool = _custom(
        "slack_list_channels",
        "Enumerate every Slack room the bot belongs to.",
        {"type": "object", "properties": {}},
    )
    smesh.registry.UpsertTools(rpb.UpsertToolsRequest(tools=[tool]), timeout=30)
    assert embedding() is None  # cleared by the registry on the description change

    def recomputed() -> bool:
        assemble(smesh, "conv-embed")  # any call notices the changed catalog
        return embedding() is not None

    wait_for(recomputed, what="the recomputed embedding")
    engine.dispose()


def test_model_configs_list_and_upsert(smesh: SurfaceMesh) -> None:
    stub = smesh.surface()
    listed = stub.ListModelConfigs(spb.ListModelConfigsRequest(), timeout=10).configs
    assert "claude-sonnet-4-5" in [c.model for c in listed]
    config = spb.ModelConfig(
        provider="anthropic",
        model="claude-test",
        capabilities=["web_search"],
        max_output_tokens=2048,
        roles=["tool_auditor"],
        input_price_per_mtok=1.5,
    )
    stored = stub.UpsertModelConfig(spb.UpsertModelConfigRequest(config=config), timeout=10)
    assert stored.config.max_output_tokens == 2048
    listed = stub.ListModelConfigs(spb.ListModelConfigsRequest(), timeout=10).configs
    assert [c.input_price_per_mtok for c in listed if c.model == "claude-test"] == [1.5]
    with pytest.raises(grpc.RpcError) as info:
        stub.UpsertModelConfig(
            spb.UpsertModelConfigRequest(config=spb.ModelConfig(model="x", provider="nope")),
            timeout=10,
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("call", "code", "reason"),
    [
        (
            lambda m: assemble(m, "c", tenant=""),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            lambda m: assemble(m, "c", model="no-such-model"),
            grpc.StatusCode.NOT_FOUND,
            "MODEL_NOT_CONFIGURED",
        ),
        (lambda m: search(m, "   ", "c"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        (
            lambda m: search(m, "x", "c", limit=500),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (lambda m: search(m, "x", ""), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
    ],
)
def test_bad_requests_are_clear_statuses(smesh: SurfaceMesh, call, code, reason) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call(smesh)
    assert info.value.code() == code
    assert rpc_error(info.value).reason == reason


def test_search_tools_with_bad_input_is_a_schema_hint(smesh: SurfaceMesh) -> None:
    response = smesh.call("search_tools", json.dumps({"query": ""}), conversation="conv-bad")
    assert response.result.envelope.WhichOneof("kind") == "hint"


@pytest.mark.parametrize(
    ("conversation", "reason"), [("c" * 129, "ID_TOO_LONG"), ("conv\x00nul", "ID_INVALID")]
)
def test_a_conversation_id_the_working_set_cannot_store_is_invalid_argument(
    smesh: SurfaceMesh, conversation: str, reason: str
) -> None:
    """PostgreSQL refuses ids over the 128-character columns and NUL: before, UNAVAILABLE."""
    with pytest.raises(grpc.RpcError) as caught:
        search(smesh, "create a jira ticket", conversation)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert from_rpc_error(caught.value).reason == reason


def test_search_tools_is_one_trace_from_dispatcher_to_surface(smesh: SurfaceMesh) -> None:
    response = smesh.call(
        "search_tools", json.dumps({"query": "create a jira ticket"}), conversation="conv-trace"
    )
    assert response.result.envelope.WhichOneof("kind") == "ok"

    def surface_span():  # type: ignore[no-untyped-def]
        return [
            s
            for s in smesh.spans.spans()
            if s.service_name == "toolmesh-surface"
            and s.name.endswith("SurfaceService/SearchTools")
            and s.attributes.get("toolmesh.search.paged_in") is not None
        ]

    def joined() -> bool:
        dispatcher = {
            s.trace_id for s in smesh.spans.spans() if s.service_name == "toolmesh-dispatcher"
        }
        return any(s.trace_id in dispatcher for s in surface_span())

    wait_for(joined, what="a SearchTools span in the dispatcher's trace")


def test_cli_shows_the_surface_derives_and_sets_models(
    smesh: SurfaceMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    from shared.cli.main import main as toolmesh

    address = ["--surface", smesh.address("surface1")]
    search(smesh, "post a message to a slack channel", "conv-cli", limit=1)
    assert (
        toolmesh(
            ["surface", "show", "--conversation", "conv-cli", "--tenant", "tenant-a", *address]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "paged in  slack_send_message" in out and "resident  query" in out
    assert (
        toolmesh(["surface", "show", "--json", "--format", "openai", "--tenant", "t", *address])
        == 0
    )
    tools = json.loads(capsys.readouterr().out)
    assert all(t["type"] == "function" for t in tools)
    assert toolmesh(["surface", "derive", *address]) == 0
    assert "tools:" in capsys.readouterr().out
    assert (
        toolmesh(
            [
                "models",
                "set",
                "claude-cli",
                "--provider",
                "anthropic",
                "--max-output-tokens",
                "512",
                *address,
            ]
        )
        == 0
    )
    assert toolmesh(["models", *address]) == 0
    assert "claude-cli" in capsys.readouterr().out
    assert (
        toolmesh(
            ["models", "set", "bad", "--provider", "nope", "--max-output-tokens", "1", *address]
        )
        == 2
    )
