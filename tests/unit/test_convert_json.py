"""JSON object inputs (tool inputs, MCP arguments, rule parameters): anything that parses but
that no other service, database or client could take back is INVALID_ARGUMENT naming why."""

from __future__ import annotations

import json
import sys

import pytest

from shared.contract import Ok, ToolResult, envelope_to_tool_result
from shared.convert import (
    MAX_RESULT_BYTES,
    check_ids,
    context_ids,
    parse_json_object,
    tool_result_to_pb,
)
from shared.errors import InvalidArgument
from toolmesh.type.v1 import types_pb2 as pb


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ('{"a": NaN}', "NaN is not a JSON value"),
        ('{"a": Infinity}', "Infinity is not a JSON value"),
        ('{"a": [-Infinity]}', "-Infinity is not a JSON value"),
        ('{"a": 1e999}', "the number 1e999 is out of range for a double"),
        ('{"a": -2.5E+400}', "out of range for a double"),
        ('{"a": ' + "9" * 5000 + "}", f"more than {sys.get_int_max_str_digits()} digits"),
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"a": ' + "[" * 500 + "]" * 500 + "}", "nested more than 100 levels deep"),
        ('{"a": ' + '{"b": ' * 100 + "1" + "}" * 100 + "}", "nested more than 100 levels deep"),
        ('{"a": "x\\ud800y"}', "unpaired UTF-16 surrogate ('\\ud800')"),
        ('{"\\uDFFF": 1}', "unpaired UTF-16 surrogate ('\\udfff')"),
        ('{"a": {"b": ["\\ude00\\ud83d"]}}', "unpaired UTF-16 surrogate"),
        ('{"echo": 1, "echo": 2}', "the key 'echo' appears twice in one object"),
        ('{"a": [{"x": 1, "y": 2, "x": 1}]}', "the key 'x' appears twice"),
        ('{"\\u0061": 1, "a": 2}', "the key 'a' appears twice"),  # the same key, escaped
    ],
)
def test_unacceptable_json_is_invalid_argument_saying_why(text: str, detail: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_json_object(text, "tool_use.input_json")
    error = caught.value
    assert error.reason == "INPUT_NOT_JSON"
    assert error.message.startswith("tool_use.input_json is not acceptable JSON: ")
    assert detail in error.message


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"a": "\\ud83d\\ude00"}', {"a": "\U0001f600"}),  # a surrogate pair is one character
        ('{"a": "\\u00e9\\u0000"}', {"a": "é\x00"}),
        ('{"a": 1.7976931348623157e308, "b": -0.0, "c": 1e-400}', None),
        ('{"a": ' + "9" * 4000 + "}", {"a": int("9" * 4000)}),
        ('{"a": ' + "[" * 99 + "]" * 99 + "}", None),
        ('{"a": "' + "[{" * 500 + '"}', None),  # brackets inside a string are not nesting
        ("{" + ", ".join(f'"k{i}": [[1]]' for i in range(200)) + "}", None),
        ('{"a": {"k": 1}, "b": {"k": 2}, "A": 3}', None),  # the same key in two objects; case
        ("  ", {}),
    ],
)
def test_acceptable_json_decodes_as_before(text: str, value: object) -> None:
    decoded = parse_json_object(text, "f")
    if value is not None:
        assert decoded == value
    else:
        assert isinstance(decoded, dict)


@pytest.mark.parametrize(
    ("text", "reason"), [("[1]", "INPUT_NOT_OBJECT"), ("{x", "INPUT_NOT_JSON")]
)
def test_what_is_not_an_object_keeps_its_reason(text: str, reason: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_json_object(text, "f")
    assert caught.value.reason == reason


@pytest.mark.parametrize(
    "result",
    [
        ToolResult(content="before \udc80 after"),
        envelope_to_tool_result(Ok(data={"text": "x\ud800"})),
        ToolResult(content="fine", cards=[{"title": "\udfff"}]),
    ],
)
def test_a_result_holding_text_that_is_not_unicode_becomes_an_err_naming_it(
    result: ToolResult,
) -> None:
    message = tool_result_to_pb(result)
    assert message.envelope.err.err_kind == "malformed_result"
    assert "not valid Unicode" in message.envelope.err.message
    assert "unpaired UTF-16 surrogate" in message.content
    message.SerializeToString()  # and it can be sent


def test_a_result_with_valid_astral_text_is_untouched() -> None:
    message = tool_result_to_pb(ToolResult(content="\U0001f600 ok"))
    assert message.content.endswith("\U0001f600 ok")
    assert message.envelope.WhichOneof("kind") == "ok"


@pytest.mark.parametrize(
    ("context", "reason", "field"),
    [
        (pb.CallContext(tenant_id="t" * 129), "ID_TOO_LONG", "context.tenant_id"),
        (pb.CallContext(conversation_id="a\x00b"), "ID_INVALID", "context.conversation_id"),
        (pb.CallContext(user_id="u\n"), "ID_INVALID", "context.user_id"),
        (pb.CallContext(namespace_id="n" * 200), "ID_TOO_LONG", "context.namespace_id"),
        (pb.CallContext(tool_use_id="x\x7f"), "ID_INVALID", "context.tool_use_id"),
    ],
)
def test_ids_a_table_cannot_store_are_invalid_argument(
    context: pb.CallContext, reason: str, field: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_ids(context_ids(context))
    assert caught.value.reason == reason
    assert caught.value.field_violations[0][0] == field
    assert "\x00" not in caught.value.message  # control characters shown as U+FFFD


def test_ordinary_ids_pass() -> None:
    check_ids(context_ids(pb.CallContext(tenant_id="t" * 128, conversation_id="conv-é-😀")))


def test_a_result_no_service_could_send_on_becomes_an_err_naming_its_size() -> None:
    # An MCP server's 40 MB text went out as content and again as the Ok's data, and failed
    # between the bridge and the registry ("Sent message larger than max").
    big = envelope_to_tool_result(Ok(data="z" * (20 * 1024 * 1024)))
    message = tool_result_to_pb(big)
    assert message.envelope.err.err_kind == "result_too_large"
    assert str(MAX_RESULT_BYTES) in message.envelope.err.message
    assert message.ByteSize() < 10_000
    fits = tool_result_to_pb(envelope_to_tool_result(Ok(data="z" * (1024 * 1024))))
    assert fits.envelope.WhichOneof("kind") == "ok"


def test_mapping_keys_read_the_same_on_the_strict_and_the_lenient_path() -> None:
    from shared.convert import data_json

    keys = {True: 1, False: 2, None: 3, 7: 4, 1.5: 5}
    strict = json.loads(data_json(keys))
    lenient = json.loads(data_json({**keys, "nan": float("nan"), "obj": object()}))
    assert strict == {"true": 1, "false": 2, "null": 3, "7": 4, "1.5": 5}
    assert {k: v for k, v in lenient.items() if k in strict} == strict
    assert lenient["nan"] == "nan"
