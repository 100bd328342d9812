"""The compiled first pass of input validation: it only ever accepts what jsonschema accepts, and
stays out of the way where the two libraries could disagree."""

from __future__ import annotations

import itertools
from typing import Any

import jsonschema
import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.registry.core import Registry
from services.registry.fast_accept import fast_acceptor, uses_regex
from services.registry.model import ToolDef
from services.registry.repository import SqlToolRepository
from shared.contract import Hint

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object"},
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 10},
            "s": {"type": "string", "minLength": 2, "maxLength": 3},
            "e": {"enum": ["a", 1, None, True]},
        },
        "required": ["n"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "xs": {"type": "array", "items": {"type": "number"}, "uniqueItems": True},
            "t": {"type": "array", "prefixItems": [{"type": "string"}], "maxItems": 2},
        },
    },
    {
        "type": "object",
        "properties": {"v": {"oneOf": [{"type": "integer"}, {"type": "string", "const": "x"}]}},
        "dependentRequired": {"v": ["w"]},
    },
    {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/pos"}, "m": {"type": "integer", "multipleOf": 3}},
        "$defs": {"pos": {"type": "number", "exclusiveMinimum": 0}},
        "if": {"required": ["a"]},
        "then": {"required": ["m"]},
    },
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"b": {"type": "boolean"}, "o": {"type": "object", "maxProperties": 1}},
        "not": {"required": ["zz"]},
    },
]

VALUES: list[Any] = [
    None,
    True,
    0,
    1.0,
    3,
    -1,
    2.5,
    11,
    2**70,
    "",
    "x",
    "ab",
    "😀😀",  # two code points, four UTF-16 units
    "abcd",
    [],
    [1, 2],
    [1, 1],
    [1, True],
    ["s"],
    ["s", 1, 2],
    {},
    {"k": 1},
    {"k": 1, "j": 2},
]
KEYS = ["n", "s", "e", "xs", "t", "v", "w", "a", "m", "b", "o", "zz"]


def instances() -> list[Any]:
    found: list[Any] = [None, 1, "x", [], {}]
    for key in KEYS:
        found.extend({key: value} for value in VALUES)
    for (k1, v1), (k2, v2) in itertools.product(
        [("n", 3), ("a", 2.5), ("v", 1), ("m", 6), ("s", "ab")],
        [("w", 0), ("m", 4), ("e", "a"), ("n", 11), ("a", 0)],
    ):
        found.append({k1: v1, k2: v2})
    return found


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_whatever_the_first_pass_accepts_jsonschema_accepts_and_it_accepts_most(
    schema: dict[str, Any],
) -> None:
    accept = fast_acceptor(schema)
    assert accept is not None
    validator = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)(schema)
    agreed = 0
    for instance in instances():
        valid = validator.is_valid(instance)
        if accept(instance):
            assert valid, f"accepted {instance!r}, which jsonschema refuses"
        agreed += accept(instance) == valid
    assert agreed >= 0.95 * len(instances())


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "^\\d+$"}}},
        {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
        {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
        {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
        {"$schema": "http://example.com/my-meta", "type": "object"},
    ],
    ids=["pattern", "patternProperties", "propertyNames", "remote-ref", "unknown-meta"],
)
def test_regular_expressions_remote_references_and_unknown_drafts_get_no_first_pass(
    schema: dict[str, Any],
) -> None:
    assert fast_acceptor(schema) is None


def test_the_regex_walk_is_bounded_and_finds_nested_keywords() -> None:
    assert uses_regex({"anyOf": [{"items": [{"not": {"pattern": "a"}}]}]}) is True
    assert uses_regex({"properties": {"a": {"type": "string"}}}) is False
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(50):
        deep = {"items": [deep, deep]}
    assert uses_regex(deep, max_nodes=1000) is None


def test_an_instance_the_compiled_validator_cannot_take_is_left_to_jsonschema() -> None:
    accept = fast_acceptor({"type": "object", "properties": {"x": {"type": "integer"}}})
    assert accept is not None
    assert accept({"x": object()}) is False  # not convertible: never raises
    assert accept({"x": float("nan")}) is False
    assert accept({"x": 10**400}) is True  # an integer beyond 64 bits is still an integer


@pytest.fixture
def registry(sessions: sessionmaker[Session]) -> Registry:
    reg = Registry(SqlToolRepository(sessions), cache_ttl_s=0.0)
    reg.seed_system_tools()
    return reg


def tool(name: str, schema: dict[str, Any]) -> ToolDef:
    return ToolDef(
        name=name,
        description=name,
        input_schema=schema,
        tool_type="custom",
        implementation="result = 1",
        tenant_id="t1",
        created_by="u1",
        status="approved",
    )


def test_valid_input_skips_jsonschema_and_invalid_input_still_gets_its_hint(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = SCHEMAS[1]
    calls: list[Any] = []
    real = jsonschema.Draft202012Validator.iter_errors

    def counting(self: Any, instance: Any, *args: Any) -> Any:
        calls.append(instance)
        return real(self, instance, *args)

    monkeypatch.setattr(jsonschema.Draft202012Validator, "iter_errors", counting)
    checked = tool("checked", schema)

    assert registry._validate(checked, {"n": 1}) is None
    calls.clear()  # the first call also checked the schema against its meta-schema
    assert registry._validate(checked, {"n": 3, "s": "ab"}) is None
    assert calls == []
    hint = registry._validate(checked, {"n": 11, "q": 1})
    assert isinstance(hint, Hint) and hint.hint_kind == "schema"
    assert "n" in hint.message and calls == [{"n": 11, "q": 1}]


def test_a_pattern_is_still_enforced_by_jsonschema_on_re2(registry: Registry) -> None:
    digits = tool("digits", {"type": "object", "properties": {"d": {"pattern": "^\\d+$"}}})

    assert registry._validate(digits, {"d": "123"}) is None
    # RE2's \d is ASCII: Arabic-Indic digits do not match (the Rust engine's would).
    hint = registry._validate(digits, {"d": "١٢٣"})
    assert isinstance(hint, Hint) and hint.hint_kind == "schema"


def test_hostile_depth_neither_crashes_nor_recurses_without_bound() -> None:
    deep_schema: dict[str, Any] = {"type": "array"}
    for _ in range(2000):
        deep_schema = {"type": "array", "items": deep_schema}
    assert fast_acceptor(deep_schema) is None  # the compiled validator refuses it: jsonschema

    accept = fast_acceptor({"type": "object", "properties": {"x": {"type": "array"}}})
    assert accept is not None
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    assert accept({"x": deep}) is True


class PanicException(BaseException):  # the name pyo3 gives a Rust panic
    """What a panic in compiled code raises in Python: a BaseException."""


def test_a_panic_in_the_compiled_validator_leaves_the_decision_to_jsonschema(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import jsonschema_rs

    class Panicking:
        def is_valid(self, instance: Any) -> bool:
            raise PanicException("index out of bounds")

    monkeypatch.setattr(jsonschema_rs, "validator_for", lambda *a, **k: Panicking())
    accept = fast_acceptor({"type": "object"})
    assert accept is not None and accept({"a": 1}) is False

    def panic(*args: Any, **kwargs: Any) -> Any:
        raise PanicException("at build")

    monkeypatch.setattr(jsonschema_rs, "validator_for", panic)
    assert fast_acceptor({"type": "object"}) is None

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(jsonschema_rs, "validator_for", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fast_acceptor({"type": "object"})
