"""The `toolmesh` command line: a thin gRPC client of the mesh."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import grpc

from shared.clients import cli_channel

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# The flag that names each service's address on the commands that reach it.
ADDRESS_FLAGS = {
    "registry": "--registry",
    "dispatcher": "--dispatcher",
    "sandbox": "--sandbox",
    "mcp_bridge": "--bridge",
    "surface": "--surface",
}


class UsageError(Exception):
    """A command line or configuration the CLI refuses before calling anything: `main` prints
    it as one `error: ...` line and exits 2."""


def seconds(text: str) -> float:
    """An argparse type for deadlines: a finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return value


def wait_seconds(text: str) -> float:
    """An argparse type for waits: a finite number of seconds, 0 (do not wait) or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds, 0 or more")
    return value


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse type for a whole number in [low, high] (the range of the protobuf field it
    fills, or narrower): protobuf raises on a value out of its field's range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from {low} to {high}")
        return value

    parse.__name__ = "int"
    return parse


limit = int_between(1, INT32_MAX)  # a row limit: 0 would mean "the server's default"
port = int_between(0, 65535)


def service_channel(service: str, address: str) -> grpc.Channel:
    """A CLI channel to `service` at `address` (see shared.clients.cli_channel); an empty
    address — the service configured away with an empty TOOLMESH_<SERVICE>_ADDR — is a
    UsageError naming the variable and the flag, not a gRPC error about an empty URI."""
    if not address.strip():
        flag = ADDRESS_FLAGS.get(service, "")
        raise UsageError(
            f"no {service} address: TOOLMESH_{service.upper()}_ADDR is empty"
            + (f"; set it or pass {flag} HOST:PORT" if flag else "")
        )
    return cli_channel(address)
