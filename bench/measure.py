"""Measurement helpers for benchmarks: sequential latency percentiles, closed-loop throughput
with a fixed number of calls in flight, and the one-line ratio report against a baseline."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
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
    samples.sort()
    return LatencyStats(
        p50_ms=percentile(samples, 50),
        p99_ms=percentile(samples, 99),
        mean_ms=sum(samples) / len(samples),
        n=n,
    )


async def measure_throughput(call: Call, concurrency: int, duration_s: float) -> float:
    """Completed calls per second with `concurrency` calls in flight for about `duration_s`.

    Each worker starts a new call as soon as its last one finishes and stops starting calls at
    the deadline; calls still running then are awaited and counted. A failed call fails the
    measurement.
    """
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
    elapsed = time.perf_counter() - start
    return completed / elapsed


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
