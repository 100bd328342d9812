"""The analysis tools through the real mesh (dispatcher -> registry -> handler): datasets are loaded
into a conversation, joined with SQL, described and previewed; they live in the database, so a
second replica serves them too; tenants are isolated; mistakes are hints; and a path outside the
data roots is refused without being read."""

from __future__ import annotations

import ctypes
import json
import os
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from shared.arrow_ipc import ipc_to_dataframe
from shared.launcher import ServiceProcess, start_service
from tests.integration.conftest import Mesh
from toolmesh.dispatcher.v1 import dispatcher_pb2 as dpb
from toolmesh.dispatcher.v1 import dispatcher_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb

pytestmark = pytest.mark.integration

CONVERSATION = "analysis"


def call(
    via: Mesh | dispatcher_pb2_grpc.DispatcherServiceStub,
    name: str,
    inputs: dict[str, Any],
    *,
    conversation: str = CONVERSATION,
    tenant: str = "tenant-a",
) -> pb.ToolResult:
    """One tool call through the mesh's dispatcher (`mesh.call`) or another dispatcher's stub."""
    if isinstance(via, Mesh):
        return via.call(name, json.dumps(inputs), conversation=conversation, tenant=tenant).result
    response = via.DispatchToolCall(
        dpb.DispatchToolCallRequest(
            tool_use=pb.ToolUse(name=name, input_json=json.dumps(inputs)),
            context=pb.CallContext(tenant_id=tenant, conversation_id=conversation),
        ),
        timeout=60,
    )
    return response.result


def kind(result: pb.ToolResult) -> str | None:
    return result.envelope.WhichOneof("kind")


def ok(result: pb.ToolResult) -> pb.Ok:
    assert kind(result) == "ok", result.content
    return result.envelope.ok


def schema_hint(result: pb.ToolResult) -> pb.Hint:
    assert kind(result) == "hint", result.content
    assert result.envelope.hint.hint_kind == pb.HINT_KIND_SCHEMA, result.content
    return result.envelope.hint


def columns(envelope: pb.Ok) -> dict[str, pb.ColumnSpec]:
    return {c.name: c for c in envelope.schema}


def data_rows(result: pb.ToolResult) -> list[dict[str, Any]]:
    """The rows of an Ok result's table, decoded from its Arrow IPC payload (Ok.table) — never
    parsed from the rendered text."""
    envelope = ok(result)
    assert envelope.HasField("table"), f"no table on the Ok result (rows={envelope.rows})"
    assert not envelope.data_json
    records: list[dict[str, Any]] = ipc_to_dataframe(envelope.table.arrow_ipc).to_dict("records")
    return records


@pytest.fixture(scope="module")
def loaded(mesh: Mesh) -> Mesh:
    """people.csv and orders.csv loaded into tenant-a's conversation `analysis`."""
    for path in ("people.csv", "orders.csv"):
        assert kind(call(mesh, "load_dataset", {"path": path})) == "ok"
    return mesh


@contextmanager
def replica(mesh: Mesh) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    """A second registry + dispatcher pair on the mesh's database, started independently."""
    env = dict(mesh.env)
    env.pop("TOOLMESH_REGISTRY_ADDR", None)
    started: list[ServiceProcess] = []
    try:
        started.append(start_service("registry", env=env, port=0))
        env["TOOLMESH_REGISTRY_ADDR"] = started[0].address
        started.append(start_service("dispatcher", env=env, port=0))
        yield started[0], started[1]
    finally:
        for proc in reversed(started):
            proc.stop()


def test_load_dataset_reports_the_measured_rows_and_schema(mesh: Mesh) -> None:
    result = call(mesh, "load_dataset", {"path": "people.csv"}, conversation="load")
    envelope = ok(result)
    assert envelope.rows == 5
    cols = columns(envelope)
    assert list(cols) == ["id", "name", "city", "age", "joined"]
    assert cols["id"].dtype == "int64"
    assert cols["age"].null_count == 1
    assert cols["id"].distinct_count == 5


