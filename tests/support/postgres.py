"""A throw-away PostgreSQL server for tests: Debian's `postgresql` binaries, a temp directory, a
free loopback port, trust authentication, durability off. Installs the package when it is
missing and we are root; runs the server as the `postgres` user when we are root (PostgreSQL
refuses to run as root)."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import make_url

logger = logging.getLogger(__name__)

SUPERUSER = "toolmesh"
DEFAULT_DBNAME = "toolmesh"
_RUN_AS = "postgres"
_PG_ROOT = "/usr/lib/postgresql"
_START_TIMEOUT_S = 60.0
_START_ATTEMPTS = 3  # a free port can be taken between probing it and the server binding it
_DBNAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class PostgresSetupError(RuntimeError):
    """The test PostgreSQL server could not be installed, initialised or started."""


@dataclass(frozen=True)
class _Binaries:
    initdb: Path
    pg_ctl: Path


def _find_binaries() -> _Binaries | None:
    """initdb/pg_ctl of the highest installed major version (never whatever is on PATH)."""
    candidates: list[tuple[tuple[int, ...], Path]] = []
    for initdb in glob.glob(f"{_PG_ROOT}/*/bin/initdb"):
        bindir = Path(initdb).parent
        version = bindir.parent.name
        if not (bindir / "pg_ctl").exists():
            continue
        try:
            key = tuple(int(part) for part in version.split("."))
        except ValueError:
            continue
        candidates.append((key, bindir))
    if not candidates:
        return None
    _, bindir = max(candidates)
    return _Binaries(initdb=bindir / "initdb", pg_ctl=bindir / "pg_ctl")


def _is_root() -> bool:
    return os.geteuid() == 0


def _install_postgresql() -> None:
    logger.info("installing the postgresql package with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", "postgresql"],
    ):
        proc = subprocess.run(
            cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise PostgresSetupError(
                f"{' '.join(cmd)} failed with exit code {proc.returncode}:\n{proc.stderr[-4000:]}"
            )


def ensure_binaries() -> _Binaries:
    """Find the PostgreSQL server binaries, installing Debian's package if we are root."""
    found = _find_binaries()
    if found is not None:
        return found
    if not _is_root():
        raise PostgresSetupError(
            f"PostgreSQL server binaries not found under {_PG_ROOT}/<version>/bin and not "
            "running as root, so they cannot be installed: run "
            "'sudo apt-get install -y postgresql' or deselect these tests with -m 'not postgres'"
        )
    if shutil.which("apt-get") is None:
        raise PostgresSetupError(
            f"PostgreSQL server binaries not found under {_PG_ROOT} and apt-get is not available"
        )
    _install_postgresql()
    found = _find_binaries()
    if found is None:
        raise PostgresSetupError(
            f"apt-get installed postgresql but no {_PG_ROOT}/*/bin/initdb + pg_ctl were found"
        )
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Runner:
    """Runs the server binaries as ourselves, or as `postgres` via runuser when we are root."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.prefix: list[str] = []
        if _is_root():
            try:
                pw = pwd.getpwnam(_RUN_AS)
            except KeyError as exc:
                raise PostgresSetupError(
                    f"running as root but there is no {_RUN_AS!r} system user to run "
                    "PostgreSQL as (the Debian postgresql package creates it)"
                ) from exc
            runuser = shutil.which("runuser")
            if runuser is not None:
                self.prefix = [runuser, "-u", _RUN_AS, "--"]
            else:
                setpriv = shutil.which("setpriv")
                if setpriv is None:
                    raise PostgresSetupError(
                        "running as root but neither runuser nor setpriv exist"
                    )
                self.prefix = [
                    setpriv,
                    f"--reuid={pw.pw_uid}",
                    f"--regid={pw.pw_gid}",
                    "--init-groups",
                    "--",
                ]
            self._chown_tree(workdir, pw.pw_uid, pw.pw_gid)

    @staticmethod
    def _chown_tree(root: Path, uid: int, gid: int) -> None:
        os.chown(root, uid, gid)
        for dirpath, dirnames, filenames in os.walk(root):
            for name in (*dirnames, *filenames):
                os.chown(os.path.join(dirpath, name), uid, gid)

    def run(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("PG") and not key.startswith("LC_") and key != "LANG"
        }
        env["LC_ALL"] = "C"
        return subprocess.run(
            [*self.prefix, *argv],
            cwd=self.workdir,  # the postgres user may not be able to read our cwd
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _conninfo(port: int, dbname: str) -> str:
    return make_conninfo(host="127.0.0.1", port=port, user=SUPERUSER, dbname=dbname)


def _url(port: int, dbname: str) -> str:
    return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{port}/{dbname}"


def _wait_accepting(port: int, deadline: float, log_file: Path) -> None:
    last_error = ""
    while True:
        try:
            with psycopg.connect(_conninfo(port, "postgres"), connect_timeout=2) as conn:
                conn.execute("select 1")
            return
        except psycopg.OperationalError as exc:
            last_error = str(exc).strip()
        if time.monotonic() >= deadline:
            raise PostgresSetupError(
                f"PostgreSQL on 127.0.0.1:{port} did not accept connections in time "
                f"({last_error}); server log:\n{_tail(log_file)}"
            )
        time.sleep(0.05)


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no server log)"


def _check_dbname(name: str) -> None:
    if not _DBNAME_RE.match(name):
        raise ValueError(f"database name {name!r} must match {_DBNAME_RE.pattern}")


def _create(conninfo: str, name: str, template: str | None = None) -> None:
    _check_dbname(name)
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        _check_dbname(template)
        statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
        conn.execute(statement)


def create_database(admin_url: str, name: str, *, template: str | None = None) -> str:
    """Create a fresh database `name` on the server of `admin_url` (a copy of `template` when
    given, which must have no open connections); return its SQLAlchemy URL."""
    url = make_url(admin_url)
    conninfo = make_conninfo(
        host=url.host or "127.0.0.1",
        port=url.port or 5432,
        user=url.username or SUPERUSER,
        password=url.password or None,
        dbname="postgres",
    )
    _create(conninfo, name, template)
    return url.set(database=name).render_as_string(hide_password=False)


def _kill_postmaster(data_dir: Path) -> None:
    """Last resort when pg_ctl stop fails: SIGKILL the pid in postmaster.pid."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _pg_ctl_start(
    runner: _Runner,
    pg: _Binaries,
    data_dir: Path,
    sock_dir: Path,
    log_file: Path,
    port: int,
    settings: Mapping[str, str],
) -> subprocess.CompletedProcess[str]:
    options = (
        f"-c listen_addresses=127.0.0.1 -p {port} -k {shlex.quote(str(sock_dir))} "
        "-c fsync=off -c full_page_writes=off -c synchronous_commit=off"
    )
    for name, value in settings.items():
        options += f" -c {shlex.quote(f'{name}={value}')}"
    argv = [str(pg.pg_ctl), "-D", str(data_dir), "-l", str(log_file), "-o", options]
    argv += ["-w", "-t", str(int(_START_TIMEOUT_S)), "start"]
    return runner.run(argv, timeout=_START_TIMEOUT_S + 10)


