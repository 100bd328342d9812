"""A compiled first pass over tool inputs: accept valid input without running `jsonschema`.

Every call's input is validated against its tool's input schema before the tool runs. The
`jsonschema` library is the authority (its errors become the `schema` Hint the model reads),
but it walks the schema in Python: for `ping`'s small schema ~6 µs a call, more for the larger
schemas MCP servers publish, on the registry's event loop. `jsonschema-rs` compiles the schema
once and checks an instance in well under a microsecond.

So a call's input is first offered to the compiled validator: when it says valid, the input is
accepted; otherwise `jsonschema` runs as before and decides (if it finds nothing wrong, the input
is accepted too). Only the compiled validator's "valid" is trusted, and only where the two
libraries cannot disagree on it:

- schemas with regular expressions (`pattern`, `patternProperties`) are left to `jsonschema`,
  which runs them on RE2 (shared.schema_regex): the Rust engine's `\\d` and `\\w` are Unicode,
  RE2's ASCII, so the same pattern accepts different text;
- both read the schema in the same dialect: the one jsonschema reads it in
  (schema_check.dialect: `$schema` spelled with https, or left out of a draft-04 schema) is
  given to the compiled validator, which would otherwise read https draft-07 as draft-07 where
  jsonschema read it as 2020-12;
- `multipleOf` (on the decimal numbers as written) and `uniqueItems` are checked alike in both
  (schema_check.install);
- formats are annotations in both (no format assertion), references are never fetched
  (`offline`), and a schema the compiled validator refuses (an unknown meta-schema, a reference
  it cannot resolve) has no first pass;
- an instance it cannot take (an integer beyond 64 bits, say) falls back to `jsonschema`;
- a panic in the compiled code (which reaches Python as a PanicException, a BaseException, not
  an Exception) means the same: `jsonschema` decides, and the call is not failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import jsonschema_rs

logger = logging.getLogger(__name__)

# Keywords whose values are regular expressions.
REGEX_KEYWORDS = frozenset({"pattern", "patternProperties"})
# A schema with more nodes than this is left to jsonschema alone (the walk is bounded).
MAX_SCHEMA_NODES = 20_000

Acceptor = Callable[[Any], bool]


def uses_regex(schema: Any, max_nodes: int = MAX_SCHEMA_NODES) -> bool | None:
    """Whether a regular-expression keyword appears anywhere in `schema` (conservatively: a
    property that happens to be named `pattern` counts too); None when the schema has more than
    `max_nodes` nodes."""
    stack = [schema]
    seen = 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > max_nodes:
            return None
        if isinstance(node, Mapping):
            if not REGEX_KEYWORDS.isdisjoint(node.keys()):
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def fast_acceptor(schema: Mapping[str, Any], dialect: str | None = None) -> Acceptor | None:
    """A compiled check that says True only for input `jsonschema` also accepts, or None when
    `schema` gets no first pass (see the module's docstring). `dialect` is the `$schema` URI
    jsonschema reads the schema in (schema_check.dialect): the compiled validator is told the
    same, whatever `$schema` the schema spells (https for http, say) or leaves out."""
    if uses_regex(schema) is not False:
        return None
    compiled = dict(schema)
    if dialect is not None:
        compiled["$schema"] = dialect
    try:
        validator = jsonschema_rs.validator_for(compiled, validate_formats=False, offline=True)
    except BaseException as exc:  # any refusal, even a panic, means: jsonschema alone
        if not _recoverable(exc):
            raise
        logger.debug("no compiled first pass for a schema: %s", exc)
        return None
    is_valid = validator.is_valid

    def accept(instance: Any) -> bool:
        try:
            return bool(is_valid(instance))
        except BaseException as exc:  # an instance it cannot take: jsonschema decides
            if not _recoverable(exc):
                raise
            return False

    return accept


def _recoverable(exc: BaseException) -> bool:
    """An Exception, or a panic of the compiled code; not KeyboardInterrupt, SystemExit..."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"
