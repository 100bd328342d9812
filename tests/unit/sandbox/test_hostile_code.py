"""More hostile code against the worker pool, beyond test_hostile.py: what one execution could
leave for, or do to, the executions of other tenants (IPC objects in the namespace every worker
shares, the rlimits and scheduling of the zygote and of other workers, all of one uid), and what
a worker could make the host do with what it sends back (results the service cannot return,
tables that decode to far more than their bytes, frames the host's decoder chokes on). Every
attempt starts from the real builtins (the pre-check bypassed), and every one must end in a
result or an Err naming the problem, with the pool still serving."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.sandbox.cgroups import host_pid
from services.sandbox.core import Sandbox, outcome_to_result
from services.sandbox.host import CALL_LIMIT_GRACE, Limits, RunOutcome, WorkerPool
from services.sandbox.servicer import result_to_pb
from shared import convert
from shared.contract import ToolResult
from tests.unit.sandbox.test_hostile import ESCAPE

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIMITS = Limits(wall_seconds=20, cpu_seconds=5, memory_bytes=256 << 20, output_bytes=256 << 10)


async def run(pool: WorkerPool, code: str, limits: Limits = LIMITS) -> RunOutcome:
    return await pool.run(code=code, inputs={}, tool_name="hostile", limits=limits)


def attempt(body: str) -> str:
    """Code that runs `body` with the real os and reports what happened as `result`."""
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    return (
        ESCAPE
        + "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        + f"try:\n{indented}\n    result = 'ESCAPED'\nexcept Exception as e:\n"
        + "    result = 'blocked: ' + type(e).__name__ + ': ' + str(e)\n"
    )


async def assert_blocked(pool: WorkerPool, body: str) -> None:
    out = await run(pool, attempt(body))
    assert out.ok, out.message
    assert out.content.startswith("blocked"), out.content


def checked(call: str) -> str:
    """A libc call that raises OSError when it fails."""
    return f"r = {call}\nif r == -1 or r == ctypes.c_void_p(-1).value:\n" + (
        "    raise OSError(ctypes.get_errno(), 'refused')"
    )


async def alive(pool: WorkerPool) -> None:
    out = await run(pool, "result = 'alive'")
    assert out.ok and out.content == "alive", out


# --- state one execution could leave for the next -------------------------------------------


IPC_CREAT = 0o1000


@pytest.mark.parametrize(
    "body",
    [
        checked(f"libc.msgget(0x5151, {IPC_CREAT} | 0o666)"),
        checked(f"libc.shmget(0x5252, 1 << 20, {IPC_CREAT} | 0o666)"),
        checked(f"libc.semget(0x5353, 1, {IPC_CREAT} | 0o666)"),
        checked("libc.mq_open(b'/leak', 0o100 | 2, 0o666, None)"),
    ],
)
async def test_no_ipc_object_can_be_made_to_outlive_the_execution(
    pool: WorkerPool, body: str
) -> None:
    await assert_blocked(pool, body)


async def test_a_message_left_in_a_sysv_queue_never_reaches_the_next_execution(
    pool: WorkerPool,
) -> None:
    """Every worker shares the zygote's IPC namespace: a queue (or shared memory segment) made
    by one execution would outlive it, readable by the next tenant's."""
    sender = (
        "class Msg(ctypes.Structure):\n"
        "    _fields_ = [('mtype', ctypes.c_long), ('mtext', ctypes.c_char * 32)]\n"
        f"q = libc.msgget(0x5454, {IPC_CREAT} | 0o666)\n"
        "libc.msgsnd(q, ctypes.byref(Msg(1, b'tenant-a-secret')), 32, 0)\n"
        f"s = libc.shmget(0x5555, 4096, {IPC_CREAT} | 0o666)\n"
        "libc.shmat.restype = ctypes.c_void_p\n"
        "a = libc.shmat(s, None, 0)\n"
        "if s >= 0:\n"
        "    ctypes.memmove(a, b'tenant-a-secret', 15)\n"
        "result = (q, s)"
    )
    receiver = (
        "class Msg(ctypes.Structure):\n"
        "    _fields_ = [('mtype', ctypes.c_long), ('mtext', ctypes.c_char * 32)]\n"
        "m = Msg()\n"
        "libc.msgrcv(libc.msgget(0x5454, 0), ctypes.byref(m), 32, 0, 0o4000)\n"
        "libc.shmat.restype = ctypes.c_void_p\n"
        "s = libc.shmget(0x5555, 0, 0)\n"
        "seen = ctypes.string_at(libc.shmat(s, None, 0), 15) if s >= 0 else b''\n"
        "result = repr((m.mtext, seen))"
    )
    prelude = ESCAPE + "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    made = await run(pool, prelude + sender)
    assert made.ok and made.content == "(-1, -1)", made
    read = await run(pool, prelude + receiver)
    assert read.ok, read.message
    assert "tenant-a-secret" not in read.content, read.content


