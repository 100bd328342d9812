"""`toolmesh up`: migrate the database, start a local span store unless an OTLP endpoint is
configured, start every implemented service, and stop them all cleanly on Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import FrameType

from shared.cli.render import echo
from shared.config import IMPLEMENTED_SERVICES, Settings
from shared.db.engine import upgrade
from shared.errors import ToolmeshError
from shared.launcher import LaunchError, ServiceProcess, service_env, start_services


def run_up(args: argparse.Namespace, settings: Settings) -> int:
    from shared.telemetry.collector import CollectorThread, JsonlSpanSink

    # A plain flag, not a threading.Event: the handler runs in the main thread between two
    # bytecodes, possibly while that thread is inside Event.wait holding the Event's lock, and
    # Event.set would then wait for that lock for ever (a second signal made it likely).
    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    # From the start: a Ctrl-C during the migration lets it finish instead of breaking it off.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        for root in settings.data_roots:
            root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        echo(
            f"error: cannot create the data directory {exc.filename}: {exc.strerror} "
            "(set TOOLMESH_DATA_DIR / TOOLMESH_DATA_ROOTS)",
            file=sys.stderr,
        )
        return 2
    try:
        upgrade(settings.database_url)
    except ToolmeshError as exc:
        echo(f"error: {exc.message}", file=sys.stderr)
        return 2
    if stopping:
        echo("toolmesh stopped.", flush=True)
        return 0
    env = service_env()
    env.setdefault("OTEL_BSP_SCHEDULE_DELAY", "1000")  # `toolmesh trace --last` right after a call
    collector: CollectorThread | None = None
    if settings.tracing and not settings.otlp_endpoint:
        spans_path = settings.data_dir / "spans.jsonl"
        collector = CollectorThread(JsonlSpanSink(spans_path), port=args.collector_port)
        try:
            port = collector.start()
        except OSError as exc:
            echo(
                f"error: cannot start the span store on 127.0.0.1:{args.collector_port} ({exc}); "
                "pass --collector-port or set OTEL_EXPORTER_OTLP_ENDPOINT",
                file=sys.stderr,
            )
            return 2
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"127.0.0.1:{port}"
        echo(f"span store      listening on 127.0.0.1:{port} -> {spans_path}", flush=True)

    started: list[ServiceProcess] = []
    code = 0
    try:
        # In a process group of their own: a Ctrl-C in the terminal (sent to the foreground
        # group) reaches only `toolmesh up`, which stops them with SIGTERM, instead of killing
        # each service mid-import with a KeyboardInterrupt traceback during start-up.
        started = start_services(
            [(name, settings.ports[name]) for name in IMPLEMENTED_SERVICES],
            env=env,
            echo_output=not args.quiet,
            own_process_group=True,
        )
        if stopping:  # stopped while starting: not an error
            return code
        for proc in started:
            echo(f"{proc.name:<15} listening on {proc.address}", flush=True)
        echo(f"database        {settings.database_url}", flush=True)
        echo(f"data roots      {os.pathsep.join(map(str, settings.data_roots))}", flush=True)
        echo("toolmesh is up; Ctrl-C stops it.", flush=True)
        while not stopping:
            time.sleep(0.2)  # a signal's handler runs as soon as the sleep is interrupted
            if stopping:
                break  # services stopping on the same Ctrl-C are not a crash
            dead = [p for p in started if p.process.poll() is not None]
            if dead:
                for p in dead:
                    echo(f"{p.name} exited with {p.process.returncode}", file=sys.stderr)
                code = 1
                break
    except LaunchError as exc:
        echo(f"error: {exc}", file=sys.stderr)
        code = 2
    finally:
        for proc in reversed(started):
            proc.stop(timeout=settings.grace_s + 5)
        if collector is not None:
            collector.stop()
        echo("toolmesh stopped.", flush=True)
    return code
