"""Hostile code against the worker pool itself, with the in-language pre-check bypassed on
purpose: every attempt starts from the real `os`/`__import__`, reached by the classic frame and
subclass walks, so what contains it is the operating system (bubblewrap namespaces, landlock,
seccomp, rlimits, the host's wall clock) — and the pool keeps serving afterwards."""

from __future__ import annotations

import ast
import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pandas as pd
import pytest
import pytest_asyncio

from services.sandbox.cgroups import host_pid
from services.sandbox.host import Limits, RunOutcome, WorkerPool
from shared.arrow_ipc import dataframe_to_ipc, ipc_to_dataframe
from shared.errors import Unavailable

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The escape every in-process Python sandbox falls to: real builtins through a subclass walk.
ESCAPE = """
_wc = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "catch_warnings"][0]
_b = _wc()._module.__builtins__
__builtins__.update(_b)
import ast
import asyncio
import os
"""

SECRET = "toolmesh-secret-7f3a91"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool() -> AsyncIterator[WorkerPool]:
    os.environ["TOOLMESH_TEST_SECRET"] = SECRET  # the host has a secret; workers must not see it
    pool = WorkerPool(size=2)
    await pool.start()
    yield pool
    await pool.close()
    os.environ.pop("TOOLMESH_TEST_SECRET", None)


LIMITS = Limits(wall_seconds=20, cpu_seconds=5, memory_bytes=256 << 20, output_bytes=256 << 10)


async def run(pool: WorkerPool, code: str, **kw: object) -> RunOutcome:
    return await pool.run(
        code=code,
        inputs=kw.pop("inputs", {}),  # type: ignore[arg-type]
        tool_name="hostile",
        limits=kw.pop("limits", LIMITS),  # type: ignore[arg-type]
        df_ipc=kw.pop("df_ipc", None),  # type: ignore[arg-type]
    )


def attempt(body: str) -> str:
    """Code that runs `body` with the real os and reports what happened as `result`."""
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    return (
        ESCAPE
        + f"try:\n{indented}\n    result = 'ESCAPED'\nexcept Exception as e:\n"
        + ("    result = 'blocked: ' + type(e).__name__ + ': ' + str(e)\n")
    )


async def assert_blocked(pool: WorkerPool, body: str) -> str:
    out = await run(pool, attempt(body))
    assert out.ok, out.message
    assert out.content.startswith("blocked"), out.content
    return out.content


async def test_the_escape_reaches_real_os_so_the_os_layers_are_what_is_tested(
    pool: WorkerPool,
) -> None:
    out = await run(pool, ESCAPE + "result = os.getuid(), os.getpid() > 0")
    assert out.ok, out.message
    assert out.content == "(65534, True)"


def _host_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in lines)}


async def test_workers_and_their_zygote_seen_from_the_host_are_unprivileged(
    pool: WorkerPool,
) -> None:
    worker = await pool.take()
    try:
        pid = host_pid(worker.pidfd)
        assert pid is not None
        mine = _host_status(pid)
        zygote = _host_status(int(mine["PPid"]))
    finally:
        worker.kill()
        worker.close()
    root = os.geteuid() == 0
    expected = str(65534 if root else os.geteuid())
    for status in (mine, zygote):
        assert status["Uid"].split() == [expected] * 4, status
        assert status["Groups"] == "", status
        assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == 0, status
        if root:  # nothing left to regain either
            assert int(status["CapBnd"], 16) == int(status["CapInh"], 16) == 0, status
    assert mine["Seccomp"] == "2" and mine["NoNewPrivs"] == "1", mine


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "/etc/hostname", "/root/.bashrc", "/proc/1/environ", "/proc/1/cmdline"],
)
async def test_files_outside_the_view_cannot_be_read(pool: WorkerPool, path: str) -> None:
    await assert_blocked(pool, f"open({path!r}, 'rb').read(1)")


async def test_the_service_data_dir_and_project_are_not_visible(
    pool: WorkerPool, tmp_path: Path
) -> None:
    secret = tmp_path / "toolmesh.db"
    secret.write_text("data")
    await assert_blocked(pool, f"open({str(secret)!r}).read()")
    await assert_blocked(pool, f"open({str(Path.cwd() / 'pyproject.toml')!r}).read()")


async def test_no_other_process_is_visible_in_proc(pool: WorkerPool) -> None:
    out = await run(
        pool,
        ESCAPE
        + "me = str(os.getpid())\n"
        + "seen = []\n"
        + "try:\n"
        + "    pids = [d for d in os.listdir('/proc') if d.isdigit() and d != me]\n"
        + "except PermissionError:\n"
        + "    pids = [str(p) for p in range(1, 200) if str(p) != me]\n"
        + "for p in pids:\n"
        + "    try:\n"
        + "        seen.append((p, open('/proc/' + p + '/environ','rb').read()[:40]))\n"
        + "    except Exception as e:\n"
        + "        pass\n"
        + "result = repr(seen)",
    )
    assert out.ok, out.message
    assert out.content == "[]"


