"""The code that runs INSIDE the sandbox: the zygote (the pool's parent) and the single-use
workers it forks. This file is bind-mounted read-only into the bubblewrap sandbox and run as
`python -I -B /sbx/worker.py CONFIG`; it imports only the standard library at module level
(pandas, numpy, pyarrow and pyseccomp are imported by the zygote before it forks anything;
landlock is used through raw syscalls), and the host imports it only for the frame format and
the curated builtins.

Wire format on every pipe: frames of a 4-byte big-endian length, one type byte (`J` JSON object,
`B` raw bytes) and the payload. DataFrames travel as Arrow IPC streams in `B` frames, never pickle.

Zygote (one per pool, started by the host with a clean environment before the gRPC server):
    control socket (a SOCK_SEQPACKET socketpair, fd in CONFIG; fds travel with SCM_RIGHTS)
    host -> {"op": "spawn", "id": N} + [request-read fd, reply-write fd]
    zygote -> {"event": "spawned", "id": N, "pid": p} + [pidfd of the worker]
    zygote -> {"event": "exited", "id": N, "code": c, "signal": s}

When the service runs as root the zygote first drops to an unprivileged host uid and gid
(CONFIG "run_as"), so neither it nor any worker ever runs user code as a host-root process.

Worker (forked per execution, used once): lowers its privileges in layers — private workdir and
own /proc entry only (landlock), no core dumps and not ptrace-able (dumpable 0), rlimits,
a seccomp filter — and only then reads its one request."""

from __future__ import annotations

import array
import builtins
import json
import os
import signal
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any

HEADER = struct.Struct(">IB")
JSON_FRAME = ord("J")
BYTES_FRAME = ord("B")
MAX_CONTROL_FRAME = 1 << 20
CONTROL_FD = 3
SANDBOX_DIR = "/sbx"
WORKDIR_ROOT = "/tmp"
MAX_PRINT_CHARS = 64 * 1024
# The kinds of the error frames a worker sends; the host passes on no other (a kind becomes an
# Err's err_kind, and that the `error.type` attribute of the registry's tool-call metrics).
ERROR_KINDS = frozenset(
    {"execution_error", "memory_limit", "disk_limit", "no_result", "output_limit"}
)

# The curated builtins of the custom-tool namespace (the spec's SAFE_BUILTINS, plus what benign
# code needs: class statements, exceptions, a few pure helpers). A courtesy, not security.
SAFE_BUILTIN_NAMES: tuple[str, ...] = (
    "abs", "all", "any", "ascii", "bin", "bool", "bytes", "callable", "chr", "complex",
    "dict", "divmod", "enumerate", "filter", "float", "format", "frozenset", "hash", "hex",
    "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next",
    "object", "oct", "ord", "pow", "print", "range", "repr", "reversed", "round", "set",
    "slice", "sorted", "str", "sum", "tuple", "type", "zip", "property", "staticmethod",
    "classmethod", "super", "__build_class__",
    "True", "False", "None", "NotImplemented", "Ellipsis",
    "Exception", "ArithmeticError", "AssertionError", "AttributeError", "IndexError",
    "KeyError", "LookupError", "NameError", "NotImplementedError", "OverflowError",
    "RuntimeError", "StopIteration", "TypeError", "ValueError", "ZeroDivisionError",
)  # fmt: skip


class FrameError(Exception):
    """A frame that is malformed or over its size limit."""


# --- frames ---------------------------------------------------------------------------------


def encode_json(obj: dict[str, Any]) -> bytes:
    payload = json.dumps(obj, separators=(",", ":"), default=str).encode()
    return HEADER.pack(len(payload), JSON_FRAME) + payload


def encode_bytes(data: bytes) -> bytes:
    return HEADER.pack(len(data), BYTES_FRAME) + data


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact(fd: int, n: int) -> bytes:
    chunks: list[bytes] = []
    while n > 0:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, limit: int) -> tuple[int, bytes]:
    length, kind = HEADER.unpack(read_exact(fd, HEADER.size))
    if kind not in (JSON_FRAME, BYTES_FRAME):
        raise FrameError(f"unknown frame type {kind}")
    if length > limit:
        raise FrameError(f"frame of {length} bytes over the {limit}-byte limit")
    return kind, read_exact(fd, length)


