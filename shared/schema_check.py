"""What makes a tool's input schema unusable, and which JSON Schema dialect it is read in.

A custom tool's schema is vetted when the tool is registered (`schema_problem`); an MCP server's
schema is taken as declared and vetted when it is first used (`schema_defect`), so that a call
to an unusable one is answered with a schema Hint saying why, never a traceback.

Unusable is: not a JSON Schema its dialect accepts, a `$ref` the registry cannot resolve, or
references that loop without ever reaching a value (`{"$defs": {"a": {"$ref": "#/$defs/b"},
"b": {"$ref": "#/$defs/a"}}}` would recurse for ever on any input).

The dialect (`dialect`) is the one `$schema` names, whether written with http or https, with
or without the empty fragment; a schema declaring none is read as 2020-12, unless only an older
dialect accepts it (a draft-04 boolean `exclusiveMinimum`, a draft-07 `items` array, as OpenAPI
3.0 and older generators write them), which it is then read in.

A `pattern` is checked as a regular expression that RE2 (what input patterns run on, see
shared.schema_regex) or Python's `re` can compile: Unicode property escapes (`\\p{L}`) are
valid ECMA-262 that `re` refuses.

The registry never fetches a schema: a `$ref` to another document (http, file, any URI not
starting with `#`) would be unresolvable at call time, so a custom tool naming one is refused.
Local references (`#/$defs/...`, `#/properties/...`) must point at something that exists."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any
from urllib.parse import unquote

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema.exceptions import ValidationError

from shared import schema_regex

MAX_LISTED = 5

Dialect = type[jsonschema.protocols.Validator]

_DIALECTS: dict[str, Dialect] = {
    "json-schema.org/draft-03/schema": jsonschema.Draft3Validator,
    "json-schema.org/draft-04/schema": jsonschema.Draft4Validator,
    "json-schema.org/draft-06/schema": jsonschema.Draft6Validator,
    "json-schema.org/draft-07/schema": jsonschema.Draft7Validator,
    "json-schema.org/draft/2019-09/schema": jsonschema.Draft201909Validator,
    "json-schema.org/draft/2020-12/schema": jsonschema.Draft202012Validator,
}
DEFAULT_DIALECT: Dialect = jsonschema.Draft202012Validator
# Tried in order for a schema that declares no dialect.
_UNDECLARED = (
    jsonschema.Draft202012Validator,
    jsonschema.Draft7Validator,
    jsonschema.Draft4Validator,
)
# Dialects in which a `$ref` makes its sibling keywords ignored.
_REF_ALONE = frozenset(
    {
        jsonschema.Draft3Validator,
        jsonschema.Draft4Validator,
        jsonschema.Draft6Validator,
        jsonschema.Draft7Validator,
    }
)

_TYPE_NAMES = ("array", "boolean", "integer", "null", "number", "object", "string")
# What tool-calling datasets and other languages write for a JSON Schema type (BFCL's "dict",
# "float", "tuple", "any"; Java and JavaScript names).
_TYPE_SYNONYMS = {
    "dict": "object",
    "map": "object",
    "hashmap": "object",
    "record": "object",
    "float": "number",
    "double": "number",
    "decimal": "number",
    "int": "integer",
    "long": "integer",
    "short": "integer",
    "byte": "integer",
    "bigint": "integer",
    "bool": "boolean",
    "str": "string",
    "char": "string",
    "list": "array",
    "tuple": "array",
    "set": "array",
    "arraylist": "array",
    "none": "null",
}
_ANY_TYPES = frozenset({"any", "mixed"})


def _normalise_uri(uri: str) -> str:
    text = uri.strip()
    for scheme in ("https://", "http://"):
        if text.lower().startswith(scheme):
            text = text[len(scheme) :]
            break
    return text.rstrip("#").rstrip("/").lower()


def dialect(schema: Any) -> Dialect:
    """The validator class `schema` is read with (see the module's docstring)."""
    if not isinstance(schema, Mapping):
        return DEFAULT_DIALECT
    declared = schema.get("$schema")
    if isinstance(declared, str):
        return _DIALECTS.get(_normalise_uri(declared), DEFAULT_DIALECT)
    if declared is not None:
        return DEFAULT_DIALECT  # not a URI: the meta-schema check reports it
    for cls in _UNDECLARED:
        try:
            if next(_meta_errors(schema, cls), None) is None:
                return cls
        except RecursionError:
            break  # schema_defect says it is nested too deeply
    return DEFAULT_DIALECT


def dialect_uri(cls: Dialect) -> str:
    """The canonical `$schema` URI of a dialect."""
    meta = cls.META_SCHEMA
    return str(meta.get("$id") or meta.get("id"))


# --- validation semantics ------------------------------------------------------------------


def _is_multiple(value: int | float, divisor: int | float) -> bool:
    """Whether `value` is a multiple of `divisor` as the numbers are written in JSON: 19.99 is
    a multiple of 0.01 (in binary floating point 19.99 / 0.01 is 1998.9999999999998)."""
    if isinstance(value, int) and isinstance(divisor, int):
        return divisor != 0 and value % divisor == 0
    try:
        quotient = Fraction(Decimal(repr(value))) / Fraction(Decimal(repr(divisor)))
    except (InvalidOperation, ValueError, ZeroDivisionError, OverflowError):
        return False
    return quotient.denominator == 1


def _multiple_of(
    validator: Any, divisor: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "number") or not validator.is_type(divisor, "number"):
        return
    if not _is_multiple(instance, divisor):
        yield ValidationError(f"{instance!r} is not a multiple of {divisor}")


def _json_key(value: Any) -> Any:
    """A hashable stand-in for a JSON value, equal for values JSON Schema calls equal (1 and
    1.0; objects whatever their key order) and only for those (1 and true differ)."""
    if isinstance(value, bool) or value is None:
        return ("c", value)
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("a", tuple(_json_key(v) for v in value))
    if isinstance(value, Mapping):
        return ("o", frozenset((k, _json_key(v)) for k, v in value.items()))
    return ("x", id(value))


def _unique_items(
    validator: Any, unique: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: dict[Any, int] = {}
    for index, item in enumerate(instance):
        first = seen.setdefault(_json_key(item), index)
        if first != index:
            yield ValidationError(f"has non-unique elements (items {first} and {index} are equal)")
            return


_KEYWORDS = {"multipleOf": _multiple_of, "uniqueItems": _unique_items}


def install() -> None:
    """Make jsonschema check two keywords as the compiled first pass checks them (fast_accept),
    so that the two never disagree (idempotent; like shared.schema_regex.install, for the
    process): `multipleOf` on the decimal numbers as written, and `uniqueItems` in linear time
    (jsonschema compares every pair of objects: 21 s for 4000 of them)."""
    for cls in _DIALECTS.values():
        for keyword, check in _KEYWORDS.items():
            if keyword in cls.VALIDATORS:
                cls.VALIDATORS[keyword] = check


def _is_regex(pattern: object) -> bool:
    if not isinstance(pattern, str):
        return True  # the meta-schema's type check reports it
    try:
        schema_regex.compile_re2(pattern)
        return True
    except ValueError:
        pass
    try:
        re.compile(pattern)
        return True
    except (re.error, OverflowError, RecursionError):
        return False


def _format_checker(cls: Dialect) -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker()
    checker.checkers = dict(cls.FORMAT_CHECKER.checkers)
    checker.checkers["regex"] = (_is_regex, ())
    return checker


def _meta_errors(schema: Any, cls: Dialect) -> Iterator[ValidationError]:
    """Where `schema` breaks its dialect's meta-schema (what `check_schema` checks, with the
    regular expressions checked as described in the module's docstring)."""
    meta = cls(cls.META_SCHEMA, format_checker=_format_checker(cls))
    return meta.iter_errors(schema)


def _where(path: Any) -> str:
    return "/".join(str(p) for p in path) or "the root"


def _type_advice(name: str) -> str:
    folded = name.strip().lower()
    if folded in _TYPE_NAMES:
        return f"JSON Schema type names are lower case: use '{folded}'"
    if folded in _TYPE_SYNONYMS:
        return f"use '{_TYPE_SYNONYMS[folded]}'"
    if folded in _ANY_TYPES:
        return "leave 'type' out to allow any value"
    return "use one of " + ", ".join(_TYPE_NAMES)


def _describe_meta_error(error: ValidationError) -> str:
    path = list(error.path)
    value = error.instance
    if path and path[-1] == "type" and isinstance(value, str | list):
        names = [value] if isinstance(value, str) else value
        bad = [n for n in names if not (isinstance(n, str) and n in _TYPE_NAMES)]
        if bad:
            advice = "; ".join(
                f"{n!r}: {_type_advice(n)}" if isinstance(n, str) else f"{n!r} is not a name"
                for n in bad[:3]
            )
            return f"{_where(path)}: not a JSON Schema type ({advice})"
    return f"{_where(path)}: {error.message[:200]}"


def meta_problems(schema: Any, cls: Dialect) -> list[str]:
    """Every way `schema` breaks its dialect's meta-schema, each naming where, first ones
    first (empty when it is a valid schema)."""
    found: dict[str, None] = {}
    errors = sorted(
        _take(_meta_errors(schema, cls), 100),
        key=lambda e: [str(p) for p in e.path],
    )
    for error in errors:
        found.setdefault(_describe_meta_error(error))
    return list(found)


def _take(errors: Iterator[ValidationError], n: int) -> list[ValidationError]:
    out = []
    for error in errors:
        out.append(error)
        if len(out) >= n:
            break
    return out


def _listed(problems: list[str]) -> str:
    more = f"; and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    return "; ".join(problems[:MAX_LISTED]) + more


# --- references ---------------------------------------------------------------------------


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


def _unresolvable(schema: dict[str, Any]) -> list[str]:
    anchors: set[str] | None = None
    bad: list[str] = []
    for where, ref in _refs(schema):
        if not isinstance(ref, str):
            continue  # the meta-schema check reported it
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
    return bad


# Keywords whose subschemas apply to the same value as the schema they are in: a reference
# reached again through these only loops, it never moves on to a part of the value.
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_MAPS = ("dependentSchemas", "dependencies")
_REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")


def _in_place(node: Mapping[str, Any], cls: Dialect) -> Iterator[tuple[str | None, Any]]:
    """The (reference, subschema) pairs applied to the same value as `node`: a reference is
    given as written, a structural child as None."""
    for key in _REFERENCES:
        if isinstance(node.get(key), str):
            yield node[key], None
    if cls in _REF_ALONE and "$ref" in node:
        return
    for key in _IN_PLACE_LISTS:
        value = node.get(key)
        if isinstance(value, list):
            for sub in value:
                yield None, sub
    for key in _IN_PLACE_ONE:
        if key in node:
            yield None, node[key]
    for key in _IN_PLACE_MAPS:
        value = node.get(key)
        if isinstance(value, Mapping):
            for sub in value.values():
                if isinstance(sub, Mapping):
                    yield None, sub


_SUBSCHEMA_ONE = (
    "additionalProperties",
    "additionalItems",
    "items",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = (
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
)


def _subschemas(node: Mapping[str, Any]) -> Iterator[Any]:
    """Every subschema directly inside `node` (not the values of enum, const, default...)."""
    for key in _SUBSCHEMA_ONE:
        if isinstance(node.get(key), Mapping):
            yield node[key]
    for key in _SUBSCHEMA_LISTS:
        value = node.get(key)
        if isinstance(value, list):
            yield from (sub for sub in value if isinstance(sub, Mapping))
    for key in _SUBSCHEMA_MAPS:
        value = node.get(key)
        if isinstance(value, Mapping):
            yield from (sub for sub in value.values() if isinstance(sub, Mapping))


def reference_cycle(schema: Any, cls: Dialect) -> list[str] | None:
    """The references of a loop that never reaches a part of the value (each applies to the
    same value as the last, back to the first), or None when there is none. Every subschema
    is a starting point: a loop reached only through `properties` recurses as surely."""
    if not isinstance(schema, Mapping):
        return None
    spec = referencing.jsonschema.specification_with(
        dialect_uri(cls), default=referencing.jsonschema.DRAFT202012
    )
    root = referencing.Registry().resolver_with_root(spec.create_resource(schema))
    done: set[int] = set()

    def subresolver(res: Any, sub: Any) -> Any:
        return res.in_subresource(spec.create_resource(sub))

    def loop_from(start: Mapping[str, Any], start_res: Any) -> list[str] | None:
        on_path: dict[int, int] = {}  # id(node) -> its index in `path`
        path: list[str | None] = []  # the reference each node on the path was reached by
        # Depth-first, without recursion: (node, its resolver, its children still to visit).
        stack: list[tuple[Any, Any, Iterator[tuple[str | None, Any]]]] = []

        def enter(node: Any, via: str | None, res: Any) -> list[str] | None:
            key = id(node)
            if key in on_path:
                refs = [r for r in path[on_path[key] + 1 :] if r is not None]
                return [*refs, via] if via is not None else refs or None
            if key in done or not isinstance(node, Mapping):
                return None
            on_path[key] = len(path)
            path.append(via)
            stack.append((node, res, _in_place(node, cls)))
            return None

        found = enter(start, None, start_res)
        while stack and found is None:
            node, res, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                on_path.pop(id(node), None)
                done.add(id(node))
                continue
            ref, sub = child
            try:
                if ref is not None:
                    resolved = res.lookup(ref)
                    found = enter(resolved.contents, ref, resolved.resolver)
                else:
                    found = enter(sub, None, subresolver(res, sub))
            except referencing.exceptions.Unresolvable:
                continue  # reported as unresolvable, or left to the validator
            except (TypeError, ValueError, LookupError):
                continue  # a malformed part: the meta-schema check reports it
        return found

    walk: list[tuple[Mapping[str, Any], Any]] = [(schema, root)]
    while walk:
        node, res = walk.pop()
        if id(node) not in done:
            found = loop_from(node, res)
            if found:
                return found
        for sub in _subschemas(node):
            try:
                walk.append((sub, subresolver(res, sub)))
            except (TypeError, ValueError, LookupError):
                continue
    return None


def _cycle_text(refs: list[str]) -> str:
    loop = " -> ".join(repr(r[:100]) for r in [*refs, refs[0]])
    return f"references that loop without ever reaching a value ({loop})"


def dialect_name(cls: Dialect) -> str:
    """`draft-07`, `2020-12`...: how a dialect is named in a message."""
    uri = dialect_uri(cls)
    return uri.rstrip("#").rsplit("/", 2)[-2] if "/draft/" in uri else uri.rsplit("/", 2)[-2]


def schema_defect(schema: Any, cls: Dialect) -> str | None:
    """Why `schema`, read in dialect `cls`, cannot validate any input, or None: "not a valid
    JSON Schema (draft-07): <where: what>..." or "references that loop ...". What an MCP
    server's schema is held to."""
    try:
        problems = meta_problems(schema, cls)
    except RecursionError:
        return f"not a valid JSON Schema ({dialect_name(cls)}): nested too deeply to be checked"
    if problems:
        return f"not a valid JSON Schema ({dialect_name(cls)}): " + _listed(problems)
    cycle = reference_cycle(schema, cls)
    if cycle:
        return _cycle_text(cycle)
    return None


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why `schema` cannot validate a custom tool's input, or None when it can."""
    defect = schema_defect(schema, dialect(schema))
    if defect is not None:
        return ("has " if defect.startswith("references") else "is ") + defect
    bad = _unresolvable(schema)
    if bad:
        return "has unresolvable references: " + _listed(bad)
    return None
