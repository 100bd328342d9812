"""Measurement helpers for benchmarks: sequential latency percentiles, closed-loop throughput
with a fixed number of calls in flight, and the one-line ratio report against a baseline."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Call = Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class LatencyStats:
    """Latency of `n` sequential calls, in milliseconds."""

    p50_ms: float
    p99_ms: float
    mean_ms: float
    n: int

    def __str__(self) -> str:
        return (
            f"p50 {self.p50_ms:.3f} ms, p99 {self.p99_ms:.3f} ms, "
            f"mean {self.mean_ms:.3f} ms (n={self.n})"
        )


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of ascending values, linearly interpolated."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    rank = (len(sorted_values) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    fraction = rank - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


async def measure_latency(call: Call, n: int, warmup: int) -> LatencyStats:
    """Await `call` `warmup` times unmeasured, then `n` times one after another."""
    if n < 1 or warmup < 0:
        raise ValueError("need n >= 1 and warmup >= 0")
    for _ in range(warmup):
        await call()
    samples: list[float] = []
    for _ in range(n):
        start = time.perf_counter_ns()
        await call()
        samples.append((time.perf_counter_ns() - start) / 1e6)
    return _stats(samples)


async def measure_throughput(call: Call, concurrency: int, duration_s: float) -> float:
    """Completed calls per second with `concurrency` calls in flight for about `duration_s`.

    Each worker starts a new call as soon as its last one finishes and stops starting calls at
    the deadline; calls still running then are awaited and counted. A failed call fails the
    measurement.
    """
    completed, elapsed = await _closed_loop(call, concurrency, duration_s)
    return completed / elapsed


async def _closed_loop(call: Call, concurrency: int, duration_s: float) -> tuple[int, float]:
    """(calls completed, seconds taken) of measure_throughput's load."""
    if concurrency < 1 or duration_s <= 0:
        raise ValueError("need concurrency >= 1 and duration_s > 0")
    completed = 0
    start = time.perf_counter()
    deadline = start + duration_s

    async def worker() -> None:
        nonlocal completed
        while time.perf_counter() < deadline:
            await call()
            completed += 1

    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())
    return completed, time.perf_counter() - start


# Unmeasured calls at the start of each turn: a process idle since its last turn answers its
# first calls from cold caches, which is not what a run of sequential calls measures.
TURN_WARMUP = 5


def _stats(samples: list[float]) -> LatencyStats:
    samples = sorted(samples)
    return LatencyStats(
        p50_ms=percentile(samples, 50),
        p99_ms=percentile(samples, 99),
        mean_ms=sum(samples) / len(samples),
        n=len(samples),
    )


async def measure_interleaved(
    calls: Mapping[str, Call], n: int, block: int, warmup: int = 50
) -> dict[str, LatencyStats]:
    """Latency of `n` sequential calls of each kind, sampled in turns of `block` calls (the
    order of the kinds reversed every round, each turn after TURN_WARMUP unmeasured calls),
    after `warmup` calls of each kind.

    On a shared machine the load moves more from one second to the next than from one kind of
    call to the other, so sampled in turns every kind, and every ratio, sees the same load."""
    if n < 1 or block < 1 or not calls:
        raise ValueError("need n >= 1, block >= 1 and at least one kind of call")
    for call in calls.values():
        for _ in range(warmup):
            await call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for turn in range(-(-n // block)):
        for name in names if turn % 2 == 0 else reversed(names):
            call, taken = calls[name], samples[name]
            for _ in range(TURN_WARMUP):
                await call()
            for _ in range(min(block, n - len(taken))):
                start = time.perf_counter_ns()
                await call()
                taken.append((time.perf_counter_ns() - start) / 1e6)
    return {name: _stats(taken) for name, taken in samples.items()}


async def measure_throughput_interleaved(
    calls: Mapping[str, Call], concurrency: int, duration_s: float, rounds: int = 3
) -> dict[str, float]:
    """Calls per second of each kind with `concurrency` in flight: `rounds` windows of
    `duration_s / rounds` per kind, the order reversed every round; each kind's figure is its
    completed calls over its windows' total time. Like measure_interleaved, so that a change
    in the machine's load falls on every kind rather than on whichever ran then."""
    if rounds < 1:
        raise ValueError("need rounds >= 1")
    window = duration_s / rounds
    completed: dict[str, int] = dict.fromkeys(calls, 0)
    taken: dict[str, float] = dict.fromkeys(calls, 0.0)
    names = list(calls)
    for turn in range(rounds):
        for name in names if turn % 2 == 0 else reversed(names):
            count, elapsed = await _closed_loop(calls[name], concurrency, window)
            completed[name] += count
            taken[name] += elapsed
    return {name: completed[name] / taken[name] for name in names}


def _fmt(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def ratio_line(label: str, value: float, baseline: float, unit: str) -> str:
    """'label: value unit vs baseline unit = X.XXx' (value / baseline)."""
    ratio = f"{value / baseline:.2f}x" if baseline else "n/a"
    return f"{label}: {_fmt(value)} {unit} vs {_fmt(baseline)} {unit} = {ratio}"


@dataclass(frozen=True)
class CpuTimes:
    """The machine's CPU time so far, from the `cpu` line of /proc/stat (in ticks)."""

    total: int  # user, nice, system, idle, iowait, irq, softirq, steal (guest is in user)
    idle: int  # idle and iowait
    steal: int  # taken by the hypervisor for other guests

    @staticmethod
    def parse(stat: str) -> CpuTimes | None:
        for line in stat.splitlines():
            fields = line.split()
            if fields and fields[0] == "cpu" and len(fields) >= 9:
                values = [int(v) for v in fields[1:9]]
                return CpuTimes(sum(values), values[3] + values[4], values[7])
        return None

    @staticmethod
    def now(path: Path = Path("/proc/stat")) -> CpuTimes | None:
        try:
            return CpuTimes.parse(path.read_text())
        except (OSError, ValueError):
            return None  # not Linux, or no /proc: nothing to report


def load_line(before: CpuTimes, after: CpuTimes, cpus: int) -> str | None:
    """How busy the machine's CPUs were between two readings, and what the hypervisor stole."""
    total = after.total - before.total
    if total <= 0:
        return None
    busy = 1 - (after.idle - before.idle) / total
    steal = (after.steal - before.steal) / total
    return (
        f"machine during the run: {busy:.0%} of {cpus} CPUs busy, "
        f"{steal:.1%} stolen by the hypervisor"
    )


@contextmanager
def machine_load() -> Iterator[None]:
    """Print, after the block, how busy the machine was while it ran and how much CPU time the
    hypervisor stole (Linux; nothing elsewhere), to read a run's figures by: runs in different
    phases of a shared VM differ by up to a third. (Not every slow phase shows as steal: on
    the VMs this was measured on, slow phases showed none.)"""
    before = CpuTimes.now()
    yield
    after = CpuTimes.now()
    if before is not None and after is not None:
        line = load_line(before, after, os.cpu_count() or 1)
        if line is not None:
            print("  " + line)
