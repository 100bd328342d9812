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
from collections.abc import Iterator, Mapping
from typing import Any

import re2

logger = logging.getLogger(__name__)

_MAX_CACHED = 4096


_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is reported by its caller, not printed by RE2


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


def compile_re2(pattern: str) -> Any:
    """The RE2 program of `pattern` (it matches in time linear in the text), ECMA-262's
    `\\u` escapes translated (ecma_to_re2). ValueError saying why when RE2 cannot take it
    (backreferences, lookaround, a syntax error)."""
    try:
        return re2.compile(ecma_to_re2(pattern), _OPTIONS)
    except re2.error as exc:
        text = exc.args[0] if exc.args else exc
        raise ValueError(
            text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
        ) from None


class Re2Search:
    """A stand-in for the `re` module where jsonschema only calls `re.search(pattern, text)`."""

    def __init__(self) -> None:
        self._compiled: dict[str, Any] = {}

    def compile(self, pattern: str) -> Any:
        """The RE2 program of `pattern`, or None when RE2 cannot take it (cached either way)."""
        if pattern in self._compiled:
            return self._compiled[pattern]
        try:
            compiled = compile_re2(pattern)
        except ValueError as exc:
            logger.warning(
                "input schema pattern %r is not an RE2 expression (%s): not enforced",
                pattern[:200],
                exc,
            )
            compiled = None
        if len(self._compiled) >= _MAX_CACHED:
            self._compiled.clear()
        self._compiled[pattern] = compiled
        return compiled

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
