"""The sandbox checks a custom tool's input schema as the registry does (shared.schema_check), so
a definition it stores is one the registry accepts and one it refuses gets the same advice."""

from __future__ import annotations

from typing import Any

import pytest

from services.sandbox.core import validate_definition
from shared.errors import InvalidArgument
from shared.schema_check import schema_problem

CODE = "result = {'ok': True}"


def refusal(schema: dict[str, Any]) -> str:
    with pytest.raises(InvalidArgument) as info:
        validate_definition("probe", CODE, schema, "t1")
    ((field, description),) = info.value.field_violations
    assert field == "tool.input_schema_json"
    return description


def test_a_non_standard_type_is_refused_with_the_fix_named() -> None:
    schema = {"type": "dict", "properties": {"x": {"type": "float"}}}
    described = refusal(schema)
    assert "'float': use 'number'" in described and "'dict': use 'object'" in described
    assert described == schema_problem(schema)


def test_a_reference_loop_is_refused_before_it_can_recurse_at_call_time() -> None:
    schema = {
        "type": "object",
        "properties": {"e": {"$ref": "#/$defs/expr"}},
        "$defs": {"expr": {"anyOf": [{"$ref": "#/$defs/expr"}, {"type": "string"}]}},
    }
    assert "loop" in refusal(schema)


@pytest.mark.parametrize(
    "schema",
    [
        # A Unicode property pattern RE2 runs (Python's re alone cannot compile it).
        {"type": "object", "properties": {"name": {"type": "string", "pattern": r"^\p{L}+$"}}},
        # An https $schema spelling of draft-07.
        {
            "$schema": "https://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"n": {"type": "integer", "exclusiveMinimum": 0}},
        },
    ],
)
def test_schemas_the_registry_accepts_are_accepted(schema: dict[str, Any]) -> None:
    assert schema_problem(schema) is None
    validate_definition("probe", CODE, schema, "t1")
