"""What makes a tool's input schema unusable, found when the tool is registered rather than on
every call: not a JSON Schema its dialect accepts, or a `$ref` the registry cannot resolve.

The registry never fetches a schema: a `$ref` to another document (http, file, any URI not
starting with `#`) would be unresolvable at call time, so a custom tool naming one is refused.
Local references (`#/$defs/...`, `#/properties/...`) must point at something that exists."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import jsonschema

MAX_LISTED = 5


def _refs(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every `$ref` (and `$dynamicRef`) in the schema, with where it is."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}/{key}"
            if key in ("$ref", "$dynamicRef"):
                yield where, value
            else:
                yield from _refs(value, where)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _refs(value, f"{path}/{i}")


def _resolves(schema: Any, pointer: str) -> bool:
    """Whether the JSON pointer (RFC 6901, URI-fragment encoded) names a part of `schema`."""
    node = schema
    if not pointer:
        return True
    if not pointer.startswith("/"):
        return False  # a plain-name fragment (an $anchor): left to the validator
    for token in unquote(pointer)[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False
    return True


def _anchors(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("$anchor", "$dynamicAnchor") and isinstance(value, str):
                found.add(value)
            else:
                found |= _anchors(value)
    elif isinstance(node, list):
        for value in node:
            found |= _anchors(value)
    return found


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why `schema` cannot validate a tool's input, or None when it can."""
    cls = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        return f"is not a valid JSON Schema: {exc.message[:200]}" + (
            f" (at {where})" if where else ""
        )
    anchors: set[str] | None = None
    bad: list[str] = []
    for where, ref in _refs(schema):
        if not isinstance(ref, str):
            continue  # check_schema reported it
        if not ref.startswith("#"):
            bad.append(f"{where} = {ref[:100]!r} names another document (never fetched)")
            continue
        fragment = ref[1:]
        if fragment and not fragment.startswith("/"):
            anchors = _anchors(schema) if anchors is None else anchors
            if unquote(fragment) in anchors:
                continue
        if not _resolves(schema, fragment):
            bad.append(f"{where} = {ref[:100]!r} points at nothing in the schema")
    if bad:
        more = f"; and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
        return "has unresolvable references: " + "; ".join(bad[:MAX_LISTED]) + more
    return None
