"""What a server sends cannot drive the terminal the CLI prints to: in human-readable output,
escape sequences (CSI, OSC 8 links, OSC 52 clipboard writes), BEL, backspace, carriage return,
DEL, C1 controls and bidi overrides from tool results, descriptions, error messages, log rows
and span attributes are shown as escapes (`\\x1b`, `\\u202e`), tabs and newlines kept; --json
output is the same value with those characters as JSON escapes."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.cli import render
from shared.cli.render import json_text, terminal_text
from shared.contract.table import display_width
from shared.telemetry import semconv
from tests.unit.cli.hostile_mesh import (
    HOSTILE,
    HOSTILE_SHOWN,
    REFUSED_TOOL,
    HostileMesh,
    hostile_mesh,
    point_cli_at,
    run,
)

# What a terminal acts on (stated here, not imported: the test locks the set).
ACTED_ON = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module")
def mesh() -> Iterator[HostileMesh]:
    with hostile_mesh() as running:
        yield running


@pytest.fixture(autouse=True)
def env(mesh: HostileMesh, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    point_cli_at(mesh.address, monkeypatch, tmp_path)


def strings(value: Any) -> Iterator[str]:
    """Every string in a decoded JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


# --- the escaping itself ----------------------------------------------------------------------


def test_terminal_text_escapes_what_a_terminal_acts_on_and_keeps_newlines_and_tabs() -> None:
    assert terminal_text(HOSTILE) == HOSTILE_SHOWN
    assert terminal_text("a\nb\tc") == "a\nb\tc"
    assert terminal_text("\x00\x1b\x7f\x80\x9f\u202a\u202e\u2066\u2069") == (
        "\\x00\\x1b\\x7f\\x80\\x9f\\u202a\\u202e\\u2066\\u2069"
    )


def test_terminal_text_leaves_other_text_alone_and_escapes_once() -> None:
    text = "naïve café, 東京, مرحبا, emoji 🎉, a\\path, \u00a0no-break"
    assert terminal_text(text) == text
    assert terminal_text(terminal_text(HOSTILE)) == HOSTILE_SHOWN


def test_json_text_is_the_same_json_value_with_nothing_a_terminal_acts_on() -> None:
    document = json.dumps({"k\u202e": [HOSTILE, "東京"]}, indent=2, ensure_ascii=False)
    shown = json_text(document)
    assert ACTED_ON.search(shown) is None
    assert json.loads(shown) == json.loads(document)
    assert "東京" in shown  # readable non-ASCII stays readable


# --- every printer ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["call", "ping"],
        ["call", REFUSED_TOOL],
        ["tools"],
        ["tools", "--all"],
        ["log"],
        ["seed"],
        ["stats"],
        ["stats", "--contract"],
        ["export", "list"],
        ["policy", "list"],
        ["cancel", "conversation"],
        ["mcp", "list"],
        ["jobs", "list"],
        ["surface", "derive"],
        ["models"],
    ],
)
def test_server_text_in_human_output_is_shown_escaped(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, err = run(argv, capsys)
    assert "Traceback" not in err, err
    assert ACTED_ON.search(out + err) is None, (out + err)[:2000]
    assert "start\\x1b[31mred" in out + err  # the server's text is there, escaped


def test_a_tool_result_keeps_its_newlines_and_tabs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["call", "ping"], capsys)
    assert code == 0
    assert out == f"{HOSTILE_SHOWN}\nsecond\tline\n{HOSTILE_SHOWN}\n"  # result, then a warning


def test_an_rpc_error_is_one_escaped_line_and_its_field_violations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(["call", REFUSED_TOOL], capsys)
    assert code == 2 and out == ""
    assert err.splitlines() == [
        f"error: INVALID_ARGUMENT (HOSTILE_REASON): {HOSTILE_SHOWN}",
        f"  {HOSTILE_SHOWN}: {HOSTILE_SHOWN}",
    ]


def test_a_span_tree_shows_span_names_and_attributes_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "data"
    store.mkdir()
    span = {
        "trace_id": "ab" * 16,
        "span_id": "1" * 16,
        "parent_span_id": "",
        "name": f"execute_tool {HOSTILE}",
        "kind": "SERVER",
        "service_name": HOSTILE,
        "start_ns": 1,
        "end_ns": 2_000_001,
        "status_code": "ERROR",
        "status_message": HOSTILE,
        "attributes": {
            semconv.GEN_AI_OPERATION_NAME: semconv.OPERATION_EXECUTE_TOOL,
            semconv.TOOLMESH_TENANT_ID: HOSTILE,
        },
    }
    (store / "spans.jsonl").write_text(json.dumps(span) + "\n")
    code, out, err = run(["trace", "--last"], capsys)
    assert code == 0, err
    assert ACTED_ON.search(out) is None
    assert out.count(HOSTILE_SHOWN) >= 3, out


@pytest.mark.parametrize(
    "argv",
    [
        ["call", "ping", "--json"],
        ["tools", "--json"],  # json.dumps(ensure_ascii=False): C1 and bidi controls were raw
        ["tools", "--all", "--json"],
        ["log", "--json"],
        ["stats", "--json"],
        ["stats", "--contract", "--json"],
        ["export", "list", "--json"],  # ensure_ascii=False too
        ["policy", "list", "--json"],
        ["cancel", "conversation", "--json"],
        ["mcp", "list", "--json"],
        ["jobs", "list", "--json"],
    ],
)
def test_json_output_carries_the_server_text_as_json_escapes(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert ACTED_ON.search(out) is None, out[:2000]
    assert any(HOSTILE in s for s in strings(json.loads(out))), out[:2000]


def test_every_printer_of_the_cli_goes_through_render() -> None:
    """A builtin print() outside render.py would bypass the escaping."""
    package = Path(render.__file__).parent
    bare = [
        f"{path.name}:{node.lineno}"
        for path in sorted(package.glob("*.py"))
        if path.name != "render.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
    ]
    assert not bare, bare


LISTED = [
    {"name": "short", "description": "x" * 300},
    {"name": "wide_tool", "description": "表" * 200},
]


def test_a_piped_tool_listing_keeps_every_description_whole(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Output to a pipe or a file (grep, a saved listing) is never cut, whatever COLUMNS says."""
    monkeypatch.setenv("COLUMNS", "40")
    render.print_tools(LISTED, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("x" * 300) and lines[1].endswith("表" * 200)


def test_a_tool_listing_on_a_terminal_fits_its_width_counting_wide_characters_as_two(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(render.sys.stdout, "isatty", lambda: True)
    render.print_tools(LISTED, as_json=False)
    lines = capsys.readouterr().out.splitlines()[:2]
    for line in lines:
        assert display_width(line) <= 80 and line.endswith("…"), line
    assert display_width(lines[1]) >= 78  # filled, not cut at 80 characters of width 2
