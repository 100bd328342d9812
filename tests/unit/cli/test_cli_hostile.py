"""The `toolmesh` command line under hostile use, without a mesh: arguments that are not UTF-8,
numbers out of their field's range, an empty service address, an API key no header can carry,
flags given before a subcommand, a broken span store, a closed or full stdout, Ctrl-C and bugs.
Each answers one `error: ...` line (or argparse's usage) and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.cli import main as main_module
from tests.unit.cli.hostile_mesh import one_error_line, run

TOOLMESH = Path(sys.executable).parent / "toolmesh"
NOT_UTF8 = b"\xff".decode("utf-8", "surrogateescape")  # what Python makes of argv byte 0xff


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith(("TOOLMESH_", "OTEL_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("TOOLMESH_DATA_DIR", str(tmp_path / "data"))
    yield


@pytest.fixture
def dead_address() -> Iterator[str]:
    """A loopback address nobody listens on (the socket is bound, never listening)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


# --- arguments that are not UTF-8 -------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["call", "ping", "--input", '{"echo": "' + NOT_UTF8 + '"}'], "--input"),
        (["call", NOT_UTF8 + "ping"], "name"),
        (["call", "ping", "--conversation", NOT_UTF8], "--conversation"),
        (["call", "ping", "--capability", NOT_UTF8], "--capability"),
        (["log", "--tool", NOT_UTF8], "--tool"),
        (["tools", "--tenant", NOT_UTF8], "--tenant"),
        (["keys", "hash", NOT_UTF8], "key"),
        (["mcp", "connect", "x", "--command", NOT_UTF8], "--command"),
        (["mcp", "connect", "x", "--command", "true", "--arg", NOT_UTF8], "--arg"),
        (
            [
                "policy",
                "add",
                "--tenant",
                "t",
                "--name",
                NOT_UTF8,
                "--kind",
                "deny_tool",
                "--tool",
                "x",
            ],
            "--name",
        ),
        (["stats", "--tool", NOT_UTF8], "--tool"),
        (["cancel", NOT_UTF8], "conversation"),
        (["surface", "show", "--conversation", NOT_UTF8], "--conversation"),
    ],
)
def test_an_argument_that_is_not_utf8_is_named_and_exits_2(
    argv: list[str],
    named: str,
    dead_address: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for service in ("REGISTRY", "DISPATCHER", "SANDBOX", "MCP_BRIDGE", "SURFACE"):
        monkeypatch.setenv(f"TOOLMESH_{service}_ADDR", dead_address)  # never reached
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == ""
    assert one_error_line(err).startswith(f"error: argument {named}: not valid UTF-8"), err


# --- numbers out of range ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["log", "--limit", "0"], "--limit"),  # 0 is the server's default of 50, not zero rows
        (["log", "--limit", "-1"], "--limit"),
        (["log", "--limit", "99999999999"], "--limit"),  # over int32: protobuf raised
        (["export", "list", "--limit", "99999999999"], "--limit"),
        (["jobs", "list", "--limit", "-1"], "--limit"),  # listed nothing, exit 0
        (["jobs", "list", "--limit", "99999999999"], "--limit"),
        (["jobs", "build", "x", "--wait", "nan"], "--wait"),
        (["jobs", "build", "x", "--wait", "-5"], "--wait"),
        (["policy", "disable", str(2**70)], "id"),
        (
            ["models", "set", "m", "--provider", "anthropic", "--max-output-tokens", str(2**40)],
            "--max-output-tokens",
        ),
    ],
)
def test_a_number_out_of_range_is_a_usage_error(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert f"error: argument {option}: " in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("value", ["-1", "70000"])  # -1 bound port 65535
def test_up_refuses_a_collector_port_out_of_range(value: str, tmp_path: Path) -> None:
    # In a process of its own, with a data directory that cannot be made: never a mesh.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = _script(f'TOOLMESH_DATA_DIR={blocker} exec "$1" up --quiet --collector-port={value}')
    assert done.returncode == 2
    assert f"error: argument --collector-port: '{value}'" in done.stderr, done.stderr


def test_stats_since_further_back_than_datetime_goes_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(["stats", "--since", "99999999999d"], capsys)
    assert code == 2
    assert "before year 1" in one_error_line(err)


def test_stats_since_that_does_not_parse_exits_2_as_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(["stats", "--since", "yesterday"], capsys)
    assert code == 2
    assert "--since 'yesterday'" in one_error_line(err)


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "service", "flag"),
    [
        (["call", "ping"], "dispatcher", "--dispatcher"),
        (["log"], "dispatcher", "--dispatcher"),
        (["tools"], "registry", "--registry"),
        (["stats"], "registry", "--registry"),
        (["export", "list"], "dispatcher", "--dispatcher"),
        (["policy", "list"], "dispatcher", "--dispatcher"),
        (["mcp", "list"], "mcp_bridge", "--bridge"),
        (["jobs", "list"], "sandbox", "--sandbox"),
        (["tools", "approve", "x"], "sandbox", "--sandbox"),
        (["models"], "surface", "--surface"),
    ],
)
def test_an_empty_service_address_names_the_variable_and_the_flag(
    argv: list[str],
    service: str,
    flag: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(f"TOOLMESH_{service.upper()}_ADDR", "")  # the service configured away
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert f"TOOLMESH_{service.upper()}_ADDR is empty" in line and flag in line, line


@pytest.mark.parametrize("key", ["bad\nkey", "ключ", "k\x01", " padded "])
def test_an_api_key_no_header_can_carry_is_a_configuration_error(
    key: str,
    dead_address: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TOOLMESH_API_KEY", key)
    code, out, err = run(["call", "ping", "--dispatcher", dead_address], capsys)
    assert code == 2 and out == ""
    assert "TOOLMESH_API_KEY" in one_error_line(err)


def test_a_bad_collector_port_variable_concerns_only_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOOLMESH_COLLECTOR_PORT", "abc")
    blocker = tmp_path / "a-file"  # should `up` get further, it stops at the data directory
    blocker.write_text("")
    monkeypatch.setenv("TOOLMESH_DATA_DIR", str(blocker))
    code, out, _ = run(["keys", "hash", "k"], capsys)  # the parser of every command read it
    assert code == 0 and len(out.strip()) == 64
    code, _, err = run(["up"], capsys)
    assert code == 2
    assert "TOOLMESH_COLLECTOR_PORT 'abc'" in one_error_line(err)


# --- `tools` options before a subcommand --------------------------------------------------------


def test_tools_options_given_before_list_are_kept() -> None:
    parser = main_module.build_parser()
    args = parser.parse_args(["tools", "--all", "--json", "--tenant", "t", "list"])
    assert (args.all, args.json, args.tenant) == (True, True, "t")
    args = parser.parse_args(["tools", "list", "--all"])
    assert args.all is True
    args = parser.parse_args(["tools", "--tenant", "t", "approve", "x"])
    assert args.tenant == "t"


def test_tools_registry_given_before_list_is_the_one_asked(
    dead_address: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOOLMESH_REGISTRY_ADDR", "127.0.0.1:1")  # not the one asked for
    code, _, err = run(["tools", "--registry", dead_address, "list"], capsys)
    assert code == 2
    assert f"registry at {dead_address}" in err, err


def test_listing_flags_before_a_verb_they_do_not_apply_to_are_refused(
    dead_address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["tools", "--all", "approve", "x", "--sandbox", dead_address], capsys)
    assert code == 2
    assert "--all" in one_error_line(err)


# --- trace ------------------------------------------------------------------------------------


def test_trace_with_an_id_and_last_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["trace", "--last", "0" * 32], capsys)
    assert code == 2
    assert "not both" in one_error_line(err)


def test_trace_id_is_checked_and_case_folded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["trace", "zzz"], capsys)
    assert code == 2 and "not a trace id" in one_error_line(err)
    store = tmp_path / "data"
    store.mkdir()
    span = {
        "trace_id": "ab" * 16,
        "span_id": "1" * 16,
        "parent_span_id": "",
        "name": "execute_tool ping",
        "kind": "INTERNAL",
        "service_name": "toolmesh-registry",
        "start_ns": 1,
        "end_ns": 2_000_001,
        "status_code": "OK",
        "status_message": "",
        "attributes": {},
    }
    (store / "spans.jsonl").write_text(json.dumps(span) + "\n")
    code, out, err = run(["trace", "AB" * 16], capsys)
    assert code == 0, err
    assert "execute_tool ping" in out


@pytest.mark.parametrize(
    "content",
    [b'{"garbage": 1}\n{"garbage": 2}\n', b"[1]\n[2]\n", b"null\nnull\n", b"\xff\xfe\n{}\n", None],
)
def test_a_span_store_that_cannot_be_read_is_one_error_line(
    content: bytes | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "data" / "spans.jsonl"
    store.parent.mkdir()
    if content is None:
        store.mkdir()  # a directory where the file should be
    else:
        store.write_bytes(content)
    code, out, err = run(["trace", "--last"], capsys)
    assert code == 2 and out == ""
    assert "cannot read the span store" in one_error_line(err)


# --- tools add --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"input_schema": {"type": "object"}, "timeout_seconds": "abc"}, "timeout_seconds"),
        ({"input_schema": {"type": "object"}, "timeout_seconds": -1}, "timeout_seconds"),
        ({"input_schema": {"type": "object"}, "required_capabilities": 5}, "required_capabilities"),
        (
            {"input_schema": {"type": "object"}, "required_capabilities": [1]},
            "required_capabilities",
        ),
        ({"input_schema": {"type": "object"}, "name": ["x"]}, "name"),
    ],
)
def test_tools_add_names_a_tool_document_field_of_the_wrong_type(
    doc: dict[str, object],
    field: str,
    tmp_path: Path,
    dead_address: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code_file, schema_file = tmp_path / "t.py", tmp_path / "t.json"
    code_file.write_text("result = 1\n")
    schema_file.write_text(json.dumps(doc))
    argv = ["tools", "add", "--code", str(code_file), "--schema", str(schema_file)]
    code, _, err = run([*argv, "--sandbox", dead_address], capsys)
    assert code == 2
    assert f"{field} must be" in one_error_line(err)


# --- the process: stdout, Ctrl-C, bugs --------------------------------------------------------


def test_ctrl_c_is_one_line_and_the_sigint_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(args: argparse.Namespace, settings: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(main_module, "cmd_keys_hash", interrupted)
    code, _, err = run(["keys", "hash", "k"], capsys)
    assert code == 130
    assert err.strip() == "interrupted"


def test_an_unexpected_exception_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(args: argparse.Namespace, settings: object) -> int:
        raise RuntimeError("something broke")

    monkeypatch.setattr(main_module, "cmd_keys_hash", broken)
    code, _, err = run(["keys", "hash", "k"], capsys)
    assert code == 2
    assert "RuntimeError: something broke" in one_error_line(err)
    monkeypatch.setenv("TOOLMESH_LOG_LEVEL", "debug")  # asked for: the traceback too
    code, _, err = run(["keys", "hash", "k"], capsys)
    assert code == 2 and "Traceback" in err


def _script(shell: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLMESH_", "OTEL_"))}
    return subprocess.run(
        ["sh", "-c", shell, "sh", str(TOOLMESH)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_a_closed_stdout_is_refused_before_anything_runs() -> None:
    done = _script('exec "$1" keys hash k >&-')
    assert done.returncode == 2
    assert "standard output is closed" in one_error_line(done.stderr)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_output_that_cannot_be_written_is_one_error_line() -> None:
    done = _script('exec "$1" keys hash k > /dev/full')
    assert done.returncode == 2
    assert "cannot write the output: No space left on device" in one_error_line(done.stderr)


def test_up_with_a_data_directory_it_cannot_create_exits_2(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = _script(f'TOOLMESH_DATA_DIR={blocker} exec "$1" up --quiet --collector-port 0')
    assert done.returncode == 2
    assert f"cannot create the data directory {blocker}" in one_error_line(done.stderr)