# --- what one execution could do to the zygote or to another tenant's worker -----------------


async def _zygote_pid(pool: WorkerPool) -> int:
    """The zygote's host pid: the parent of a worker."""
    worker = await pool.take()
    try:
        pid = host_pid(worker.pidfd)
        assert pid is not None
        status = _proc(pid, "status").splitlines()
        return int(next(line for line in status if line.startswith("PPid:")).split()[1])
    finally:
        worker.kill()
        worker.close()


def _proc(pid: int, name: str) -> str:
    return Path(f"/proc/{pid}/{name}").read_text()


def _stat(pid: int) -> dict[str, str]:
    text = _proc(pid, "stat")
    fields = text[text.rindex(")") + 2 :].split()
    return {"nice": fields[16], "policy": fields[38]}


@pytest.mark.parametrize(
    "body",
    [
        "import resource\nresource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (4, 4))",
        "import resource\nresource.prlimit(os.getppid(), resource.RLIMIT_CPU, (1, 1))",
        "os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)",
        "os.setpriority(os.PRIO_USER, 0, 19)",
        "os.setpriority(os.PRIO_PGRP, os.getpgid(os.getppid()), 19)",
        "os.sched_setscheduler(os.getppid(), os.SCHED_IDLE, os.sched_param(0))",
        "os.sched_setaffinity(os.getppid(), {0})",
        checked("libc.syscall(251, 1, os.getppid(), (3 << 13) | 7)"),  # ioprio_set, idle class
    ],
)
async def test_the_zygote_and_other_workers_limits_and_scheduling_are_out_of_reach(
    pool: WorkerPool, body: str
) -> None:
    """Worker and zygote share one uid, which is all prlimit and the scheduler calls check:
    a worker that lowered the zygote's RLIMIT_NOFILE left it unable to take a worker's pipes,
    and every tenant's next execution failed UNAVAILABLE after a minute, for good."""
    zygote = await _zygote_pid(pool)
    limits_before = _proc(zygote, "limits")
    stat_before = _stat(zygote)
    await assert_blocked(pool, body)
    assert _proc(zygote, "limits") == limits_before
    assert _stat(zygote) == stat_before
    await alive(pool)


async def test_a_worker_still_sets_its_own_limits_and_priority(pool: WorkerPool) -> None:
    out = await run(
        pool,
        ESCAPE
        + "import resource\n"
        + "resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))\n"
        + "os.setpriority(os.PRIO_PROCESS, 0, 5)\n"
        + "os.sched_setaffinity(0, os.sched_getaffinity(0))\n"
        + "result = resource.getrlimit(resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, 0)",
    )
    assert out.ok and out.content == "((32, 32), 5)", out


async def test_a_pre_started_worker_is_out_of_reach_of_the_running_one(pool: WorkerPool) -> None:
    idle = await pool.take()  # a worker waiting for its request, as another tenant's would be
    try:
        pid = host_pid(idle.pidfd)
        assert pid is not None
        before = _proc(pid, "limits")
        # Its pid inside the namespace: workers are the zygote's children, numbered upwards.
        out = await run(
            pool,
            ESCAPE
            + "import resource\nhit = []\n"
            + "for p in range(2, os.getpid()):\n"
            + "    try:\n"
            + "        resource.prlimit(p, resource.RLIMIT_CPU, (0, 0))\n"
            + "        hit.append(p)\n"
            + "    except OSError:\n"
            + "        pass\n"
            + "result = hit",
        )
        assert out.ok and out.content == "[]", out
        assert _proc(pid, "limits") == before
    finally:
        idle.kill()
        idle.close()


# --- results the service could not send on, or must not act on -------------------------------


