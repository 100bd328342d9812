"""The mesh under real database faults, through real service processes.

PostgreSQL restarted (fast shutdown, then started again on its port), killed hard (SIGKILL of
the postmaster) or its connections terminated by the server, in the middle of a load, or out of
connection slots; a SQLite file made read-only, its disk full, deleted, or replaced by a file
that is not a database, under a running mesh. Whatever the fault, a call answers UNAVAILABLE
promptly, with a reason and a message that say what is wrong, never a traceback or a hang; no
call leaves part of its rows; a call answered OK has its rows, in the database everyone reads;
and once the fault clears, every service that touches the database (registry, dispatcher,
surface, sandbox, MCP bridge) serves its next call without a restart, its background work
(group commit, the cancellation poller, the periodic Tier-0 derivation, the job workers)
included."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from sqlalchemy import text

from shared.db.engine import make_engine, upgrade
from shared.launcher import ServiceProcess, start_service
from shared.rpc_errors import from_rpc_error
from shared.telemetry.collector import MemorySpanSink
from tests.integration.conftest import Mesh, free_ports, start_mesh
from tests.support.postgres import DEFAULT_DBNAME, PostgresServer, postgres_instance
from tests.support.readonly import read_only
from tests.support.waiting import wait_for
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2 as mpb
from toolmesh.mcp_bridge.v1 import mcp_bridge_pb2_grpc
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.sandbox.v1 import sandbox_pb2 as spb
from toolmesh.sandbox.v1 import sandbox_pb2_grpc
from toolmesh.surface.v1 import surface_pb2 as supb
from toolmesh.surface.v1 import surface_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MCP_SERVER = ["-m", "tests.mcp_servers.raw_server"]
TENANT = "faults"
# A call during a fault answers within this (a stopped server refuses at once; a connection
# attempt gives up after 5 s), and a call's own deadline is well beyond it.
PROMPT_S = 5.0
DEADLINE_S = 30.0
# How long the dispatcher waits for one database operation (TOOLMESH_DB_WAIT_S).
DB_WAIT_S = 2.0
# The events every dispatched call logs beside its tool_execution_log row.
CALL_EVENTS = {"tool_call", "decision", "tool_result", "outcome"}


# --- answers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """How one RPC ended: OK (with its response) or a status code with its ErrorInfo reason."""

    code: str
    reason: str
    details: str
    seconds: float
    response: Any = None

    @property
    def ok(self) -> bool:
        return self.code == "OK"


def answer(rpc: Callable[[], Any]) -> Answer:
    """How `rpc` ended (an rpc that returns an Answer itself is taken at its word)."""
    started = time.monotonic()
    try:
        response = rpc()
    except grpc.RpcError as exc:
        reason = from_rpc_error(exc).reason
        details = exc.details() or ""
        return Answer(exc.code().name, reason, details, time.monotonic() - started)
    if isinstance(response, Answer):
        return response
    return Answer("OK", "", "", time.monotonic() - started, response)


def assert_unavailable(
    got: Answer, what: str, reasons: tuple[str, ...] = ("DATABASE_UNAVAILABLE",)
) -> None:
    assert got.code == "UNAVAILABLE" and got.reason in reasons, f"{what}: {got}"
    assert got.seconds < PROMPT_S, f"{what} took {got.seconds:.1f} s to answer: {got}"
    assert "Traceback" not in got.details


class Services:
    """One read and one write of each service that touches the database, through its RPCs."""

    def __init__(self, mesh: Mesh, *, mcp: bool = False) -> None:
        self.mesh = mesh
        self.dispatcher = mesh.dispatcher
        self.registry = mesh.registry
        self.surface = surface_pb2_grpc.SurfaceServiceStub(mesh._channel("surface"))
        self.sandbox = sandbox_pb2_grpc.SandboxServiceStub(mesh._channel("sandbox"))
        self.bridge = (
            mcp_bridge_pb2_grpc.McpBridgeServiceStub(mesh._channel("mcp_bridge")) if mcp else None
        )
        self.exports = mesh.data_dir / "exports"

    def dispatch(self, conversation: str, **inputs: Any) -> Answer:
        """A ping through the dispatcher: it reads the conversation's state, runs the tool in
        the registry, and writes its log rows and events."""
        tool_use_id = f"toolu_{uuid.uuid4().hex[:20]}"
        inputs.setdefault("echo", tool_use_id)
        return answer(
            lambda: self.dispatcher.DispatchToolCall(
                dpb.DispatchToolCallRequest(
                    tool_use=pb.ToolUse(id=tool_use_id, name="ping", input_json=json.dumps(inputs)),
                    context=pb.CallContext(tenant_id=TENANT, conversation_id=conversation),
                ),
                timeout=DEADLINE_S,
            )
        )

    def reads(self) -> dict[str, Callable[[], Any]]:
        return {
            "registry ListTools": lambda: self.registry.ListTools(
                rpb.ListToolsRequest(), timeout=DEADLINE_S
            ),
            "surface GetWorkingSet": lambda: self.surface.GetWorkingSet(
                supb.GetWorkingSetRequest(conversation_id="c"), timeout=DEADLINE_S
            ),
            "sandbox ListJobs": lambda: self.sandbox.ListJobs(
                spb.ListJobsRequest(tenant_id=TENANT), timeout=DEADLINE_S
            ),
            "dispatcher ListExecutionLog": lambda: self.dispatcher.ListExecutionLog(
                dpb.ListExecutionLogRequest(tenant_id=TENANT, limit=5), timeout=DEADLINE_S
            ),
        }

    def writes(self) -> dict[str, Callable[[], Any]]:
        """Each call writes a new row (a fresh name each time)."""

        def upsert() -> Any:
            tool = pb.ToolDefinition(
                name=f"draft_{uuid.uuid4().hex[:12]}",
                description="a draft written by the database fault tests",
                input_schema_json="{}",
                tool_type=pb.TOOL_TYPE_CUSTOM,
                implementation="result = 1",
                status=pb.TOOL_STATUS_DRAFT,
                tenant_id=TENANT,
            )
            return self.registry.UpsertTools(rpb.UpsertToolsRequest(tools=[tool]), timeout=30)

        def register() -> Any:
            tool = pb.ToolDefinition(
                name=f"custom_{uuid.uuid4().hex[:12]}",
                description="a custom tool written by the database fault tests",
                implementation="result = 1",
                input_schema_json="{}",
                tenant_id=TENANT,
            )
            return self.sandbox.RegisterCustomTool(
                spb.RegisterCustomToolRequest(tool=tool), timeout=DEADLINE_S
            )

        return {
            "dispatcher DispatchToolCall": lambda: self.dispatch("writes"),
            "registry UpsertTools": upsert,
            "sandbox RegisterCustomTool": register,
        }

    def every_rpc(self) -> dict[str, Callable[[], Any]]:
        """Reads, writes, a Tier-0 derivation (reads usage, stores the floor: no write when it
        did not change) and, with the MCP bridge, a connection (stored)."""
        rpcs = {**self.reads(), **self.writes()}
        rpcs["surface DeriveTier0"] = lambda: self.surface.DeriveTier0(
            supb.DeriveTier0Request(), timeout=DEADLINE_S
        )
        if self.bridge is not None:
            bridge = self.bridge

            def connect() -> Any:
                server = mpb.ServerConfig(
                    name=f"raw{uuid.uuid4().hex[:6]}",
                    transport=mpb.TRANSPORT_STDIO,
                    command=sys.executable,
                    args=MCP_SERVER,
                )
                return bridge.Connect(mpb.ConnectRequest(server=server), timeout=DEADLINE_S)

            rpcs["mcp_bridge Connect"] = connect
        return rpcs

    def submit_job(self) -> str:
        job = self.sandbox.SubmitBuildJob(
            spb.SubmitBuildJobRequest(
                request="a tool that adds two numbers",
                context=pb.CallContext(tenant_id=TENANT, conversation_id="jobs"),
            ),
            timeout=DEADLINE_S,
        ).job
        return job.id

    def job_status(self, job_id: str) -> int:
        request = spb.GetJobRequest(id=job_id, tenant_id=TENANT)
        return int(self.sandbox.GetJob(request, timeout=DEADLINE_S).job.status)


def echo(got: Answer) -> str:
    """The tool_use_id a ping answered OK echoes (Services.dispatch)."""
    return str(json.loads(got.response.result.envelope.ok.data_json)["echo"])


def call_each(rpcs: dict[str, Callable[[], Any]]) -> dict[str, Answer]:
    return {name: answer(rpc) for name, rpc in rpcs.items()}


def assert_every_rpc_serves(services: Services) -> None:
    """Every service's next call succeeds: none needs a restart, none needs a retry."""
    for name, got in call_each(services.every_rpc()).items():
        assert got.ok, f"{name} after the fault cleared: {got}"


