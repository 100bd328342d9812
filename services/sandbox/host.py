"""The host side of the sandbox: starts the zygote inside bubblewrap, keeps a pool of pre-started
single-use workers, and runs one execution on one worker — frames in, nested tool calls served,
frames out — under a host-side wall clock that SIGKILLs the worker through its pidfd.

No grpc here: the core hands in a `ToolCallHandler` for call_tool."""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from services.sandbox import worker as wire
from services.sandbox.admission import Admission, Origin, SlotRefused
from services.sandbox.cgroups import CgroupLimiter, default_name, host_pid
from services.sandbox.ipc_check import table_problem
from shared.errors import FailedPrecondition, Unavailable

logger = logging.getLogger(__name__)

WORKER_FILE = Path(wire.__file__).resolve()
SANDBOX_DIR = "/sbx"
# Environment of the zygote (and so of every worker): nothing but this.
SANDBOX_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_MAX_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "random",
    "HOME": "/tmp",
}
# The host uid and gid executions run as when the service runs as root (nobody / nogroup).
NOBODY = 65534
NOGROUP = 65534
FRAME_OVERHEAD = 64 * 1024
# The cgroup memory limit is the execution's memory limit plus this (pages shared with the
# zygote stay charged to it; what a worker writes is charged to the worker).
CGROUP_MEMORY_SLACK = 64 * 1024 * 1024
# call_tool frames answered with a refusal past max_tool_calls before the worker is killed.
CALL_LIMIT_GRACE = 8
# The private /tmp (one tmpfs all of a zygote's workers share) holds at most this by default:
# the default memory limit of one execution. bwrap caps a tmpfs with `--size` from 0.8 on.
DEFAULT_TMP_BYTES = 512 * 1024 * 1024
TMPFS_SIZE_BWRAP = (0, 8)


@dataclass(frozen=True)
class Limits:
    """Limits of one execution (see ExecutionLimits in sandbox.proto)."""

    wall_seconds: float = 10.0
    cpu_seconds: float = 10.0
    memory_bytes: int = 512 * 1024 * 1024
    output_bytes: int = 1024 * 1024
    max_tool_calls: int = 16
    max_call_bytes: int = 1024 * 1024


@dataclass
class RunOutcome:
    """What one execution produced: a result frame, or an error kind naming what stopped it."""

    ok: bool
    form: str = ""  # text | table | response
    content: str = ""
    response: dict[str, Any] | None = None
    table_ipc: bytes | None = None
    error_kind: str = ""
    message: str = ""
    tool_calls: int = 0
    execution_ms: float = 0.0
    killed: bool = False  # the host (or a limit) killed the worker; it did not answer


# call_tool(name, inputs) -> (reply frame, optional Arrow IPC of a table)
ToolCallHandler = Callable[[str, dict[str, Any]], Awaitable[tuple[dict[str, Any], bytes | None]]]


@dataclass
class _Worker:
    id: int
    pid: int
    pidfd: int
    to_worker: int
    from_worker: int
    exited: asyncio.Future[tuple[int, int]] = field(repr=False)
    generation: int = 0  # which zygote forked it
    oom_killed: bool = False  # its cgroup saw the OOM killer (known once it exited)

    def kill(self) -> None:
        if self.pidfd >= 0:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def close(self) -> None:
        for attr in ("pidfd", "to_worker", "from_worker"):
            fd = getattr(self, attr)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, attr, -1)


