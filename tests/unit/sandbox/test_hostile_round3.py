"""Hostile code against the worker pool, round three (beyond test_hostile.py and
test_hostile_code.py): what one execution could do to the zygote every tenant's executions are
forked from (hold it up with a directory that takes seconds to remove, or signal it through a
pipe's owner on a kernel without landlock), to another tenant's files (watch their names, stat
them by a guessable path), to the service's share of the CPU (a scheduling group of its own per
worker), and to the service's own work and metrics (tables of thousands of columns, cards of
hundreds of thousands of values, code too large to parse quickly, error kinds of its own
making); and what a caller that cancels leaves behind. Every attempt starts from the real
builtins (the pre-check bypassed); each must end in a result or an Err naming the problem, with
the pool still serving."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from services.sandbox import precheck
from services.sandbox import worker as wire
from services.sandbox.admission import Origin
from services.sandbox.cgroups import host_pid
from services.sandbox.core import MAX_CARD_VALUES, Sandbox, validate_definition
from services.sandbox.host import Limits, RunOutcome, WorkerPool
from services.sandbox.ipc_check import MAX_TABLE_COLUMNS
from shared.errors import InvalidArgument
from tests.unit.sandbox.test_hostile import ESCAPE
from tests.unit.sandbox.test_hostile_code import forged_table

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The worker's own ends of its two pipes, as code that ignores the protocol finds them.
PIPE_ENDS = ESCAPE + (
    "import fcntl, stat\n"
    "def _pipe_end(mode):\n"
    "    for f in range(3, 64):\n"
    "        try:\n"
    "            fifo = stat.S_ISFIFO(os.fstat(f).st_mode)\n"
    "        except OSError:\n"
    "            continue\n"
    "        if fifo and fcntl.fcntl(f, fcntl.F_GETFL) & 3 == mode:\n"
    "            return f\n"
    "request_fd, reply_fd = _pipe_end(os.O_RDONLY), _pipe_end(os.O_WRONLY)\n"
)
LIMITS = Limits(wall_seconds=20, cpu_seconds=5, memory_bytes=256 << 20, output_bytes=1 << 20)


async def run(pool: WorkerPool, code: str, limits: Limits = LIMITS, **kw: object) -> RunOutcome:
    return await pool.run(code=code, inputs={}, tool_name="hostile", limits=limits, **kw)  # type: ignore[arg-type]


async def until(condition: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    """Poll `condition` (it watches other processes) until it holds, or fail after `timeout`."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while not condition():
        assert loop.time() < give_up, f"timed out waiting for {what or 'the condition'}"
        await asyncio.sleep(0.02)


async def alive(pool: WorkerPool) -> None:
    out = await run(pool, "result = 'alive'")
    assert out.ok and out.content == "alive", out


async def process_gone(pidfd: int, timeout: float = 15.0) -> None:
    """Wait until the process of `pidfd` has exited (a pidfd turns readable then)."""
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()

    def exited() -> None:
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(pidfd, exited)
    try:
        await asyncio.wait_for(gone, timeout)
    finally:
        loop.remove_reader(pidfd)


def _text(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        return None


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in lines if ":" in line)}


