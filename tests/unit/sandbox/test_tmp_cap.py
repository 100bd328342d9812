"""The private /tmp is a tmpfs: what a worker writes there is memory no RLIMIT_AS sees, and
where the memory cgroup is not writable nothing stopped it short of the host's RAM. bwrap now
caps that tmpfs (`--size`, bwrap 0.8+): writing past the cap is ENOSPC, which comes back as the
tool's Err `disk_limit` naming the cap — the service and its pool carry on, and the space is
free again for the next execution."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from services.sandbox.host import Limits, RunOutcome, WorkerPool

pytestmark = pytest.mark.asyncio(loop_scope="module")

CAP = 8 << 20
LIMITS = Limits(wall_seconds=30, cpu_seconds=10, memory_bytes=256 << 20)
ESCAPE = """
_wc = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "catch_warnings"][0]
__builtins__.update(_wc()._module.__builtins__)
import os
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool() -> AsyncIterator[WorkerPool]:
    # No cgroups: the case the cap is for (a host that does not let the service make them).
    pool = WorkerPool(size=1, tmp_bytes=CAP, cgroups=False)
    await pool.start()
    if pool.tmp_size is None:
        await pool.close()
        pytest.skip("this bubblewrap cannot cap a tmpfs (--size needs 0.8 or later)")
    yield pool
    await pool.close()


async def run(pool: WorkerPool, code: str) -> RunOutcome:
    return await pool.run(code=code, inputs={}, tool_name="fill", limits=LIMITS)


async def test_the_tmp_a_worker_sees_is_the_size_of_the_cap(pool: WorkerPool) -> None:
    out = await run(pool, ESCAPE + "s = os.statvfs('/tmp')\nresult = s.f_blocks * s.f_frsize")
    assert out.ok and int(out.content) == CAP, out


async def test_writing_past_the_cap_is_an_err_naming_it_and_the_pool_carries_on(
    pool: WorkerPool,
) -> None:
    # Honest code (no escape): a CSV bigger than the cap, under the 16 MiB file-size limit.
    big = "pd.DataFrame({'x': ['y' * 1000] * 12000}).to_csv('big.csv')\nresult = 'written'"
    out = await run(pool, big)
    assert not out.ok and out.error_kind == "disk_limit", out
    assert "No space left on device" in out.message
    assert "the sandbox's /tmp holds at most 8 MiB" in out.message
    # Several files, each under the file-size limit, past the cap together.
    many = ESCAPE + (
        "chunk = b'x' * (3 << 20)\n"
        "for i in range(4):\n"
        "    with open(f'f{i}', 'wb') as f:\n"
        "        f.write(chunk)\n"
        "result = 'ESCAPED'"
    )
    out = await run(pool, many)
    assert not out.ok and out.error_kind == "disk_limit", out
    # The space is free again: the next execution writes what fits.
    fits = "pd.DataFrame({'x': ['y' * 1000] * 4000}).to_csv('ok.csv')\nresult = 'fits'"
    after = await run(pool, fits)
    assert after.ok and after.content == "fits", after


async def test_an_exception_posing_as_enospc_is_not_taken_at_its_word(pool: WorkerPool) -> None:
    """The kind is read from the exception's own errno slot, not from what its class claims."""
    code = ESCAPE + (
        "class E(OSError):\n"
        "    @property\n"
        "    def errno(self):\n"
        "        raise RuntimeError('no')\n"
        "raise E(28, 'No space left on device')"
    )
    out = await run(pool, code)
    assert not out.ok and out.error_kind == "disk_limit", out
    fake = ESCAPE + "class E(OSError):\n    errno = 28\nraise E('not really')"
    out = await run(pool, fake)
    assert not out.ok and out.error_kind == "execution_error", out