def _kill_zygote(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL bwrap's whole process group. Killing bwrap alone while it starts leaves its
    child (pid 1 of the new namespace, not yet tied to bwrap's life by --die-with-parent)
    blocked for ever on a start-up handshake: an orphan that holds the service's stderr.
    The group is signalled even when bwrap is gone: Linux never reuses a pid that still names
    a process group, so the id reaches only what is left of that group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def landlock_abi() -> int:
    """The kernel's landlock ABI version (0: none), as the worker's confinement will find it."""
    import ctypes

    landlock_create_ruleset, version_flag = 444, 1  # x86_64 and arm64 share the number
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return max(0, int(libc.syscall(landlock_create_ruleset, None, 0, version_flag)))
    except (OSError, AttributeError):
        return 0


def _has_sys_admin() -> bool:
    """Whether this process holds CAP_SYS_ADMIN (what bwrap needs as root, with no user
    namespace, to make the sandbox's namespaces and mounts)."""
    cap_sys_admin = 21
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> cap_sys_admin & 1)
    return False


def parse_bwrap_version(text: str) -> tuple[int, ...] | None:
    """(0, 8, 0) from `bubblewrap 0.8.0`; None when the text names no version."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in match.groups() if g is not None) if match else None


def tmp_size_for(bwrap: str, tmp_bytes: int) -> int | None:
    """The size cap of the sandbox's /tmp that `bwrap` can apply: `tmp_bytes`, or None (no cap
    of its own, said once in the log) when it is 0 or this bwrap predates `--size`."""
    if tmp_bytes <= 0:
        return None
    try:
        done = subprocess.run(
            [bwrap, "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
        version = parse_bwrap_version(done.stdout + done.stderr)
    except (OSError, subprocess.SubprocessError):
        version = None
    if version is None or version < TMPFS_SIZE_BWRAP:
        logger.warning(
            "bubblewrap %s cannot cap a tmpfs (--size needs 0.8 or later): the sandbox's /tmp "
            "has no size cap of its own; only a writable memory cgroup limits what workers "
            "write there",
            ".".join(map(str, version)) if version else "(version unknown)",
        )
        return None
    return tmp_bytes


def python_read_paths() -> list[str]:
    """What the sandbox binds read-only: the Python install and the site-packages in use."""
    paths = {sys.base_prefix, *(p for p in sys.path if "site-packages" in p and os.path.isdir(p))}
    stdlib = sysconfig.get_paths()["stdlib"]
    paths.add(os.path.dirname(stdlib))
    return sorted(p for p in paths if p)


class _Binds:
    """Read-only binds of host paths into the sandbox's fresh root. With `open_parents`, every
    directory bwrap has to make on the way to a bind is made 0755 first: as root bwrap makes them
    0700, which the uid the zygote drops to could not traverse. (Inside the sandbox these are
    bwrap's own directories, so a host /root of mode 700 above the Python install does not
    matter: a bind mount does not re-check its source's parents.)"""

    def __init__(self, open_parents: bool) -> None:
        self.args: list[str] = []
        self._open_parents = open_parents
        self._made: set[str] = {"/"}
        self._mounted: list[str] = []  # host directories bound in: their own modes apply below

    def _covered(self, path: str) -> bool:
        return path in self._made or any(
            path == m or path.startswith(m + "/") for m in self._mounted
        )

    def _parents(self, dest: str) -> None:
        if not self._open_parents:
            return
        for parent in reversed(PurePosixPath(dest).parents):
            if not self._covered(str(parent)):
                self.args += ["--perms", "0755", "--dir", str(parent)]
                self._made.add(str(parent))

    def ro_bind(self, src: str, dest: str) -> None:
        self._parents(dest)
        self.args += ["--ro-bind", src, dest]
        self._mounted.append(dest.rstrip("/") or "/")

    def made(self, path: str) -> None:
        """`path` is a directory the sandbox made (a tmpfs): what is below it is made here."""
        self._made.add(path)


def bwrap_command(bwrap: str, config: dict[str, Any]) -> list[str]:
    """The bubblewrap command line of the zygote: every namespace new, nothing writable but a
    private tmpfs /tmp, the Python install read-only, no data dir, a clean environment.

    Unprivileged service: a new user namespace whose uid 65534 is the service's own uid (what
    bwrap maps it to). Service run as root: that mapping would make the sandbox's uid host root,
    so there is no user namespace; bwrap runs as root (so it can reach the Python install even
    under a mode-700 /root) and leaves the zygote nothing but CAP_SETUID, CAP_SETGID and
    CAP_SETPCAP, which the zygote uses once, first thing, to empty its capability bounding set
    and become `config["run_as"]` (uid, gid; no supplementary groups) for good: every
    capability set is then empty (worker._become checks)."""
    run_as = bool(config.get("run_as"))
    cmd = [bwrap]
    if run_as:
        cmd += [
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-cgroup-try",
            # As root without a user namespace bwrap keeps every capability unless told not to.
            "--cap-drop",
            "ALL",
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
            "--cap-add",
            "CAP_SETPCAP",
        ]
    else:
        cmd += ["--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534"]
    cmd += ["--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv"]
    binds = _Binds(open_parents=run_as)
    binds.ro_bind("/usr", "/usr")
    for link in ("lib", "lib64", "bin", "sbin"):
        target = f"/{link}"
        if os.path.islink(target):
            binds.args += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            binds.ro_bind(target, target)
    if os.path.exists("/etc/ld.so.cache"):
        binds.ro_bind("/etc/ld.so.cache", "/etc/ld.so.cache")
    # The private /tmp first: a Python install or virtualenv that lives under /tmp (a CI
    # checkout, say) is then bound on top of it, not hidden by it.
    binds.args += ["--proc", "/proc", "--dev", "/dev"]
    # bwrap makes the tmpfs as the uid it runs as: root's 0755 /tmp would not be writable by the
    # uid the zygote drops to (only sandbox processes, all of that uid, ever see this /tmp).
    binds.args += ["--perms", "1777"] if run_as else []
    # Capped (bwrap 0.8+): files written there are memory no RLIMIT_AS sees, and without a
    # writable memory cgroup nothing else stops them before the host's RAM does.
    binds.args += ["--size", str(int(config["tmp_bytes"]))] if config.get("tmp_bytes") else []
    binds.args += ["--tmpfs", "/tmp"]
    binds.made("/tmp")
    for path in config["read_paths"]:
        if not path.startswith("/usr") and path != "/etc/ld.so.cache":
            binds.ro_bind(path, path)
    binds.ro_bind(str(WORKER_FILE), f"{SANDBOX_DIR}/worker.py")
    cmd += [*binds.args, "--chdir", "/tmp"]
    for key, value in SANDBOX_ENV.items():
        cmd += ["--setenv", key, value]
    # -I: isolated mode (no env vars, no user site); -S is not used: site adds site-packages.
    cmd += [
        os.path.realpath(sys.executable),
        "-I",
        "-B",
        f"{SANDBOX_DIR}/worker.py",
        json.dumps(config),
    ]
    return cmd


class WorkerPool:
    """One zygote (inside bwrap) and a pool of pre-started, single-use workers."""

    def __init__(
        self,
        *,
        size: int = 2,
        bwrap: str | None = None,
        start_timeout_s: float = 60.0,
        max_input_bytes: int = 64 << 20,
        max_concurrent: int = 16,
        tenant_max_concurrent: int = 4,
        slot_wait_s: float = 10.0,
        tmp_bytes: int = DEFAULT_TMP_BYTES,
        cgroups: bool = True,
        uid: int = NOBODY,
        gid: int = NOGROUP,
        landlock: bool = True,
    ) -> None:
        self._size = max(1, size)
        # False: workers skip landlock, as on a kernel without it (where the service still runs,
        # with a warning): how tests check that the other layers hold there on their own.
        self._landlock = landlock
        # Who executions run as on the host when the service is root (see bwrap_command).
        self._run_as = (uid, gid)
        # Executions beyond these wait for a slot, for a bounded time: a flood cannot fork
        # without bound, one tenant cannot take every slot, and a nested call cannot wait for
        # a slot only its own callers could free (admission.py).
        self.admission = Admission(
            total=max_concurrent, per_tenant=tenant_max_concurrent, wait_s=slot_wait_s
        )
        self._bwrap = bwrap or shutil.which("bwrap") or ""
        self._start_timeout_s = start_timeout_s
        self._max_input_bytes = max_input_bytes
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._ready: asyncio.Queue[_Worker] = asyncio.Queue()
        self._pending: dict[int, asyncio.Future[_Worker]] = {}
        self._workers: dict[int, _Worker] = {}
        self._next_id = 0
        self._zygote_ready: asyncio.Future[None] | None = None
        self._refill_tasks: set[asyncio.Task[None]] = set()
        self._refills_pending = 0  # pool refills started and not yet over (see _refill)
        self._closed = False
        self._lock = asyncio.Lock()
        self._generation = 0
        self._use_cgroups = cgroups
        self._cgroups: CgroupLimiter | None = None
        self._tmp_bytes = tmp_bytes
        self.tmp_size: int | None = None  # the cap bwrap puts on /tmp (set by start)

    @property
    def isolation(self) -> dict[str, Any]:
        return {
            "bwrap": self._bwrap,
            "size": self._size,
            "run_as": self._drop_to(),
            "tmp_bytes": self.tmp_size,
        }

    def _drop_to(self) -> tuple[int, int] | None:
        """The (uid, gid) the zygote drops to: only when the service runs as root; otherwise
        bwrap's user namespace maps the sandbox's uid to the service's own, unprivileged one."""
        return self._run_as if os.geteuid() == 0 else None

    async def start(self) -> None:
        """Start the zygote (before any gRPC server exists) and fill the pool."""
        if landlock_abi() < 1:
            logger.warning(
                "landlock is not available on this kernel: custom tools still run in bubblewrap "
                "with seccomp and rlimits, but workers (one uid) are kept from each other's "
                "files in the shared /tmp only by their directories' modes"
            )
        if not self._bwrap:
            raise FailedPrecondition(
                "bubblewrap (bwrap) is not installed; the sandbox refuses to run code without it",
                reason="SANDBOX_UNAVAILABLE",
            )
        if self._drop_to() is not None and not _has_sys_admin():
            raise FailedPrecondition(
                "the sandbox runs as root without CAP_SYS_ADMIN (a container's root?), so "
                "bubblewrap cannot build its namespaces without a user namespace, which would "
                "map the sandbox to root; run the service as an unprivileged user instead",
                reason="SANDBOX_UNAVAILABLE",
            )
        if min(self._run_as) <= 0:
            raise FailedPrecondition(
                f"the sandbox's uid and gid must not be root's (got {self._run_as}); set "
                "TOOLMESH_SANDBOX_UID and TOOLMESH_SANDBOX_GID to an unprivileged user",
                reason="SANDBOX_UNAVAILABLE",
            )
        self.tmp_size = await asyncio.to_thread(tmp_size_for, self._bwrap, self._tmp_bytes)
        if self._use_cgroups:
            limiter = await asyncio.to_thread(CgroupLimiter, default_name())
            self._cgroups = limiter if limiter.available else None
        await self._start_zygote()
        await asyncio.gather(*(self._spawn_into_pool() for _ in range(self._size)))

    async def _start_zygote(self) -> None:
        loop = asyncio.get_running_loop()
        host_sock = self._popen_zygote()
        self._generation += 1
        host_sock.setblocking(False)
        self._sock = host_sock
        self._zygote_ready = loop.create_future()
        loop.add_reader(host_sock.fileno(), self._on_control)
        try:
            await asyncio.wait_for(asyncio.shield(self._zygote_ready), self._start_timeout_s)
        except TimeoutError:
            await self._reap_zygote()
            raise Unavailable(
                f"sandbox zygote not ready after {self._start_timeout_s:.0f}s",
                reason="SANDBOX_UNAVAILABLE",
            ) from None
        except BaseException:
            await self._reap_zygote()  # no zombie bwrap when start-up fails
            raise
        logger.info("sandbox zygote started (bwrap pid %d)", self._proc.pid if self._proc else 0)

    async def _reap_zygote(self) -> None:
        if self._proc is not None:
            _kill_zygote(self._proc)
            await asyncio.to_thread(self._proc.wait)

    def _popen_zygote(self) -> socket.socket:
        """Start bwrap + the zygote (fork+exec, never a bare fork of this process) with an
        environment of nothing but PATH; returns the host end of the control socket."""
        host_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = {
            "control_fd": child_sock.fileno(),
            "read_paths": ["/usr", "/etc/ld.so.cache", *python_read_paths()],
            "site_paths": [p for p in sys.path if "site-packages" in p and os.path.isdir(p)],
            "max_input_bytes": self._max_input_bytes,
            "require_landlock": False,
            "run_as": self._drop_to(),
            "tmp_bytes": self.tmp_size,
            "landlock": self._landlock,
        }
        cmd = bwrap_command(self._bwrap, config)
        self._proc = subprocess.Popen(
            cmd,
            env={"PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            pass_fds=(child_sock.fileno(),),
            close_fds=True,
            # Its own process group: a terminal's Ctrl-C reaches the service, which stops the
            # zygote itself, and a kill reaches bwrap's half-started child too (see
            # _kill_zygote).
            start_new_session=True,
        )
        child_sock.close()
        return host_sock

    def _on_control(self) -> None:
        assert self._sock is not None
        while True:
            fds = array.array("i")
            try:
                data, ancdata, _f, _a = self._sock.recvmsg(
                    wire.MAX_CONTROL_FRAME, socket.CMSG_SPACE(4 * fds.itemsize)
                )
            except BlockingIOError:
                return
            except OSError:
                data = b""
            for level, ctype, cdata in ancdata if data else ():
                if level == socket.SOL_SOCKET and ctype == socket.SCM_RIGHTS:
                    fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
            if not data:
                self._zygote_lost()
                return
            try:
                length, kind = wire.HEADER.unpack(data[: wire.HEADER.size])
                msg = wire.decode_json(kind, data[wire.HEADER.size : wire.HEADER.size + length])
            except (ValueError, wire.FrameError) as exc:
                logger.error("bad control frame from the zygote: %s", exc)
                for fd in fds:
                    os.close(fd)
                continue
            self._handle_control(msg, list(fds))

    def _handle_control(self, msg: dict[str, Any], fds: list[int]) -> None:
        event = msg.get("event")
        if event == "ready":
            if self._zygote_ready is not None and not self._zygote_ready.done():
                self._zygote_ready.set_result(None)
        elif event == "spawned":
            wid = int(msg["id"])
            future = self._pending.pop(wid, None)
            worker = self._workers.get(wid)
            if future is None or future.done() or worker is None or len(fds) != 1:
                for fd in fds:  # a worker nobody waits for any more (see _spawn): stopped
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                    os.close(fd)
                return
            worker.pid = int(msg["pid"])
            worker.pidfd = fds[0]
            if self._cgroups is not None:
                pid = host_pid(worker.pidfd)
                if pid is not None:
                    self._cgroups.attach(wid, pid)
            if not future.done():
                future.set_result(worker)
        elif event == "spawn_failed":
            failed = self._workers.pop(int(msg["id"]), None)
            if failed is not None:
                failed.close()
            future = self._pending.pop(int(msg["id"]), None)
            for fd in fds:
                os.close(fd)
            if future is not None and not future.done():
                future.set_exception(
                    Unavailable(
                        f"the sandbox could not start a worker: {msg.get('error', '')}",
                        reason="SANDBOX_SPAWN_FAILED",
                    )
                )
        elif event == "exited":
            worker = self._workers.pop(int(msg["id"]), None)
            if self._cgroups is not None:
                if worker is not None:
                    worker.oom_killed = self._cgroups.oom_killed(int(msg["id"]))
                self._cgroups.release(int(msg["id"]))
            if worker is not None and not worker.exited.done():
                worker.exited.set_result((int(msg["code"]), int(msg["signal"])))
            for fd in fds:
                os.close(fd)

    def _zygote_lost(self) -> None:
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if self._closed:
            return
        if self._zygote_ready is not None and not self._zygote_ready.done():
            code = self._proc.poll() if self._proc is not None else None
            self._zygote_ready.set_exception(
                Unavailable(
                    f"the sandbox zygote exited during start-up (exit code {code})",
                    reason="SANDBOX_UNAVAILABLE",
                )
            )
            return
        logger.error("sandbox zygote is gone; restarting it")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(Unavailable("sandbox zygote exited", reason="SANDBOX_LOST"))
        self._pending.clear()
        for worker in self._workers.values():
            if not worker.exited.done():
                worker.exited.set_result((-1, signal.SIGKILL))
        self._workers.clear()
        while not self._ready.empty():
            self._ready.get_nowait().close()
        old = self._proc
        if old is not None:
            _kill_zygote(old)
        task = asyncio.ensure_future(self._restart_in_background(old))
        self._refill_tasks.add(task)
        task.add_done_callback(self._refill_tasks.discard)

    async def _restart(self) -> None:
        """Start a new zygote after the last one died (raises Unavailable when it cannot)."""
        async with self._lock:
            if self._sock is None and not self._closed:
                await self._start_zygote()

    async def _restart_in_background(self, old: subprocess.Popen[bytes] | None) -> None:
        if old is not None:
            await asyncio.to_thread(old.wait)  # reaped: no zombie bwrap
        try:
            await self._restart()
        except (Unavailable, OSError) as exc:
            logger.error("could not restart the sandbox zygote: %s", exc)
            return
        for _ in range(self._size):
            self._refill()

    async def _spawn(self) -> _Worker:
        if self._sock is None:
            await self._restart()
        if self._sock is None:
            raise Unavailable("the sandbox is not running", reason="SANDBOX_UNAVAILABLE")
        loop = asyncio.get_running_loop()
        self._next_id += 1
        wid = self._next_id
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        worker = _Worker(
            wid, 0, -1, req_w, rep_r, exited=loop.create_future(), generation=self._generation
        )
        future: asyncio.Future[_Worker] = loop.create_future()
        self._pending[wid] = future
        self._workers[wid] = worker
        try:
            self._sock.sendmsg(
                [wire.encode_json({"op": "spawn", "id": wid})],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [req_r, rep_w]))],
            )
        except OSError as exc:
            self._pending.pop(wid, None)
            self._workers.pop(wid, None)
            worker.close()
            raise Unavailable(
                f"the sandbox zygote is unreachable: {exc}", reason="SANDBOX_UNAVAILABLE"
            ) from None
        finally:
            os.close(req_r)
            os.close(rep_w)
        try:
            return await asyncio.wait_for(future, self._start_timeout_s)
        except BaseException as exc:
            # Timed out, or the call that wanted it was cancelled (its caller gone, a deadline):
            # the worker may start all the same, or have started as the cancellation came.
            # Nobody will send it a request: it must not wait for one for ever.
            self._pending.pop(wid, None)
            worker.kill()  # when it started (its pidfd came), whether or not it was handed out
            worker.close()  # its request pipe closed: a worker that starts now reads EOF, exits
            if isinstance(exc, TimeoutError):
                raise Unavailable(
                    f"no sandbox worker started within {self._start_timeout_s:.0f}s",
                    reason="SANDBOX_UNAVAILABLE",
                ) from None
            raise

    async def _spawn_into_pool(self) -> None:
        try:
            worker = await self._spawn()
        except (Unavailable, OSError) as exc:
            logger.error("could not pre-start a sandbox worker: %s", exc)
            return
        if self._closed or not self._usable(worker):
            worker.kill()
            worker.close()
            return
        self._ready.put_nowait(worker)

    def _usable(self, worker: _Worker) -> bool:
        """Forked by the running zygote and not exited (a zygote restart kills its workers)."""
        return worker.generation == self._generation and not worker.exited.done()

    def _refill(self) -> None:
        """Start a worker for the pool, unless the pool (with the workers already being
        started for it) is full: a worker started on the spot for a call that found the pool
        empty took nothing from it, and refilling after it too grew the pool to the widest
        burst of calls (idle processes, descriptors and memory, kept for good)."""
        if self._closed or self._ready.qsize() + self._refills_pending >= self._size:
            return
        self._refills_pending += 1
        task = asyncio.ensure_future(self._refill_one())
        self._refill_tasks.add(task)
        task.add_done_callback(self._refill_tasks.discard)

    async def _refill_one(self) -> None:
        try:
            await self._spawn_into_pool()
        finally:
            self._refills_pending -= 1

    async def take(self) -> _Worker:
        """A fresh worker (never one that ran anything), replacing it in the pool; started on
        the spot when the pool is empty. Unavailable when no worker can be started."""
        if self._closed:
            raise Unavailable("the sandbox is shutting down", reason="SANDBOX_UNAVAILABLE")
        worker = None
        while not self._ready.empty():
            candidate = self._ready.get_nowait()
            if self._usable(candidate):
                worker = candidate
                break
            candidate.close()
        if worker is None:
            worker = await self._spawn()
        self._refill()
        return worker

    async def run(
        self,
        *,
        code: str,
        inputs: dict[str, Any],
        tool_name: str,
        limits: Limits,
        df_ipc: bytes | None = None,
        on_call_tool: ToolCallHandler | None = None,
        origin: Origin | None = None,
    ) -> RunOutcome:
        """Run `code` once on a fresh worker, once `origin` (who it runs for, where in its call
        tree) gets a slot; an Err `concurrency_limit` naming the limit when it gets none. Never
        raises for anything the code does."""
        try:
            async with self.admission.slot(origin or Origin(), limits.wall_seconds):
                return await self._run(code, inputs, tool_name, limits, df_ipc, on_call_tool)
        except SlotRefused as exc:
            return RunOutcome(ok=False, error_kind="concurrency_limit", message=str(exc))

    async def _run(
        self,
        code: str,
        inputs: dict[str, Any],
        tool_name: str,
        limits: Limits,
        df_ipc: bytes | None,
        on_call_tool: ToolCallHandler | None,
    ) -> RunOutcome:
        started = time.perf_counter()
        worker = await self.take()
        clean = False
        try:
            outcome = await self._converse(
                worker, code, inputs, tool_name, limits, df_ipc, on_call_tool
            )
            clean = not outcome.killed
        finally:
            worker.kill()
            worker.close()
        if not clean:
            # Killed mid-run: the zygote removes the worker's private directory before it
            # reports the exit, so nothing the execution wrote is left when this returns. (A
            # worker that answered emptied its directory itself before answering.)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(worker.exited), 2.0)
        outcome.execution_ms = (time.perf_counter() - started) * 1000
        return outcome

    async def _converse(
        self,
        worker: _Worker,
        code: str,
        inputs: dict[str, Any],
        tool_name: str,
        limits: Limits,
        df_ipc: bytes | None,
        on_call_tool: ToolCallHandler | None,
    ) -> RunOutcome:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.wall_seconds
        reader = asyncio.StreamReader(limit=2**16, loop=loop)
        # The pipe owns the descriptor from here, before any await: a call cancelled while the
        # transport connects has the transport close it (later, from the loop), and a worker
        # that still held it closed it first — the transport then closed whatever descriptor
        # had been given that number since (another execution's pipe).
        pipe = os.fdopen(worker.from_worker, "rb", 0)
        worker.from_worker = -1
        try:
            transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), pipe
            )
        except BaseException:
            pipe.close()  # once: closing a closed pipe object again is a no-op
            raise
        calls = 0
        try:
            request = {
                "tool_name": tool_name,
                "code": code,
                "inputs": inputs,
                "has_df": df_ipc is not None,
                "limits": {
                    "cpu_seconds": limits.cpu_seconds,
                    "memory_bytes": limits.memory_bytes,
                    "output_bytes": limits.output_bytes,
                    "max_tool_calls": limits.max_tool_calls,
                },
            }
            if self._cgroups is not None:
                self._cgroups.limit_memory(worker.id, limits.memory_bytes + CGROUP_MEMORY_SLACK)
            payload = wire.encode_json(request)
            if df_ipc is not None:
                payload += wire.encode_bytes(df_ipc)
            await self._write(worker, payload, deadline)
            max_frame = limits.output_bytes + FRAME_OVERHEAD
            while True:
                kind, body = await self._read_frame(reader, max_frame, deadline)
                msg = wire.decode_json(kind, body)
                mtype = msg.get("type")
                if mtype == "call_tool":
                    calls += 1
                    if calls > limits.max_tool_calls + CALL_LIMIT_GRACE:
                        # Refused calls still cost the host a frame to read and decode each:
                        # code that keeps calling past its refusal is stopped.
                        worker.kill()
                        return RunOutcome(
                            ok=False,
                            killed=True,
                            error_kind="tool_call_limit",
                            message=(
                                f"kept calling tools after its limit of {limits.max_tool_calls} "
                                "calls was reached; the worker was killed"
                            ),
                            tool_calls=calls,
                        )
                    reply, table = await self._serve_call(
                        msg, calls, limits, on_call_tool, deadline
                    )
                    frame = wire.encode_json({**reply, "has_table": table is not None})
                    if table is not None:
                        frame += wire.encode_bytes(table)
                    await self._write(worker, frame, deadline)
                    continue
                if mtype == "result":
                    table_ipc = None
                    if msg.get("has_table"):
                        bkind, table_ipc = await self._read_frame(reader, max_frame, deadline)
                        if bkind != wire.BYTES_FRAME:
                            raise wire.FrameError("expected the table's Arrow IPC frame")
                        problem = table_problem(table_ipc, max_cells=limits.output_bytes)
                        if problem is not None:
                            return RunOutcome(
                                ok=False,
                                error_kind=problem[0],
                                message=f"the result cannot be returned: {problem[1]}",
                                tool_calls=calls,
                            )
                    response = msg.get("response")
                    return RunOutcome(
                        ok=True,
                        form=str(msg.get("form", "text")),
                        content=str(msg.get("content", "")),
                        response=response if isinstance(response, dict) else None,
                        table_ipc=table_ipc,
                        tool_calls=calls,
                    )
                if mtype == "error":
                    said = msg.get("kind")  # what the tool's own code may have written
                    return RunOutcome(
                        ok=False,
                        error_kind=said if said in wire.ERROR_KINDS else "execution_error",
                        message=str(msg.get("message", ""))[:4000],
                        tool_calls=calls,
                    )
                raise wire.FrameError(f"unexpected frame type {mtype!r}")
        except TimeoutError:
            worker.kill()
            return RunOutcome(
                ok=False,
                killed=True,
                error_kind="timeout",
                message=f"execution exceeded the {limits.wall_seconds:g}s wall-clock limit "
                "and was killed",
                tool_calls=calls,
            )
        except wire.FrameError as exc:
            worker.kill()
            over = "limit" in str(exc)
            return RunOutcome(
                ok=False,
                killed=True,
                error_kind="output_limit" if over else "protocol_error",
                message=(
                    f"output over the {limits.output_bytes}-byte output limit; the worker was "
                    "killed"
                    if over
                    else f"the worker broke the protocol: {exc}"
                ),
                tool_calls=calls,
            )
        except (EOFError, asyncio.IncompleteReadError, BrokenPipeError, ConnectionError):
            return await self._died(worker, limits, calls)
        except (ValueError, KeyError, RecursionError) as exc:  # RecursionError: nested JSON
            worker.kill()
            return RunOutcome(
                ok=False,
                killed=True,
                error_kind="protocol_error",
                message=f"bad frame: {exc}",
                tool_calls=calls,
            )
        finally:
            transport.close()

    async def _died(self, worker: _Worker, limits: Limits, calls: int) -> RunOutcome:
        try:
            code, sig = await asyncio.wait_for(asyncio.shield(worker.exited), 5.0)
        except TimeoutError:
            code, sig = -1, 0
        if sig == signal.SIGXCPU:
            return RunOutcome(
                ok=False,
                killed=True,
                error_kind="cpu_limit",
                message=f"execution exceeded the {limits.cpu_seconds:g}s CPU-time limit and was "
                "killed",
                tool_calls=calls,
            )
        if sig == signal.SIGKILL and worker.oom_killed:
            return RunOutcome(
                ok=False,
                killed=True,
                error_kind="memory_limit",
                message=f"execution exceeded the {limits.memory_bytes >> 20} MiB memory limit "
                "(files written to /tmp count too) and was killed",
                tool_calls=calls,
            )
        if sig == signal.SIGKILL:
            return RunOutcome(
                ok=False,
                killed=True,
                error_kind="killed",
                message=f"the worker was killed (the {limits.cpu_seconds:g}s CPU-time hard "
                "limit, the kernel's OOM killer, or the sandbox restarting); nothing was returned",
                tool_calls=calls,
            )
        what = f"signal {signal.Signals(sig).name}" if sig else f"exit code {code}"
        return RunOutcome(
            ok=False,
            killed=True,
            error_kind="crashed",
            message=f"the worker died ({what}) before returning a result",
            tool_calls=calls,
        )

    async def _write(self, worker: _Worker, data: bytes, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        fd = worker.to_worker
        os.set_blocking(fd, False)
        view = memoryview(data)
        while view:
            try:
                n = os.write(fd, view)
                view = view[n:]
                continue
            except BlockingIOError:
                pass
            writable: asyncio.Future[None] = loop.create_future()
            loop.add_writer(fd, _resolve, writable)
            try:
                await asyncio.wait_for(writable, max(0.0, deadline - loop.time()))
            finally:
                loop.remove_writer(fd)

    async def _read_frame(
        self, reader: asyncio.StreamReader, limit: int, deadline: float
    ) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        remaining = max(0.0, deadline - loop.time())
        head = await asyncio.wait_for(reader.readexactly(wire.HEADER.size), remaining)
        length, kind = wire.HEADER.unpack(head)
        if kind not in (wire.JSON_FRAME, wire.BYTES_FRAME):
            raise wire.FrameError(f"unknown frame type {kind}")
        if length > limit:
            raise wire.FrameError(f"frame of {length} bytes over the {limit}-byte limit")
        remaining = max(0.0, deadline - loop.time())
        return kind, await asyncio.wait_for(reader.readexactly(length), remaining)

    async def _serve_call(
        self,
        msg: dict[str, Any],
        calls: int,
        limits: Limits,
        on_call_tool: ToolCallHandler | None,
        deadline: float,
    ) -> tuple[dict[str, Any], bytes | None]:
        def refuse(code: str, error: str) -> tuple[dict[str, Any], bytes | None]:
            return {"ok": False, "kind": "err", "code": code, "error": error, "content": ""}, None

        name, inputs = msg.get("name"), msg.get("inputs")
        if not isinstance(name, str) or not isinstance(inputs, dict):
            return refuse("INVALID_ARGUMENT", "call_tool needs a tool name and a dict of inputs")
        if calls > limits.max_tool_calls:
            return refuse(
                "TOOL_CALL_LIMIT",
                f"call_tool limit reached: at most {limits.max_tool_calls} calls per execution",
            )
        size = len(json.dumps(inputs))
        if size > limits.max_call_bytes:
            return refuse(
                "INPUT_TOO_LARGE",
                f"call_tool inputs are {size} bytes, over the {limits.max_call_bytes}-byte limit",
            )
        if on_call_tool is None:
            return refuse("UNAVAILABLE", "call_tool is not available in this execution")
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(on_call_tool(name, inputs), max(0.0, deadline - loop.time()))

    async def close(self) -> None:
        self._closed = True
        for task in list(self._refill_tasks):
            task.cancel()
        while not self._ready.empty():
            worker = self._ready.get_nowait()
            worker.kill()
            worker.close()
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        await self._reap_zygote()
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.close)
