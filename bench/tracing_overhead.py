"""Benchmark: the cost of tracing a tool call. The internal `ping` tool through the mesh
(client -> dispatcher -> registry -> handler) with tracing off, with every call sampled (spans
on both services, W3C trace context + baggage on the hop, OTLP export to a real receiver), and
with 10% of traces sampled (OTEL_TRACES_SAMPLER=parentbased_traceidratio). The three meshes run
at once and are measured in turns (bench.measure), each figure printed as a ratio against
tracing off measured in the same run.

    make bench            # or: python -m bench.tracing_overhead [--n 1500] [--duration 3]

Target (issue 7): sampled p50 within 1.2x of tracing off.
"""

from __future__ import annotations

import argparse
import asyncio
from contextlib import AsyncExitStack

from bench.dispatch_overhead import ping_call, start_ping
from bench.measure import (
    machine_load,
    measure_interleaved,
    measure_throughput_interleaved,
    ratio_line,
)
from bench.span_counter import SpanCounter

# name -> (tracing on, extra environment)
CONFIGS: dict[str, tuple[bool, dict[str, str]]] = {
    "off": (False, {}),
    "sampled": (True, {}),
    "10% sampled": (
        True,
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
    ),
}


async def main_async(n: int, block: int, duration: float, concurrency: int) -> None:
    with SpanCounter() as sink:
        async with AsyncExitStack() as stack:
            calls = {
                name: ping_call(await start_ping(stack, tracing, sink.port, extra))
                for name, (tracing, extra) in CONFIGS.items()
            }
            lat = await measure_interleaved(calls, n, block, warmup=300)
            tput = await measure_throughput_interleaved(calls, concurrency, duration)
    off = lat["off"]
    print(
        f"tracing overhead: ping through dispatcher -> registry (latency in turns of {block} calls)"
    )
    print(
        f"  baseline, tracing off: p50 {off.p50_ms:.2f} ms, p99 {off.p99_ms:.2f} ms, "
        f"{tput['off']:.0f} calls/s at {concurrency} in flight"
    )
    for name in ("sampled", "10% sampled"):
        target = "   (target <= 1.2x)" if name == "sampled" else ""
        print(f"  {name}:")
        print("    " + ratio_line("p50", lat[name].p50_ms, off.p50_ms, "ms") + target)
        print("    " + ratio_line("p99", lat[name].p99_ms, off.p99_ms, "ms"))
        print("    " + ratio_line(f"throughput@{concurrency}", tput[name], tput["off"], "calls/s"))
    print(f"  ({sink.count} spans exported to the OTLP receiver)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=1500, help="sequential calls for latency")
    parser.add_argument("--block", type=int, default=50, help="calls of one kind in a turn")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of throughput load")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    with machine_load():
        asyncio.run(main_async(args.n, args.block, args.duration, args.concurrency))


if __name__ == "__main__":
    main()
