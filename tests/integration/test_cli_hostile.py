"""The `toolmesh` console script against a real mesh, used roughly: Ctrl-C during a long call,
Ctrl-C while `toolmesh up` is still starting its services, and downloads to places that cannot
be written or whose names are not UTF-8."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import Mesh, free_ports
from tests.integration.test_cli import (
    TOOLMESH,
    clean_env,
    cmdline,
    descendants_of,
    on_sqlite_mesh,
    running,
    toolmesh,
)

pytestmark = pytest.mark.integration


@on_sqlite_mesh
def test_ctrl_c_during_a_call_cancels_it_without_a_traceback(mesh: Mesh) -> None:
    process = subprocess.Popen(
        [
            str(TOOLMESH),
            "call",
            "ping",
            "--input",
            '{"delay_ms": 30000}',
            "--conversation",
            "cli-ctrl-c",
            "--dispatcher",
            mesh.address("dispatcher"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        start_new_session=True,  # its own process group, as a shell job
    )
    time.sleep(3)  # imports (~0.5 s), then the call: the dispatcher holds it for 30 s
    assert process.poll() is None
    os.killpg(process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    out, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert err.strip() == "interrupted", err
    assert out == ""
    # The RPC went away with the process: the dispatcher logs the call as cancelled.
    deadline = time.monotonic() + 30
    while True:
        listed = toolmesh(
            "log",
            "--conversation",
            "cli-ctrl-c",
            "--json",
            "--dispatcher",
            mesh.address("dispatcher"),
        )
        rows = json.loads(listed.stdout) if listed.returncode == 0 else []
        if rows or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert rows and "cancelled" in rows[0].get("error", ""), rows


@on_sqlite_mesh
def test_export_get_into_a_directory_that_does_not_exist_is_one_error_line(
    mesh: Mesh, tmp_path: Path
) -> None:
    response = mesh.call("ping", '{"export_text": "hello"}', conversation="cli-export")
    file_id = response.result.exports[0].file_id
    target = tmp_path / "missing" / "out.txt"
    done = toolmesh(
        "export",
        "get",
        file_id,
        "--tenant",
        "tenant-a",
        "-o",
        str(target),
        "--dispatcher",
        mesh.address("dispatcher"),
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: cannot write {target}: No such file or directory"
    assert not list(tmp_path.iterdir())  # no temporary file left behind


@on_sqlite_mesh
def test_export_get_to_a_file_name_that_is_not_utf8(mesh: Mesh, tmp_path: Path) -> None:
    """Any bytes are a Linux file name: written, and its name printed back as those bytes."""
    response = mesh.call("ping", '{"export_text": "hello"}', conversation="cli-export-2")
    file_id = response.result.exports[0].file_id
    target = os.fsencode(tmp_path) + b"/\xffout.txt"
    done = subprocess.run(
        [
            os.fsencode(TOOLMESH),
            b"export",
            b"get",
            file_id.encode(),
            b"--tenant",
            b"tenant-a",
            b"-o",
            target,
            b"--dispatcher",
            mesh.address("dispatcher").encode(),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        # As in an en_US.UTF-8 locale (the C and C.UTF-8 ones escape such bytes by default).
        env=clean_env(PYTHONIOENCODING="utf-8:strict"),
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert Path(os.fsdecode(target)).read_bytes() == b"hello"
    assert done.stdout.startswith(target + b" (5 bytes")


def test_up_interrupted_while_starting_stops_cleanly(tmp_path: Path) -> None:
    """Ctrl-C reaches the whole process group, services still importing included: `up` lets
    them finish starting, stops them, and says so; no service dies of the signal mid-import."""
    ports = free_ports(5)
    env = clean_env(
        TOOLMESH_DATA_DIR=str(tmp_path / "toolmesh"),
        TOOLMESH_SHUTDOWN_GRACE_S="2",
        PYTHONUNBUFFERED="1",
        **{
            f"TOOLMESH_{name}_PORT": str(port)
            for name, port in zip(
                ("REGISTRY", "DISPATCHER", "SANDBOX", "MCP_BRIDGE", "SURFACE"), ports, strict=True
            )
        },
    )
    process = subprocess.Popen(
        [str(TOOLMESH), "up", "--collector-port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    everything: dict[int, str] = {}
    try:
        assert process.stdout is not None
        for line in process.stdout:  # the span store is up: the services are being spawned
            if "span store" in line:
                break
        deadline = time.monotonic() + 10
        while len(everything) < 5 and time.monotonic() < deadline:
            everything.update(descendants_of(process.pid))
            time.sleep(0.05)
        assert len(everything) >= 5, everything
        os.killpg(process.pid, signal.SIGINT)  # they are still importing
        output, _ = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        for pid, start in everything.items():
            if running(pid, start):
                os.kill(pid, signal.SIGKILL)
    assert process.returncode == 0, output
    assert "toolmesh stopped." in output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert "exited with" not in output, output
    left = [cmdline(pid) for pid, start in everything.items() if running(pid, start)]
    assert not left, f"processes left behind: {left}"