def decode_json(kind: int, payload: bytes) -> dict[str, Any]:
    if kind != JSON_FRAME:
        raise FrameError("expected a JSON frame")
    obj = json.loads(payload)
    if not isinstance(obj, dict):
        raise FrameError("a JSON frame must hold an object")
    return obj


# --- zygote ---------------------------------------------------------------------------------


def _preload() -> dict[str, Any]:
    """Import and warm up everything a worker needs, so a fork is all a request costs."""
    import ctypes.util

    real_find = ctypes.util.find_library
    # No ldconfig inside the sandbox: name the libraries libseccomp and libc load from.
    ctypes.util.find_library = lambda name: {"seccomp": "libseccomp.so.2", "c": "libc.so.6"}.get(
        name, real_find(name)
    )
    try:
        import pyseccomp  # type: ignore[import-untyped]
    finally:
        ctypes.util.find_library = real_find
    import io

    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.ipc as ipc

    warm = pd.DataFrame({"a": [1, 2, 2], "b": ["x", "y", "z"], "c": [1.5, 2.5, np.nan]})
    warm.groupby("a").agg({"c": "mean"}).to_string(max_rows=30, max_cols=15)
    warm["b"].str.upper().value_counts()
    sink = io.BytesIO()
    table = pa.Table.from_pandas(warm, preserve_index=False)
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    ipc.open_stream(sink.getvalue()).read_all().to_pandas()
    np.arange(10).std()
    return {"pd": pd, "np": np, "pa": pa, "ipc": ipc, "seccomp": pyseccomp}


def _send_control(sock: socket.socket, obj: dict[str, Any], fds: list[int] | None = None) -> None:
    data = encode_json(obj)
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendmsg([data])