def _start(
    runner: _Runner,
    pg: _Binaries,
    data_dir: Path,
    sock_dir: Path,
    log_file: Path,
    settings: Mapping[str, str] | None = None,
) -> int:
    """Start the server on a free port (retrying if the port is taken); return the port."""
    for attempt in range(1, _START_ATTEMPTS + 1):
        port = _free_port()
        proc = _pg_ctl_start(runner, pg, data_dir, sock_dir, log_file, port, settings or {})
        if proc.returncode == 0:
            return port
        log = _tail(log_file)
        if "could not bind" in log or "Address already in use" in log:
            logger.warning("port %d taken (attempt %d), retrying on another", port, attempt)
            continue
        raise PostgresSetupError(
            f"pg_ctl start failed (exit {proc.returncode}): {proc.stdout}{proc.stderr}\n"
            f"server log:\n{log}"
        )
    raise PostgresSetupError(f"no free port after {_START_ATTEMPTS} attempts")


def _postmaster_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not: a killed postmaster is re-parented to
    init, which may take its time to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _server_pids(data_dir: Path) -> list[int]:
    """Every live process of the server of `data_dir`: its postmaster and the backends and
    helpers it started, orphans of a killed postmaster included (found by their working
    directory, which every server process sets to the data directory)."""
    found = []
    target = str(data_dir.resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "cwd") != target:
                continue
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith("postgres"):
            found.append(int(entry.name))
    return found


