"""Benchmark: the per-execution cost of a trivial custom tool (`result = 1`) on a pre-started,
single-use, fully isolated worker (bubblewrap namespaces, landlock, seccomp, rlimits; the pool
refilled in the background), measured in one run against:
  * the same code exec'd in-process with the curated builtins (no isolation at all),
  * a bare `python -c pass` spawn (the floor of any process-per-call design),
  * a fresh interpreter importing pandas (what the pool keeps off the request path).

    make bench            # or: python -m bench.sandbox_overhead [--n 200]

Target (issue 4): p50 under 10 ms with full isolation.
"""

from __future__ import annotations

import argparse
import asyncio
import builtins
import sys
from collections.abc import Sequence
from typing import Any

from bench.measure import (
    machine_load,
    measure_latency,
    ratio_line,
)
from services.sandbox.host import Limits, WorkerPool
from services.sandbox.worker import SAFE_BUILTIN_NAMES

CODE = "result = 1"
TARGET_P50_MS = 10.0


def in_process() -> Any:
    safe = {n: getattr(builtins, n) for n in SAFE_BUILTIN_NAMES if hasattr(builtins, n)}
    namespace: dict[str, Any] = {"__builtins__": safe, "inputs": {}}
    exec(compile(CODE, "<tool>", "exec"), namespace)
    return str(namespace["result"])


async def spawn(*args: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.DEVNULL, env={}
    )
    await process.wait()


async def main_async(n: int, pool_size: int) -> int:
    pool = WorkerPool(size=pool_size)
    await pool.start()
    limits = Limits()
    try:

        async def sandboxed() -> None:
            outcome = await pool.run(code=CODE, inputs={}, tool_name="bench", limits=limits)
            if not outcome.ok:
                raise RuntimeError(outcome.message)

        async def inproc() -> None:
            in_process()

        sandbox = await measure_latency(sandboxed, n=n, warmup=min(20, n))
        local = await measure_latency(inproc, n=n, warmup=min(20, n))
        bare = await measure_latency(lambda: spawn("-c", "pass"), n=max(10, n // 4), warmup=3)
        pandas = await measure_latency(lambda: spawn("-c", "import pandas"), n=5, warmup=1)
    finally:
        await pool.close()
    print(f"custom tool in the sandbox (pool of {pool_size}): {sandbox}")
    print(f"same code exec'd in-process:        {local}")
    print(f"bare `python -c pass` spawn:         {bare}")
    print(f"fresh interpreter importing pandas:  {pandas}")
    print(ratio_line("sandbox p50 vs in-process", sandbox.p50_ms, local.p50_ms, "ms"))
    print(ratio_line("sandbox p50 vs python -c pass", sandbox.p50_ms, bare.p50_ms, "ms"))
    print(ratio_line("sandbox p50 vs pandas import", sandbox.p50_ms, pandas.p50_ms, "ms"))
    verdict = "met" if sandbox.p50_ms < TARGET_P50_MS else "MISSED"
    print(f"target p50 < {TARGET_P50_MS:.0f} ms with full isolation: {verdict}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sandbox_overhead")
    parser.add_argument("--n", type=int, default=200, help="sequential executions measured")
    parser.add_argument("--pool", type=int, default=2, help="pre-started workers")
    args = parser.parse_args(argv)
    with machine_load():
        return asyncio.run(main_async(args.n, args.pool))


if __name__ == "__main__":
    sys.exit(main())
