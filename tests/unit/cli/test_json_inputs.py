"""`--input` (and `policy add --params`) take the JSON from the command line, from a file
(`@PATH`) or from standard input (`-`, `@-`), so an input may be as large as the dispatcher
accepts (TOOLMESH_MAX_INPUT_BYTES) instead of the ~128 KiB one argument holds. A file or a
stream that cannot be used is one `error: ...` line and exit 2, and nothing is called."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shared.cli import UsageError, json_argument
from shared.config import Settings
from tests.unit.cli.hostile_mesh import HostileMesh, hostile_mesh, one_error_line, point_cli_at, run

ARGV_LIMIT = 128 * 1024  # MAX_ARG_STRLEN: the most one Linux command-line argument holds


@pytest.fixture(scope="module")
def module_mesh() -> Iterator[HostileMesh]:
    with hostile_mesh() as running:
        yield running


@pytest.fixture
def mesh(module_mesh: HostileMesh) -> HostileMesh:
    module_mesh.calls.clear()
    module_mesh.rules.clear()
    return module_mesh


@pytest.fixture(autouse=True)
def env(module_mesh: HostileMesh, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    point_cli_at(module_mesh.address, monkeypatch, tmp_path)


def stdin_of(data: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def big_input() -> str:
    """A tool input no command-line argument could carry."""
    return json.dumps({"echo": "é" * ARGV_LIMIT, "tag": "big"})


# --- where the JSON comes from ----------------------------------------------------------------


def test_call_sends_the_json_of_a_file_given_as_at_path(
    mesh: HostileMesh, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = big_input()
    path = tmp_path / "input.json"
    path.write_text(text, encoding="utf-8")
    code, _, err = run(["call", "ping", "--input", f"@{path}"], capsys)
    assert code == 0, err
    assert [c.tool_use.input_json for c in mesh.calls] == [text]


@pytest.mark.parametrize("dash", ["-", "@-"])
def test_call_sends_the_json_of_standard_input_given_as_a_dash(
    dash: str,
    mesh: HostileMesh,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = big_input()
    stdin_of(text.encode("utf-8"), monkeypatch)
    code, _, err = run(["call", "ping", "--input", dash], capsys)
    assert code == 0, err
    assert [c.tool_use.input_json for c in mesh.calls] == [text]


def test_call_sends_literal_json_as_given(
    mesh: HostileMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["call", "ping", "--input", ' {"at": "@x"}'], capsys)
    assert code == 0, err
    assert [c.tool_use.input_json for c in mesh.calls] == [' {"at": "@x"}']


def test_a_file_whose_name_is_not_utf8_is_read(
    mesh: HostileMesh, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any bytes are a Linux file name; Python hands byte 0xff over as a lone surrogate."""
    name = os.fsdecode(os.fsencode(tmp_path) + b"/\xffinput.json")
    Path(name).write_text('{"echo": 1}', encoding="utf-8")
    code, _, err = run(["call", "ping", "--input", f"@{name}"], capsys)
    assert code == 0, err
    assert [c.tool_use.input_json for c in mesh.calls] == ['{"echo": 1}']


