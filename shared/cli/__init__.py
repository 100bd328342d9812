"""The `toolmesh` command line: a thin gRPC client of the mesh."""

from __future__ import annotations

import argparse
import math


def seconds(text: str) -> float:
    """An argparse type for deadlines: a finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return value
