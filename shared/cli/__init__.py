"""The `toolmesh` command line: a thin gRPC client of the mesh."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import BinaryIO

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


# The exit code of a command whose RPC failed (a usage error's is argparse's 2 as well).
EXIT_RPC_ERROR = 2


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


# The help of every option json_argument reads, after what the JSON object is.
JSON_SOURCE_HELP = (
    "@PATH reads it from a file and - (or @-) from standard input, up to "
    "TOOLMESH_MAX_INPUT_BYTES (a command-line argument holds ~128 KiB); JSON never starts "
    "with @, so a literal needs no escaping"
)


def json_argument(value: str, option: str, *, max_bytes: int, stdin: BinaryIO | None = None) -> str:
    """The JSON text an option such as `--input` stands for: `@PATH` the contents of a file,
    `-` or `@-` standard input (`stdin`, default the process's), anything else the text as
    given. JSON text never begins with "@", so the "@" form is unambiguous and a literal needs
    no escape (there is no curl-style "@@"). What is read must be UTF-8 text of at most
    `max_bytes` bytes (the dispatcher's input limit, TOOLMESH_MAX_INPUT_BYTES; more is not
    read): a UsageError naming the option and the problem otherwise. A command line caps one
    argument at about 128 KiB; a file or a pipe takes what the dispatcher takes."""
    if value in ("-", "@-"):
        source = "standard input"
        stream = stdin if stdin is not None else getattr(sys.stdin, "buffer", None)
        if stream is None:
            raise UsageError(f"{option}: standard input is closed")
        try:
            data = stream.read(max_bytes + 1)
        except OSError as exc:
            raise UsageError(
                f"{option}: cannot read standard input: {exc.strerror or exc}"
            ) from None
    elif value.startswith("@"):
        path = value[1:]
        if not path:
            raise UsageError(f"{option}: give a file name after @ (or - for standard input)")
        source = path
        try:
            with open(path, "rb") as file:
                data = file.read(max_bytes + 1)
        except OSError as exc:  # missing, unreadable, a directory
            raise UsageError(f"{option}: cannot read {path}: {exc.strerror or exc}") from None
    else:
        return value
    if len(data) > max_bytes:
        raise UsageError(
            f"{option}: {source} holds more than {max_bytes} bytes, the input limit "
            "(TOOLMESH_MAX_INPUT_BYTES)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{option}: {source} is not UTF-8 text (byte 0x{data[exc.start]:02x} at "
            f"offset {exc.start})"
        ) from None


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
