"""The benchmarks' measurement helpers: kinds of call sampled in turns (so that a change in the
machine's load falls on every kind), and closed-loop throughput in turns."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.measure import (
    TURN_WARMUP,
    CpuTimes,
    load_line,
    measure_interleaved,
    measure_throughput_interleaved,
    percentile,
)


def recording(order: list[str], name: str, sleep_s: float = 0.0):  # type: ignore[no-untyped-def]
    async def call() -> None:
        order.append(name)
        await asyncio.sleep(sleep_s)

    return call


async def test_latency_is_sampled_in_turns_reversed_every_round() -> None:
    order: list[str] = []
    calls = {"a": recording(order, "a"), "b": recording(order, "b", 0.002)}
    stats = await measure_interleaved(calls, n=6, block=3, warmup=2)
    assert order[:4] == ["a", "a", "b", "b"]  # the warm-up of each kind
    turn = TURN_WARMUP + 3
    turns = [order[4 + i * turn] for i in range(4)]
    assert turns == ["a", "b", "b", "a"]  # a b, then b a
    assert all(len(set(order[4 + i * turn : 4 + (i + 1) * turn])) == 1 for i in range(4))
    assert len(order) == 4 + 4 * turn
    assert stats["a"].n == stats["b"].n == 6
    assert stats["b"].p50_ms >= 2.0 > stats["a"].p50_ms


async def test_the_last_turn_takes_only_what_is_left() -> None:
    order: list[str] = []
    stats = await measure_interleaved({"a": recording(order, "a")}, n=5, block=3, warmup=0)
    assert stats["a"].n == 5
    assert len(order) == 2 * TURN_WARMUP + 5


async def test_throughput_is_measured_in_windows_per_kind_in_turns() -> None:
    order: list[str] = []
    seen: list[str] = []

    def kind(name: str, sleep_s: float):  # type: ignore[no-untyped-def]
        async def call() -> None:
            if not seen or seen[-1] != name:
                seen.append(name)
            order.append(name)
            await asyncio.sleep(sleep_s)

        return call

    rates = await measure_throughput_interleaved(
        {"fast": kind("fast", 0.005), "slow": kind("slow", 0.02)},
        concurrency=4,
        duration_s=0.6,
        rounds=3,
    )
    # fast slow | slow fast | fast slow: back-to-back windows of a kind read as one run.
    assert seen == ["fast", "slow", "fast", "slow"]
    # 4 in flight: at most 800/s and 200/s; timers on a busy machine only make them slower.
    assert 100 < rates["fast"] <= 800
    assert 25 < rates["slow"] <= 200
    assert rates["fast"] > 2 * rates["slow"]


async def test_bad_arguments_are_refused() -> None:
    async def call() -> None:
        return None

    with pytest.raises(ValueError):
        await measure_interleaved({"a": call}, n=0, block=1)
    with pytest.raises(ValueError):
        await measure_interleaved({}, n=1, block=1)
    with pytest.raises(ValueError):
        await measure_throughput_interleaved({"a": call}, concurrency=1, duration_s=1, rounds=0)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_the_machine_load_is_read_from_proc_stat_and_reported_as_busy_and_stolen(
    tmp_path: Path,
) -> None:
    stat = tmp_path / "stat"
    #                user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\nintr 1\n")
    before = CpuTimes.now(stat)
    assert before == CpuTimes(total=1000, idle=850, steal=0)
    stat.write_text("cpu  400 0 150 1150 50 0 0 250 0 0\n")
    after = CpuTimes.now(stat)
    assert after == CpuTimes(total=2000, idle=1200, steal=250)
    line = load_line(before, after, 2)  # 1,000 ticks: 350 idle, 250 stolen
    assert line is not None and "65% of 2 CPUs busy" in line and "25.0% stolen" in line
    assert load_line(after, after, 2) is None  # no time passed: nothing to say
    assert CpuTimes.now(tmp_path / "missing") is None  # not Linux: nothing to report
    assert CpuTimes.parse("intr 1\n") is None