def zygote_children(zygote: int) -> list[int]:
    """Host pids of the processes whose parent is the zygote (its workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if _status(int(entry)).get("PPid") == str(zygote):
                    found.append(int(entry))
            except OSError:
                continue
    return found


async def zygote_of(pool: WorkerPool) -> int:
    worker = await pool.take()
    try:
        pid = host_pid(worker.pidfd)
        assert pid is not None
        return int(_status(pid)["PPid"])
    finally:
        worker.kill()
        worker.close()


# --- the zygote: every tenant's executions start from it ---------------------------------------


LINK_BOMB = ESCAPE + (
    "import time\n"
    "os.close(os.open('f', os.O_CREAT | os.O_WRONLY, 0o600))\n"
    "n, start = 0, time.monotonic()\n"
    "while time.monotonic() - start < 1.5:\n"
    "    for _ in range(1000):\n"
    "        os.link('f', str(n))\n"
    "        n += 1\n"
    "call_tool('made', {'links': n})\n"
    "time.sleep(60)\n"
)


async def test_removing_a_killed_workers_huge_directory_does_not_hold_up_new_workers(
    pool: WorkerPool,
) -> None:
    """A killed worker's directory is removed before its exit is reported. The zygote did that
    itself, between two spawns: hundreds of thousands of hard links (seconds of unlinking per
    second spent making them, a 30-second wall clock allowed minutes of it) kept the zygote
    from starting any tenant's worker until they were gone."""
    bomb = await pool.take()
    fresh = []
    try:
        request = {
            "tool_name": "bomb",
            "code": LINK_BOMB,
            "inputs": {},
            "has_df": False,
            "limits": {"cpu_seconds": 10, "memory_bytes": 512 << 20, "output_bytes": 1 << 16},
        }
        os.write(bomb.to_worker, wire.encode_json(request))
        kind, body = await asyncio.wait_for(
            asyncio.to_thread(wire.read_frame, bomb.from_worker, 1 << 20), 30
        )
        made = wire.decode_json(kind, body)
        assert made.get("type") == "call_tool", made
        assert made["inputs"]["links"] > 50_000, made  # enough to take a while to remove
        bomb.kill()
        await process_gone(bomb.pidfd)
        for _ in range(pool._ready.qsize() + 1):  # past the pre-started: one forked from now
            fresh.append(await asyncio.wait_for(pool.take(), 30))
        started_while_removing = not bomb.exited.done()
    finally:
        for worker in (bomb, *fresh):
            worker.kill()
            worker.close()
    assert started_while_removing, "new workers waited until the directory was removed"
    # The directory still goes before the exit is reported.
    await asyncio.wait_for(asyncio.shield(bomb.exited), 60)
    await alive(pool)


async def test_a_call_cancelled_while_its_worker_starts_leaves_no_worker_behind(
    pool: WorkerPool,
) -> None:
    """With the pre-started workers taken, a call waits for a worker of its own. Cancelled then
    (its caller gone, a deadline), the worker started anyway and was never told to stop: a
    process waiting for ever on a request, with its pipe and pidfd held by the service, one
    more for every such cancellation."""
    zygote = await zygote_of(pool)
    runs = [
        asyncio.ensure_future(run(pool, "result = 1", origin=Origin(f"tenant-{i}")))
        for i in range(pool._ready.qsize() + 3)  # more than are pre-started
    ]
    await asyncio.sleep(0)  # every run takes a worker or asks the zygote for one
    assert pool._pending, "no run waited for a worker to start: nothing was tested"
    for task in runs:
        task.cancel()
    await asyncio.gather(*runs, return_exceptions=True)
    await until(
        lambda: not pool._pending and len(pool._workers) == pool._ready.qsize(),
        what="every worker the pool knows of to be a pre-started one",
    )
    await until(
        lambda: len(zygote_children(zygote)) == pool._ready.qsize(),
        what="the zygote's only children to be the pre-started workers",
    )
    await alive(pool)