def _recv_control(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(
        MAX_CONTROL_FRAME, socket.CMSG_SPACE(8 * fds.itemsize)
    )
    if not data:
        raise EOFError("control socket closed")
    for level, ctype, cdata in ancdata:
        if level == socket.SOL_SOCKET and ctype == socket.SCM_RIGHTS:
            fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
    length, kind = HEADER.unpack(data[: HEADER.size])
    return decode_json(kind, data[HEADER.size : HEADER.size + length]), list(fds)


def zygote_main(config: dict[str, Any]) -> None:
    import ctypes

    # Not dumpable: its /proc entries (memory, descriptors) are then out of reach of workers of
    # its own uid even where landlock is not there to keep them out (a service run unprivileged
    # never changes the zygote's credentials, which is what clears the flag for a root one).
    pr_set_dumpable = 4
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_dumpable, 0, 0, 0, 0)
    mods = _preload()
    sock = socket.socket(fileno=int(config.get("control_fd", CONTROL_FD)))
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, tuple[int, str]] = {}  # worker pid -> (its id, its directory)
    # Cleaner pid -> the exit of the worker whose directory it removes (reported when done).
    cleaners: dict[int, tuple[int, int, int]] = {}

    def detach() -> None:
        """In a forked child: let go of the zygote's signal pipe and control socket."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(rfd)
        os.close(wfd)
        sock.close()

    _send_control(sock, {"event": "ready", "pid": os.getpid()})
    import select

    while True:
        readable, _, _ = select.select([sock.fileno(), rfd], [], [])
        if rfd in readable:
            os.read(rfd, 4096)
            try:
                _reap(sock, children, cleaners, detach)
            except OSError:  # the host is gone: so are we
                break
        if sock.fileno() in readable:
            try:
                msg, fds = _recv_control(sock)
            except (EOFError, OSError):
                break
            if msg.get("op") != "spawn" or len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                continue
            wid = int(msg["id"])
            # Not guessable: landlock keeps a worker from opening or listing another's files,
            # not from stat()ing them by name (their sizes and times, as they are written).
            workdir = os.path.join(WORKDIR_ROOT, f"w{wid}-{os.urandom(12).hex()}")
            try:
                pid = _fork_worker(workdir)
            except OSError as exc:  # no room for its directory, or no process left: say so
                for fd in fds:
                    os.close(fd)
                try:
                    _send_control(sock, {"event": "spawn_failed", "id": wid, "error": str(exc)})
                except OSError:
                    break
                continue
            if pid == 0:
                detach()
                code = 0
                try:
                    worker_main(fds[0], fds[1], workdir, config, mods)
                except BaseException:  # noqa: BLE001 - the worker never unwinds into the zygote
                    code = 70
                os._exit(code)
            for fd in fds:
                os.close(fd)
            children[pid] = (wid, workdir)
            pidfd = os.pidfd_open(pid)
            try:
                _send_control(sock, {"event": "spawned", "id": wid, "pid": pid}, [pidfd])
            except OSError:
                break
            finally:
                os.close(pidfd)
    for pid in [*children, *cleaners]:
        os.kill(pid, signal.SIGKILL)


def _fork_worker(workdir: str) -> int:
    """Make the worker's directory (anything already there removed first: nothing a worker
    left may reach the next) and fork; OSError when either fails."""
    try:
        os.mkdir(workdir, 0o700)
    except FileExistsError:
        remove_tree(workdir)
        os.mkdir(workdir, 0o700)
    try:
        return os.fork()
    except OSError:
        remove_tree(workdir)
        raise


def remove_tree(path: str) -> bool:
    """Remove the directory `path` and everything beneath it, whatever a worker made of it: a
    tree thousands of levels deep (shutil.rmtree recurses, and such paths exceed PATH_MAX),
    directories it made read-only. Works on descriptors, one level at a time: a directory
    that cannot be removed yet has its entries moved up beside it, so no path grows long and
    no recursion grows deep. Never raises; True when `path` is gone."""
    import shutil

    try:
        shutil.rmtree(path)
        return True
    except FileNotFoundError:
        return True
    except (OSError, RecursionError):
        pass
    try:
        os.chmod(path, 0o700)
        root = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    hoisted = 0
    try:
        progress = True
        while progress:
            progress = False
            try:
                with os.scandir(root) as it:
                    entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            except OSError:
                break
            for name, is_dir in entries:
                if not is_dir:
                    try:
                        os.unlink(name, dir_fd=root)
                        progress = True
                    except OSError:
                        pass
                    continue
                try:
                    os.chmod(name, 0o700, dir_fd=root)
                    os.rmdir(name, dir_fd=root)
                    progress = True
                    continue
                except OSError:
                    pass  # not empty: its entries move up beside it
                try:
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
                except OSError:
                    continue
                try:
                    with os.scandir(sub) as it:
                        children = [e.name for e in it]
                    for child in children:
                        hoisted += 1
                        try:
                            os.rename(child, f".rm{hoisted}", src_dir_fd=sub, dst_dir_fd=root)
                            progress = True
                        except OSError:
                            pass
                except OSError:
                    pass
                finally:
                    os.close(sub)
    finally:
        os.close(root)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _reap(
    sock: socket.socket,
    children: dict[int, tuple[int, str]],
    cleaners: dict[int, tuple[int, int, int]],
    detach: Callable[[], None],
) -> None:
    """Report every child that exited. A worker's exit is reported once its directory is gone:
    at once when it left it empty (as a worker that answered does); otherwise a cleaner child
    removes it first. Removing what a killed worker made takes about as long as making it did
    (seconds of hard links, say), and the zygote starts every tenant's workers: it must not."""
    while children or cleaners:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in cleaners:
            wid, code, sig = cleaners.pop(pid)
        else:
            wid, workdir = children.pop(pid, (-1, ""))
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
            if workdir and not _remove_if_empty(workdir):
                cleaner = _fork_cleaner(workdir, detach)
                if cleaner is not None:
                    cleaners[cleaner] = (wid, code, sig)
                    continue
                remove_tree(workdir)  # no process to spare: here, as the last resort
        _send_control(sock, {"event": "exited", "id": wid, "code": code, "signal": sig})