def test_a_query_joining_two_loaded_files_returns_the_right_rows(loaded: Mesh) -> None:
    result = call(
        loaded,
        "query",
        {
            "sql": "SELECT p.name, count(*) AS orders, sum(o.amount) AS total "
            "FROM people p JOIN orders o ON o.person_id = p.id "
            "WHERE o.status = 'paid' GROUP BY p.name ORDER BY p.name"
        },
    )
    envelope = ok(result)
    assert envelope.rows == 3
    assert [c.name for c in envelope.schema] == ["name", "orders", "total"]
    assert columns(envelope)["orders"].dtype == "int64"  # integers stay integers
    rows = data_rows(result)
    assert [(r["name"], r["orders"]) for r in rows] == [("Ada", 2), ("Linus", 1), ("Zoë", 1)]
    assert [r["total"] for r in rows] == pytest.approx([19.75, 3.10, 42.0])


def test_an_outer_join_keeps_the_person_without_orders(loaded: Mesh) -> None:
    envelope = ok(
        call(
            loaded,
            "query",
            {
                "sql": "SELECT p.name, o.order_id FROM people p "
                "LEFT JOIN orders o ON o.person_id = p.id"
            },
        )
    )
    assert envelope.rows == 7  # six orders, plus Margaret with none
    assert columns(envelope)["order_id"].null_count == 1
    assert columns(envelope)["name"].distinct_count == 5


def test_describe_entry_describes_every_column(loaded: Mesh) -> None:
    envelope = ok(call(loaded, "describe_entry", {"name": "people"}))
    assert envelope.rows == 5  # one description row per column
    cols = columns(envelope)
    assert list(cols) == ["id", "name", "city", "age", "joined"]
    assert cols["age"].null_count == 1
    assert cols["city"].distinct_count == 5


def test_preview_data_shows_a_window_with_the_true_row_count(loaded: Mesh) -> None:
    result = call(loaded, "preview_data", {"name": "orders", "limit": 2, "offset": 1})
    envelope = ok(result)
    assert envelope.rows == 6  # the dataset's true size, not the window's
    assert columns(envelope)["order_id"].distinct_count == 6
    assert [r["order_id"] for r in data_rows(result)] == [101, 102]


def test_another_replica_on_the_same_database_serves_the_conversations_datasets(
    loaded: Mesh,
) -> None:
    with replica(loaded) as (_, dispatcher), grpc.insecure_channel(dispatcher.address) as ch:
        other = dispatcher_pb2_grpc.DispatcherServiceStub(ch)
        envelope = ok(
            call(
                other,
                "query",
                {
                    "sql": "SELECT o.* FROM orders o JOIN people p ON o.person_id = p.id "
                    "WHERE p.city = 'Zürich'",
                    "save_as": "zurich_orders",
                },
            )
        )
        assert envelope.rows == 2
        assert [c.name for c in envelope.schema] == ["order_id", "person_id", "amount", "status"]
    # ...and what the replica saved, the first replica serves.
    saved = ok(call(loaded, "describe_entry", {"name": "zurich_orders"}))
    assert saved.rows == 4
    assert columns(saved)["order_id"].distinct_count == 2


def test_another_tenant_cannot_see_the_dataset(loaded: Mesh) -> None:
    for tool, inputs in [
        ("preview_data", {"name": "people"}),
        ("describe_entry", {"name": "people"}),
        ("query", {"sql": "SELECT * FROM people"}),
    ]:
        schema_hint(call(loaded, tool, inputs, tenant="tenant-b"))
    # The owner still sees it.
    assert ok(call(loaded, "preview_data", {"name": "people"})).rows == 5


def test_an_unknown_column_is_a_schema_hint_whose_first_alternative_is_the_right_column(
    loaded: Mesh,
) -> None:
    hint = schema_hint(call(loaded, "query", {"sql": "SELECT nmae FROM people"}))
    assert hint.alternatives, "the hint names no alternative"
    assert hint.alternatives[0].label.rsplit(".", 1)[-1] == "name"