async def test_a_call_cancelled_while_it_connects_to_its_worker_closes_that_pipe_once(
    pool: WorkerPool,
) -> None:
    """The worker still held its reply pipe's descriptor while the transport on it connected:
    cancelled then, the call closed the descriptor as it let the worker go, and the transport
    closed it again a moment later — by then, possibly another execution's pipe that had been
    given the same number (here: EBADF in the event loop)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        for _ in range(3):
            await until(lambda: pool._ready.qsize() > 0, what="a pre-started worker")
            task = asyncio.ensure_future(run(pool, "result = 1"))
            await asyncio.sleep(0)  # it takes that worker and starts reading its pipe
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for _ in range(5):  # the transport's own closing runs from the loop
                await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert not errors, errors
    await alive(pool)


# --- another tenant's files --------------------------------------------------------------------


async def test_another_executions_file_names_cannot_be_watched(pool: WorkerPool) -> None:
    """Landlock covers opening and listing, not inotify: a worker watched /tmp and the other
    workers' directories and read, as they were made, the names of another tenant's files
    ('secret_customer_list.csv', and every write to it)."""
    code = ESCAPE + (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.inotify_init1(0)\n"
        "watched = [libc.inotify_add_watch(fd, p, 0xfff) for p in (b'/tmp', b'.')]\n"
        "result = (fd, watched, libc.fanotify_init(0, 0))"
    )
    out = await run(pool, code)
    assert out.ok and out.content == "(-1, [-1, -1], -1)", out


async def test_another_executions_directory_cannot_be_found_to_look_into(pool: WorkerPool) -> None:
    """Nor does landlock cover stat: with directories named /tmp/w1, /tmp/w2, … in the order
    workers start, one execution read the size and times of another tenant's files, by name,
    while they were being written. A worker's directory name is not guessable now."""
    release = asyncio.Event()
    written = asyncio.Event()

    async def park(name: str, inputs: dict[str, object]) -> tuple[dict[str, object], None]:
        written.set()
        await release.wait()
        return {"ok": True, "kind": "ok", "content": "", "error": None}, None

    victim = asyncio.ensure_future(
        run(
            pool,
            "pd.DataFrame({'a': range(1000)}).to_csv('payroll.csv')\n"
            "call_tool('park', {})\nresult = 'done'",
            on_call_tool=park,
            origin=Origin("tenant-victim"),
        )
    )
    try:
        await asyncio.wait_for(written.wait(), 30)
        out = await run(
            pool,
            ESCAPE
            + "mine = os.path.basename(os.getcwd())\n"
            + "n = int(''.join(c for c in mine.split('-')[0] if c.isdigit()))\n"
            + "seen = {}\n"
            + "for i in range(max(1, n - 50), n + 50):\n"
            + "    try:\n"
            + "        seen[i] = os.stat(f'/tmp/w{i}/payroll.csv').st_size\n"
            + "    except OSError:\n"
            + "        pass\n"
            + "result = seen",
            origin=Origin("tenant-spy"),
        )
    finally:
        release.set()
    assert out.ok and out.content == "{}", out
    done = await asyncio.wait_for(victim, 30)
    assert done.ok and done.content == "done", done


async def test_a_killed_executions_directory_is_gone_when_its_call_returns(
    pool: WorkerPool,
) -> None:
    """What test_hostile checks by probing /tmp/w<n>, with names no longer guessable: the
    killed execution names its directory itself, and the next one looks for it."""
    said: list[str] = []

    async def note(name: str, inputs: dict[str, str]) -> tuple[dict[str, object], None]:
        said.append(inputs["cwd"])
        return {"ok": True, "kind": "ok", "content": "", "error": None}, None

    killed = await run(
        pool,
        ESCAPE
        + "import time\nopen('left.txt', 'w').write('x')\n"
        + "call_tool('cwd', {'cwd': os.getcwd()})\ntime.sleep(60)",
        limits=Limits(wall_seconds=1, cpu_seconds=5),
        on_call_tool=note,
    )
    assert killed.error_kind == "timeout" and len(said) == 1, killed
    probe = await run(pool, ESCAPE + f"result = os.path.exists({said[0]!r})")
    assert probe.ok and probe.content == "False", probe


# --- the service's share of the CPU -----------------------------------------------------------


async def test_workers_share_one_scheduling_group_and_cannot_make_their_own(
    pool: WorkerPool,
) -> None:
    """Each worker started a session of its own, and with it (sched_autogroup) a scheduling
    group that weighed as much as the whole service: sixteen spinning executions on two cores
    left the service a seventeenth of the CPU (its own work ran 7x slower). Workers now stay in
    the zygote's session, all of them one group, and cannot leave it."""
    probe = ESCAPE + (
        "mine = os.getsid(0) == os.getpid()\n"
        "refused = []\n"
        "for call in (os.setsid, lambda: os.setpgid(0, 0)):\n"
        "    try:\n"
        "        call()\n"
        "    except OSError:\n"
        "        refused.append(True)\n"
        "result = (mine, refused)"
    )
    out = await run(pool, probe)
    assert out.ok and out.content == "(False, [True, True])", out
    idle = await pool.take()
    try:
        pid = host_pid(idle.pidfd)
        assert pid is not None
        zygote = _text(f"/proc/{_status(pid)['PPid']}/autogroup")  # None: no autogroups
        assert _text(f"/proc/{pid}/autogroup") == zygote
    finally:
        idle.kill()
        idle.close()


