"""The five services. Importing this package first (as `python -m services.<name>` does) picks
gRPC's I/O engine before grpc is imported (shared/grpc_engine.py)."""

from shared.grpc_engine import choose_io_engine

choose_io_engine()
