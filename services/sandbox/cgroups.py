"""Per-worker cgroup limits, where the host lets us create cgroups: a pids limit (threads count,
so a thread bomb stops at it) and a memory limit, on cgroup v1 (`pids` and `memory`
hierarchies) or v2 (`pids.max`, `memory.max`); and one CPU group for all workers together, so
that however many run they weigh as much as one process against the service (on v2 the
per-service parent is that group wherever the cpu controller is enabled above it; on v1 every
worker joins one cgroup of the `cpu` hierarchy).
Best effort: when cgroups are not writable the sandbox still has its rlimits and seccomp, and
says so once in the log."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")


def host_pid(pidfd: int) -> int | None:
    """The pid (in this process's PID namespace) a pidfd refers to."""
    try:
        for line in Path(f"/proc/self/fdinfo/{pidfd}").read_text().splitlines():
            if line.startswith("Pid:"):
                pid = int(line.split()[1])
                return pid if pid > 0 else None
    except (OSError, ValueError):
        return None
    return None


class CgroupLimiter:
    """One cgroup per worker under a per-service parent; `None` dirs when unavailable."""

    def __init__(self, name: str, *, max_pids: int = 32, root: Path = ROOT) -> None:
        self._max_pids = max_pids
        self._parents: dict[str, Path] = {}  # controller -> parent dir
        self._v2 = (root / "cgroup.controllers").exists() and not (root / "pids").is_dir()
        controllers = ("",) if self._v2 else ("pids", "memory")
        for controller in controllers:
            parent = (root / controller / name) if controller else (root / name)
            try:
                parent.mkdir(exist_ok=True)
                if self._v2:
                    (parent / "cgroup.subtree_control").write_text("+pids +memory")
            except OSError as exc:
                logger.info("cgroup %s limits unavailable (%s); rlimits still apply", parent, exc)
                continue
            self._parents[controller] = parent
        self._cpu: Path | None = None  # v1: the cpu cgroup every worker joins
        if not self._v2 and (root / "cpu").is_dir():
            try:
                (root / "cpu" / name).mkdir(exist_ok=True)
                self._cpu = root / "cpu" / name
            except OSError as exc:
                logger.info("cgroup cpu group unavailable (%s); workers weigh one each", exc)

    @property
    def available(self) -> bool:
        return bool(self._parents) or self._cpu is not None

    def _dirs(self, wid: int) -> dict[str, Path]:
        return {c: p / f"w{wid}" for c, p in self._parents.items()}

    def attach(self, wid: int, pid: int) -> bool:
        """Create the worker's cgroups with the pids limit and move `pid` into them."""
        ok = True
        for controller, path in self._dirs(wid).items():
            try:
                path.mkdir(exist_ok=True)
                if controller in ("pids", ""):
                    (path / "pids.max").write_text(str(self._max_pids))
                (path / "cgroup.procs").write_text(str(pid))
            except OSError as exc:
                logger.warning("could not put worker %d in %s: %s", wid, path, exc)
                ok = False
        if self._cpu is not None:
            try:
                (self._cpu / "cgroup.procs").write_text(str(pid))
            except OSError as exc:
                logger.warning("could not put worker %d in %s: %s", wid, self._cpu, exc)
                ok = False
        return ok

    def limit_memory(self, wid: int, limit_bytes: int) -> None:
        for controller, path in self._dirs(wid).items():
            name = "memory.max" if controller == "" else "memory.limit_in_bytes"
            if controller in ("memory", ""):
                with contextlib.suppress(OSError):
                    (path / name).write_text(str(limit_bytes))

    def oom_killed(self, wid: int) -> bool:
        """Whether the kernel's OOM killer killed a task of the worker's memory cgroup (read
        before `release`): `oom_kill` in memory.oom_control (v1) or memory.events (v2)."""
        for controller, path in self._dirs(wid).items():
            if controller not in ("memory", ""):
                continue
            name = "memory.events" if controller == "" else "memory.oom_control"
            try:
                lines = (path / name).read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                    return True
        return False

    def release(self, wid: int) -> None:
        """Remove the worker's cgroups (after it exited)."""
        for path in self._dirs(wid).values():
            with contextlib.suppress(OSError):
                path.rmdir()

    def close(self, wait_s: float = 2.0) -> None:
        """Remove every cgroup this limiter made, waiting up to `wait_s` for killed workers to
        finish exiting (a cgroup with tasks cannot be removed)."""
        deadline = time.monotonic() + wait_s
        while True:
            left = 0
            for parent in self._parents.values():
                for child in parent.glob("w*"):
                    try:
                        child.rmdir()
                    except OSError:
                        left += 1
            if self._cpu is not None:
                try:
                    self._cpu.rmdir()
                    self._cpu = None
                except OSError:
                    left += 1
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for parent in self._parents.values():
            with contextlib.suppress(OSError):
                parent.rmdir()
        self._parents.clear()
        self._cpu = None


def default_name() -> str:
    return f"toolmesh-sandbox-{os.getpid()}"