async def test_on_cgroup_v1_the_workers_weigh_as_one_cpu_group(pool: WorkerPool) -> None:
    """Without autogroups (disabled, or a service inside a cpu cgroup), every worker weighed as
    much as the service. Where the cpu hierarchy is writable the workers share one cgroup."""
    if pool._cgroups is None or _text("/sys/fs/cgroup/cpu/cgroup.procs") is None:
        pytest.skip("no writable cgroup v1 cpu hierarchy here")
    idle = await pool.take()
    try:
        pid = host_pid(idle.pidfd)
        assert pid is not None
        lines = (_text(f"/proc/{pid}/cgroup") or "").splitlines()
        cpu = next(line.split(":", 2)[2] for line in lines if ":cpu," in line or ":cpu:" in line)
        assert cpu.startswith("/toolmesh-sandbox-"), lines
    finally:
        idle.kill()
        idle.close()


# --- results the service pays for --------------------------------------------------------------


async def test_a_forged_table_of_tens_of_thousands_of_empty_columns_is_an_output_limit(
    pool: WorkerPool,
) -> None:
    """Columns with no rows hold no cells, which is all the cell budget counted: 24,000 null
    columns fit in a 1 MiB frame, and describing and encoding them took the service 8 s of
    CPU under the GIL (every other call waited), for a 4.8 MB response."""
    out = await run(
        pool, forged_table("blob = stream(pa.table({f'c{i}': pa.nulls(0) for i in range(6000)}))")
    )
    assert not out.ok and out.error_kind == "output_limit", out
    assert "columns" in out.message
    await alive(pool)


async def test_an_honest_table_wider_than_the_column_limit_is_an_output_limit(
    pool: WorkerPool,
) -> None:
    wide = MAX_TABLE_COLUMNS + 1
    out = await run(pool, f"result = pd.DataFrame({{f'c{{i}}': [i] for i in range({wide})}})")
    assert not out.ok and out.error_kind == "output_limit", out
    execution = await Sandbox(pool).execute(
        tool_name="t",
        code=f"result = pd.DataFrame({{f'c{{i}}': [i] for i in range({MAX_TABLE_COLUMNS})}})",
        inputs={},
        limits=LIMITS,
    )
    assert len(execution.result.envelope.schema) == MAX_TABLE_COLUMNS  # type: ignore[union-attr]


async def test_an_error_kind_the_worker_never_sends_is_not_passed_on(pool: WorkerPool) -> None:
    """The kind of a worker's error frame became the Err's err_kind, which the registry records
    as the `error.type` attribute of its tool-call metrics: code writing its own error frames
    made a new metric series per call (unbounded memory in every service recording them, or
    other tools' series pushed into the SDK's overflow). Only the kinds a worker sends pass."""
    kinds = []
    for kind in ("made-up-kind-7f3a", "memory_limit", ""):
        out = await run(
            pool,
            PIPE_ENDS
            + "import json, struct, time\n"
            + f"body = json.dumps({{'type': 'error', 'kind': {kind!r}, 'message': 'm'}}).encode()\n"
            + "os.write(reply_fd, struct.pack('>IB', len(body), 74) + body)\n"
            + "time.sleep(60)\n",
        )
        assert not out.ok and out.message == "m", out
        kinds.append(out.error_kind)
    assert kinds == ["execution_error", "memory_limit", "execution_error"]


async def test_cards_of_hundreds_of_thousands_of_values_are_an_err_not_seconds_of_the_loop(
    pool: WorkerPool,
) -> None:
    """Cards within the output limit and the depth limit, but of 200,000 one-item lists: the
    service turned them into a google.protobuf.Struct on its event loop (2.3 s with every other
    call waiting) for a 6 MB response. The values cards may hold are counted now."""
    code = f"result = {{'message': 'm', 'cards': [{{'k': [[0]] * {MAX_CARD_VALUES}}}]}}"
    execution = await Sandbox(pool).execute(tool_name="t", code=code, inputs={}, limits=LIMITS)
    assert getattr(execution.result.envelope, "err_kind", "") == "bad_result", execution
    assert f"{MAX_CARD_VALUES}" in execution.result.content
    fits = "result = {'message': 'm', 'cards': [{'k': list(range(1000))}, {'a': {'b': 1}}]}"
    execution = await Sandbox(pool).execute(tool_name="t", code=fits, inputs={}, limits=LIMITS)
    assert execution.result.cards == [{"k": list(range(1000))}, {"a": {"b": 1}}]