def test_an_unknown_table_is_a_schema_hint_naming_the_closest_dataset(loaded: Mesh) -> None:
    hint = schema_hint(call(loaded, "query", {"sql": "SELECT * FROM peeple"}))
    assert hint.alternatives[0].label == "people"


SECRET = "TOPSECRET_VALUE_42"
_IN_ACCESS, _IN_OPEN = 0x1, 0x20


@contextmanager
def opened_files(directory: Path) -> Iterator[Callable[[], set[str]]]:
    """Watch `directory` with inotify (any process, symlinks resolved by the kernel); yields a
    function returning the names of the files in it opened or read since the watch began."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        pytest.skip(f"inotify is not available: {os.strerror(ctypes.get_errno())}")
    try:
        if libc.inotify_add_watch(fd, os.fsencode(directory), _IN_ACCESS | _IN_OPEN) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch failed", str(directory))

        def names() -> set[str]:
            found: set[str] = set()
            while True:
                try:
                    buffer = os.read(fd, 65536)
                except BlockingIOError:
                    return found
                offset = 0
                while offset < len(buffer):
                    _, _, _, length = struct.unpack_from("iIII", buffer, offset)
                    raw = buffer[offset + 16 : offset + 16 + length]
                    found.add(raw.rstrip(b"\0").decode())
                    offset += 16 + length

        yield names
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory outside the data roots holding a valid CSV that must never be read."""
    directory = tmp_path_factory.mktemp("outside-the-roots")
    (directory / "secret.csv").write_text(f"secret\n{SECRET}\n", encoding="utf-8")
    return directory


def _outside_path(case: str, mesh: Mesh, outside: Path) -> str:
    if case == "file symlink":
        link = mesh.files_dir / "leak.csv"
        if not link.is_symlink():
            link.symlink_to(outside / "secret.csv")
        return "leak.csv"
    if case == "directory symlink":
        link = mesh.files_dir / "leaky_dir"
        if not link.is_symlink():
            link.symlink_to(outside, target_is_directory=True)
        return "leaky_dir/secret.csv"
    if case == "traversal to a real file":
        return os.path.relpath(outside / "secret.csv", mesh.files_dir)
    return case


@pytest.mark.parametrize(
    "case",
    [
        "../../etc/passwd",
        "/etc/passwd",
        "traversal to a real file",
        "file symlink",
        "directory symlink",
    ],
)
def test_a_path_outside_the_data_roots_is_refused_unread_and_logged_as_failed(
    mesh: Mesh, outside: Path, case: str
) -> None:
    conversation = f"outside-{case.replace('/', '_').replace(' ', '_')}"
    raw = _outside_path(case, mesh, outside)
    assert not (mesh.files_dir / raw).resolve().is_relative_to(mesh.files_dir.resolve())

    with opened_files(outside) as opened:
        result = call(mesh, "load_dataset", {"path": raw}, conversation=conversation)
        assert "secret.csv" not in opened()

    assert kind(result) == "err", result.content
    assert result.envelope.err.err_kind == "PathOutsideDataRoots"
    for leaked in (SECRET, "root:"):
        assert leaked not in result.content
    # Nothing was loaded into the conversation...
    tables = call(mesh, "query", {"sql": "SHOW TABLES"}, conversation=conversation)
    assert ok(tables).rows == 0
    # ...and the refusal is logged as a failed call.
    entries = mesh.dispatcher.ListExecutionLog(
        dpb.ListExecutionLogRequest(conversation_id=conversation, tool_name="load_dataset")
    ).entries
    assert [(e.tool_name, e.success) for e in entries] == [("load_dataset", False)]
    assert entries[0].error
    events = mesh.dispatcher.ListConversationEvents(
        dpb.ListConversationEventsRequest(conversation_id=conversation, event_type="tool_result")
    ).events
    results = [json.loads(e.data_json) for e in events]
    assert [r["envelope"] for r in results if r["tool_name"] == "load_dataset"] == ["err"]


