"""What every service's `main` shares: the readiness announcement launchers wait for, and running
the service coroutine so that start-up failures are one clear line, not a traceback."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from shared.errors import ToolmeshError

logger = logging.getLogger(__name__)

READY_EVENT = "ready"
# Set by the launcher: the service stops gracefully when the process that started it is gone,
# so a killed `toolmesh up` or test run never leaves services behind.
EXIT_WITH_PARENT_ENV = "TOOLMESH_EXIT_WITH_PARENT"


def announce_ready(service: str, address: str) -> None:
    """One JSON line on stdout: {"event": "ready", "service": ..., "address": ...}."""
    sys.stdout.write(
        json.dumps({"event": READY_EVENT, "service": service, "address": address}) + "\n"
    )
    sys.stdout.flush()


def run(main: Coroutine[Any, Any, None]) -> None:
    try:
        asyncio.run(main)
    except ToolmeshError as exc:
        logger.error("cannot start: %s", exc.message)
        sys.exit(2)
    except OSError as exc:
        logger.error("cannot start: %s", exc)
        sys.exit(2)
    except KeyboardInterrupt:
        pass