def forge(frames: str, setup: str = "") -> str:
    """Code that runs `setup`, then writes `frames` (an expression of bytes) straight to its
    reply pipe, as a worker that ignores the protocol would, then waits to be killed."""
    return (
        ESCAPE
        + setup
        + "\nimport json, struct, time\n"
        + "def frame(kind, body):\n"
        + "    return struct.pack('>IB', len(body), kind) + body\n"
        + "def j(obj):\n"
        + "    return frame(74, json.dumps(obj).encode())\n"
        + "out = max(int(f) for f in os.listdir('/proc/self/fd') if int(f) > 2)\n"
        + f"os.write(out, {frames})\n"
        + "time.sleep(60)\n"
    )


DEEP_CARD = "card = 1\nfor _ in range(40):\n    card = {'k': card}\n"


@pytest.mark.parametrize(
    "code",
    [
        # Exports name host files: a sandboxed tool has none (the dispatcher would register any
        # file under the data dir for download).
        "result = {'message': 'm', 'exports': {'db': {'path': 'toolmesh.db'}}}",
        "result = {'message': 'm', 'datasets': {'t': [1, 2, 3]}}",
        "result = {'message': 'm', 'cards': 'not a list'}",
        "result = {'message': 'm', 'cards': [1, 2]}",
        DEEP_CARD + "result = {'message': 'm', 'cards': [card]}",
        "result = {'message': 'm', 'cost': float('inf')}",
        "result = {'message': 'm', 'cost': -5}",
        # math.isfinite raised OverflowError on it: INTERNAL.
        "result = {'message': 'm', 'cost': 10**400}",
    ],
)
async def test_a_response_the_service_cannot_return_is_an_err_naming_it(
    pool: WorkerPool, code: str
) -> None:
    """Before, each of these failed the RPC (INTERNAL: a TypeError or AttributeError in the
    conversion, or a card the registry could not parse back) or, for exports, was passed on."""
    execution = await Sandbox(pool).execute(tool_name="t", code=code, inputs={}, limits=LIMITS)
    assert execution.result.envelope is not None
    assert getattr(execution.result.envelope, "err_kind", "") == "bad_result", execution.result
    wire = convert.tool_result_to_pb(execution.result)
    assert type(wire).FromString(wire.SerializeToString()).envelope.err.err_kind == "bad_result"


async def test_a_response_with_cards_and_a_cost_still_comes_back(pool: WorkerPool) -> None:
    execution = await Sandbox(pool).execute(
        tool_name="t",
        code="result = {'message': 'm', 'cards': [{'a': {'b': [1, 2]}}], 'cost': 0.25}",
        inputs={},
        limits=LIMITS,
    )
    assert execution.result.cards == [{"a": {"b": [1, 2]}}] and execution.result.cost == 0.25


async def test_a_forged_table_that_is_not_arrow_ipc_is_an_err(pool: WorkerPool) -> None:
    head = "j({'type': 'result', 'form': 'table', 'content': 't', 'has_table': True})"
    out = await run(pool, forge(head + " + frame(66, b'not arrow at all')"))
    assert not out.ok and out.error_kind == "bad_result", out
    # The core does not trust what reaches it either (before, this raised: INTERNAL).
    result = outcome_to_result("t", RunOutcome(ok=True, form="table", table_ipc=b"junk"))
    assert getattr(result.envelope, "err_kind", "") == "bad_result", result


def forged_table(build: str) -> str:
    """A forged result frame whose table is the Arrow IPC stream `build` leaves in `blob`."""
    setup = (
        "import io, pyarrow as pa, pyarrow.ipc as ipc\n"
        "def stream(table, **options):\n"
        "    sink = io.BytesIO()\n"
        "    with ipc.new_stream(sink, table.schema, **options) as writer:\n"
        "        writer.write_table(table)\n"
        "    return sink.getvalue()\n" + build
    )
    head = "j({'type': 'result', 'form': 'table', 'content': 't', 'has_table': True})"
    return forge(head + " + frame(66, blob)", setup)