def test_policy_add_reads_its_params_from_a_file_too(
    mesh: HostileMesh, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "params.json"
    path.write_text('{"max_calls": 10, "window_seconds": 60}', encoding="utf-8")
    argv = ["policy", "add", "--tenant", "t", "--name", "n", "--kind", "rate_limit"]
    code, _, err = run([*argv, "--tool", "ping", "--params", f"@{path}"], capsys)
    assert code == 0, err
    assert [r.params_json for r in mesh.rules] == ['{"max_calls": 10, "window_seconds": 60}']


# --- the dispatcher's input limit -------------------------------------------------------------


def test_an_input_of_the_limit_is_sent_and_one_byte_more_is_refused(
    mesh: HostileMesh,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TOOLMESH_MAX_INPUT_BYTES", "64")
    path = tmp_path / "input.json"
    at_limit = json.dumps({"echo": "x" * 50}).ljust(64)
    path.write_text(at_limit, encoding="utf-8")
    code, _, err = run(["call", "ping", "--input", f"@{path}"], capsys)
    assert code == 0, err
    path.write_text(at_limit + " ", encoding="utf-8")
    code, out, err = run(["call", "ping", "--input", f"@{path}"], capsys)
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert "--input" in line and "TOOLMESH_MAX_INPUT_BYTES" in line, line
    stdin_of((at_limit + " ").encode("utf-8"), monkeypatch)
    code, _, err = run(["call", "ping", "--input", "-"], capsys)
    assert code == 2
    assert "TOOLMESH_MAX_INPUT_BYTES" in one_error_line(err)
    assert [c.tool_use.input_json for c in mesh.calls] == [at_limit]


def test_the_cli_takes_the_dispatchers_default_limit() -> None:
    assert Settings.from_env({}).max_input_bytes == 4 * 1024 * 1024


def test_an_endless_stream_is_refused_after_reading_one_byte_over_the_limit() -> None:
    with open("/dev/zero", "rb") as endless, pytest.raises(UsageError):
        json_argument("-", "--input", max_bytes=1024, stdin=endless)
    stream = io.BytesIO(b"x" * 5000)
    with pytest.raises(UsageError):
        json_argument("@-", "--input", max_bytes=1024, stdin=stream)
    assert stream.tell() == 1025


# --- sources that cannot be used --------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda d: d / "missing.json", "No such file"),
        (lambda d: d, "Is a directory"),
        (lambda d: _file(d / "latin1.json", b'{"echo": "caf\xe9"}'), "not UTF-8"),
        (lambda d: _file(d / "utf16.json", '{"a": 1}'.encode("utf-16")), "not UTF-8"),
    ],
    ids=["missing", "directory", "latin-1", "utf-16"],
)
def test_a_file_that_cannot_be_used_is_one_usage_error_and_nothing_is_called(
    make: Callable[[Path], Path],
    named: str,
    mesh: HostileMesh,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = make(tmp_path)
    code, out, err = run(["call", "ping", "--input", f"@{path}"], capsys)
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert line.startswith("error: --input: ") and str(path) in line and named in line, line
    assert mesh.calls == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_one_usage_error(
    mesh: HostileMesh, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _file(tmp_path / "secret.json", b"{}")
    path.chmod(0)
    code, _, err = run(["call", "ping", "--input", f"@{path}"], capsys)
    assert code == 2
    assert "Permission denied" in one_error_line(err)
    assert mesh.calls == []


def test_an_at_sign_alone_asks_for_a_file_name(
    mesh: HostileMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["call", "ping", "--input", "@"], capsys)
    assert code == 2
    assert "file name" in one_error_line(err)
    assert mesh.calls == []


def test_standard_input_that_is_not_utf8_or_closed_is_one_usage_error(
    mesh: HostileMesh, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin_of(b'{"echo": "\xff"}', monkeypatch)
    code, _, err = run(["call", "ping", "--input", "-"], capsys)
    assert code == 2
    assert "standard input is not UTF-8" in one_error_line(err)
    monkeypatch.setattr("sys.stdin", None)  # started with `<&-`
    code, _, err = run(["call", "ping", "--input", "-"], capsys)
    assert code == 2
    assert "standard input is closed" in one_error_line(err)
    assert mesh.calls == []


def test_policy_params_from_a_missing_file_is_one_usage_error(
    mesh: HostileMesh, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["policy", "add", "--tenant", "t", "--name", "n", "--kind", "deny_tool"]
    code, _, err = run([*argv, "--tool", "ping", "--params", f"@{tmp_path}/nope.json"], capsys)
    assert code == 2
    assert one_error_line(err).startswith("error: --params: ")
    assert mesh.rules == []


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
