"""A dispatcher started before anything migrated its database waits for the schema, saying so,
instead of serving errors: it serves once the registry (or `toolmesh db upgrade`) migrated it."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from services.dispatcher import __main__ as dispatcher_main
from shared.db.engine import make_engine, upgrade

REPO = Path(__file__).resolve().parents[3]


async def test_waits_on_a_fresh_database_until_it_is_migrated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    engine = make_engine(url)
    try:
        assert "fresh database" in (dispatcher_main.schema_problem(engine) or "")
        caplog.set_level(logging.INFO, logger=dispatcher_main.__name__)
        stop = asyncio.Event()
        waiting = asyncio.ensure_future(dispatcher_main.wait_for_schema(engine, stop, poll_s=0.05))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        assert "waiting for the database schema" in caplog.text
        await asyncio.to_thread(upgrade, url)  # what the registry does on start
        assert await asyncio.wait_for(waiting, timeout=10) is True
        assert "database schema ready" in caplog.text
        assert dispatcher_main.schema_problem(engine) is None
    finally:
        engine.dispose()


async def test_a_stop_signal_ends_the_wait(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
    try:
        stop = asyncio.Event()
        waiting = asyncio.ensure_future(dispatcher_main.wait_for_schema(engine, stop, poll_s=0.05))
        await asyncio.sleep(0.1)
        stop.set()
        assert await asyncio.wait_for(waiting, timeout=5) is False
    finally:
        engine.dispose()


async def test_a_migrated_or_newer_schema_does_not_wait(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        assert await dispatcher_main.wait_for_schema(engine, asyncio.Event()) is True
        with engine.begin() as connection:  # a revision of a later release
            connection.execute(text("UPDATE alembic_version SET version_num = 'from_the_future'"))
        assert dispatcher_main.schema_problem(engine) is None
    finally:
        engine.dispose()


def test_the_dispatcher_process_serves_only_after_the_migration(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'mesh.db'}"
    env = {
        **os.environ,
        "TOOLMESH_DATA_DIR": str(tmp_path),
        "TOOLMESH_DATABASE_URL": url,
        "TOOLMESH_DISPATCHER_PORT": "0",
        "TOOLMESH_TRACING": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.dispatcher"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout: list[str] = []
    stderr: list[str] = []
    readers = [
        threading.Thread(target=lambda: stdout.extend(proc.stdout or ()), daemon=True),
        threading.Thread(target=lambda: stderr.extend(proc.stderr or ()), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + 30
        while not any("waiting for the database schema" in line for line in stderr):
            assert proc.poll() is None, "".join(stderr)
            assert time.monotonic() < deadline, "".join(stderr)
            time.sleep(0.05)
        assert not any('"ready"' in line for line in stdout)
        upgrade(url)
        while not any('"ready"' in line for line in stdout):
            assert proc.poll() is None, "".join(stderr)
            assert time.monotonic() < deadline, "".join(stderr)
            time.sleep(0.05)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for reader in readers:
            reader.join(5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert proc.returncode == 0, "".join(stderr)
