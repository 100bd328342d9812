"""The `toolmesh` console script as a user runs it: `call` prints the rendered result and its
exit code says Ok/Hint (0), Err (1) or RPC failure (2); `tools` and `log` read the mesh; and
`toolmesh up` starts every service on its configured port, is traceable, and stops them all on
SIGTERM."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.integration.conftest import Mesh, free_ports

pytestmark = pytest.mark.integration

TOOLMESH = Path(sys.executable).parent / "toolmesh"

# The CLI is a thin client: its mesh tests run on one backend (the backends themselves are
# covered by the dispatch and analysis tests).
on_sqlite_mesh = pytest.mark.parametrize("mesh", ["sqlite"], indirect=True, scope="module")


def clean_env(**overrides: str) -> dict[str, str]:
    """The caller's environment without toolmesh/OpenTelemetry settings, plus `overrides`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLMESH_", "OTEL_"))}
    env.update(overrides)
    return env


def toolmesh(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TOOLMESH), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=dict(env) if env is not None else clean_env(),
        timeout=timeout,
        check=False,
    )


def call(mesh: Mesh, *args: str) -> subprocess.CompletedProcess[str]:
    return toolmesh("call", *args, "--dispatcher", mesh.address("dispatcher"))


@on_sqlite_mesh
def test_call_prints_the_rendered_ok_result_and_exits_0(mesh: Mesh) -> None:
    done = call(mesh, "ping", "--input", '{"echo": {"n": 3}}')
    assert done.returncode == 0, done.stderr
    assert "✓ ok." in done.stdout
    assert '"n": 3' in done.stdout  # the integer arrives as an integer


@on_sqlite_mesh
def test_call_again_with_its_tool_use_id_prints_the_same_result_and_says_it_did_not_run(
    mesh: Mesh,
) -> None:
    args = ("ping", "--input", '{"echo": "once"}', "--tool-use-id", "toolu_cli_retry")
    first = call(mesh, *args, "--conversation", "cli-retry")
    again = call(mesh, *args, "--conversation", "cli-retry")
    assert first.returncode == again.returncode == 0, again.stderr
    assert again.stdout == first.stdout and '"echo": "once"' in again.stdout
    assert "answered before" not in first.stderr
    assert "toolu_cli_retry was answered before" in again.stderr
    assert "did not run again" in again.stderr


@on_sqlite_mesh
def test_call_with_progress_prints_the_reports_to_stderr_as_they_come(mesh: Mesh) -> None:
    plain = call(mesh, "ping", "--input", '{"echo": "x"}')
    done = call(
        mesh, "ping", "--progress", "--input", '{"delay_ms": 300, "progress_steps": 3, "echo": "x"}'
    )
    assert done.returncode == 0, done.stderr
    reports = [line for line in done.stderr.splitlines() if line.startswith("…")]
    assert reports == [
        "… ping step 1 of 3 (0%)",
        "… ping step 2 of 3 (33%)",
        "… ping step 3 of 3 (67%)",
    ]
    assert done.stdout == plain.stdout  # the result prints as without --progress
    failed = call(mesh, "ping", "--progress", "--input", '{"fail": "error"}')
    assert failed.returncode == 1 and "ping was asked to fail" in failed.stdout
    unknown = call(mesh, "pnig", "--progress")
    assert unknown.returncode == 2 and "did you mean ping" in unknown.stderr


@on_sqlite_mesh
def test_call_prints_a_result_over_grpcs_default_4_mb_message_limit(mesh: Mesh) -> None:
    """A result may be up to 32 MB serialised; the CLI's channel took gRPC's default 4 MB and
    answered RESOURCE_EXHAUSTED for a call that had run."""
    # ~15 MB of hex digits: the result's Arrow table does not compress below 4 MB.
    sql = (
        "SELECT (SELECT string_agg(md5((i * 100 + j)::VARCHAR), '') FROM range(60) r(j)) AS s "
        "FROM range(8000) t(i)"
    )
    done = call(mesh, "query", "--input", json.dumps({"sql": sql, "limit": 8000}))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "8000 row(s)" in done.stdout


@on_sqlite_mesh
def test_call_exits_0_on_a_hint(mesh: Mesh) -> None:
    done = call(mesh, "ping", "--input", '{"fail": "hint"}')
    assert done.returncode == 0, done.stderr
    assert "hint" in done.stdout


