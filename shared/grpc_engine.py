"""The gRPC I/O engine of toolmesh's processes, chosen before grpc is imported.

gRPC reads GRPC_EXPERIMENTS once, as its core starts (set after `import grpc`, it is ignored).
By default every toolmesh service and benchmark process turns off the EventEngine TCP client
and listener (`-event_engine_client,-event_engine_listener`): grpc then does its socket I/O on
the thread that polls its completion queue (grpc.aio's poller), where the EventEngine hands each
read and write to one of its own threads first. One thread handoff less per message matters at
one call in flight on a VM, where waking a sleeping thread is slow: measured here, a 1-hop
grpc.aio echo in one process 547-571 µs p50 against 659-726 µs, and the `ping` benchmark's mesh
0.2-0.3 ms faster (tests and numbers in README, Benchmarks). An operator's own GRPC_EXPERIMENTS
wins; set it empty to run grpc's default engine."""

from __future__ import annotations

import os
import sys

DEFAULT_GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"
# Whether the last choose_io_engine() ran before grpc was imported (so it took effect).
chosen_in_time = False


def choose_io_engine() -> bool:
    """Set GRPC_EXPERIMENTS to the default unless the environment names its own; whether the
    choice can still take effect (grpc not imported yet)."""
    global chosen_in_time
    os.environ.setdefault("GRPC_EXPERIMENTS", DEFAULT_GRPC_EXPERIMENTS)
    chosen_in_time = "grpc" not in sys.modules
    return chosen_in_time
