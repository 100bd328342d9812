"""The mesh when things go wrong: a dispatcher whose database is down answers UNAVAILABLE quickly
and leaves no rows behind; a registry that cannot reach its database refuses to start with one
clear line; and SIGTERM drains the calls in flight before a service exits."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import func, select

from shared.db.engine import make_engine
from shared.db.models import ConversationEventRow, ToolExecutionLogRow
from shared.launcher import (
    LaunchError,
    ServiceProcess,
    service_env,
    start_service,
    start_services,
)
from shared.rpc_errors import from_rpc_error
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration

UNREACHABLE_DATABASE = "postgresql+psycopg://x@127.0.0.1:1/none"
GRACE_S = 3.0


def base_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    settings = {
        "TOOLMESH_DATA_DIR": str(tmp_path / "data"),
        "TOOLMESH_DATABASE_URL": f"sqlite:///{tmp_path}/toolmesh.db",
        "TOOLMESH_TRACING": "0",
        "TOOLMESH_SHUTDOWN_GRACE_S": str(GRACE_S),
    }
    env = service_env(**{**settings, **overrides})
    for key in ("TOOLMESH_REGISTRY_ADDR", "TOOLMESH_DISPATCHER_ADDR"):
        env.pop(key, None)
    return env


@contextmanager
def services(*started: ServiceProcess) -> Iterator[None]:
    """Stops the given service processes (last started first) however the test ends."""
    try:
        yield
    finally:
        for proc in reversed(started):
            proc.stop()


def request(name: str, inputs: dict[str, Any], conversation: str) -> dpb.DispatchToolCallRequest:
    return dpb.DispatchToolCallRequest(
        tool_use=pb.ToolUse(name=name, input_json=json.dumps(inputs)),
        context=pb.CallContext(tenant_id="tenant-a", conversation_id=conversation),
    )


def rows_of(database_url: str, conversation: str) -> dict[str, int]:
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            return {
                table.__tablename__: conn.execute(
                    select(func.count())
                    .select_from(table)
                    .where(table.conversation_id == conversation)
                ).scalar_one()
                for table in (ToolExecutionLogRow, ConversationEventRow)
            }
    finally:
        engine.dispose()


# --- (a) the dispatcher's database is down ------------------------------------------------------


def test_a_dispatcher_whose_database_is_down_answers_unavailable_promptly_and_writes_nothing(
    tmp_path: Path,
) -> None:
    env = base_env(tmp_path)
    registry = start_service("registry", env=env, port=0)
    with services(registry):
        broken_env = {
            **env,
            "TOOLMESH_DATABASE_URL": UNREACHABLE_DATABASE,
            "TOOLMESH_REGISTRY_ADDR": registry.address,
        }
        dispatcher = start_service("dispatcher", env=broken_env, port=0)
        with services(dispatcher), grpc.insecure_channel(dispatcher.address) as ch:
            stub = dispatcher_pb2_grpc.DispatcherServiceStub(ch)
            for _ in range(2):  # and it keeps answering
                started = time.monotonic()
                with pytest.raises(grpc.RpcError) as caught:
                    stub.DispatchToolCall(request("ping", {}, "db-down"), timeout=15)
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
                assert from_rpc_error(caught.value).reason == "DATABASE_UNAVAILABLE"
                assert time.monotonic() - started < 15
            assert dispatcher.stop(timeout=GRACE_S + 10) == 0
    assert rows_of(env["TOOLMESH_DATABASE_URL"], "db-down") == {
        "tool_execution_log": 0,
        "conversation_events": 0,
    }


@pytest.mark.parametrize("mux", ["1", "0"], ids=["call-stream", "unary"])
def test_a_registry_that_dies_and_comes_back_is_called_again(tmp_path: Path, mux: str) -> None:
    """Killed mid-conversation, the registry's calls fail UNAVAILABLE at once (no hang), and
    once it is back on its address the dispatcher's next calls reach it, on a new call stream
    or a plain unary RPC."""
    env = base_env(tmp_path, TOOLMESH_MUX=mux)
    port = _free_port()
    registry = start_service("registry", env=env, port=port)
    dispatcher = start_service(
        "dispatcher", env={**env, "TOOLMESH_REGISTRY_ADDR": registry.address}, port=0
    )
    revived: list[ServiceProcess] = []
    try:
        with grpc.insecure_channel(dispatcher.address) as ch:
            stub = dispatcher_pb2_grpc.DispatcherServiceStub(ch)
            assert stub.DispatchToolCall(request("ping", {"echo": 1}, "revive"), timeout=15)
            registry.process.kill()
            registry.process.wait(10)
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as caught:
                stub.DispatchToolCall(request("ping", {"echo": 2}, "revive"), timeout=30)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - started < 15
            revived.append(start_service("registry", env=env, port=port))
            deadline = time.monotonic() + 60
            attempt = 2
            while True:  # the channel reconnects with gRPC's backoff (seconds)
                attempt += 1  # new arguments each time: repeats would trip the loop guard
                try:
                    answer = stub.DispatchToolCall(
                        request("ping", {"echo": attempt}, "revive"), timeout=15
                    )
                    break
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                    assert time.monotonic() < deadline, "the dispatcher never reached it again"
                    time.sleep(0.2)  # polling, bounded by the deadline
            assert answer.result.envelope.WhichOneof("kind") == "ok", answer.result
            assert json.loads(answer.result.envelope.ok.data_json)["echo"] == attempt
    finally:
        for proc in (dispatcher, *revived, registry):
            proc.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- (b) the registry's database is down at start-up ------------------------------------------


def test_a_registry_that_cannot_reach_its_database_refuses_to_start_with_one_clear_line(
    tmp_path: Path,
) -> None:
    env = base_env(tmp_path, TOOLMESH_DATABASE_URL=UNREACHABLE_DATABASE)
    started = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        registry = start_service("registry", env=env, port=0, timeout=30)
        registry.stop()
    assert time.monotonic() - started < 30
    text = str(caught.value)
    assert "Traceback" not in text
    reasons = [line for line in text.splitlines() if "database unavailable" in line.lower()]
    assert reasons, text
    assert "127.0.0.1" in reasons[-1]  # names where it tried


def test_when_one_of_services_started_together_fails_the_others_are_stopped(
    tmp_path: Path,
) -> None:
    """start_services (toolmesh up, the test meshes): the dispatcher cannot bind a port that is
    taken, so the launch fails naming it and why in one line, not a traceback, and the
    registry started beside it does not live on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        children_before = _children()
        with pytest.raises(LaunchError) as caught:
            start_services([("registry", 0), ("dispatcher", busy)], env=base_env(tmp_path))
    assert _children() == children_before
    message = str(caught.value)
    assert message.startswith("dispatcher exited with 2 before it was ready"), message
    assert "Traceback" not in message
    assert f"cannot listen on 127.0.0.1:{busy}: the address is in use" in message


