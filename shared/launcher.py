"""Starting service processes: used by `toolmesh up` and by the integration tests, so both run
the mesh the same way. Each service announces readiness with one JSON line on stdout."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

from shared.service_main import EXIT_WITH_PARENT_ENV, READY_EVENT


class LaunchError(RuntimeError):
    """A service process exited or never announced readiness."""


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen[str]
    address: str
    output: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait for a graceful exit, SIGKILL after `timeout`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.pump is not None:
            self.pump.join(timeout=5)
        # Closing the pipe while the pump still reads it would block until the read returns,
        # which is never if a leaked grandchild holds the write end: the pump is a daemon
        # thread, and the pipe closes when nothing holds it.
        if self.process.stdout is not None and not (self.pump and self.pump.is_alive()):
            self.process.stdout.close()
        return self.process.returncode


def _pump(stream: IO[str], lines: queue.Queue[str | None], sink: list[str], echo: bool) -> None:
    for line in stream:
        sink.append(line)
        lines.put(line)
        if echo:
            sys.stderr.write(line)
    lines.put(None)


def start_service(
    name: str,
    *,
    env: Mapping[str, str],
    port: int,
    timeout: float = 60.0,
    echo_output: bool = False,
) -> ServiceProcess:
    """Start `python -m services.<name> --port N` and wait until it says it is ready."""
    return start_services([(name, port)], env=env, timeout=timeout, echo_output=echo_output)[0]


def start_services(
    services: Sequence[tuple[str, int]],
    *,
    env: Mapping[str, str],
    timeout: float = 60.0,
    echo_output: bool = False,
    own_process_group: bool = False,
) -> list[ServiceProcess]:
    """Start several services at once, then wait until every one is ready: their start-ups
    (seconds of imports each) overlap. No service needs another to be up to start (clients
    connect lazily and background work retries), so only their addresses must be known in
    advance. If one fails, every one started is stopped and the error names it. With
    `own_process_group`, the services run in a process group of their own: a Ctrl-C in the
    terminal (sent to the foreground group) reaches only the caller, which stops them."""
    return _start_all(
        [(name, ["-m", f"services.{name}", "--port", str(port)]) for name, port in services],
        env=env,
        timeout=timeout,
        echo_output=echo_output,
        own_process_group=own_process_group,
    )


def start_process(
    name: str,
    python_args: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float = 60.0,
    echo_output: bool = False,
) -> ServiceProcess:
    """Start `python <python_args>` and wait for its ready line naming `name`."""
    return _start_all([(name, python_args)], env=env, timeout=timeout, echo_output=echo_output)[0]


def _start_all(
    commands: Sequence[tuple[str, Sequence[str]]],
    *,
    env: Mapping[str, str],
    timeout: float,
    echo_output: bool,
    own_process_group: bool = False,
) -> list[ServiceProcess]:
    """Spawn every (name, python args), then wait for each one's ready line within one
    deadline; on any failure stop all of them."""
    pending = [_spawn(name, args, env, echo_output, own_process_group) for name, args in commands]
    deadline = time.monotonic() + timeout
    try:
        return [_await_ready(p, deadline, timeout) for p in pending]
    except BaseException:
        for p in pending:
            p.stop(timeout=1)
        raise


@dataclass
class _Pending(ServiceProcess):
    """A started process whose ready line has not been read yet."""

    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)


def _spawn(
    name: str,
    python_args: Sequence[str],
    env: Mapping[str, str],
    echo_output: bool,
    own_process_group: bool = False,
) -> _Pending:
    process = subprocess.Popen(
        [sys.executable, *python_args],
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        process_group=0 if own_process_group else None,
    )
    assert process.stdout is not None
    pending = _Pending(name, process, "")
    pending.pump = threading.Thread(
        target=_pump,
        args=(process.stdout, pending.lines, pending.output, echo_output),
        daemon=True,
    )
    pending.pump.start()
    return pending


def _await_ready(pending: _Pending, deadline: float, timeout: float) -> ServiceProcess:
    name, output = pending.name, pending.output
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LaunchError(f"{name} not ready after {timeout:.0f}s:\n{''.join(output[-40:])}")
        try:
            line = pending.lines.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                pending.process.wait(5)
            raise LaunchError(
                f"{name} exited with {pending.process.returncode} before it was ready:\n"
                + "".join(output[-40:])
            )
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == READY_EVENT and event.get("service") == name:
                return ServiceProcess(
                    name, pending.process, str(event["address"]), output, pending.pump
                )


def service_env(base: Mapping[str, str] | None = None, **overrides: str) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(overrides)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # A launched service stops by itself when its launcher dies (see shared.server).
    env.setdefault(EXIT_WITH_PARENT_ENV, "1")
    return env