def test_the_inotify_watch_does_see_a_read_through_a_symlink(outside: Path, tmp_path: Path) -> None:
    """The control for the test above: a file that IS read through a symlink is noticed."""
    link = tmp_path / "link.csv"
    link.symlink_to(outside / "secret.csv")
    with opened_files(outside) as opened:
        assert SECRET in link.read_text(encoding="utf-8")
        assert "secret.csv" in opened()


def test_a_workbook_sheet_and_a_json_file_load_through_the_mesh(mesh: Mesh) -> None:
    """The registry process reads .xlsx (openpyxl, imported on first use) and JSON (DuckDB's
    reader on /proc/self/fd), and its input validation takes `sheet` as a name or a number."""
    import openpyxl

    book = openpyxl.Workbook()
    first = book.active
    assert first is not None
    first.title = "Notes"
    first.append(["read me"])
    table = book.create_sheet("Data")
    table.append(["city", "visits"])
    table.append(["Oslo", 3])
    table.append(["Rome", 4])
    book.save(mesh.files_dir / "visits.xlsx")
    (mesh.files_dir / "events.jsonl").write_text(
        '{"id": 1, "where": {"city": "Oslo"}}\n{"id": 2, "where": {"city": "Rome"}}\n', "utf-8"
    )

    by_number = call(mesh, "load_dataset", {"path": "visits.xlsx", "sheet": 2}, conversation="x")
    events = call(mesh, "load_dataset", {"path": "events.jsonl"}, conversation="x")
    joined = call(
        mesh,
        "query",
        {
            "sql": 'SELECT v.city, v.visits FROM visits v JOIN events e ON e."where.city" = v.city '
            "ORDER BY v.visits"
        },
        conversation="x",
    )

    assert ok(by_number).rows == 2 and ok(events).rows == 2
    assert data_rows(joined) == [{"city": "Oslo", "visits": 3}, {"city": "Rome", "visits": 4}]
    bad_sheet = call(mesh, "load_dataset", {"path": "visits.xlsx", "sheet": 0}, conversation="x")
    assert "sheet" in schema_hint(bad_sheet).message


def test_a_legacy_workbook_and_a_database_table_load_and_join_through_the_mesh(
    mesh: Mesh,
) -> None:
    """An Excel 97-2003 workbook (read by its own capped child process of the registry's) and a
    table of a SQLite database, joined with SQL; a workbook whose grid dwarfs its file is
    refused and the registry goes on serving."""
    import sqlite3

    con = sqlite3.connect(mesh.files_dir / "regions.sqlite")
    con.executescript(
        "CREATE TABLE region (name TEXT, manager TEXT);"
        "INSERT INTO region VALUES ('north', 'Ada'), ('south', 'Bo'), ('east', 'Cy');"
        "CREATE TABLE other (x INTEGER);"
    )
    con.commit()
    con.close()
    conversation = "formats"
    assert ok(call(mesh, "load_dataset", {"path": "sales.xls"}, conversation=conversation))
    loaded = ok(
        call(
            mesh,
            "load_dataset",
            {"path": "regions.sqlite", "table": "region"},
            conversation=conversation,
        )
    )
    assert loaded.rows == 3
    joined = call(
        mesh,
        "query",
        {
            "sql": "SELECT r.manager, s.units FROM sales s JOIN region r ON r.name = s.region "
            "ORDER BY s.units DESC"
        },
        conversation=conversation,
    )
    assert data_rows(joined) == [
        {"manager": "Ada", "units": 12},
        {"manager": "Bo", "units": 7},
        {"manager": "Cy", "units": 0},
    ]
    bomb = call(mesh, "load_dataset", {"path": "grid_bomb.xls"}, conversation=conversation)
    assert kind(bomb) == "err" and "MiB of memory" in bomb.content, bomb.content
    assert ok(call(mesh, "preview_data", {"name": "sales"}, conversation=conversation))
