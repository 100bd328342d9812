"""The effects of a dispatched result, with real storage (SQLite and PostgreSQL) and an
in-process registry at the RegistryGateway seam: exports registered (generated_files, the export
catalog, `export` and `export.ready` events) or refused as an Err naming the problem; datasets
promoted into the conversation; cards finalised per response; and replay — the recorded effects
of the dispatched calls, applied to an empty database, reproduce conversation_events byte for
byte."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from services.dispatcher.core import Dispatcher
from services.dispatcher.effects import ExportFiles, SqlEffectsStore
from services.dispatcher.guardrails import PolicyRule
from services.dispatcher.logstore import SqlCallLog, SqlEventRecorder
from services.dispatcher.servicer import DispatcherServicer
from services.dispatcher.statestore import SqlGuardrailStore
from services.registry.context import DatasetScope
from services.registry.datasets import SqlDatasetStore
from shared import convert
from shared.arrow_ipc import dataframe_to_ipc
from shared.contract import Effects, Ok, ToolResult, envelope_to_tool_result
from shared.contract.effects import (
    EffectContext,
    TelemetryEvent,
    apply_effects,
    effects_from_json,
    effects_to_json,
)
from shared.db.engine import make_engine, session_factory
from shared.db.models import (
    ConversationEventBlobRow,
    ConversationEventRow,
    ExportCatalogRow,
    GeneratedFileRow,
)
from shared.errors import FailedPrecondition, NotFound
from tests.conftest import BACKENDS, fresh_database_url
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb

CTX = pb.CallContext(tenant_id="t1", user_id="u1", conversation_id="c1")


@dataclass
class ScriptedRegistry:
    """Answers each call with the ToolResult its input names (by `result` key)."""

    results: dict[str, ToolResult | pb.ToolResult] = field(default_factory=dict)

    async def execute(
        self, request: rpb.ExecuteToolRequest, timeout: float
    ) -> rpb.ExecuteToolResponse:
        inputs = json.loads(request.input_json)
        answer = self.results.get(str(inputs.get("result", "")))
        if answer is None:
            answer = envelope_to_tool_result(Ok(data={"echo": inputs.get("echo")}))
        pb_result = (
            answer if isinstance(answer, pb.ToolResult) else convert.tool_result_to_pb(answer)
        )
        copy = pb.ToolResult()
        copy.CopyFrom(pb_result)
        return rpb.ExecuteToolResponse(result=copy)

    async def tool_timeout(self, name: str, tenant_id: str) -> float | None:
        return None


@dataclass
class Env:
    core: Dispatcher
    registry: ScriptedRegistry
    log: SqlCallLog
    engine: Engine
    sessions: sessionmaker[Session]
    data_dir: Path
    store: SqlEffectsStore


@pytest.fixture
async def env(
    engine: Engine, sessions: sessionmaker[Session], tmp_path: Path
) -> AsyncIterator[Env]:
    data_dir = tmp_path / "data"
    (data_dir / "exports").mkdir(parents=True)
    registry = ScriptedRegistry()
    log = SqlCallLog(sessions)
    store = SqlEffectsStore(engine)
    core = Dispatcher(
        registry, log, SqlGuardrailStore(engine), data_dir=data_dir, effects_store=store
    )
    yield Env(core, registry, log, engine, sessions, data_dir, store)
    await core.close()
    await asyncio.to_thread(log.close)


def use(tool_use_id: str, **inputs: Any) -> pb.ToolUse:
    return pb.ToolUse(id=tool_use_id, name="tool", input_json=json.dumps(inputs))


def kind(result: pb.ToolResult) -> str:
    env = result.envelope
    return env.err.err_kind if env.WhichOneof("kind") == "err" else str(env.WhichOneof("kind"))


def exporting(path: str, filename: str = "report.csv") -> ToolResult:
    return envelope_to_tool_result(
        Ok(
            data={"written": filename},
            effects=Effects(exports={filename: {"path": path, "mime_type": "text/csv"}}),
        )
    )


def event_types(env: Env, tool_use_id: str) -> list[str]:
    page = env.log.page_events(tenant_id="t1", conversation_id="c1", event_type="", limit=500)
    events = page.entries
    return [e.event_type for e in events if e.tool_use_id == tool_use_id]


# --- exports ---------------------------------------------------------------------------------


async def test_an_export_is_registered_announced_and_downloadable(env: Env) -> None:
    (env.data_dir / "exports" / "report.csv").write_text("a,b\n1,2\n")
    env.registry.results["export"] = exporting("exports/report.csv")
    outcome = await env.core.dispatch(use("x1", result="export"), CTX)
    assert kind(outcome.result) == "ok"
    (export,) = outcome.result.exports
    assert export.file_id and export.size_bytes == 8 and export.source_tool == "tool"
    assert outcome.result.envelope.ok.effects.exports[0].file_id == export.file_id
    assert event_types(env, "x1") == [
        "tool_call",
        "decision",
        "export",
        "export.ready",
        "tool_result",
        "outcome",
    ]
    with Session(env.engine) as s:
        row = s.scalars(select(GeneratedFileRow)).one()
        catalog = s.scalars(select(ExportCatalogRow)).one()
    assert (row.file_id, row.filename, row.path, row.size_bytes) == (
        export.file_id,
        "report.csv",
        "exports/report.csv",
        8,
    )
    assert (row.conversation_id, row.tool_use_id, row.mime_type) == ("c1", "x1", "text/csv")
    assert (catalog.name, catalog.file_id, catalog.conversation_id) == (
        "report.csv",
        export.file_id,
        "c1",
    )
    files = ExportFiles(env.store, env.data_dir)
    entry, path = await files.open("t1", export.file_id)
    assert (entry.filename, entry.mime_type) == ("report.csv", "text/csv")
    assert b"".join([c async for c in files.chunks(path)]) == b"a,b\n1,2\n"
    assert [e.file_id for e in await files.list("t1", "c1", 10)] == [export.file_id]
    with pytest.raises(NotFound):
        await files.open("other-tenant", export.file_id)
    path.unlink()
    with pytest.raises(FailedPrecondition):
        await files.open("t1", export.file_id)


@pytest.mark.parametrize(
    ("where", "err_kind"),
    [
        ("outside-absolute", "export_path_outside_data_dir"),
        ("outside-dotdot", "export_path_outside_data_dir"),
        ("symlink-out", "export_path_outside_data_dir"),
        ("the-database", "export_path_outside_exports"),
        ("a-data-file", "export_path_outside_exports"),
        ("symlink-to-the-database", "export_path_outside_exports"),
        ("missing", "export_missing"),
        ("empty", "export_invalid"),
    ],
)
async def test_a_bad_export_becomes_an_err_naming_the_problem(
    env: Env, tmp_path: Path, where: str, err_kind: str
) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("not yours")
    link = env.data_dir / "exports" / "link.txt"
    os.symlink(outside, link)
    # Inside the data dir but not written as an export: never published (before: any file
    # under the data dir was, the SQLite database included).
    (env.data_dir / "toolmesh.db").write_bytes(b"SQLite format 3\x00")
    (env.data_dir / "files").mkdir(exist_ok=True)
    (env.data_dir / "files" / "people.csv").write_text("name\nAda\n")
    os.symlink(env.data_dir / "toolmesh.db", env.data_dir / "exports" / "db-link")
    path = {
        "the-database": str(env.data_dir / "toolmesh.db"),
        "a-data-file": "files/people.csv",
        "symlink-to-the-database": "exports/db-link",
        "outside-absolute": str(outside),
        "outside-dotdot": "../secret.txt",
        "symlink-out": "exports/link.txt",
        "missing": "exports/nope.csv",
        "empty": "",
    }[where]
    env.registry.results["bad"] = exporting(path)
    outcome = await env.core.dispatch(use("bad1", result="bad"), CTX)
    assert kind(outcome.result) == err_kind
    assert "tool" in outcome.result.error
    with Session(env.engine) as s:
        assert s.scalars(select(GeneratedFileRow)).all() == []
    assert event_types(env, "bad1") == ["tool_call", "decision", "tool_result", "outcome"]


# --- datasets --------------------------------------------------------------------------------


async def test_datasets_of_a_result_are_promoted_into_the_conversation(env: Env) -> None:
    df = pd.DataFrame({"city": ["Oslo", "Lima", None], "pop": [700, 10_000, 5]})
    result = pb.ToolResult(content="✓ ok. 3 row(s).")
    result.envelope.ok.rows = 3
    result.datasets.add(name="cities", arrow_ipc=dataframe_to_ipc(df), rows=3)
    env.registry.results["ds"] = result
    outcome = await env.core.dispatch(use("d1", result="ds"), CTX)
    assert kind(outcome.result) == "ok"
    datasets = SqlDatasetStore(env.sessions)
    scope = DatasetScope("t1", "c1")
    pd.testing.assert_frame_equal(datasets.load(scope, "cities"), df)
    (info,) = datasets.list(scope)
    assert (info.name, info.rows, info.source) == ("cities", 3, "tool:tool")
    # A later result with the same name replaces it.
    smaller = pb.ToolResult(content="✓ ok.")
    smaller.envelope.ok.rows = 1
    smaller.datasets.add(name="cities", arrow_ipc=dataframe_to_ipc(df.head(1)), rows=1)
    env.registry.results["ds2"] = smaller
    await env.core.dispatch(use("d2", result="ds2"), CTX)
    assert len(datasets.load(scope, "cities")) == 1


async def test_a_dataset_that_is_not_arrow_becomes_an_err(env: Env) -> None:
    result = pb.ToolResult(content="✓ ok.")
    result.envelope.ok.rows = 0
    result.datasets.add(name="junk", arrow_ipc=b"not arrow at all")
    env.registry.results["junk"] = result
    outcome = await env.core.dispatch(use("j1", result="junk"), CTX)
    assert kind(outcome.result) == "invalid_dataset"
    assert SqlDatasetStore(env.sessions).list(DatasetScope("t1", "c1")) == []


# --- cards -----------------------------------------------------------------------------------


async def test_cards_are_finalised_per_result_and_across_a_turn(env: Env) -> None:
    def with_cards(*cards: dict[str, Any]) -> ToolResult:
        return envelope_to_tool_result(Ok(data={}, effects=Effects(cards=list(cards))))

    env.registry.results["a"] = with_cards(
        {"type": "cited_answer", "answer": "first"},
        {"type": "map_display", "display_id": "m", "layers": [{"id": "l1"}]},
        {"type": "map_display", "display_id": "m", "layers": [{"id": "l2"}]},
    )
    env.registry.results["b"] = with_cards({"type": "cited_answer", "answer": "second"})
    single = await env.core.dispatch(use("c0", result="a"), CTX)
    cards = [convert.from_struct(c) for c in single.result.cards]
    assert [c["type"] for c in cards] == ["cited_answer", "map_display"]
    assert cards[1]["layers"] == [{"id": "l1"}, {"id": "l2"}]
    assert event_types(env, "c0").count("card") == 2
    turn = await env.core.dispatch_many([use("c1", result="a"), use("c2", result="b")], CTX)
    first = [convert.from_struct(c) for c in turn[0].result.cards]
    second = [convert.from_struct(c) for c in turn[1].result.cards]
    assert [c["type"] for c in first] == ["map_display"]
    assert second == [{"type": "cited_answer", "answer": "second"}]


# --- replay ----------------------------------------------------------------------------------


def _rows(engine: Engine, conversation: str) -> list[tuple[Any, ...]]:
    stmt = (
        select(
            ConversationEventRow.tenant_id,
            ConversationEventRow.conversation_id,
            ConversationEventRow.event_type,
            ConversationEventRow.tool_use_id,
            ConversationEventRow.data,
            ConversationEventBlobRow.data,
            ConversationEventRow.created_at,
        )
        .outerjoin(
            ConversationEventBlobRow, ConversationEventRow.blob_id == ConversationEventBlobRow.id
        )
        .where(ConversationEventRow.conversation_id == conversation)
        .order_by(ConversationEventRow.id)
    )
    with Session(engine) as s:
        return [tuple(r) for r in s.execute(stmt)]


@pytest.fixture(params=BACKENDS)
def replay_target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, str]:
    """Two fresh databases on one backend: the original run's and the empty replay store."""
    urls = []
    for _ in range(2):
        urls.append(
            fresh_database_url(request, request.param, str(tmp_path_factory.mktemp("replay")))
        )
    return urls[0], urls[1]


