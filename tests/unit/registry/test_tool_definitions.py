"""UpsertTools' validation of a custom or MCP definition (tool_from_pb): what a tool could not
be called with, or what no column or prompt could hold, is INVALID_ARGUMENT naming the field
when the tool is registered, never a tool that fails on every call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.registry.servicer import tool_from_pb, tool_to_pb
from shared import convert
from shared.errors import InvalidArgument
from shared.schema_check import schema_problem
from toolmesh.type.v1 import types_pb2 as pb


def definition(**kw: Any) -> pb.ToolDefinition:
    fields: dict[str, Any] = {
        "name": "probe_tool",
        "description": "a probe",
        "input_schema_json": '{"type": "object"}',
        "tool_type": pb.TOOL_TYPE_CUSTOM,
        "implementation": "def run(inputs, ctx):\n    return {}\n",
    }
    fields.update(kw)
    return pb.ToolDefinition(**fields)


def refused_fields(message: pb.ToolDefinition) -> list[str]:
    with pytest.raises(InvalidArgument) as caught:
        tool_from_pb(message)
    assert caught.value.reason == "INVALID_TOOL_DEFINITION"
    return [f for f, _ in caught.value.field_violations]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "nope"},  # not a JSON Schema type
        {"properties": {"a": {"minimum": "five"}}},
        {"$ref": "http://127.0.0.1:9/remote.json"},  # another document: never fetched
        {"$ref": "file:///etc/passwd"},
        {"properties": {"a": {"$ref": "#/$defs/missing"}}},
        {"properties": {"a": {"$ref": "#missing-anchor"}}},
    ],
)
def test_a_custom_tool_whose_schema_could_not_validate_a_call_is_refused(
    schema: dict[str, Any],
) -> None:
    assert schema_problem(schema) is not None
    assert refused_fields(definition(input_schema_json=json.dumps(schema))) == ["input_schema_json"]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "$defs": {"n": {}}},
        {"properties": {"a": {"$ref": "#/properties/b"}, "b": {"type": "integer"}}},
        {"$defs": {"a~b/c": {}}, "properties": {"x": {"$ref": "#/$defs/a~0b~1c"}}},
        {"$defs": {"n": {"$anchor": "num"}}, "properties": {"x": {"$ref": "#num"}}},
        {"properties": {"tree": {"$ref": "#"}}},
    ],
)
def test_local_references_that_resolve_are_accepted(schema: dict[str, Any]) -> None:
    assert schema_problem(schema) is None
    assert tool_from_pb(definition(input_schema_json=json.dumps(schema))).input_schema == schema


def test_an_mcp_servers_schema_is_taken_as_it_is() -> None:
    schema = {"properties": {"a": {"$ref": "#/$defs/missing"}}}
    tool = tool_from_pb(
        definition(tool_type=pb.TOOL_TYPE_MCP, input_schema_json=json.dumps(schema))
    )
    assert tool.input_schema == schema


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"timeout_seconds": float("nan")}, "timeout_seconds"),
        ({"timeout_seconds": float("inf")}, "timeout_seconds"),
        ({"timeout_seconds": -1.0}, "timeout_seconds"),
        ({"timeout_seconds": 86_401.0}, "timeout_seconds"),
        ({"description": "x" * (convert.MAX_TOOL_DESCRIPTION_CHARS + 1)}, "description"),
        ({"handler_path": "os.system"}, "handler_path"),
        ({"test_results_json": "{broken"}, "test_results_json"),  # was INTERNAL
        ({"test_results_json": '{"n": NaN}'}, "test_results_json"),
        ({"test_results_json": "[1, 2]"}, "test_results_json"),
        (
            {"annotations": pb.ToolAnnotations(title="t" * (convert.MAX_TOOL_TITLE_CHARS + 1))},
            "annotations.title",
        ),
        ({"annotations": pb.ToolAnnotations(title="two\nlines")}, "annotations.title"),
    ],
)
def test_unusable_fields_are_refused_naming_the_field(changes: dict[str, Any], field: str) -> None:
    assert refused_fields(definition(**changes)) == [field]


def test_a_definition_within_the_limits_is_kept_whole() -> None:
    tool = tool_from_pb(
        definition(
            description="d" * convert.MAX_TOOL_DESCRIPTION_CHARS,
            timeout_seconds=86_400.0,
            test_results_json='{"passed": 3}',
        )
    )
    assert len(tool.description) == convert.MAX_TOOL_DESCRIPTION_CHARS
    assert tool.timeout_seconds == 86_400.0 and tool.test_results == {"passed": 3}


def test_annotations_round_trip_with_unset_hints_staying_unset() -> None:
    """An undeclared hint is not a false one: MCP reads an absent destructiveHint as true."""
    sent = pb.ToolAnnotations(title="Purge", destructive=True, read_only=False)
    tool = tool_from_pb(definition(tool_type=pb.TOOL_TYPE_MCP, annotations=sent))
    assert tool.annotations == {"title": "Purge", "destructive": True, "read_only": False}
    returned = tool_to_pb(tool).annotations
    assert returned == sent
    assert not returned.HasField("idempotent") and not returned.HasField("open_world")
    assert tool_from_pb(definition(annotations=pb.ToolAnnotations())).annotations is None
    assert not tool_to_pb(tool_from_pb(definition())).HasField("annotations")


def test_custom_code_past_what_the_sandbox_runs_is_refused_at_registration() -> None:
    """The sandbox refuses code over convert.MAX_CUSTOM_CODE_BYTES at every execution
    (code_rejected): the registry no longer stores such a custom tool (it took up to 1 MiB)."""
    fits = "x = 1\n" * (convert.MAX_CUSTOM_CODE_BYTES // 6)
    assert tool_from_pb(definition(implementation=fits)).implementation == fits
    assert refused_fields(definition(implementation=fits + "y = 2\n")) == ["implementation"]
    # An MCP tool's implementation (its server and tool name) is not code.
    tool_from_pb(definition(tool_type=pb.TOOL_TYPE_MCP, implementation="mcp:c:" + "t" * 300_000))