def _remove_if_empty(path: str) -> bool:
    """Remove `path` when it is an empty directory (or gone); False when anything is in it."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _fork_cleaner(path: str, detach: Callable[[], None]) -> int | None:
    """A child of the zygote that removes the tree at `path` and exits; None when no process
    could be forked."""
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:
        try:
            detach()
            remove_tree(path)
        finally:
            os._exit(0)
    return pid


# --- worker ---------------------------------------------------------------------------------


def _confine(workdir: str, config: dict[str, Any], mods: dict[str, Any]) -> None:
    """The in-process layers, strongest last: dumpable 0, landlock, rlimits, seccomp."""
    import ctypes
    import resource

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_dumpable, pr_set_no_new_privs = 4, 38
    libc.prctl(pr_set_dumpable, 0, 0, 0, 0)
    libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0)
    os.chdir(workdir)
    read_paths = [*config.get("read_paths", []), SANDBOX_DIR, f"/proc/{os.getpid()}"]
    try:
        if config.get("landlock", True):
            _landlock(libc, read_paths, ["/dev/null", "/dev/urandom", "/dev/zero"], workdir)
    except OSError:
        if config.get("require_landlock"):
            raise
    nofile = int(config.get("max_open_files", 64))
    for limit, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, nofile),
        (resource.RLIMIT_FSIZE, int(config.get("max_file_bytes", 16 << 20))),
        # No real-time policy and no nice value below the one it starts with, whatever the
        # service was given: a SCHED_FIFO spin would take a core from everything else on it.
        (resource.RLIMIT_RTPRIO, 0),
        (resource.RLIMIT_NICE, 0),
    ):
        resource.setrlimit(limit, (value, value))
    _install_seccomp(mods["seccomp"])


def _landlock(libc: Any, read_paths: list[str], devices: list[str], workdir: str) -> None:
    """Landlock by raw syscalls: read-only beneath `read_paths`, read-write beneath `workdir`,
    nothing else; on ABI >= 4 no TCP bind/connect, on ABI >= 6 no signals or abstract Unix
    sockets reaching outside this process. Raises OSError when landlock is unavailable."""
    import ctypes

    create, add_rule, restrict = 444, 445, 446
    abi = libc.syscall(create, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        raise OSError(ctypes.get_errno(), "landlock is not available")
    handled = 0x1FFF | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)
    handled |= 1 << 15 if abi >= 5 else 0
    file_read, file_write = 1 | 4, 2 | (1 << 14 if abi >= 3 else 0)
    dir_read = file_read | 8

    class Attr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class Beneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]

    attr = Attr(handled, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(create, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        rules = [(p, dir_read if os.path.isdir(p) else file_read) for p in read_paths]
        rules += [(d, file_read | file_write) for d in devices]
        rules.append((workdir, handled))
        for path, allowed in rules:
            if not os.path.exists(path):
                continue
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = Beneath(allowed & handled, fd)
                if libc.syscall(add_rule, ruleset, 1, ctypes.byref(rule), 0) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path} failed")
            finally:
                os.close(fd)
        if libc.syscall(restrict, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


def _install_seccomp(sc: Any) -> None:
    import errno

    eperm = sc.ERRNO(errno.EPERM)
    me = os.getpid()
    clone_thread = 0x00010000
    flt = sc.SyscallFilter(sc.ALLOW)
    for name in (
        "socket", "socketpair", "execve", "execveat", "fork", "vfork", "ptrace",
        "process_vm_readv", "process_vm_writev", "mount", "umount2", "unshare", "setns",
        "pivot_root", "chroot", "bpf", "perf_event_open", "keyctl", "add_key", "request_key",
        "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
        "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
        "reboot", "swapon", "swapoff", "syslog", "acct", "settimeofday", "clock_settime",
        "open_by_handle_at", "name_to_handle_at", "pidfd_open", "pidfd_send_signal",
        "pidfd_getfd", "tkill", "mknod", "mknodat", "fsopen", "fsmount", "fsconfig",
        "move_mount", "open_tree", "mount_setattr", "setuid", "setgid", "setreuid",
        "setregid", "setresuid", "setresgid", "setgroups", "personality", "quotactl",
        "lookup_dcookie", "vhangup", "seccomp", "ioprio_set",
        # A new session is a new scheduling group (see worker_main); a process group is how
        # one would get back into another session's.
        "setsid", "setpgid",
        # Landlock does not cover watching a path: a watch on /tmp or another worker's
        # directory read another tenant's file names as they were made.
        "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
        # System V and POSIX IPC objects live in the IPC namespace every worker shares with the
        # zygote and outlive the worker that made them: a channel to the next tenant's
        # execution, and memory no worker's limit accounts for once its maker is gone.
        "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop", "semctl",
        "shmget", "shmat", "shmdt", "shmctl", "mq_open", "mq_unlink", "mq_timedsend",
        "mq_timedreceive", "mq_notify", "mq_getsetattr",
        # Every worker runs as the same uid, and landlock does not cover a file's mode, owner,
        # times or extended attributes: a worker could make another's directory read-only
        # (that tenant's next execution cannot write a file), or leave a read-only tree the
        # clean-up cannot empty. A file's mode is set when it is made (open, mkdir).
        "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat",
        "utime", "utimes", "utimensat", "futimesat",
        "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
    ):  # fmt: skip
        try:
            flt.add_rule(eperm, name)
        except (OSError, ValueError):
            continue  # a syscall this architecture does not have
    # Threads are fine, new processes are not; clone3 must answer ENOSYS so glibc falls back.
    flt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, clone_thread, 0))
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        flt.add_rule(eperm, name, sc.Arg(0, sc.NE, me))
    # Nor through a file's owner, which the kernel signals (with a signal of the owner's
    # choosing, F_SETSIG: SIGKILL) whenever the file turns ready under O_ASYNC, checking nothing
    # but the uid the zygote shares: only landlock's signal scoping (ABI 6) stopped a worker
    # that owned its request pipe to the zygote from killing it with the next reply. A file
    # keeps its default owner, none (leases and dnotify make the caller itself the owner).
    f_setown, f_setown_ex = 8, 15
    for command in (f_setown, f_setown_ex):
        flt.add_rule(eperm, "fcntl", sc.Arg(1, sc.EQ, command))
    fiosetown, siocspgrp, tiocspgrp = 0x8901, 0x8902, 0x5410  # the same, as ioctls
    for request in (fiosetown, siocspgrp, tiocspgrp):
        flt.add_rule(eperm, "ioctl", sc.Arg(1, sc.EQ, request))
    # The zygote and every other worker run as the same uid, which is all these calls check:
    # on another process they would lower the zygote's rlimits (no fd can reach it: the
    # sandbox stops serving everyone), or another tenant's CPU limit, nice value or scheduling
    # policy. Only pid 0 (the caller) is left.
    for name in (
        "prlimit64", "sched_setscheduler", "sched_setparam", "sched_setattr", "sched_setaffinity",
    ):  # fmt: skip
        flt.add_rule(eperm, name, sc.Arg(0, sc.NE, 0))
    prio_process = 0  # setpriority(PRIO_PROCESS, 0, n) only: not a group, a user or a pid
    flt.add_rule(eperm, "setpriority", sc.Arg(0, sc.NE, prio_process))
    flt.add_rule(eperm, "setpriority", sc.Arg(1, sc.NE, 0))
    flt.load()


class _Printer:
    """`print` of the namespace: captured, capped, never on the worker's stdout."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0

    def __call__(self, *args: Any, sep: str = " ", end: str = "\n", **_: Any) -> None:
        if self.size >= MAX_PRINT_CHARS:
            return
        text = sep.join(str(a) for a in args) + end
        self.parts.append(text[: MAX_PRINT_CHARS - self.size])
        self.size += len(text)

    def text(self) -> str:
        return "".join(self.parts)