@pytest.mark.parametrize(
    ("build", "kind"),
    [
        # 10^8 nulls: a 600-byte stream that decoded to an 800 MB object column in the host.
        ("blob = stream(pa.table({'a': pa.nulls(100_000_000)}))", "output_limit"),
        # A compressed buffer states its own decompressed size.
        (
            "blob = stream(pa.table({'a': [0] * 1000}), "
            "options=ipc.IpcWriteOptions(compression='zstd'))",
            "bad_result",
        ),
        # 100,000 intervals run-end encoded in a few hundred bytes (520,000 within the default
        # output limit): converting them took the
        # host seconds on its event loop, with every other call waiting.
        (
            "vals = pa.array([pa.MonthDayNano([1, 2, 3])], type=pa.month_day_nano_interval())\n"
            "ree = pa.RunEndEncodedArray.from_arrays(pa.array([100_000], pa.int32()), vals)\n"
            "blob = stream(pa.table({'a': ree}))",
            "bad_result",
        ),
        (
            "blob = stream(pa.table({'a': pa.array(['x'], type=pa.string_view())}))",
            "bad_result",
        ),
        # A string whose offsets reach far past its 7-byte buffer: converting it read the host's
        # memory (or segfaulted the service, for offsets that left the mapping).
        (
            "import struct\nblob = stream(pa.table({'s': ['ZZZZZZZ']}))\n"
            "at = blob.find(b'ZZZZZZZ') - 4\n"
            "blob = blob[:at] + struct.pack('<i', 3000) + blob[at + 4:]",
            "bad_result",
        ),
    ],
)
async def test_a_forged_table_the_host_must_not_decode_is_an_err(
    pool: WorkerPool, build: str, kind: str
) -> None:
    out = await run(pool, forged_table(build))
    assert not out.ok and out.error_kind == kind, out
    await alive(pool)


@pytest.mark.parametrize(
    "build",
    [
        # pandas metadata naming an index column that is not there: TypeError in to_pandas.
        "t = pa.table({'a': [1, 2, 3]})\n"
        "blob = stream(t.replace_schema_metadata({'pandas': "
        '\'{"index_columns": [7], "columns": [], "column_indexes": []}\'}))',
        # Two columns of one name: AttributeError measuring the schema.
        "blob = stream(pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=['a', 'a']))",
    ],
)
async def test_a_forged_table_that_decodes_into_nonsense_is_an_err_not_a_failed_rpc(
    pool: WorkerPool, build: str
) -> None:
    out = await run(pool, forged_table(build))
    assert out.ok and out.table_ipc is not None, out  # well-formed Arrow: the host passes it on
    result = await asyncio.to_thread(outcome_to_result, "t", out)
    assert getattr(result.envelope, "err_kind", "") == "bad_result", result
    await alive(pool)


async def test_a_result_that_cannot_be_encoded_is_an_err_bad_result_on_the_wire() -> None:
    result = ToolResult(content="m", cards=[{"n": 10**400}])
    wire = await result_to_pb("t", result)
    assert wire.envelope.err.err_kind == "bad_result"
    assert "cannot be sent" in wire.envelope.err.message


async def test_a_worker_that_keeps_calling_past_its_limit_is_stopped(pool: WorkerPool) -> None:
    """Each refused call still cost the host a frame to read and decode (up to the output
    limit): code calling in a loop kept the service's CPU busy for its whole wall time."""
    limits = Limits(
        wall_seconds=20,
        cpu_seconds=5,
        memory_bytes=256 << 20,
        output_bytes=256 << 10,
        max_tool_calls=3,
    )
    call = "j({'type': 'call_tool', 'name': 'ping', 'inputs': {'pad': 'x' * 1000}})"
    code = forge(f"b''.join({call} for _ in range(50))")
    out = await pool.run(code=code, inputs={}, tool_name="hostile", limits=limits)
    assert not out.ok and out.error_kind == "tool_call_limit", out
    assert out.tool_calls == 3 + CALL_LIMIT_GRACE + 1
    await alive(pool)


@pytest.mark.parametrize("end", ["result = 'deep'", "os._exit(0)"])
async def test_a_tree_thousands_of_levels_deep_is_cleaned_up_and_the_zygote_lives(
    pool: WorkerPool, end: str
) -> None:
    """shutil.rmtree recursed once per level when the zygote reaped the worker: RecursionError,
    which killed the zygote and every execution in flight, of every tenant. A worker that
    answers empties its directory itself; one that exits without answering leaves it to the
    zygote."""
    zygote = pool._proc.pid if pool._proc is not None else None
    code = (
        ESCAPE
        + "for _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n"
        + "with open('leaf', 'w') as f:\n    f.write('x')\n"
        + end
    )
    out = await run(pool, code)
    assert out.ok == (end != "os._exit(0)"), out
    for _ in range(3):
        await alive(pool)
    assert (pool._proc.pid if pool._proc is not None else None) == zygote


