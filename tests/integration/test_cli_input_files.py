"""`toolmesh call --input @PATH` and `--input -` against a real mesh: a tool input larger than
one command-line argument can hold (~128 KiB on Linux) reaches the tool whole, from a file or
a pipe, as it would from a program calling the dispatcher."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import Mesh
from tests.integration.test_cli import TOOLMESH, clean_env, on_sqlite_mesh, toolmesh

pytestmark = pytest.mark.integration

ARGV_LIMIT = 128 * 1024  # MAX_ARG_STRLEN: the most one Linux command-line argument holds


def big_input(tag: str) -> str:
    return json.dumps({"echo": {"tag": tag, "padding": "x" * (2 * ARGV_LIMIT)}})


def echoed(stdout: str) -> object:
    """What ping echoed back, from `call --json`'s response."""
    return json.loads(json.loads(stdout)["result"]["envelope"]["ok"]["dataJson"])["echo"]


@on_sqlite_mesh
def test_call_takes_an_input_over_the_argv_limit_from_a_file(mesh: Mesh, tmp_path: Path) -> None:
    path = tmp_path / "input.json"
    path.write_text(big_input("from-file"), encoding="utf-8")
    done = toolmesh(
        "call",
        "ping",
        "--input",
        f"@{path}",
        "--json",
        "--dispatcher",
        mesh.address("dispatcher"),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert echoed(done.stdout) == json.loads(path.read_text(encoding="utf-8"))["echo"]


@on_sqlite_mesh
def test_call_takes_an_input_over_the_argv_limit_from_standard_input(mesh: Mesh) -> None:
    text = big_input("from-stdin")
    done = subprocess.run(
        [
            str(TOOLMESH),
            "call",
            "ping",
            "--input",
            "-",
            "--json",
            "--dispatcher",
            mesh.address("dispatcher"),
        ],
        input=text,
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=clean_env(),
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert echoed(done.stdout) == json.loads(text)["echo"]