def output_since(proc: ServiceProcess, mark: int) -> str:
    return "".join(proc.output[mark:])


def wait_for_background_work(services: Services, surface: ServiceProcess, mark: int) -> None:
    """The loops no call drives work again: the surface's periodic Tier-0 derivation (logged
    after `mark` of its output) and the sandbox's job workers."""
    wait_for(
        lambda: "tier0 derived" in output_since(surface, mark),
        10,
        "the surface's periodic Tier-0 derivation to run again",
    )
    job_id = services.submit_job()
    wait_for(
        lambda: services.job_status(job_id) == spb.JOB_STATUS_FAILED,
        15,
        "the sandbox's job workers to pick up a job (it fails: no LLM is configured)",
    )


def assert_no_traceback(mesh: Mesh, *extra: ServiceProcess) -> None:
    for proc in (*mesh.processes.values(), *extra):
        text_ = "".join(proc.output)
        assert "Traceback" not in text_, f"{proc.name} logged a traceback:\n{text_[-6000:]}"


# --- rows ---------------------------------------------------------------------------------------


def call_rows(
    database_url: str, conversations: tuple[str, ...] = ()
) -> tuple[set[str], dict[str, set[str]]]:
    """The tool_use_ids with a tool_execution_log row, and each tool_use_id's event types (of
    this module's tenant; of the given conversations only, when some are given)."""
    where = "tenant_id = :t"
    params: dict[str, Any] = {"t": TENANT}
    if conversations:
        names = ", ".join(f":c{i}" for i in range(len(conversations)))
        where += f" AND conversation_id IN ({names})"
        params.update({f"c{i}": c for i, c in enumerate(conversations)})
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            logged = {
                r[0]
                for r in conn.execute(
                    text(f"SELECT tool_use_id FROM tool_execution_log WHERE {where}"), params
                )
            }
            events: dict[str, set[str]] = {}
            for tool_use_id, event_type in conn.execute(
                text(f"SELECT tool_use_id, event_type FROM conversation_events WHERE {where}"),
                params,
            ):
                events.setdefault(tool_use_id, set()).add(event_type)
    finally:
        engine.dispose()
    return logged, events