def _children() -> set[int]:
    """Pids of this process's live children."""
    mine = str(os.getpid())
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[1] == mine and fields[0] != "Z":
                found.add(int(entry.name))
    return found


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ({"TOOLMESH_DISPATCHER_PORT": "abc"}, "TOOLMESH_DISPATCHER_PORT='abc' is not an integer"),
        ({"TOOLMESH_DATABASE_URL": "nonsense://x"}, "TOOLMESH_DATABASE_URL nonsense://x cannot"),
        (
            {"TOOLMESH_MUX_STREAMS": "0"},
            "configuration error: TOOLMESH_MUX_STREAMS=0 is not between 1 and 64",
        ),
        (
            {"TOOLMESH_TOOL_TIMEOUT_S": "nan"},
            "configuration error: TOOLMESH_TOOL_TIMEOUT_S='nan' is not a finite number",
        ),
        (
            {"TOOLMESH_SHUTDOWN_GRACE_S": "-1"},
            "configuration error: TOOLMESH_SHUTDOWN_GRACE_S='-1' is not",
        ),
        (
            {"TOOLMESH_MAX_INPUT_BYTES": "-5"},
            "configuration error: TOOLMESH_MAX_INPUT_BYTES='-5' is negative",
        ),
    ],
)
def test_a_malformed_setting_stops_a_service_with_one_line_not_a_traceback(
    tmp_path: Path, setting: dict[str, str], said: str
) -> None:
    env = base_env(tmp_path, **setting)
    done = subprocess.run(
        [sys.executable, "-m", "services.dispatcher"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    assert f"cannot start: {'configuration error: ' if 'PORT' in said else ''}{said}" in (
        done.stderr + done.stdout
    )


# --- (c) SIGTERM drains the calls in flight -----------------------------------------------------


def health_status(address: str) -> str:
    """SERVING / NOT_SERVING, or the gRPC code when the server refuses the check."""
    with grpc.insecure_channel(address) as ch:
        try:
            response = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=2
            )
        except grpc.RpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def wait_until_draining(address: str, timeout: float) -> None:
    """Until the server reports NOT_SERVING: it drains (new calls refused, running ones go on)."""
    deadline = time.monotonic() + timeout
    while health_status(address) == "SERVING":
        if time.monotonic() > deadline:
            raise AssertionError(f"{address} still reports SERVING after {timeout}s")
        time.sleep(0.02)  # polling, bounded by the deadline


def wait_until_refusing(address: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while health_status(address) in {"SERVING", "NOT_SERVING"}:
        if time.monotonic() > deadline:
            raise AssertionError(f"{address} still accepts new calls after {timeout}s")
        time.sleep(0.05)  # polling, bounded by the deadline


@pytest.mark.parametrize("victim", ["dispatcher", "registry"])
@pytest.mark.parametrize("mux", ["1", "0"], ids=["call-stream", "unary"])
def test_sigterm_lets_the_call_in_flight_finish_then_exits_0_and_refuses_new_calls(
    tmp_path: Path, victim: str, mux: str
) -> None:
    """The dispatcher's call to the registry rides a call stream (TOOLMESH_MUX=1, the default)
    or a plain unary RPC: either way a registry draining on SIGTERM answers it."""
    env = base_env(tmp_path, TOOLMESH_MUX=mux)
    registry = start_service("registry", env=env, port=0)
    with services(registry):
        dispatcher = start_service(
            "dispatcher", env={**env, "TOOLMESH_REGISTRY_ADDR": registry.address}, port=0
        )
        target = {"registry": registry, "dispatcher": dispatcher}[victim]
        with services(dispatcher), grpc.insecure_channel(dispatcher.address) as ch:
            stub = dispatcher_pb2_grpc.DispatcherServiceStub(ch)
            # A first call warms what a conversation's first call awaits before it reaches the
            # registry (the conversation's state row, the tool's timeout, the rule cache): the
            # two calls below then go on to the registry in the order they came, and the quick
            # one's answer means the slow one has reached the registry too.
            warm = stub.DispatchToolCall(request("ping", {}, "drain"), timeout=30)
            assert warm.result.envelope.WhichOneof("kind") == "ok"
            slow: Future[dpb.DispatchToolCallResponse] = stub.DispatchToolCall.future(
                request("ping", {"delay_ms": 2000, "echo": "slow"}, "drain"), timeout=30
            )
            # A quick call sent after the slow one on the same connection: once it is answered,
            # both services have received the slow call (HTTP/2 frames arrive in order).
            quick = stub.DispatchToolCall(request("ping", {}, "drain"), timeout=30)
            assert quick.result.envelope.WhichOneof("kind") == "ok"
            assert not slow.done()

            target.process.send_signal(signal.SIGTERM)
            # While it drains, a new call on the open connection is refused UNAVAILABLE (which
            # a client retries elsewhere), never CANCELLED (what gRPC answers for a call it
            # held unmatched when the server stopped: grpc/grpc#41785).
            wait_until_draining(target.address, timeout=GRACE_S)
            with pytest.raises(grpc.RpcError) as refused:
                stub.DispatchToolCall(request("ping", {}, "drain-late"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            if victim == "dispatcher" and not slow.done():
                assert from_rpc_error(refused.value).reason == "SHUTTING_DOWN"
            wait_until_refusing(target.address, timeout=GRACE_S + 2)

            response = slow.result(timeout=30)
            assert response.result.envelope.WhichOneof("kind") == "ok"
            assert json.loads(response.result.envelope.ok.data_json)["echo"] == "slow"
            assert target.process.wait(timeout=GRACE_S + 10) == 0

            with pytest.raises(grpc.RpcError) as after:
                stub.DispatchToolCall(request("ping", {}, "drain-after"), timeout=10)
            assert after.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("service", ["registry", "dispatcher"])
def test_a_service_signalled_right_after_it_announced_ready_still_exits_gracefully(
    tmp_path: Path, service: str
) -> None:
    proc = start_service(service, env=base_env(tmp_path), port=0)
    with services(proc):
        proc.process.send_signal(signal.SIGTERM)  # a launcher may stop it at any moment
        assert proc.process.wait(timeout=GRACE_S + 10) == 0