async def test_replaying_recorded_effects_reproduces_conversation_events_byte_for_byte(
    replay_target: tuple[str, str], tmp_path: Path
) -> None:
    original_url, empty_url = replay_target
    engine = make_engine(original_url)
    replay_engine = make_engine(empty_url)
    log = SqlCallLog(session_factory(engine))
    data_dir = tmp_path / "data"
    (data_dir / "exports").mkdir(parents=True)
    (data_dir / "exports" / "r.txt").write_text("report")
    registry = ScriptedRegistry(
        {
            "export": exporting("exports/r.txt", "r.txt"),
            "cards": envelope_to_tool_result(
                Ok(data={}, effects=Effects(cards=[{"type": "chart", "é": "ü"}]))
            ),
            "fails": ToolResult(error="it broke"),
        }
    )
    store = SqlGuardrailStore(engine)
    core = Dispatcher(
        registry, log, store, data_dir=data_dir, effects_store=SqlEffectsStore(engine)
    )
    try:
        await core.add_rule(
            PolicyRule(0, "t1", "no-x", "deny_tool", "denied", "blocking", {}, "", True, "test")
        )
        outcomes = [
            await core.dispatch(use("r1", echo="x" * 40_000, reasoning="big: a blob"), CTX),
            await core.dispatch(use("r2", result="export"), CTX),
            await core.dispatch(use("r3", result="cards"), CTX),
            await core.dispatch(use("r4", result="fails"), CTX),
            await core.dispatch(pb.ToolUse(id="r5", name="denied", input_json="{}"), CTX),
            *await core.dispatch_many([use("r6", echo=1), use("r7", echo=2)], CTX),
        ]
        recorded = [e for o in outcomes for e in o.effects]
        assert sum(isinstance(e, TelemetryEvent) for e in recorded) == len(_rows(engine, "c1"))
        corpus = effects_to_json(recorded)  # a replay corpus round-trips JSON
        apply_effects(
            effects_from_json(corpus),
            EffectContext(recorder=SqlEventRecorder(replay_engine, "t1", "c1")),
        )
        original, replayed = _rows(engine, "c1"), _rows(replay_engine, "c1")
        assert any(row[5] is not None for row in original)  # the blob path is covered
        assert {row[2] for row in original} >= {
            "tool_call",
            "decision",
            "export",
            "export.ready",
            "card",
            "policy_violation",
            "tool_result",
            "outcome",
        }
        assert replayed == original
    finally:
        await core.close()
        await asyncio.to_thread(log.close)
        engine.dispose()
        replay_engine.dispose()