def assert_whole_rows(
    database_url: str, answered_ok: set[str], conversations: tuple[str, ...]
) -> None:
    """Every call answered OK has its log row and its events; no call of `conversations` has
    part of them."""
    logged, events = call_rows(database_url, conversations)
    missing = answered_ok - logged
    assert not missing, f"{len(missing)} calls answered OK have no log row: {sorted(missing)[:5]}"
    partial = {u for u in logged | set(events) if u not in logged or events.get(u) != CALL_EVENTS}
    assert not partial, {u: (u in logged, sorted(events.get(u, ()))) for u in sorted(partial)[:5]}


# --- load ---------------------------------------------------------------------------------------


@dataclass
class Load:
    """Dispatched calls (a third of them in the tool for a while) from a few threads, and the
    other services' reads from one more, until stopped; every answer kept."""

    services: Services
    dispatchers: int = 3
    stop: threading.Event = field(default_factory=threading.Event)
    answers: list[tuple[float, str, str, Answer]] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        for i in range(self.dispatchers):
            self._threads.append(threading.Thread(target=self._dispatch, args=(i,), daemon=True))
        self._threads.append(threading.Thread(target=self._read, daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(DEADLINE_S + 5)
            assert not thread.is_alive(), "a call of the load never returned"

    def _dispatch(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            tool_use_id = f"toolu_load{i}_{n}_{uuid.uuid4().hex[:8]}"
            delay = 100 if n % 3 == 0 else 0
            request = dpb.DispatchToolCallRequest(
                tool_use=pb.ToolUse(
                    id=tool_use_id,
                    name="ping",
                    input_json=json.dumps({"echo": tool_use_id, "delay_ms": delay}),
                ),
                context=pb.CallContext(tenant_id=TENANT, conversation_id=f"load{i}"),
            )
            call = self.services.dispatcher.DispatchToolCall
            got = answer(functools.partial(call, request, timeout=DEADLINE_S))
            self.answers.append((time.monotonic(), "dispatcher", tool_use_id, got))
            if not got.ok:
                time.sleep(0.02)  # a failing call returns at once: not a busy loop

    def _read(self) -> None:
        reads = list(self.services.reads().items())
        i = 0
        while not self.stop.is_set():
            name, rpc = reads[i % len(reads)]
            i += 1
            self.answers.append((time.monotonic(), name, "", answer(rpc)))
            time.sleep(0.01)

    def count(self, *, ok: bool, since: float = 0.0, service: str | None = None) -> int:
        return sum(
            1
            for at, name, _, got in list(self.answers)
            if at >= since and got.ok == ok and (service is None or name.startswith(service))
        )

    def succeeding(self, service: str, since: float) -> bool:
        """Whether `service` answered OK at least twice since `since`."""
        return self.count(ok=True, since=since, service=service) >= 2

    @property
    def conversations(self) -> tuple[str, ...]:
        return tuple(f"load{i}" for i in range(self.dispatchers))

    def dispatched_ok(self) -> set[str]:
        return {u for _, name, u, got in self.answers if name == "dispatcher" and got.ok}


def assert_load_answers(load: Load) -> None:
    """Every answer of the load was OK or UNAVAILABLE for the database, and prompt."""
    assert load.answers
    for _, name, tool_use_id, got in load.answers:
        if not got.ok:
            assert got.code == "UNAVAILABLE", f"{name} {tool_use_id}: {got}"
            assert got.reason == "DATABASE_UNAVAILABLE", f"{name} {tool_use_id}: {got}"
        assert got.seconds < PROMPT_S + 1, f"{name} {tool_use_id} took {got.seconds:.1f} s"


# --- PostgreSQL -----------------------------------------------------------------------------------


@dataclass
class PgMesh:
    server: PostgresServer
    url: str
    mesh: Mesh
    services: Services
    second_dispatcher: ServiceProcess

    def dispatcher_b(self) -> dispatcher_pb2_grpc.DispatcherServiceStub:
        channel = grpc.insecure_channel(self.second_dispatcher.address)
        self.mesh.channels.append(channel)
        return dispatcher_pb2_grpc.DispatcherServiceStub(channel)


def mesh_env(*, bridge: bool = False) -> tuple[dict[str, str], list[tuple[str, int]]]:
    """The surface, sandbox and (with `bridge`) MCP bridge beside registry and dispatcher:
    their addresses, and settings that make their background work run often."""
    surface, sandbox, bridge_port = free_ports(3)
    env = {
        "TOOLMESH_SURFACE_ADDR": f"127.0.0.1:{surface}",
        "TOOLMESH_SURFACE_EMBEDDINGS": "0",
        "TOOLMESH_SURFACE_DERIVE_INTERVAL_S": "0.5",
        "TOOLMESH_SANDBOX_ADDR": f"127.0.0.1:{sandbox}",
        "TOOLMESH_TOOL_CACHE_TTL_S": "0",
        "TOOLMESH_DB_WAIT_S": str(DB_WAIT_S),
        # No LLM: a build job is claimed by a worker, then fails at once, saying why.
        "ANTHROPIC_API_KEY": "",
        "PYTHONPATH": str(ROOT),
    }
    also = [("surface", surface), ("sandbox", sandbox)]
    if bridge:
        env["TOOLMESH_MCP_BRIDGE_ADDR"] = f"127.0.0.1:{bridge_port}"
        also.append(("mcp_bridge", bridge_port))
    return env, also


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this module's own, which its tests stop, kill and fill: commits
    durable (the tests check that a call answered OK has its rows after a crash)."""
    with postgres_instance(settings={"synchronous_commit": "on", "max_connections": "60"}) as pg:
        yield pg


@pytest.fixture(scope="module")
def pg_mesh(
    pg_server: PostgresServer,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[MemorySpanSink, int],
) -> Iterator[PgMesh]:
    tmp = tmp_path_factory.mktemp("faults-pg")
    url = pg_server.url()
    upgrade(url)
    sink, port = collector
    env, also = mesh_env(bridge=True)
    mesh = start_mesh("postgres", url, tmp, sink, port, env, also)
    second: ServiceProcess | None = None
    try:
        second = start_service("dispatcher", env=mesh.env, port=0)
        yield PgMesh(pg_server, url, mesh, Services(mesh, mcp=True), second)
    finally:
        if second is not None:
            second.stop()
        mesh.close()
        if not pg_server.running:  # a test failed with the server down
            pg_server.start()


@pytest.fixture
def pg_up(pg_mesh: PgMesh) -> PgMesh:
    """The module's mesh, its server running (after a test that failed with it stopped)."""
    if not pg_mesh.server.running:
        pg_mesh.server.start()
    return pg_mesh


pg_test = pytest.mark.postgres


@pg_test
def test_postgres_restarted_every_service_answers_unavailable_then_serves_again(
    pg_up: PgMesh,
) -> None:
    """A fast shutdown, then a start on the same port: during the outage each service's calls
    answer UNAVAILABLE at once, saying the database is unavailable, and write nothing; a call
    in flight across the outage is still cancelled from another replica once the server is
    back (the cancellation poller lived through it); the surface re-derives Tier-0 on its
    own again, a job submitted afterwards is picked up by the sandbox's workers; and every
    service's next call succeeds, with no restart."""
    pg_mesh = pg_up
    m, services, server = pg_mesh.mesh, pg_mesh.services, pg_mesh.server
    assert_every_rpc_serves(services)
    surface, dispatcher = m.processes["surface"], m.processes["dispatcher"]

    # A call whose tool runs across the outage, on dispatcher A (its first progress report
    # says the tool is running).
    slow_id = f"toolu_slow_{uuid.uuid4().hex[:12]}"
    stream = m.dispatcher.DispatchToolCallStream(
        dpb.DispatchToolCallStreamRequest(
            tool_use=pb.ToolUse(
                id=slow_id, name="ping", input_json='{"delay_ms": 60000, "progress_steps": 100}'
            ),
            context=pb.CallContext(tenant_id=TENANT, conversation_id="across"),
        ),
        timeout=DEADLINE_S * 2,
    )
    first = next(stream)
    assert first.WhichOneof("event") == "progress", first
    pool = ThreadPoolExecutor(1)
    try:
        slow = pool.submit(lambda: [e for e in stream if e.WhichOneof("event") == "result"])
        marks = (len(surface.output), len(dispatcher.output))
        stopped = time.monotonic()
        server.stop("fast")
        during = call_each(services.every_rpc())
        for name, got in during.items():
            assert_unavailable(got, f"{name} while the database is down")
            assert "database unavailable" in got.details.lower(), got
        assert time.monotonic() - stopped < 2 * PROMPT_S
        # The background work met the outage too.
        wait_for(
            lambda: "periodic tier0 derivation failed" in output_since(surface, marks[0]),
            10,
            "the surface's periodic derivation to meet the outage",
        )
        wait_for(
            lambda: "reading cancellation flags failed" in output_since(dispatcher, marks[1]),
            10,
            "the cancellation poller to meet the outage",
        )
        assert not slow.done()

        server.start()
        restarted = len(surface.output)
        assert_every_rpc_serves(services)

        cancel = pg_mesh.dispatcher_b().Cancel(
            dpb.CancelRequest(conversation_id="across", tenant_id=TENANT), timeout=DEADLINE_S
        )
        assert cancel.known_conversation and cancel.cancel_epoch >= 1, cancel
        (final,) = slow.result(timeout=15)  # tripped by A's poller within its interval
        result = final.result.result
        assert result.envelope.err.err_kind == "cancelled", result

        wait_for_background_work(services, surface, restarted)
        logged, events = call_rows(pg_mesh.url)
        assert slow_id in logged and events[slow_id] == {*CALL_EVENTS, "progress"}
        assert_no_traceback(m, pg_mesh.second_dispatcher)
    finally:
        stream.cancel()
        pool.shutdown()


@pg_test
@pytest.mark.parametrize("fault", ["sigkill", "terminate"])
def test_postgres_killed_or_its_connections_terminated_mid_load(pg_up: PgMesh, fault: str) -> None:
    """Under a load of dispatched calls and the other services' reads: the postmaster
    SIGKILLed (then started again: crash recovery), or every service connection terminated by
    the server (pg_terminate_backend, five times over): each call answers OK or UNAVAILABLE
    promptly, none hangs; a call answered OK has all its rows, none has part of them; and
    every service's next call after the fault succeeds."""
    pg_mesh = pg_up
    m, services, server = pg_mesh.mesh, pg_mesh.services, pg_mesh.server
    with Load(services) as load:
        wait_for(lambda: load.count(ok=True, service="dispatcher") >= 10, 20, "calls to succeed")
        if fault == "sigkill":
            server.kill()
            wait_for(lambda: load.count(ok=False) >= 3, 10, "calls to fail during the outage")
            server.start()
        else:
            for _ in range(5):
                assert server.terminate_backends(server_dbname(pg_mesh.url)) >= 0
                wait_for(
                    functools.partial(load.succeeding, "dispatcher", time.monotonic()),
                    10,
                    "calls to succeed again",
                )
        recovered = time.monotonic()
        for service in ("dispatcher", "registry", "surface", "sandbox"):
            wait_for(
                functools.partial(load.succeeding, service, recovered),
                10,
                f"{service} to serve the load again",
            )
    assert_load_answers(load)
    assert_every_rpc_serves(services)
    assert_whole_rows(pg_mesh.url, load.dispatched_ok(), load.conversations)
    assert_no_traceback(m)


@pg_test
def test_a_frozen_postgres_answers_unavailable_after_the_wait_then_serves_again(
    pg_up: PgMesh,
) -> None:
    """Every process of the server stopped (a frozen host: the connections stay open, nothing
    answers on them, no driver timeout ends the wait): a dispatched call answers UNAVAILABLE
    once TOOLMESH_DB_WAIT_S has passed, saying the database did not answer, instead of
    holding on until its deadline; once the server runs again, calls succeed with no
    restart."""
    m, services = pg_up.mesh, pg_up.services
    assert services.dispatch("frozen").ok
    with pg_up.server.frozen():
        got = {
            "call": services.dispatch("frozen"),
            "log": answer(
                lambda: m.dispatcher.ListExecutionLog(
                    dpb.ListExecutionLogRequest(tenant_id=TENANT, conversation_id="frozen"),
                    timeout=DEADLINE_S,
                )
            ),
        }
    for what, one in got.items():
        assert one.code == "UNAVAILABLE" and one.reason == "DATABASE_UNAVAILABLE", (what, one)
        assert "did not answer" in one.details and "TOOLMESH_DB_WAIT_S" in one.details, one
        assert DB_WAIT_S <= one.seconds < DEADLINE_S / 2, (what, one)
    # Every other service the same way, each call after the last one's wait (a wait ended
    # leaves its connection blocked until the server runs again: the next call must not wait
    # behind it).
    with pg_up.server.frozen():
        others = call_each(services.every_rpc())
    for what, one in others.items():
        if what == "mcp_bridge Connect":  # the registry's refusal, passed on
            assert one.code == "UNAVAILABLE" and one.seconds < DEADLINE_S / 2, (what, one)
            continue
        assert one.code == "UNAVAILABLE" and one.reason == "DATABASE_UNAVAILABLE", (what, one)
        assert "did not answer" in one.details and "TOOLMESH_DB_WAIT_S" in one.details, one
        assert DB_WAIT_S <= one.seconds < DEADLINE_S / 2, (what, one)
    wait_for(lambda: services.dispatch("frozen").ok, 30, "calls to succeed after the freeze")
    assert_every_rpc_serves(services)
    assert_no_traceback(m, pg_up.second_dispatcher)


def server_dbname(url: str) -> str:
    return url.rsplit("/", 1)[1]


@pg_test
def test_postgres_out_of_connection_slots_answers_unavailable_saying_so(pg_up: PgMesh) -> None:
    """Another client holds every connection slot (and the services' own connections were
    terminated): each service answers UNAVAILABLE at once, saying the server has too many
    clients, rather than waiting; once the slots are free the next calls succeed."""
    pg_mesh = pg_up
    services, server = pg_mesh.services, pg_mesh.server
    held: list[psycopg.Connection[Any]] = []
    try:
        wait_for(lambda: _hold_every_slot(server, held), 20, "every connection slot to be held")
        for name, got in call_each(services.every_rpc()).items():
            if name == "mcp_bridge Connect":  # the registry's refusal, passed on
                assert got.code == "UNAVAILABLE", got
                continue
            assert_unavailable(got, f"{name} with every connection slot taken")
            assert "too many clients" in got.details, got
    finally:
        for conn in held:
            conn.close()
    assert_every_rpc_serves(services)
    assert_no_traceback(pg_mesh.mesh)


def _hold_every_slot(server: PostgresServer, held: list[psycopg.Connection[Any]]) -> bool:
    """Terminate the services' connections, then open connections until the server refuses
    one; True once none of the services holds a connection (one may have connected meanwhile:
    then this runs again, terminating through a connection already held)."""
    terminate = (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE backend_type = 'client backend' AND datname <> 'postgres'"
    )
    if held:
        held[0].execute(terminate)
    else:
        server.terminate_backends(DEFAULT_DBNAME)
    while True:
        try:
            held.append(
                psycopg.connect(server.conninfo("postgres"), autocommit=True, connect_timeout=5)
            )
        except psycopg.OperationalError as exc:
            assert "too many clients" in str(exc), exc
            break
    others = (
        held[0]
        .execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND datname <> 'postgres'"
        )
        .fetchone()
    )
    return others is not None and others[0] == 0


# --- SQLite -------------------------------------------------------------------------------------


@dataclass
class SqliteMesh:
    mesh: Mesh
    services: Services
    db: Path
    backup: Path  # a migrated database to restore from

    @property
    def url(self) -> str:
        return f"sqlite:///{self.db}"

    def restore(self) -> None:
        """Put the backup in place: a copy beside the database renamed over it, and the
        -wal and -shm of the file it replaces removed (SQLite finds a WAL by the database's
        path: the old file's frames would be applied to the backup)."""
        staged = self.db.with_name("restore.tmp")
        shutil.copy(self.backup, staged)
        os.replace(staged, self.db)
        for path in self.db.parent.glob(self.db.name + "-*"):
            path.unlink()


def start_sqlite_mesh(tmp: Path, db_dir: Path, collector: tuple[MemorySpanSink, int]) -> SqliteMesh:
    db = db_dir / "toolmesh.db"
    url = f"sqlite:///{db}"
    upgrade(url)
    env, also = mesh_env()
    sink, port = collector
    mesh = start_mesh("sqlite", url, tmp, sink, port, env, also)
    # The backup is taken once the registry seeded its tools (the online backup API: a
    # consistent copy while the services run).
    backup = tmp / "backup.db"
    with (
        contextlib.closing(sqlite3.connect(db)) as src,
        contextlib.closing(sqlite3.connect(backup)) as dst,
    ):
        src.backup(dst)
    return SqliteMesh(mesh, Services(mesh), db, backup)


@pytest.fixture(scope="module")
def sqlite_mesh(
    tmp_path_factory: pytest.TempPathFactory, collector: tuple[MemorySpanSink, int]
) -> Iterator[SqliteMesh]:
    tmp = tmp_path_factory.mktemp("faults-sqlite")
    db_dir = tmp / "db"
    db_dir.mkdir()
    m = start_sqlite_mesh(tmp, db_dir, collector)
    yield m
    m.mesh.close()


def test_a_sqlite_file_made_read_only_refuses_writes_then_takes_them_again(
    sqlite_mesh: SqliteMesh,
) -> None:
    """While the database file is read-only, every write answers UNAVAILABLE, saying so, and
    reads go on; connections opened meanwhile are read-only, and once the file is writable
    again every write succeeds (none of those connections is kept). Before, connections
    opened before went on writing, those opened during it refused every write for good."""
    services = sqlite_mesh.services
    assert_every_rpc_serves(services)
    writes = services.writes()
    with read_only(sqlite_mesh.db), ThreadPoolExecutor(8) as pool:
        # Several at once: each service opens more connections than it held before.
        burst = [pool.submit(call_each, writes) for _ in range(6)]
        for answers in (b.result(timeout=60) for b in burst):
            for name, got in answers.items():
                assert_unavailable(got, f"{name} while the file is read-only")
                assert "readonly" in got.details.replace("-", "").replace(" ", ""), got
        for name, got in call_each(services.reads()).items():
            assert got.ok, f"{name} while the file is read-only: {got}"
    for answers in [call_each(writes) for _ in range(8)]:  # through every pooled connection
        for name, got in answers.items():
            assert got.ok, f"{name} once the file is writable again: {got}"
    assert_no_traceback(sqlite_mesh.mesh)


def test_a_sqlite_file_deleted_under_the_mesh_is_unavailable_until_restored(
    sqlite_mesh: SqliteMesh,
) -> None:
    """The database files deleted under the running mesh: calls answer UNAVAILABLE (the
    database at the path has no schema) instead of OK with rows written to a file nobody can
    read any more; once a backup is put in place, every service serves again, and the rows
    of calls answered OK are in it."""
    services, db = sqlite_mesh.services, sqlite_mesh.db
    assert_every_rpc_serves(services)
    for path in db.parent.glob(db.name + "*"):
        path.unlink()
    ok: set[str] = set()
    for name, got in call_each(services.every_rpc()).items():
        assert_unavailable(got, f"{name} after the file was deleted", ("SCHEMA_NOT_READY",))
    got = services.dispatch("deleted")
    assert_unavailable(got, "a call after the file was deleted", ("SCHEMA_NOT_READY",))

    sqlite_mesh.restore()
    assert_every_rpc_serves(services)
    for _ in range(5):
        got = services.dispatch("restored")
        assert got.ok, got
        ok.add(echo(got))
    assert_whole_rows(sqlite_mesh.url, ok, ("restored",))
    assert_no_traceback(sqlite_mesh.mesh)


def test_a_sqlite_file_replaced_by_one_that_is_not_a_database(sqlite_mesh: SqliteMesh) -> None:
    """The database replaced by a file that is not a database: UNAVAILABLE saying so (not
    INTERNAL, not OK), and the background work lives through it: once a backup is put in
    place the surface derives Tier-0 on its own again and a job is picked up."""
    services, db, m = sqlite_mesh.services, sqlite_mesh.db, sqlite_mesh.mesh
    assert_every_rpc_serves(services)
    surface = m.processes["surface"]
    staged = db.with_name("garbage.tmp")
    staged.write_bytes(b"this is not a SQLite database\n" * 512)
    os.replace(staged, db)
    for path in db.parent.glob(db.name + "-*"):  # its -wal and -shm: a restore gone wrong
        path.unlink()
    mark = len(surface.output)
    for name, got in call_each(services.every_rpc()).items():
        assert_unavailable(got, f"{name} on a file that is not a database")
        assert "not a database" in got.details, got
    wait_for(
        lambda: "periodic tier0 derivation failed" in output_since(surface, mark),
        10,
        "the periodic derivation to meet the damaged file",
    )
    sqlite_mesh.restore()
    restored = len(surface.output)
    assert_every_rpc_serves(services)
    wait_for_background_work(services, surface, restored)
    assert_no_traceback(m)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs for the database's directory (root only)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Fill `disk` to its last byte with one file; the file."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        chunk = b"\0" * (1 << 20)
        with contextlib.suppress(OSError):  # ENOSPC: full
            while True:
                f.write(chunk)
                f.flush()
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    return filler


def test_a_full_disk_answers_unavailable_runs_no_tool_unlogged_and_recovers_when_freed(
    small_disk: Path,
    tmp_path: Path,
    collector: tuple[MemorySpanSink, int],
) -> None:
    """The database's disk full: a dispatched call answers UNAVAILABLE saying so (before,
    "call log write failed: ProgrammingError: Cannot operate on a closed database" with a
    traceback in the log), and the calls after it do not run their tool only to fail to log
    it (the log is probed with a write); writes of the other services answer UNAVAILABLE,
    reads go on. Once space is freed, the next calls succeed and are logged."""
    m = start_sqlite_mesh(tmp_path, small_disk, collector)
    try:
        services = m.services
        assert_every_rpc_serves(services)
        filler = fill(small_disk)
        first = services.dispatch("full", export_text="x")
        assert_unavailable(first, "a call on a full disk")
        assert "full" in first.details, first
        ran = _exports(services)
        for _ in range(3):
            got = services.dispatch("full", export_text="x")
            assert_unavailable(got, "a call on a full disk")
            assert "full" in got.details, got
        assert _exports(services) == ran, "a tool ran although its call could not be logged"
        for name, got in call_each(services.writes()).items():
            assert_unavailable(got, f"{name} on a full disk")
        for name, got in call_each(services.reads()).items():
            assert got.ok, f"{name} on a full disk: {got}"

        filler.unlink()
        ok: set[str] = set()
        for _ in range(3):
            got = services.dispatch("freed")
            assert got.ok, got
            ok.add(echo(got))
        assert_every_rpc_serves(services)
        assert_whole_rows(m.url, ok, ("full", "freed"))
        assert_no_traceback(m.mesh)
    finally:
        m.mesh.close()


def _exports(services: Services) -> int:
    return len(list(services.exports.glob("*/ping.txt"))) if services.exports.exists() else 0