# --- code the service itself reads --------------------------------------------------------------


async def test_code_too_large_to_check_quickly_is_refused_before_it_is_parsed(
    pool: WorkerPool,
) -> None:
    """The pre-check parses a tool's code on the service's event loop, on every execution (and
    at registration): 1 MiB of plain assignments, within the registry's limit on an
    implementation, held every other call for 2.4 s per execution; the sandbox's own
    RegisterCustomTool took 64 MiB. Code over MAX_CODE_BYTES is refused without parsing it."""
    big = "x = 1\n" * (precheck.MAX_CODE_BYTES // 6 + 1)
    execution = await Sandbox(pool).execute(tool_name="t", code=big, inputs={}, limits=LIMITS)
    assert getattr(execution.result.envelope, "err_kind", "") == "code_rejected", execution
    assert f"{precheck.MAX_CODE_BYTES}" in execution.result.content
    with pytest.raises(InvalidArgument) as info:
        validate_definition("t", big, {"type": "object"}, "tenant")
    assert info.value.field_violations[0][0] == "tool.implementation"
    fits = "x = 1\n" * (precheck.MAX_CODE_BYTES // 6 - 10) + "result = x"
    assert precheck.check(fits) is None


# --- a kernel without landlock: the other layers on their own -----------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bare_pool() -> AsyncIterator[WorkerPool]:
    """Workers without landlock, as on a kernel that lacks it (the service runs there, with a
    warning), nor cgroups: seccomp, the namespaces and the rlimits have to hold by themselves.
    (Without cgroups it also stays out of the module pool's, which are named after the
    process.)"""
    pool = WorkerPool(size=1, landlock=False, cgroups=False)
    await pool.start()
    yield pool
    await pool.close()


SIGIO_OWNER = {
    "F_SETOWN": "fcntl.fcntl(fd, fcntl.F_SETOWN, target)",
    "F_SETOWN_EX": "fcntl.fcntl(fd, 15, struct.pack('ii', 1, target))",  # F_OWNER_PID
    "F_SETOWN to a group": "fcntl.fcntl(fd, fcntl.F_SETOWN, -os.getpgid(target))",
}


@pytest.mark.parametrize("owner", sorted(SIGIO_OWNER))
async def test_a_pipes_owner_cannot_be_set_to_make_io_signal_the_zygote(
    bare_pool: WorkerPool, owner: str
) -> None:
    """kill() is limited to the worker itself, but a file's owner gets a signal whenever it
    turns readable (O_ASYNC), of the owner's choosing (F_SETSIG), checked against nothing but
    the uid the zygote shares: the next reply from the host SIGKILLed the zygote, and with it
    every tenant's executions in flight."""
    generation, bwrap = bare_pool._generation, bare_pool._proc.pid if bare_pool._proc else 0
    code = PIPE_ENDS + (
        "import signal, struct\n"
        "target, fd = os.getppid(), request_fd\n"
        "try:\n"
        f"    {SIGIO_OWNER[owner]}\n"
        "    fcntl.fcntl(fd, 10, int(signal.SIGKILL))\n"  # F_SETSIG
        "    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)\n"
        "    call_tool('ping', {})\n"  # the host's reply makes the request pipe readable
        "    result = 'ESCAPED'\n"
        "except OSError as e:\n"
        "    result = 'blocked: ' + str(e)\n"
    )
    out = await run(bare_pool, code)
    assert out.ok and out.content.startswith("blocked"), out
    await alive(bare_pool)
    assert bare_pool._generation == generation
    assert (bare_pool._proc.pid if bare_pool._proc else 0) == bwrap
