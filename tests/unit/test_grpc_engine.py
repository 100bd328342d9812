"""Every service and benchmark process picks gRPC's I/O engine before grpc is imported
(shared/grpc_engine.py); an operator's own GRPC_EXPERIMENTS, empty included, wins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shared.grpc_engine import DEFAULT_GRPC_EXPERIMENTS

SERVICES = ["registry", "dispatcher", "sandbox", "mcp_bridge", "surface"]

PROBE = (
    "import os, sys, {package}; import shared.grpc_engine as engine; "
    "print(repr(os.environ.get('GRPC_EXPERIMENTS')), engine.chosen_in_time)"
)


def probe(package: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(package=package)],
        capture_output=True,
        text=True,
        env={**clean, **env},
        check=True,
        timeout=60,
    )
    return done.stdout.strip()


@pytest.mark.parametrize("package", ["services", "bench"])
def test_importing_the_package_sets_the_engine_before_grpc_is_imported(package: str) -> None:
    assert probe(package) == f"{DEFAULT_GRPC_EXPERIMENTS!r} True"


def test_an_operators_setting_wins_even_empty() -> None:
    assert probe("services", GRPC_EXPERIMENTS="event_engine_dns") == "'event_engine_dns' True"
    assert probe("services", GRPC_EXPERIMENTS="") == "'' True"


@pytest.mark.parametrize(
    "module", [f"services.{name}.__main__" for name in SERVICES] + ["bench.echo_chain"]
)
def test_every_entry_point_chooses_the_engine_before_grpc_is_imported(module: str) -> None:
    """`python -m services.<name>` (and a benchmark's hops) import the package first, so the
    choice is made before the entry point's own imports bring grpc in."""
    assert probe(module) == f"{DEFAULT_GRPC_EXPERIMENTS!r} True"