def _arrow_bytes(mods: dict[str, Any], df: Any) -> bytes:
    import io

    pa, ipc = mods["pa"], mods["ipc"]
    frame = df.copy()
    if any(n is not None for n in frame.index.names):
        frame = frame.reset_index()
    frame.columns = [str(c) for c in frame.columns]
    for col in frame.columns:
        if frame[col].dtype == object:
            frame[col] = frame[col].map(lambda v: v if v is None else str(v))
    table = pa.Table.from_pandas(frame, preserve_index=False)
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def worker_main(
    in_fd: int, out_fd: int, workdir: str, config: dict[str, Any], mods: dict[str, Any]
) -> None:
    import resource

    # A process group of its own, in the zygote's session: a session of its own would be a
    # scheduling group of its own too (sched_autogroup), each weighing as much as the whole
    # service, whose CPU share sixteen spinning workers then cut to a seventeenth.
    os.setpgid(0, 0)
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    _confine(workdir, config, mods)
    pd, np, ipc = mods["pd"], mods["np"], mods["ipc"]
    max_frame = int(config.get("max_input_bytes", 64 << 20))
    request = decode_json(*read_frame(in_fd, max_frame))
    df = None
    if request.get("has_df"):
        _kind, payload = read_frame(in_fd, max_frame)
        df = ipc.open_stream(payload).read_all().to_pandas()
    limits = request.get("limits") or {}
    cpu = max(1, int(float(limits.get("cpu_seconds", 10)) + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(limits.get("memory_bytes", 0))
    if memory > 0:
        with open("/proc/self/statm") as f:
            vm_pages = int(f.read().split()[0])
        base = vm_pages * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (base + memory, base + memory))
    output_limit = int(limits.get("output_bytes", 1 << 20))
    max_calls = int(limits.get("max_tool_calls", 16))
    calls = [0]

    def send(obj: dict[str, Any], blob: bytes | None = None) -> None:
        if obj.get("type") in ("result", "error"):
            _empty(workdir)  # nothing the code wrote outlives its answer
        write_all(out_fd, encode_json(obj) + (encode_bytes(blob) if blob is not None else b""))

    def call_tool(name: str, inputs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run another tool through the registry with the caller's context."""
        if not isinstance(name, str):
            raise TypeError("call_tool(name, inputs): name must be a string")
        inputs = {} if inputs is None else inputs
        if not isinstance(inputs, dict):
            raise TypeError("call_tool(name, inputs): inputs must be a dict")
        calls[0] += 1
        if calls[0] > max_calls:
            return {
                "ok": False,
                "kind": "err",
                "error": f"call_tool limit reached: at most {max_calls} calls per execution",
                "code": "TOOL_CALL_LIMIT",
                "content": "",
                "table": None,
            }
        send({"type": "call_tool", "name": name, "inputs": json.loads(json.dumps(inputs))})
        reply = decode_json(*read_frame(in_fd, max_frame))
        table = None
        if reply.pop("has_table", False):
            _kind, payload = read_frame(in_fd, max_frame)
            table = ipc.open_stream(payload).read_all().to_pandas()
        reply["table"] = table
        return reply

    printer = _Printer()
    safe = {n: getattr(builtins, n) for n in SAFE_BUILTIN_NAMES if hasattr(builtins, n)}
    safe["print"] = printer
    namespace: dict[str, Any] = {
        "__builtins__": safe,
        "__name__": "custom_tool",
        "df": df,
        "pd": pd,
        "np": np,
        "inputs": request.get("inputs") or {},
        "call_tool": call_tool,
    }
    try:
        code = compile(request["code"], f"<tool {request.get('tool_name', '')}>", "exec")
        exec(code, namespace)  # the whole point, inside every layer above
    except MemoryError:
        send({"type": "error", "kind": "memory_limit", "message": "memory limit exceeded"})
        return
    except RecursionError:
        send({"type": "error", "kind": "execution_error", "message": "RecursionError"})
        return
    except BaseException as exc:  # noqa: BLE001 - user code failed: report it, never crash
        line = _user_line(exc)
        where = f" (line {line})" if line else ""
        message = _describe(exc, where)
        if _no_space(exc):
            cap = int(config.get("tmp_bytes") or 0)
            held = f"at most {cap >> 20} MiB, " if cap else ""
            message += f" — the sandbox's /tmp holds {held}shared by the executions running at once"
        send(
            {
                "type": "error",
                "kind": "disk_limit" if _no_space(exc) else "execution_error",
                "message": message,
            }
        )
        return
    _send_result(send, namespace, printer, output_limit, mods)


def _empty(workdir: str) -> None:
    try:
        names = os.listdir(workdir)
    except OSError:
        return
    for entry in names:
        path = os.path.join(workdir, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            remove_tree(path)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


def _describe(exc: BaseException, where: str = "") -> str:
    """`Type<where>: message` of an exception the code raised. Its class and its `__str__` are the
    code's own: one that raises (even SystemExit) or returns a non-string must not take the
    worker down with it, which left only "exit code 70" to report."""
    try:
        name = str(type.__getattribute__(type(exc), "__name__"))[:200]
    except BaseException:  # noqa: BLE001 - the code's own metaclass
        name = "an exception"
    try:
        text = str(exc)[:2000]
    except BaseException:  # noqa: BLE001 - the code's own __str__
        text = "(its message could not be rendered)"
    return f"{name}{where}: {text}"


def _no_space(exc: BaseException) -> bool:
    """Whether the code failed with ENOSPC (its /tmp full), read past any `errno` override."""
    import errno

    try:
        slot: Any = vars(OSError)["errno"]  # the member descriptor, not a subclass's errno
        return isinstance(exc, OSError) and slot.__get__(exc, OSError) == errno.ENOSPC
    except BaseException:  # noqa: BLE001 - the code's own exception class
        return False


def _user_line(exc: BaseException) -> int | None:
    tb = exc.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith("<tool"):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _send_result(
    send: Callable[..., None],
    namespace: dict[str, Any],
    printer: _Printer,
    output_limit: int,
    mods: dict[str, Any],
) -> None:
    pd = mods["pd"]
    if "result" not in namespace:
        printed = printer.text()
        send(
            {
                "type": "error",
                "kind": "no_result",
                "message": "the code never assigned `result`; assign your output to `result`"
                + (f" (it printed: {printed[:500]!r})" if printed else ""),
            }
        )
        return
    value = namespace["result"]
    try:
        blob = None
        if isinstance(value, pd.Series):
            value = value.to_frame()
        if isinstance(value, pd.DataFrame):
            text = value.to_string(max_rows=30, max_cols=15)
            blob = _arrow_bytes(mods, value)
            out: dict[str, Any] = {"type": "result", "form": "table", "content": text}
        elif isinstance(value, dict) and "message" in value:
            full = json.loads(json.dumps(value, default=str))
            out = {"type": "result", "form": "response", "response": full}
        else:
            out = {"type": "result", "form": "text", "content": str(value)}
        size = len(json.dumps(out, default=str)) + (len(blob) if blob else 0)
    except MemoryError:
        send({"type": "error", "kind": "memory_limit", "message": "memory limit exceeded"})
        return
    except BaseException as exc:  # noqa: BLE001 - rendering runs the code's own __str__ etc.
        send(
            {"type": "error", "kind": "execution_error", "message": f"bad result: {_describe(exc)}"}
        )
        return
    if size > output_limit:
        send(
            {
                "type": "error",
                "kind": "output_limit",
                "message": f"result is {size} bytes, over the {output_limit}-byte output limit",
            }
        )
        return
    out["has_table"] = blob is not None
    send(out, blob)


def _become(uid: int, gid: int) -> None:
    """Become host uid/gid `uid`/`gid` for good, with no supplementary groups and no
    capabilities, before anything else runs (the service is root: bwrap left this process
    CAP_SETUID, CAP_SETGID and CAP_SETPCAP for exactly this); then check no way back is left."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop, pr_set_pdeathsig = 24, 1
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last_cap = int(f.read())
    for cap in range(last_cap + 1):  # the bounding set: no capability can ever come back
        if libc.prctl(pr_capbset_drop, cap, 0, 0, 0) != 0:
            raise SystemExit(f"sandbox: cannot drop capability {cap} from the bounding set")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # all three non-zero: permitted, effective, ambient cleared

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]

    version_3 = 0x20080522
    if libc.capset(ctypes.byref(Header(version_3, 0)), (Data * 2)()) != 0:  # inheritable too
        raise SystemExit("sandbox: cannot clear the inheritable capabilities")
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    caps = [int(status[k].strip(), 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")]
    if os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3 or os.getgroups() or any(caps):
        raise SystemExit(f"sandbox: could not drop to uid {uid} gid {gid} without capabilities")
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise SystemExit("sandbox: uid 0 was still reachable after dropping privileges")
    # A credential change clears the parent-death signal: die with bwrap's init, as before.
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def main() -> None:
    config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    run_as = config.get("run_as")
    if run_as:
        _become(int(run_as[0]), int(run_as[1]))
    for path in config.get("site_paths", []):
        if path not in sys.path:
            sys.path.append(path)
    zygote_main(config)


if __name__ == "__main__":
    main()