async def test_the_environment_holds_no_secret(pool: WorkerPool) -> None:
    # Run as root, the service drops workers to an unprivileged host uid: a non-dumpable
    # worker's own /proc entries then belong to root and are not even readable to it.
    out = await run(
        pool,
        ESCAPE
        + "try:\n    env = open('/proc/self/environ', 'rb').read().decode()\n"
        + "except PermissionError:\n    env = 'unreadable'\n"
        + "result = repr(dict(os.environ)) + env",
    )
    assert out.ok, out.message
    assert SECRET not in out.content
    assert "TOOLMESH" not in out.content


async def test_files_written_do_not_outlive_the_execution(pool: WorkerPool) -> None:
    out = await run(pool, ESCAPE + "open('leftover.txt', 'w').write('x')\nresult = os.getcwd()")
    assert out.ok, out.message
    workdir = out.content
    again = await run(
        pool,
        ESCAPE
        + f"import os.path\nresult = os.path.exists({workdir!r} + '/leftover.txt'), "
        + "os.listdir('.')",
    )
    assert again.ok, again.message
    assert again.content == "(False, [])", again.content
    # A killed execution's files are gone too (the zygote removes its directory).
    limits = Limits(wall_seconds=1, cpu_seconds=5)
    killed = await run(
        pool,
        ESCAPE + "open('left.txt', 'w').write('x')\nimport time\ntime.sleep(30)",
        limits=limits,
    )
    assert killed.error_kind == "timeout"
    probe = await run(
        pool,
        ESCAPE
        + "import os.path\n"
        + f"result = [i for i in range({pool._next_id + 3}) if os.path.exists(f'/tmp/w{{i}}')"
        + " and f'/tmp/w{i}' != os.getcwd()]",
    )
    assert probe.ok, probe.message
    # Only the pre-started workers' (empty) directories exist; none of a finished execution.
    assert len(ast.literal_eval(probe.content)) <= 2, probe.content
    for target in ("/usr/evil", "/tmp/evil", "/evil", "/proc/evil"):
        await assert_blocked(pool, f"open({target!r}, 'w').write('x')")


@pytest.mark.parametrize(
    "body",
    [
        "assert os.system('true') == 0, 'spawn refused'",
        "import subprocess\nsubprocess.run(['/bin/true'])",
        "os.execv('/usr/bin/true', ['true'])",
        "os.posix_spawn('/usr/bin/true', ['true'], {})",
        "pid = os.fork()\nif pid == 0:\n    os._exit(0)",
    ],
)
async def test_processes_cannot_be_spawned_or_forked(pool: WorkerPool, body: str) -> None:
    await assert_blocked(pool, body)


@pytest.mark.parametrize(
    "body",
    [
        "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)",
        "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
        "import socket\nsocket.socket(socket.AF_UNIX, socket.SOCK_STREAM)",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:1/', timeout=1)",
    ],
)
async def test_sockets_cannot_be_opened_even_to_loopback(pool: WorkerPool, body: str) -> None:
    await assert_blocked(pool, body)


@pytest.mark.parametrize(
    "body",
    [
        "os.kill(1, 9)",
        "os.kill(-1, 9)",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.ptrace(16, 1, 0, 0) == 0, 'ptrace refused'",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.unshare(0x10000000) == 0, 'unshare refused'",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0, 'mount refused'",
    ],
)
async def test_signals_ptrace_and_namespace_calls_are_refused(pool: WorkerPool, body: str) -> None:
    await assert_blocked(pool, body)


@pytest.mark.parametrize(
    "body",
    [
        "pd.read_csv('/etc/passwd')",
        "pd.read_pickle('/etc/shadow')",
        "np.load('/etc/passwd', allow_pickle=True)",
        "pd.DataFrame({'a': [1]}).to_pickle('/usr/lib/evil.pkl')",
        "np.save('/usr/evil.npy', np.arange(3))",
        "pd.DataFrame({'a': [1]}).to_csv('/proc/1/cwd/evil.csv')",
    ],
)
async def test_pandas_and_numpy_file_and_pickle_io_is_contained(
    pool: WorkerPool, body: str
) -> None:
    await assert_blocked(pool, body)


async def test_a_memory_bomb_is_an_err_naming_the_memory_limit(pool: WorkerPool) -> None:
    out = await run(pool, "x = np.ones((1024, 1024, 512))\nresult = 1")
    assert not out.ok and out.error_kind == "memory_limit", out