# --- the streaming RPC over the core ---------------------------------------------------------


async def test_the_stream_carries_cards_export_notice_text_then_the_result(env: Env) -> None:
    (env.data_dir / "exports" / "m.csv").write_text("x\n")
    env.registry.results["all"] = envelope_to_tool_result(
        Ok(
            data={"long": "y" * 3000},
            effects=Effects(
                cards=[
                    {"type": "map_display", "display_id": "m", "layers": [{"id": 1}]},
                    {"type": "map_display", "display_id": "m", "layers": [{"id": 2}]},
                    {"type": "chart"},
                ],
                exports={"m.csv": {"path": "exports/m.csv", "mime_type": "text/csv"}},
            ),
        )
    )
    servicer = DispatcherServicer(env.core, env.log)
    request = dpb.DispatchToolCallStreamRequest(tool_use=use("st1", result="all"), context=CTX)
    messages = [m async for m in servicer.DispatchToolCallStream(request, None)]
    kinds = [m.WhichOneof("event") for m in messages]
    text_count = kinds.count("text_delta")
    assert kinds == ["card", "card", "export_ready", *["text_delta"] * text_count, "result"]
    assert text_count >= 3  # the rendered text arrives in chunks
    merged = convert.from_struct(messages[0].card)
    assert merged["layers"] == [{"id": 1}, {"id": 2}]
    final = messages[-1].result
    assert "".join(m.text_delta.text for m in messages[3:-1]) == final.result.content
    assert messages[2].export_ready.file_id == final.result.exports[0].file_id
