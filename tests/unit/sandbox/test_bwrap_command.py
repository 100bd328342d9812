"""The zygote's bubblewrap command line: a user namespace for an unprivileged service; for a
root service no user namespace (it would map the sandbox's uid to host root), nothing but the
capabilities the zygote needs to drop to its unprivileged uid, and every directory on the way to
a bind made traversable for that uid."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from services.sandbox.host import WorkerPool, bwrap_command, parse_bwrap_version, tmp_size_for
from shared.errors import FailedPrecondition

READ_PATHS = [
    "/usr",
    "/root/.pyenv/versions/3.11.7",
    "/root/.pyenv/versions/3.11.7/lib",
    "/tmp/ci/.venv/lib/python3.11/site-packages",
]


def command(run_as: list[int] | None) -> list[str]:
    return bwrap_command("bwrap", {"read_paths": READ_PATHS, "run_as": run_as})


def made_dirs(cmd: list[str]) -> list[str]:
    return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--dir"]


def test_an_unprivileged_service_keeps_the_user_namespace_and_adds_no_capability() -> None:
    cmd = command(None)
    assert cmd[1:7] == ["--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534"]
    assert "--cap-add" not in cmd and "--perms" not in cmd and not made_dirs(cmd)


def test_a_root_service_gets_no_user_namespace_and_only_the_capabilities_to_drop() -> None:
    cmd = command([65534, 65534])
    assert "--unshare-all" not in cmd and "--unshare-user" not in cmd and "--uid" not in cmd
    for ns in ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"):
        assert ns in cmd
    caps = [(cmd[i], cmd[i + 1]) for i, arg in enumerate(cmd) if arg in ("--cap-add", "--cap-drop")]
    # Dropped first: as root without a user namespace bwrap would otherwise keep them all.
    assert caps == [
        ("--cap-drop", "ALL"),
        ("--cap-add", "CAP_SETUID"),
        ("--cap-add", "CAP_SETGID"),
        ("--cap-add", "CAP_SETPCAP"),
    ]


def test_a_root_service_makes_every_parent_of_a_bind_traversable_before_binding() -> None:
    cmd = command([65534, 65534])
    etc = ["/etc"] if os.path.exists("/etc/ld.so.cache") else []
    assert made_dirs(cmd) == [
        *etc,
        "/root",
        "/root/.pyenv",
        "/root/.pyenv/versions",
        "/tmp/ci",
        "/tmp/ci/.venv",
        "/tmp/ci/.venv/lib",
        "/tmp/ci/.venv/lib/python3.11",
        "/sbx",
    ]
    for d in made_dirs(cmd):
        i = cmd.index(d)
        assert cmd[i - 3 : i] == ["--perms", "0755", "--dir"]
    assert cmd.index("/root/.pyenv/versions") < cmd.index("/root/.pyenv/versions/3.11.7")
    tmpfs = cmd.index("--tmpfs")
    assert cmd[tmpfs - 2 : tmpfs + 2] == ["--perms", "1777", "--tmpfs", "/tmp"]
    assert tmpfs < cmd.index("/tmp/ci")  # made inside the private /tmp, not hidden by it


async def test_a_pool_refuses_to_drop_to_root() -> None:
    pool = WorkerPool(uid=0, bwrap="/usr/bin/bwrap")
    with pytest.raises(FailedPrecondition) as info:
        await pool.start()
    assert info.value.reason == "SANDBOX_UNAVAILABLE"


def test_the_private_tmp_gets_its_size_cap_just_before_its_tmpfs() -> None:
    for run_as in (None, [65534, 65534]):
        capped = bwrap_command(
            "bwrap", {"read_paths": READ_PATHS, "run_as": run_as, "tmp_bytes": 8 << 20}
        )
        at = capped.index("/tmp", capped.index("--tmpfs"))
        assert capped[at - 1] == "--tmpfs"
        assert capped[at - 3 : at - 1] == ["--size", str(8 << 20)]
        assert capped.count("--size") == 1
    assert "--size" not in command(None)  # no cap asked (or bwrap too old): none given


def _fake_bwrap(tmp_path: Path, output: str) -> str:
    script = tmp_path / "bwrap"
    script.write_text(f"#!/bin/sh\necho '{output}'\n")
    script.chmod(0o755)
    return str(script)


def test_the_tmp_cap_is_applied_only_by_a_bwrap_that_supports_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert parse_bwrap_version("bubblewrap 0.8.0") == (0, 8, 0)
    assert parse_bwrap_version("bubblewrap 0.11.1\n") == (0, 11, 1)
    assert parse_bwrap_version("no version here") is None
    assert tmp_size_for(_fake_bwrap(tmp_path, "bubblewrap 0.8.0"), 8 << 20) == 8 << 20
    assert tmp_size_for(_fake_bwrap(tmp_path, "bubblewrap 0.10.0"), 8 << 20) == 8 << 20
    assert tmp_size_for(_fake_bwrap(tmp_path, "bubblewrap 0.8.0"), 0) is None  # no cap asked
    with caplog.at_level(logging.WARNING, logger="services.sandbox.host"):
        assert tmp_size_for(_fake_bwrap(tmp_path, "bubblewrap 0.6.1"), 8 << 20) is None
        assert tmp_size_for(str(tmp_path / "missing"), 8 << 20) is None
    assert "0.6.1 cannot cap a tmpfs" in caplog.text
    assert "(version unknown) cannot cap a tmpfs" in caplog.text
