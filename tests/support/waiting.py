"""Polling until a condition holds, for tests that watch another process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T], timeout: float = 60.0, what: str = "condition", every: float = 0.05
) -> T:
    """`check()`'s first truthy value, polled every `every` seconds; AssertionError naming
    `what` once `timeout` seconds pass without one."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