@pytest.mark.parametrize(
    "body",
    [
        "os.mkdir('ro')\nos.chmod('ro', 0o500)",
        "os.chmod('.', 0o500)",
        "os.utime('.', (0, 0))",
        "open('f', 'w').close()\nos.setxattr('f', 'user.k', b'v')",
        "os.chown('.', 65534, 65534)",
    ],
)
async def test_modes_times_and_attributes_of_files_cannot_be_changed(
    pool: WorkerPool, body: str
) -> None:
    """Every worker runs as one uid and landlock leaves these alone: a worker made another's
    directory read-only, or left a read-only tree no clean-up could empty."""
    await assert_blocked(pool, body)


async def test_an_honest_table_of_more_cells_than_output_bytes_is_an_output_limit(
    pool: WorkerPool,
) -> None:
    """All-None columns are Arrow's null type, which costs no bytes at all: without a count of
    cells the output limit did not bound what every service decoding the result would hold."""
    out = await run(pool, "result = pd.DataFrame({'a': [None] * 400_000})")
    assert not out.ok and out.error_kind == "output_limit", out
    ok = await run(pool, "result = pd.DataFrame({'a': [None] * 1000, 'b': range(1000)})")
    assert ok.ok and ok.form == "table", ok


@pytest.mark.parametrize("field", ["inputs", "content"])
async def test_a_frame_nested_past_the_hosts_recursion_limit_is_a_protocol_error(
    pool: WorkerPool, field: str
) -> None:
    """json.loads raised RecursionError in the host, which nothing caught: INTERNAL."""
    kind = "call_tool" if field == "inputs" else "result"
    body = f'b\'{{"type": "{kind}", "name": "x", "{field}": \' + b\'[\' * 50000 + b\']\' * 50000'
    out = await run(pool, forge(f"frame(74, {body} + b'}}')"))
    assert not out.ok and out.error_kind == "protocol_error", out
    await alive(pool)


# --- code that breaks the worker's own reporting --------------------------------------------


@pytest.mark.parametrize(
    ("code", "named"),
    [
        (
            "class E(Exception):\n    def __str__(self):\n        raise E()\nraise E()",
            "E (line 4)",
        ),
        (
            ESCAPE + "class R:\n    def __str__(self):\n        raise SystemExit(3)\nresult = R()",
            "SystemExit",
        ),
        (
            ESCAPE + "class R:\n    def __str__(self):\n        raise KeyboardInterrupt\n"
            "result = R()",
            "KeyboardInterrupt",
        ),
    ],
)
async def test_an_exception_that_cannot_be_rendered_is_still_an_execution_error(
    pool: WorkerPool, code: str, named: str
) -> None:
    """Before, the worker raised again while reporting it and died: Err crashed, exit code 70."""
    out = await run(pool, code)
    assert not out.ok and out.error_kind == "execution_error", out
    assert named in out.message, out.message


@pytest.mark.parametrize(
    "fill",
    [
        "for i in range(100):\n    with open(f'f{i}', 'wb') as f:\n        f.write(chunk)",
        "fds = [os.memfd_create(f'm{i}') for i in range(40)]\nfor fd in fds:\n"
        "    os.write(fd, chunk)",
    ],
)
async def test_filling_tmp_or_memfds_past_the_cgroup_limit_is_an_err_memory_limit(
    pool: WorkerPool, fill: str
) -> None:
    """Files in the private /tmp (a tmpfs) and memfds are memory no RLIMIT_AS counts; the
    cgroup's OOM killer stops them, which was reported as an unexplained Err `killed`."""
    if pool._cgroups is None:
        pytest.skip("cgroups are not writable here; rlimits and seccomp still apply")
    code = ESCAPE + "chunk = b'x' * (16 << 20)\n" + fill + "\nresult = 'ESCAPED'"
    out = await run(pool, code)
    assert not out.ok and out.error_kind == "memory_limit", out
    await alive(pool)