@on_sqlite_mesh
def test_call_exits_1_on_an_err_result(mesh: Mesh) -> None:
    done = call(mesh, "ping", "--input", '{"fail": "raise"}')
    assert done.returncode == 1
    assert "PingFailure" in done.stdout


@on_sqlite_mesh
def test_call_of_a_misspelt_tool_exits_2_with_not_found_naming_the_tool_meant(mesh: Mesh) -> None:
    done = call(mesh, "pnig")
    assert done.returncode == 2
    assert "NOT_FOUND" in done.stderr
    assert "ping" in done.stderr
    assert done.stdout == ""


@on_sqlite_mesh
def test_call_of_an_unknown_tool_exits_2_with_not_found_and_a_suggestion(mesh: Mesh) -> None:
    done = call(mesh, "nope")
    assert done.returncode == 2
    assert "NOT_FOUND" in done.stderr
    offered = {"ping", "compose_ping", "load_dataset", "preview_data", "describe_entry", "query"}
    assert any(name in done.stderr for name in offered), done.stderr


@on_sqlite_mesh
def test_call_with_input_that_is_not_an_object_exits_2_invalid_argument(mesh: Mesh) -> None:
    done = call(mesh, "ping", "--input", "[1]")
    assert done.returncode == 2
    assert "INVALID_ARGUMENT" in done.stderr
    assert "Traceback" not in done.stderr


def test_call_without_a_running_mesh_exits_2_unavailable() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        done = toolmesh("call", "ping", "--dispatcher", address, "--timeout", "10")
    assert done.returncode == 2
    assert "UNAVAILABLE" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "soon"])
def test_a_deadline_that_is_not_a_positive_number_of_seconds_is_refused(value: str) -> None:
    done = toolmesh("call", "ping", "--timeout", value)
    assert done.returncode == 2
    assert f"argument --timeout: {value!r}" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("nonsense://x", "TOOLMESH_DATABASE_URL nonsense://x cannot be opened"),
        ("postgresql://u:secret@127.0.0.1:1/x", "database unavailable"),
    ],
)
def test_db_upgrade_on_a_database_it_cannot_open_exits_2_naming_the_problem(
    url: str, said: str
) -> None:
    done = toolmesh("db", "upgrade", env=clean_env(TOOLMESH_DATABASE_URL=url))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [done.stderr.splitlines()[-1]], done.stderr  # one line
    assert done.stderr.startswith(f"error: {said}"), done.stderr
    assert "Traceback" not in done.stderr and "secret" not in done.stderr


