"""Linear-time regular expressions for tool input validation.

JSON Schema's `pattern` and `patternProperties` are regular expressions, and input schemas come
from outside: a tenant's custom tool, an MCP server. With Python's backtracking `re`, a pattern
such as `^(a+)+$` against forty characters runs for days, on the registry's event loop, and
every tenant's calls wait (measured: 1.2 s at 24 characters, doubling with each one). RE2
(google-re2) matches in time linear in the input, whatever the pattern.

`install()` points jsonschema's four regular-expression searches (the `pattern` and
`patternProperties` keywords, and the property look-ups of `additionalProperties` and
`unevaluatedProperties`) at RE2. RE2 has no backreferences or lookaround: registration refuses
such a pattern (`unsupported_patterns`), and one that arrives anyway (an MCP server's schema)
is not enforced, with a warning, rather than run on the backtracking engine.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import re2

logger = logging.getLogger(__name__)

# The patterns Re2Search keeps compiled: at most this many, and at most SEARCH_BUDGET_BYTES of
# what their programs may grow to (each entry counts its RE2 memory budget, `max_mem`), the
# least recently used going first. An RE2 program keeps the DFA states its searches built, up
# to its budget: with RE2's default budget (8 MiB) a short pattern whose DFA explodes
# (`[ab]*a[ab]{20}$`) held 3 MiB after one search of 200 KB, so the 4096 patterns kept before
# (cleared all at once past that) could hold gigabytes.
MAX_CACHED_PATTERNS = 4096
SEARCH_BUDGET_BYTES = 256 << 20
# The memory budget of a pattern searched in tool inputs. A pattern whose program does not fit
# (a counted repetition of thousands) gets RE2's default instead, so what compiles does not
# change; matching stays linear in time either way (past its budget RE2 leaves its DFA for
# the NFA, slower by a constant).
SEARCH_MAX_MEM = 1 << 20


_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is reported by its caller, not printed by RE2
_SEARCH_OPTIONS = re2.Options()
_SEARCH_OPTIONS.log_errors = False
_SEARCH_OPTIONS.max_mem = SEARCH_MAX_MEM


_HEX = frozenset("0123456789abcdefABCDEF")


def ecma_to_re2(pattern: str) -> str:
    """`pattern` with the escapes JSON Schema's ECMA-262 dialect has and RE2 spells otherwise:
    `\\uXXXX` and `\\u{X...}` as `\\x{...}` (`^[\\u4e00-\\u9fa5]+$`, common for CJK ranges,
    was refused as if it used lookaround). An escaped backslash stays one; everything else is
    left to RE2."""
    if "\\u" not in pattern:
        return pattern
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if char != "\\" or i + 1 >= n:
            out.append(char)
            i += 1
            continue
        if pattern[i + 1] == "u":
            digits = pattern[i + 2 : i + 6]
            if len(digits) == 4 and set(digits) <= _HEX:
                out.append(f"\\x{{{digits}}}")
                i += 6
                continue
            if pattern.startswith("{", i + 2):
                end = pattern.find("}", i + 3)
                digits = pattern[i + 3 : end] if end > 0 else ""
                if 0 < len(digits) <= 6 and set(digits) <= _HEX:
                    out.append(f"\\x{{{digits}}}")
                    i = end + 1
                    continue
        out.append(pattern[i : i + 2])  # any other escape, an escaped backslash included
        i += 2
    return "".join(out)


def compile_re2(pattern: str, options: Any = None) -> Any:
    """The RE2 program of `pattern` (it matches in time linear in the text), ECMA-262's
    `\\u` escapes translated (ecma_to_re2). ValueError saying why when RE2 cannot take it
    (backreferences, lookaround, a syntax error)."""
    try:
        return re2.compile(ecma_to_re2(pattern), options or _OPTIONS)
    except re2.error as exc:
        text = exc.args[0] if exc.args else exc
        raise ValueError(
            text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
        ) from None


class Re2Search:
    """A stand-in for the `re` module where jsonschema only calls `re.search(pattern, text)`,
    keeping the patterns it compiled within bounds (MAX_CACHED_PATTERNS, SEARCH_BUDGET_BYTES).
    Thread-safe: inputs are validated on worker threads too."""

    def __init__(
        self,
        max_entries: int = MAX_CACHED_PATTERNS,
        budget_bytes: int = SEARCH_BUDGET_BYTES,
        max_mem: int = SEARCH_MAX_MEM,
    ) -> None:
        self.max_entries = max_entries
        self.budget_bytes = budget_bytes
        self._options = _SEARCH_OPTIONS
        if max_mem != SEARCH_MAX_MEM:
            self._options = re2.Options()
            self._options.log_errors = False
            self._options.max_mem = max_mem
        # pattern -> (its program or None, the bytes it counts), least recently used first.
        self._compiled: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._compiled)

    @property
    def budgeted_bytes(self) -> int:
        """What the kept programs may grow to, together."""
        return self._weight

    def compile(self, pattern: str) -> Any:
        """The RE2 program of `pattern`, or None when RE2 cannot take it (cached either way)."""
        with self._lock:
            hit = self._compiled.get(pattern)
            if hit is not None:
                self._compiled.move_to_end(pattern)
                return hit[0]
        compiled, weight = self._compile(pattern)
        with self._lock:
            if pattern not in self._compiled:
                self._compiled[pattern] = (compiled, weight)
                self._weight += weight
                while self._compiled and (
                    len(self._compiled) > self.max_entries or self._weight > self.budget_bytes
                ):
                    _, (_, dropped) = self._compiled.popitem(last=False)
                    self._weight -= dropped
        return compiled

    def _compile(self, pattern: str) -> tuple[Any, int]:
        try:
            return compile_re2(pattern, self._options), self._options.max_mem
        except ValueError:
            pass  # too large a program for the search budget, or not RE2 at all: see below
        try:
            return compile_re2(pattern), _OPTIONS.max_mem
        except ValueError as exc:
            logger.warning(
                "input schema pattern %r is not an RE2 expression (%s): not enforced",
                pattern[:200],
                exc,
            )
            return None, 0

    def search(self, pattern: str, string: str, flags: int = 0) -> Any:
        compiled = self.compile(pattern)
        if compiled is None:
            return True  # not enforced: as if it matched
        return compiled.search(string)


SEARCH = Re2Search()


def install() -> None:
    """Make jsonschema search with RE2 (idempotent). Raises if jsonschema changed how it
    searches, rather than silently going back to backtracking. jsonschema is imported here, not
    at the top: the dispatcher compiles its rules' patterns with this module and validates no
    schema."""
    import jsonschema._keywords
    import jsonschema._utils

    for module in (jsonschema._keywords, jsonschema._utils):
        if getattr(module, "re", None) is not SEARCH:
            if not hasattr(module, "re"):
                raise RuntimeError(f"{module.__name__} no longer imports re: revisit schema_regex")
            module.re = SEARCH  # type: ignore[attr-defined]


def pattern_problem(schema: Any) -> str | None:
    """Why `schema` cannot be a custom tool's input schema for its patterns, or None."""
    bad = unsupported_patterns(schema)
    if not bad:
        return None
    listed = ", ".join(repr(p[:80]) for p in bad[:3])
    return (
        f"pattern(s) {listed} use a feature RE2 lacks (backreferences, lookaround); input "
        "patterns must be RE2 expressions, matched in linear time"
    )


def unsupported_patterns(schema: Any) -> list[str]:
    """Every `pattern` and `patternProperties` key in `schema` that RE2 cannot compile."""
    bad = []
    for pattern in _patterns(schema):
        try:
            compile_re2(pattern)
        except ValueError:
            bad.append(pattern)
    return bad


def _patterns(node: Any) -> Iterator[str]:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            if isinstance(item.get("pattern"), str):
                yield item["pattern"]
            properties = item.get("patternProperties")
            if isinstance(properties, Mapping):
                yield from (k for k in properties if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