async def test_a_cpu_bomb_is_killed_by_the_cpu_limit(pool: WorkerPool) -> None:
    limits = Limits(wall_seconds=30, cpu_seconds=1)
    out = await run(pool, "while True:\n    pass", limits=limits)
    assert not out.ok and out.error_kind == "cpu_limit", out


async def test_a_sleeping_worker_is_killed_by_the_wall_clock(pool: WorkerPool) -> None:
    limits = Limits(wall_seconds=1, cpu_seconds=5)
    out = await run(pool, ESCAPE + "import time\ntime.sleep(30)\nresult = 1", limits=limits)
    assert not out.ok and out.error_kind == "timeout", out


async def test_output_over_the_limit_is_an_err_naming_it(pool: WorkerPool) -> None:
    limits = Limits(output_bytes=10_000)
    out = await run(pool, "result = 'x' * 50_000", limits=limits)
    assert not out.ok and out.error_kind == "output_limit", out
    # A forged frame far over the limit is cut off by the host, not buffered.
    forged = (
        ESCAPE
        + "import struct\nbody = b'{' + b' ' * 5_000_000 + b'}'\n"
        + "fds = [int(f) for f in os.listdir('/proc/self/fd')]\n"
        + "for fd in fds:\n"
        + "    try:\n"
        + "        os.write(fd, struct.pack('>IB', len(body), 74) + body)\n"
        + "    except Exception:\n"
        + "        pass\n"
        + "result = 'sent'"
    )
    out = await run(pool, forged, limits=limits)
    assert not out.ok and out.error_kind == "output_limit", out


async def test_threads_still_work_under_the_seccomp_filter(pool: WorkerPool) -> None:
    out = await run(
        pool,
        ESCAPE
        + "import threading\nbox = []\nt = threading.Thread(target=lambda: box.append(7))\n"
        + "t.start()\nt.join()\nresult = box",
    )
    assert out.ok and out.content == "[7]", out


async def test_the_pool_keeps_serving_benign_code_after_all_that(pool: WorkerPool) -> None:
    df = pd.DataFrame({"city": ["a", "b", "a"], "n": [1, 2, 3]})
    out = await run(
        pool, "result = df.groupby('city', as_index=False)['n'].sum()", df_ipc=dataframe_to_ipc(df)
    )
    assert out.ok and out.form == "table", out
    assert out.table_ipc is not None
    back = ipc_to_dataframe(out.table_ipc)
    assert back.to_dict("list") == {"city": ["a", "b"], "n": [4, 2]}


async def test_the_pool_recovers_when_its_zygote_dies(pool: WorkerPool) -> None:
    assert pool._proc is not None
    generation = pool._generation
    pool._proc.kill()  # bwrap dies; the zygote dies with it (a moment later)
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        try:
            out = await run(pool, "result = 'back'")
        except Unavailable:  # while the new zygote starts
            out = None
        if out is not None and out.ok and pool._generation > generation:
            break
        assert asyncio.get_running_loop().time() < deadline, "the pool never recovered"
        await asyncio.sleep(0.2)
    assert out.content == "back"


_REAL = "_b = {src}\n_b = _b if isinstance(_b, dict) else _b.__dict__\n__builtins__.update(_b)\n"
ROUTES = {
    "subclass walk": ESCAPE,
    "function globals": _REAL.format(src="call_tool.__globals__['__builtins__']"),
    "frame walk": "def g():\n    yield 1\n"
    + _REAL.format(src="g().gi_frame.f_globals['call_tool'].__globals__['__builtins__']"),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
async def test_every_route_to_the_real_builtins_ends_at_the_os_layers(
    pool: WorkerPool, route: str
) -> None:
    code = ROUTES[route] + (
        "import os\n"
        "leaks = []\n"
        "for path in ('/proc/1/environ', '/etc/shadow', '/root/.bash_history'):\n"
        "    try:\n"
        "        leaks.append(open(path, 'rb').read(10))\n"
        "    except OSError:\n"
        "        pass\n"
        "result = (os.system('id') != 0, leaks, '{0.__class__}'.format(os))"
    )
    out = await run(pool, code)
    assert out.ok, out.message
    assert out.content == "(True, [], \"<class 'module'>\")", out.content


async def test_a_thread_bomb_stops_at_the_cgroup_pids_limit(pool: WorkerPool) -> None:
    if pool._cgroups is None:
        pytest.skip("cgroups are not writable here; rlimits and seccomp still apply")
    out = await run(
        pool,
        ESCAPE
        + "import threading, time\nn = 0\ntry:\n"
        + "    for i in range(500):\n"
        + "        t = threading.Thread(target=time.sleep, args=(5,), daemon=True)\n"
        + "        t.start()\n        n += 1\n"
        + "except RuntimeError:\n    result = n\nelse:\n    result = 'ESCAPED'",
    )
    assert out.ok, out.message
    assert out.content.isdigit() and int(out.content) < 32, out.content
