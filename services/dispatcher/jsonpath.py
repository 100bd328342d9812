"""A small, safe JSON-path subset for policy argument constraints: `$`, `.key`, `['key']` /
`["key"]` and `[index]` (negative counts from the end). No wildcards, filters or recursive
descent, so evaluating a path is one walk down the input and can never be expensive."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_PATH_CHARS = 256

_DOT_KEY = re.compile(r"\.([A-Za-z_][A-Za-z0-9_\-]*)")
_INDEX = re.compile(r"\[(-?\d{1,9})\]")
_QUOTED = re.compile(r"""\[(?:'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)")\]""")

Step = str | int


class JsonPathError(ValueError):
    """A path outside the supported subset; the message says where and why."""


@dataclass(frozen=True)
class JsonPath:
    """A parsed path: the keys (str) and list indexes (int) to follow from the root."""

    text: str
    steps: tuple[Step, ...]

    def find(self, document: Any) -> tuple[bool, Any]:
        """(True, value) when every step exists, (False, None) otherwise."""
        current = document
        for step in self.steps:
            if isinstance(step, int):
                if not isinstance(current, list) or not -len(current) <= step < len(current):
                    return False, None
                current = current[step]
            else:
                if not isinstance(current, dict) or step not in current:
                    return False, None
                current = current[step]
        return True, current


def parse(text: str) -> JsonPath:
    """Parse `$.a.b[0]`-style text; JsonPathError names the offending position."""
    if not text.startswith("$"):
        raise JsonPathError("a path starts with '$'")
    if len(text) > MAX_PATH_CHARS:
        raise JsonPathError(f"a path is at most {MAX_PATH_CHARS} characters")
    steps: list[Step] = []
    pos = 1
    while pos < len(text):
        if m := _DOT_KEY.match(text, pos):
            steps.append(m.group(1))
        elif m := _INDEX.match(text, pos):
            steps.append(int(m.group(1)))
        elif m := _QUOTED.match(text, pos):
            raw = m.group(1) if m.group(1) is not None else m.group(2)
            steps.append(re.sub(r"\\(.)", r"\1", raw))
        else:
            raise JsonPathError(
                f"unsupported syntax at position {pos} ({text[pos : pos + 10]!r}); "
                "use .key, ['key'] or [index]"
            )
        pos = m.end()
    return JsonPath(text, tuple(steps))