class PostgresServer:
    """A running throw-away server (see postgres_instance): its URLs, and the faults tests
    inflict on it — a stop (fast, smart or immediate), a SIGKILL of the postmaster, the
    termination of other clients' connections — and a start again on the same port."""

    def __init__(
        self,
        runner: _Runner,
        pg: _Binaries,
        workdir: Path,
        settings: Mapping[str, str],
    ) -> None:
        self._runner = runner
        self._pg = pg
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.sock_dir = workdir / "sock"
        self.log_file = workdir / "postgres.log"
        self.settings = dict(settings)
        self.port = 0

    def url(self, dbname: str = DEFAULT_DBNAME) -> str:
        """The SQLAlchemy URL of database `dbname` on this server."""
        return _url(self.port, dbname)

    def conninfo(self, dbname: str = DEFAULT_DBNAME) -> str:
        """The libpq connection string of `dbname` as the superuser."""
        return _conninfo(self.port, dbname)

    @property
    def running(self) -> bool:
        pid = _postmaster_pid(self.data_dir)
        return pid is not None and _alive(pid)

    def log_tail(self, limit: int = 4000) -> str:
        return _tail(self.log_file, limit)

    def _first_start(self) -> None:
        self.port = _start(
            self._runner, self._pg, self.data_dir, self.sock_dir, self.log_file, self.settings
        )
        _wait_accepting(self.port, time.monotonic() + _START_TIMEOUT_S, self.log_file)

    def start(self, timeout: float = _START_TIMEOUT_S) -> None:
        """Start the server again on its port, once whatever is left of its last run is gone
        (after a SIGKILL of the postmaster, its backends exit on their own, and a new
        postmaster refuses to start while they still hold the shared memory); returns once
        it accepts connections (after crash recovery, when it was killed)."""
        deadline = time.monotonic() + timeout
        while _server_pids(self.data_dir):
            if time.monotonic() > deadline:
                raise PostgresSetupError(
                    f"processes of the last server still run: {_server_pids(self.data_dir)}"
                )
            time.sleep(0.05)
        # A killed postmaster's lock files (its pid file and its socket's) are stale, but while
        # init has not reaped the zombie a new postmaster takes that pid for a running server
        # and refuses to start; nothing of the old server runs any more (above), so they go.
        pid = _postmaster_pid(self.data_dir)
        if pid is not None and not _alive(pid):
            socket_file = self.sock_dir / f".s.PGSQL.{self.port}"
            for stale in (self.data_dir / "postmaster.pid", Path(f"{socket_file}.lock")):
                stale.unlink(missing_ok=True)
        proc = _pg_ctl_start(
            self._runner,
            self._pg,
            self.data_dir,
            self.sock_dir,
            self.log_file,
            self.port,
            self.settings,
        )
        if proc.returncode != 0:
            raise PostgresSetupError(
                f"pg_ctl start on port {self.port} failed (exit {proc.returncode}): "
                f"{proc.stdout}{proc.stderr}\nserver log:\n{self.log_tail()}"
            )
        _wait_accepting(self.port, deadline, self.log_file)

    def stop(self, mode: str = "fast", timeout: float = 60) -> None:
        """pg_ctl stop: `fast` disconnects every client and shuts down cleanly, `smart` waits
        for clients to leave, `immediate` exits without a shutdown checkpoint (recovery on
        the next start). Returns once the server is gone."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"unknown shutdown mode {mode!r}")
        stop = self._runner.run(
            [str(self._pg.pg_ctl), "-D", str(self.data_dir), "-m", mode, "-w", "stop"],
            timeout=timeout,
        )
        if stop.returncode != 0 and self.running:
            raise PostgresSetupError(f"pg_ctl stop -m {mode} failed: {stop.stdout}{stop.stderr}")

    def kill(self, timeout: float = 30) -> None:
        """SIGKILL the postmaster (a crash: no shutdown, no message to clients) and wait until
        no new connection can reach it. Its backends notice their postmaster is gone and exit
        by themselves (start() waits for them)."""
        pid = _postmaster_pid(self.data_dir)
        if pid is None:
            raise PostgresSetupError("the server is not running (no postmaster.pid)")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Every process of the server stopped (SIGSTOP) while the block runs, then let go
        (SIGCONT) whatever happens: a frozen host, whose connections stay open and on which
        nothing answers."""
        stopped: list[int] = []
        try:
            # Scanned again until a scan finds no process it has not stopped: a backend the
            # postmaster forked during a scan (a pool opening a connection) would otherwise run
            # on and answer on its connection.
            while fresh := [p for p in _server_pids(self.data_dir) if p not in stopped]:
                for pid in fresh:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
            yield
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def terminate_backends(self, dbname: str | None = None) -> int:
        """pg_terminate_backend of every client connection but this call's own (only those
        to `dbname` when given); the number terminated."""
        query = (
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        params: tuple[str, ...] = ()
        if dbname is not None:
            query += " AND datname = %s"
            params = (dbname,)
        with psycopg.connect(self.conninfo("postgres"), autocommit=True, connect_timeout=5) as c:
            row = c.execute(query, params).fetchone()
        return int(row[0]) if row else 0

    def _final_stop(self) -> None:
        stop = self._runner.run(
            [str(self._pg.pg_ctl), "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"],
            timeout=60,
        )
        if stop.returncode != 0 and (self.data_dir / "postmaster.pid").exists():
            logger.warning("pg_ctl stop failed: %s%s", stop.stdout, stop.stderr)
            _kill_postmaster(self.data_dir)


@contextlib.contextmanager
def postgres_instance(
    dbname: str = DEFAULT_DBNAME, *, settings: Mapping[str, str] | None = None
) -> Iterator[PostgresServer]:
    """Start a throw-away PostgreSQL server with a fresh database `dbname`; yield its handle
    (PostgresServer: URLs, and stop / kill / start again on the same port for fault tests).

    The server listens on 127.0.0.1 only, has trust authentication for superuser `toolmesh`,
    keeps its data in a temp directory and is stopped and removed on exit. `settings` are
    extra server parameters (`-c name=value`), e.g. {"max_connections": "20"}.
    """
    _check_dbname(dbname)
    pg = ensure_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="toolmesh-pg-"))
    (workdir / "sock").mkdir()
    server: PostgresServer | None = None
    try:
        runner = _Runner(workdir)
        data_dir = workdir / "data"
        initdb = [str(pg.initdb), "-D", str(data_dir), "-A", "trust", "-U", SUPERUSER]
        initdb += ["--no-sync", "--encoding=UTF8", "--locale=C"]
        init = runner.run(initdb, timeout=120)
        if init.returncode != 0:
            raise PostgresSetupError(
                f"initdb failed (exit {init.returncode}): {init.stdout}{init.stderr}"
            )
        # From here on a stop attempt is needed even if start half-worked.
        server = PostgresServer(runner, pg, workdir, settings or {})
        server._first_start()
        _create(server.conninfo("postgres"), dbname)
        logger.info("test PostgreSQL listening on 127.0.0.1:%d (%s)", server.port, workdir)
        yield server
    finally:
        if server is not None:
            server._final_stop()
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def postgres_server(dbname: str = DEFAULT_DBNAME) -> Iterator[str]:
    """Start a throw-away PostgreSQL server; yield the SQLAlchemy URL of a fresh `dbname`.

    The server listens on 127.0.0.1 only, has trust authentication for superuser `toolmesh`,
    keeps its data in a temp directory and is stopped and removed on exit.
    """
    with postgres_instance(dbname) as server:
        yield server.url(dbname)