def test_db_prune_deletes_the_call_log_older_than_the_age_given(tmp_path: Path) -> None:
    """`toolmesh db prune --older-than DAYS [--dry-run]` against the configured database, as a
    dispatcher with TOOLMESH_RETENTION_DAYS sweeps it."""
    from sqlalchemy import Table, func, insert, select

    from shared.db.engine import make_engine, upgrade
    from shared.db.models import ToolExecutionLogRow

    url = f"sqlite:///{tmp_path}/toolmesh.db"
    upgrade(url)
    table: Table = ToolExecutionLogRow.__table__  # type: ignore[assignment]
    now = datetime.now(UTC)
    row = {
        "tool_name": "ping",
        "tenant_id": "t",
        "user_id": "",
        "conversation_id": "c",
        "tool_use_id": "",
        "args_hash": "",
        "input_data": {},
        "output_summary": "",
        "success": True,
        "error": None,
        "execution_ms": 1.0,
        "trace_id": "",
    }
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(
            insert(table),
            [{**row, "created_at": now - timedelta(days=d)} for d in (40, 35, 1)],
        )
    env = clean_env(TOOLMESH_DATABASE_URL=url)

    def left() -> int:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(table)).scalar_one())

    dry = toolmesh("db", "prune", "--older-than", "30", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would delete 2 tool_execution_log row(s), 0 conversation_events")
    assert left() == 3
    done = toolmesh("db", "prune", "--older-than", "30", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("deleted 2 tool_execution_log row(s)"), done.stdout
    assert left() == 1
    # The age defaults to TOOLMESH_RETENTION_DAYS.
    by_setting = toolmesh("db", "prune", env={**env, "TOOLMESH_RETENTION_DAYS": "0.5"})
    assert by_setting.returncode == 0 and by_setting.stdout.startswith("deleted 1 ")
    assert left() == 0
    engine.dispose()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["prune"], "db prune needs --older-than DAYS"),
        (["prune", "--older-than", "0"], "got 0.0"),
        (["prune", "--older-than", "-3"], "got -3.0"),
        (["prune", "--older-than", "nan"], "got nan"),
        (["prune", "--older-than", "1e9"], "at most 36500"),
        (["upgrade", "--dry-run"], "--older-than and --dry-run go with `db prune`"),
    ],
)
def test_db_prune_without_a_usable_age_is_a_usage_error(
    tmp_path: Path, args: list[str], said: str
) -> None:
    env = clean_env(TOOLMESH_DATABASE_URL=f"sqlite:///{tmp_path}/toolmesh.db")
    done = toolmesh("db", *args, env=env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr


@on_sqlite_mesh
def test_output_into_a_pipe_closed_early_ends_quietly(mesh: Mesh) -> None:
    """`toolmesh tools | head -1`: the reader goes away; no traceback, the SIGPIPE status."""
    process = subprocess.Popen(
        [str(TOOLMESH), "tools", "--all", "--registry", mesh.address("registry")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before it writes anything
    with process.stderr:
        stderr = process.stderr.read().decode()
    assert process.wait(60) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr


@on_sqlite_mesh
def test_tools_json_lists_the_model_facing_tools_with_a_reasoning_field(mesh: Mesh) -> None:
    done = toolmesh("tools", "--json", "--registry", mesh.address("registry"))
    assert done.returncode == 0, done.stderr
    tools = {t["name"]: t for t in json.loads(done.stdout)}
    assert {"load_dataset", "query"} <= tools.keys()
    assert "ping" not in tools  # internal
    for name in ("load_dataset", "query"):
        assert "reasoning" in tools[name]["input_schema"]["properties"]


@on_sqlite_mesh
def test_tools_all_includes_internal_tools(mesh: Mesh) -> None:
    done = toolmesh("tools", "--all", "--json", "--registry", mesh.address("registry"))
    assert done.returncode == 0, done.stderr
    names = {t["name"] for t in json.loads(done.stdout)}
    assert {"ping", "load_dataset", "query"} <= names


@on_sqlite_mesh
def test_log_shows_the_latest_calls_of_one_tool(mesh: Mesh) -> None:
    for _ in range(4):
        mesh.call("ping", conversation="cli-log")
    mesh.call("compose_ping", conversation="cli-log")
    done = toolmesh(
        "log", "--tool", "ping", "--limit", "3", "--dispatcher", mesh.address("dispatcher")
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if "cli-log" in line]
    assert len(rows) == 3
    assert all("ping" in row.split() for row in rows)


@on_sqlite_mesh
def test_log_filters_by_model_and_shows_it(mesh: Mesh) -> None:
    dispatcher = mesh.address("dispatcher")
    for model in ("model-a", "model-b", "model-a"):
        done = toolmesh("call", "ping", "--conversation", "cli-models", "--model", model,
                        "--dispatcher", dispatcher)  # fmt: skip
        assert done.returncode == 0, done.stderr
    done = toolmesh("log", "--model", "model-a", "--dispatcher", dispatcher)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if "cli-models" in line]
    assert len(rows) == 2 and all("model=model-a" in row for row in rows), done.stdout
    as_json = toolmesh("log", "--model", "model-b", "--json", "--dispatcher", dispatcher)
    assert [e["model"] for e in json.loads(as_json.stdout)] == ["model-b"]


# --- toolmesh up ------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name, or None when there is no such pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rpartition(")")[2].split()


def children_of(pid: int) -> dict[int, str]:
    """Live child processes of `pid`: pid -> start time (to tell a reused pid apart)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[1] == str(pid):
                found[int(entry.name)] = fields[19]
    return found


def descendants_of(pid: int) -> dict[int, str]:
    """Every live process under `pid` (children, theirs, ...): pid -> start time."""
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        for child, start in children_of(frontier.pop()).items():
            if child not in found:
                found[child] = start
                frontier.append(child)
    return found


def running(pid: int, start_time: str) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[19] == start_time and fields[0] != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


@dataclass
class Up:
    """A running `toolmesh up` and everything it printed so far."""

    process: subprocess.Popen[str]
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    output: list[str] = field(default_factory=list)
    services: dict[int, str] = field(default_factory=dict)

    def find_services(self) -> dict[int, str]:
        """The service processes `toolmesh up` started (remembered for the clean-up)."""
        self.services.update(children_of(self.process.pid))
        return dict(self.services)

    def pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_for_line(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"toolmesh up exited early:\n{''.join(self.output)}")
            if text in line:
                return
        raise AssertionError(f"no {text!r} within {timeout}s:\n{''.join(self.output)}")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[Up, dict[str, str], dict[str, int]]]:
    registry_port, dispatcher_port = free_ports(2)
    env = clean_env(
        TOOLMESH_DATA_DIR=str(tmp_path / "toolmesh"),
        TOOLMESH_REGISTRY_PORT=str(registry_port),
        TOOLMESH_DISPATCHER_PORT=str(dispatcher_port),
        TOOLMESH_TRACING="1",
        TOOLMESH_SHUTDOWN_GRACE_S="2",
        PYTHONUNBUFFERED="1",
    )
    process = subprocess.Popen(
        [str(TOOLMESH), "up", "--collector-port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        env=env,
        start_new_session=True,  # its own process group, like a shell job: see the Ctrl-C test
    )
    handle = Up(process)
    pump = threading.Thread(target=handle.pump, daemon=True)
    pump.start()
    try:
        yield handle, env, {"registry": registry_port, "dispatcher": dispatcher_port}
    finally:
        if process.poll() is None:
            handle.find_services()
            process.kill()
            process.wait(10)
        for pid, start in handle.services.items():  # only what this `toolmesh up` started
            if running(pid, start):
                os.kill(pid, signal.SIGKILL)
        pump.join(10)
        if process.stdout is not None:
            process.stdout.close()


def test_up_serves_on_the_configured_ports_traces_calls_and_stops_cleanly_on_sigterm(
    up: tuple[Up, dict[str, str], dict[str, int]],
) -> None:
    handle, env, ports = up
    handle.wait_for_line("toolmesh is up", timeout=90)
    printed = "".join(handle.output)
    for service, port in ports.items():
        assert f"127.0.0.1:{port}" in printed, f"{service} is not announced on its port"
    services = handle.find_services()
    assert {"services.registry", "services.dispatcher"} <= {
        word for pid in services for word in cmdline(pid).split()
    }

    # A call through the configured address (no --dispatcher: the port comes from the env).
    done = toolmesh("call", "ping", env=env)
    assert done.returncode == 0, done.stderr
    assert "✓ ok." in done.stdout

    # Its spans (from both services) reach the local span store and `toolmesh trace --last`
    # prints the tree: the last tool call's, not that of the log listing made after it.
    listed = toolmesh("log", "--limit", "1", env=env)
    assert listed.returncode == 0 and "ping" in listed.stdout, listed.stderr

    def complete(out: str) -> bool:
        return "execute_tool ping" in out and "DispatchToolCall" in out

    deadline = time.monotonic() + 30
    trace = toolmesh("trace", "--last", env=env)
    while not complete(trace.stdout) and time.monotonic() < deadline:
        time.sleep(0.3)  # polling the span store, bounded by the deadline
        trace = toolmesh("trace", "--last", env=env)
    assert trace.returncode == 0, trace.stderr
    assert "execute_tool ping" in trace.stdout
    assert "DispatchToolCall" in trace.stdout

    handle.process.send_signal(signal.SIGTERM)
    assert_stopped_cleanly(handle, services)


def test_up_stops_every_service_cleanly_on_ctrl_c(
    up: tuple[Up, dict[str, str], dict[str, int]],
) -> None:
    handle, _, _ = up
    handle.wait_for_line("toolmesh is up", timeout=90)
    services = handle.find_services()
    assert len(services) >= 2
    everything = descendants_of(handle.process.pid)  # the sandbox's zygote too
    os.killpg(handle.process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    assert_stopped_cleanly(handle, everything)
    assert "zygote is gone" not in "".join(handle.output), "Ctrl-C reached the sandbox zygote"


def assert_stopped_cleanly(handle: Up, services: dict[int, str]) -> None:
    try:
        code = handle.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        left = [cmdline(p) for p, start in services.items() if running(p, start)]
        raise AssertionError(
            f"toolmesh up still running 20s after the signal; services left: {left}\n"
            + "".join(handle.output)
        ) from None
    assert code == 0, "".join(handle.output)
    handle.wait_for_line("toolmesh stopped.", timeout=10)
    left = [pid for pid, start in services.items() if running(pid, start)]
    assert not left, f"service processes left behind: {[cmdline(p) for p in left]}"
