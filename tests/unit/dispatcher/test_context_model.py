"""The conversation's model (CallContext.model) on the dispatch path: passed to the registry
unchanged with every call of a single dispatch and a batch, and checked like the other context
identifiers before anything runs or is logged."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from services.dispatcher.core import Dispatcher
from services.dispatcher.logstore import SqlCallLog
from services.dispatcher.statestore import SqlGuardrailStore
from shared import convert
from shared.contract import Ok, envelope_to_tool_result
from shared.errors import InvalidArgument
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb

MODEL = "gpt-native-search"


class RecordingRegistry:
    """The RegistryGateway seam: answers every call with an Ok and keeps the request."""

    def __init__(self) -> None:
        self.requests: list[rpb.ExecuteToolRequest] = []

    async def execute(
        self, request: rpb.ExecuteToolRequest, timeout: float
    ) -> rpb.ExecuteToolResponse:
        self.requests.append(request)
        result = envelope_to_tool_result(Ok(data={"echo": json.loads(request.input_json)}))
        return rpb.ExecuteToolResponse(result=convert.tool_result_to_pb(result))

    async def tool_timeout(self, name: str, tenant_id: str) -> float | None:
        return None


@pytest.fixture
async def dispatcher(
    engine: Engine, sessions: sessionmaker[Session]
) -> AsyncIterator[tuple[Dispatcher, RecordingRegistry, SqlCallLog]]:
    registry = RecordingRegistry()
    log = SqlCallLog(sessions)
    core = Dispatcher(registry, log, SqlGuardrailStore(engine), poll_interval_s=0.05)
    yield core, registry, log
    await core.close()
    log.close()


def use(tool_use_id: str, n: int) -> pb.ToolUse:
    return pb.ToolUse(id=tool_use_id, name="search_tools", input_json=json.dumps({"n": n}))


async def test_the_model_reaches_the_registry_with_every_call(
    dispatcher: tuple[Dispatcher, RecordingRegistry, SqlCallLog],
) -> None:
    core, registry, _ = dispatcher
    ctx = pb.CallContext(tenant_id="t", user_id="u", conversation_id="c", model=MODEL)
    await core.dispatch(use("one", 0), ctx)
    await core.dispatch_many([use("two", 1), use("three", 2)], ctx)
    assert [r.context.tool_use_id for r in registry.requests] == ["one", "two", "three"]
    assert [r.context.model for r in registry.requests] == [MODEL] * 3


@pytest.mark.parametrize(
    ("model", "reason"), [("m" * 129, "ID_TOO_LONG"), ("gpt\x00", "ID_INVALID")]
)
async def test_a_model_no_config_could_have_is_refused_before_anything_runs(
    dispatcher: tuple[Dispatcher, RecordingRegistry, SqlCallLog], model: str, reason: str
) -> None:
    core, registry, log = dispatcher
    ctx = pb.CallContext(tenant_id="t", conversation_id="c", model=model)
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: core.dispatch(use("one", 0), ctx),
        lambda: core.dispatch_many([use("two", 1)], ctx),
    ]
    for call in calls:
        with pytest.raises(InvalidArgument) as refused:
            await call()
        assert refused.value.reason == reason
        assert [f for f, _ in refused.value.field_violations] == ["context.model"]
    assert registry.requests == []
    assert log.page_log(tool_name="", tenant_id="t", conversation_id="c", limit=10).entries == []
