"""Benchmarks. The raw grpc.aio baselines run on the same gRPC I/O engine as the services
(shared/grpc_engine.py), so a ratio compares the mesh with the same transport."""

from shared.grpc_engine import choose_io_engine

choose_io_engine()
