"""The registry against real published tool schemas: the MCP reference servers, github-mcp-server,
OpenAI's and Anthropic's documentation examples, BFCL, ToolBench, an OpenAPI document, and a few
derived ones that cover what the published ones do not (tests/data/tool_schemas/published.json,
each entry citing its source).

For every schema: it registers as an MCP tool as declared, and as a custom tool unless it is not
a JSON Schema (BFCL's "dict", "float", "tuple", "any"), which is refused naming where and what
to write instead; every valid input reaches the tool exactly as the model sent it, accepted by
the compiled first pass and by jsonschema alike; every invalid input is a `schema` Hint naming
the field and what was expected; and no input, however hostile to a regular expression or to a
pairwise comparison, takes more than a moment to decide."""

from __future__ import annotations

import copy
import json
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.registry.context import ToolContext
from services.registry.core import Registry
from services.registry.fast_accept import fast_acceptor
from services.registry.model import ToolDef
from services.registry.repository import SqlToolRepository
from services.registry.servicer import tool_from_pb
from shared import convert, schema_check, schema_regex
from shared.contract import Hint, ToolResult
from shared.db.engine import make_engine, session_factory
from shared.errors import InvalidArgument
from tests.conftest import fresh_database_url
from toolmesh.type.v1 import types_pb2 as pb

CORPUS_PATH = Path(__file__).parents[2] / "data" / "tool_schemas" / "published.json"
CORPUS: list[dict[str, Any]] = json.loads(CORPUS_PATH.read_text("utf-8"))["entries"]
STANDARD = [e for e in CORPUS if e["standard"]]
NON_STANDARD = [e for e in CORPUS if not e["standard"]]
# Deciding one input: generous for a loaded CI machine, far below what a backtracking regular
# expression or a quadratic comparison takes on the adversarial inputs (seconds to days).
DECISION_BUDGET_S = 5.0


def ids(entries: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in entries]


def registered_name(entry: dict[str, Any]) -> str:
    """A tool name the registry takes ([a-zA-Z0-9_-]{1,64}), unique per entry."""
    return re.sub(r"[^a-zA-Z0-9_-]", "_", entry["id"])[:64]


def definition(entry: dict[str, Any], tool_type: int) -> pb.ToolDefinition:
    return pb.ToolDefinition(
        name=registered_name(entry),
        description=f"{entry['tool']} ({entry['source'][:200]})",
        input_schema_json=json.dumps(entry["schema"]),
        tool_type=tool_type,
        implementation="def run(inputs, ctx):\n    return {}\n",
        status=pb.TOOL_STATUS_APPROVED,
        enabled=True,
    )


def typed(value: Any) -> Any:
    """`value` with every scalar tagged by its type: 1, 1.0 and True compare unequal."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


def expand(value: Any) -> Any:
    """An adversarial input from its recipe (the corpus's "expansions")."""
    if isinstance(value, dict):
        if "$repeat" in value:
            text = value["$repeat"] * value["times"]
            return value.get("prefix", "") + text + value.get("suffix", "")
        if "$list" in value:
            text = json.dumps(value["$list"])
            return [json.loads(text.replace("{i}", str(i))) for i in range(value["count"])]
        if "$keyed" in value:
            return {expand(value["$keyed"]): expand(value["value"])}
        return {k: expand(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v) for v in value]
    return value


class Recorder:
    """The MCP bridge's place: records what reached the tool."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def execute(
        self, tool: ToolDef, inputs: dict[str, Any], context: ToolContext
    ) -> ToolResult:
        self.calls.append((tool.name, inputs))
        return ToolResult(content="ran")


@pytest.fixture(scope="module")
def sessions(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[sessionmaker[Session]]:
    """One SQLite database for the module: every corpus tool is stored once."""
    engine = make_engine(fresh_database_url(request, "sqlite", str(tmp_path_factory.mktemp("db"))))
    yield session_factory(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="module")
def registry(sessions: sessionmaker[Session], recorder: Recorder) -> Iterator[Registry]:
    """Every corpus schema registered as an MCP tool, the way UpsertTools stores one."""
    reg = Registry(SqlToolRepository(sessions), cache_ttl_s=60.0, routes={"mcp": recorder})
    reg.repo.upsert([tool_from_pb(definition(e, pb.TOOL_TYPE_MCP)) for e in CORPUS])
    yield reg
    reg.close()


def ctx() -> ToolContext:
    return ToolContext(tool_name="", tenant_id="t1", conversation_id="c1")


async def call(registry: Registry, entry: dict[str, Any], inputs: Any) -> ToolResult:
    """One call as ExecuteTool makes it: the model's JSON text decoded, then executed."""
    decoded = convert.parse_json_object(json.dumps(inputs, ensure_ascii=False), "input_json")
    return (await registry.execute(registered_name(entry), decoded, ctx())).result


def both_paths(entry: dict[str, Any]) -> tuple[Any, Any]:
    """The compiled first pass (None when the schema gets none) and jsonschema's validator,
    made as the registry makes them."""
    schema = entry["schema"]
    schema_regex.install()
    schema_check.install()
    dialect = schema_check.dialect(schema)
    return (
        fast_acceptor(schema, dialect=schema_check.dialect_uri(dialect)),
        dialect(schema),
    )


# --- the corpus ----------------------------------------------------------------------------


def test_the_corpus_covers_what_it_claims() -> None:
    assert 40 <= len(CORPUS) <= 80
    assert len({e["id"] for e in CORPUS}) == len(CORPUS)
    assert len({registered_name(e) for e in CORPUS}) == len(CORPUS)
    for entry in STANDARD:
        assert entry["source"] and entry["tool"], entry["id"]
        assert entry["valid"] and entry["invalid"], entry["id"]
    features = " ".join(f for e in CORPUS for f in e["features"])
    for wanted in (
        "$ref:#", "$defs", "recursive", "anyOf", "oneOf", "allOf", "const", "huge enum",
        "format:uri", "format:date-time", "format:email", "pattern:\\d", "pattern:\\w",
        "pattern:lookahead", "pattern:\\p{L}", "patternProperties", "additionalProperties:false",
        "additionalProperties:schema", "prefixItems", "minItems", "maxItems",
        "nullable:type-array", "dependentRequired", "unevaluatedProperties", "integer",
        "exclusiveMinimum:number", "exclusiveMinimum:boolean", "$schema:draft-04",
        "$schema:draft-06", "$schema:draft-07", "$schema:2019-09", "$schema:2020-12",
        "deeply nested", "bfcl non-standard type",
    ):  # fmt: skip
        assert wanted in features, wanted


# --- registration --------------------------------------------------------------------------


@pytest.mark.parametrize("entry", CORPUS, ids=ids(CORPUS))
def test_an_mcp_servers_schema_is_registered_as_declared(entry: dict[str, Any]) -> None:
    tool = tool_from_pb(definition(entry, pb.TOOL_TYPE_MCP))
    assert tool.tool_type == "mcp" and tool.input_schema == entry["schema"]


@pytest.mark.parametrize("entry", STANDARD, ids=ids(STANDARD))
def test_a_custom_tool_with_a_published_schema_is_registered_unless_re2_cannot_run_it(
    entry: dict[str, Any],
) -> None:
    assert schema_check.schema_problem(entry["schema"]) is None
    if entry.get("re2_unsupported"):
        with pytest.raises(InvalidArgument) as caught:
            tool_from_pb(definition(entry, pb.TOOL_TYPE_CUSTOM))
        assert [f for f, _ in caught.value.field_violations] == ["input_schema_json"]
        assert "RE2" in str(caught.value)
    else:
        assert tool_from_pb(definition(entry, pb.TOOL_TYPE_CUSTOM)).input_schema == entry["schema"]


@pytest.mark.parametrize("entry", NON_STANDARD, ids=ids(NON_STANDARD))
def test_a_custom_tool_whose_schema_is_not_json_schema_is_refused_saying_where_and_what(
    entry: dict[str, Any],
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        tool_from_pb(definition(entry, pb.TOOL_TYPE_CUSTOM))
    assert caught.value.reason == "INVALID_TOOL_DEFINITION"
    [(field, problem)] = caught.value.field_violations
    assert field == "input_schema_json"
    for where, _, advice in entry["bad_types"]:
        assert where in problem and advice in problem, problem


# --- calls -----------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", STANDARD, ids=ids(STANDARD))
async def test_a_valid_input_reaches_the_tool_exactly_as_sent(
    registry: Registry, recorder: Recorder, entry: dict[str, Any]
) -> None:
    accept, validator = both_paths(entry)
    for inputs in entry["valid"]:
        assert validator.is_valid(inputs), (inputs, next(validator.iter_errors(inputs)).message)
        if accept is not None:
            assert accept(inputs), inputs  # the first pass settles valid input
        recorder.calls.clear()
        result = await call(registry, entry, inputs)
        assert result.envelope is None or not isinstance(result.envelope, Hint), result.envelope
        [(name, received)] = recorder.calls
        assert name == registered_name(entry)
        assert typed(received) == typed(inputs)  # 3 stays 3, 3.0 stays 3.0, true stays true


@pytest.mark.parametrize("entry", STANDARD, ids=ids(STANDARD))
async def test_an_invalid_input_is_a_schema_hint_naming_the_field_and_the_expectation(
    registry: Registry, recorder: Recorder, entry: dict[str, Any]
) -> None:
    accept, validator = both_paths(entry)
    for case in entry["invalid"]:
        inputs = case["input"]
        assert not validator.is_valid(inputs), inputs
        assert accept is None or not accept(inputs), inputs
        recorder.calls.clear()
        result = await call(registry, entry, inputs)
        hint = result.envelope
        assert isinstance(hint, Hint) and hint.hint_kind == "schema", (inputs, hint)
        assert case["field"] in hint.message, (case["field"], hint.message)
        assert case["expect"] in hint.message, (case["expect"], hint.message)
        assert "Traceback" not in hint.message and recorder.calls == []


WITH_FORMATS = [e for e in CORPUS if e.get("format_only")]


@pytest.mark.parametrize("entry", WITH_FORMATS, ids=ids(WITH_FORMATS))
async def test_a_format_is_an_annotation_in_both_paths(
    registry: Registry, recorder: Recorder, entry: dict[str, Any]
) -> None:
    accept, validator = both_paths(entry)
    for inputs in entry["format_only"]:
        assert validator.is_valid(inputs) and (accept is None or accept(inputs))
        recorder.calls.clear()
        await call(registry, entry, inputs)
        assert len(recorder.calls) == 1


UNENFORCED = [e for e in CORPUS if e.get("not_enforced")]


@pytest.mark.parametrize("entry", UNENFORCED, ids=ids(UNENFORCED))
async def test_an_mcp_pattern_re2_cannot_run_is_not_enforced_and_nothing_backtracks(
    registry: Registry, recorder: Recorder, entry: dict[str, Any]
) -> None:
    for inputs in entry["not_enforced"]:
        recorder.calls.clear()
        await call(registry, entry, inputs)
        assert len(recorder.calls) == 1


@pytest.mark.parametrize("entry", NON_STANDARD, ids=ids(NON_STANDARD))
async def test_an_unusable_mcp_schema_answers_every_call_with_a_hint_saying_why(
    registry: Registry, recorder: Recorder, entry: dict[str, Any]
) -> None:
    for inputs in entry["calls"]:
        recorder.calls.clear()
        hint = (await call(registry, entry, inputs)).envelope
        assert isinstance(hint, Hint) and hint.hint_kind == "schema", hint
        assert "has an invalid input schema" in hint.message
        for where, _, advice in entry["bad_types"]:
            assert where in hint.message and advice in hint.message, hint.message
        assert recorder.calls == []


ADVERSARIAL = [(e, i) for e in CORPUS for i in range(len(e.get("adversarial", [])))]


@pytest.mark.parametrize(
    ("entry", "index"), ADVERSARIAL, ids=[f"{e['id']}-{i}" for e, i in ADVERSARIAL]
)
async def test_a_hostile_input_is_decided_in_a_moment(
    registry: Registry, recorder: Recorder, entry: dict[str, Any], index: int
) -> None:
    inputs = expand(entry["adversarial"][index])
    recorder.calls.clear()
    started = time.perf_counter()
    result = await call(registry, entry, inputs)
    elapsed = time.perf_counter() - started
    assert isinstance(result.envelope, Hint) and result.envelope.hint_kind == "schema"
    assert len(result.envelope.message) < 2000
    assert elapsed < DECISION_BUDGET_S, f"{elapsed:.2f} s"


# --- the two paths agree -------------------------------------------------------------------


def mutations(value: Any, rng: random.Random, n: int) -> Iterator[Any]:
    """n variations of a JSON value: a leaf retyped or nudged, a key dropped or added."""
    leaves: list[Any] = [
        1,
        1.0,
        0,
        -1,
        2.5,
        0.07,
        19.99,
        True,
        None,
        "",
        "x",
        "1",
        [],
        {},
        10**20,
        1e-9,
    ]
    for _ in range(n):
        out = copy.deepcopy(value)
        node = out
        for _depth in range(rng.randint(0, 6)):
            if isinstance(node, dict) and node:
                key = rng.choice(list(node))
                if isinstance(node[key], dict | list) and rng.random() < 0.7:
                    node = node[key]
                    continue
                choice = rng.random()
                if choice < 0.2:
                    del node[key]
                elif choice < 0.3:
                    node[f"{key}_"] = rng.choice(leaves)
                else:
                    node[key] = rng.choice(leaves)
                break
            if isinstance(node, list) and node:
                at = rng.randrange(len(node))
                if isinstance(node[at], dict | list) and rng.random() < 0.7:
                    node = node[at]
                    continue
                if rng.random() < 0.2:
                    node.append(copy.deepcopy(node[at]))
                else:
                    node[at] = rng.choice(leaves)
                break
            break
        yield out


def test_whatever_the_first_pass_accepts_jsonschema_accepts_across_the_corpus() -> None:
    rng = random.Random(20240607)
    checked = 0
    for entry in STANDARD:
        accept, validator = both_paths(entry)
        if accept is None:
            continue
        seeds = [*entry["valid"], *(c["input"] for c in entry["invalid"])]
        for seed in seeds:
            for inputs in mutations(seed, rng, 25):
                if accept(inputs):
                    assert validator.is_valid(inputs), (entry["id"], inputs)
                checked += 1
    assert checked > 1000


# --- the defects this corpus found, one by one ------------------------------------------------


def test_money_is_a_multiple_of_a_cent_in_jsonschema_as_in_the_first_pass() -> None:
    """19.99 / 0.01 is 1998.9999999999998 in binary floating point: jsonschema refused it where
    the compiled first pass (rightly) accepted it, so the answer depended on which path ran."""
    schema_check.install()
    validator = jsonschema.Draft202012Validator({"multipleOf": 0.01})
    assert all(validator.is_valid(v) for v in (19.99, 0.07, 12345.67, 1e308, 3))
    assert not validator.is_valid(19.999)
    with_pattern = {
        "type": "object",
        "properties": {"a": {"multipleOf": 0.01}, "s": {"pattern": "^x"}},
    }
    assert fast_acceptor(with_pattern) is None  # no first pass: jsonschema alone decides
    assert jsonschema.Draft202012Validator(with_pattern).is_valid({"a": 0.07, "s": "x"})


def test_unique_objects_are_checked_in_linear_time() -> None:
    schema_check.install()
    validator = jsonschema.Draft202012Validator({"uniqueItems": True})
    items = [{"sku": str(i), "n": [i, {"k": i}]} for i in range(20000)]
    started = time.perf_counter()
    assert validator.is_valid(items)
    assert not validator.is_valid([*items, {"n": [5, {"k": 5}], "sku": "5"}])
    assert time.perf_counter() - started < DECISION_BUDGET_S
    assert validator.is_valid([1, True, "1", [1], {"a": 1}, {"a": True}, None, 0, False])
    assert not validator.is_valid([1, 1.0]) and not validator.is_valid([{"a": [1]}, {"a": [1.0]}])


@pytest.mark.parametrize(
    ("declared", "dialect"),
    [
        ("https://json-schema.org/draft-07/schema#", jsonschema.Draft7Validator),
        ("http://json-schema.org/draft-07/schema", jsonschema.Draft7Validator),
        ("https://json-schema.org/draft-04/schema#", jsonschema.Draft4Validator),
        ("https://json-schema.org/draft/2019-09/schema#", jsonschema.Draft201909Validator),
        ("https://example.com/my-meta", jsonschema.Draft202012Validator),
    ],
)
def test_both_paths_read_the_dialect_however_its_uri_is_spelled(
    declared: str, dialect: type[Any]
) -> None:
    """jsonschema read an https draft-07 schema as 2020-12 while the compiled first pass read it
    as draft-07: it accepted a string that only the ignored sibling of a $ref limits."""
    schema = {"$schema": declared, "$defs": {"s": {"type": "string"}}}
    schema["properties"] = {"x": {"$ref": "#/$defs/s", "maxLength": 2}}
    assert schema_check.dialect(schema) is dialect
    accept = fast_acceptor(schema, dialect=schema_check.dialect_uri(dialect))
    if accept is not None and accept({"x": "abcd"}):
        assert dialect(schema).is_valid({"x": "abcd"})


def test_a_schema_without_a_dialect_is_read_in_the_one_that_accepts_it() -> None:
    def read_in(schema: dict[str, Any]) -> Any:
        return schema_check.dialect({"properties": {"n": schema}})

    assert read_in({"exclusiveMinimum": 0}) is jsonschema.Draft202012Validator
    assert read_in({"minimum": 0, "exclusiveMinimum": True}) is jsonschema.Draft4Validator
    assert read_in({"items": [{"type": "string"}]}) is jsonschema.Draft7Validator
    assert schema_check.dialect({"type": "dict"}) is jsonschema.Draft202012Validator


D7 = "http://json-schema.org/draft-07/schema#"
LOOPS: list[dict[str, Any]] = [
    {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "properties": {"x": {"$ref": "#/$defs/a"}},
    },
    {"type": "object", "allOf": [{"$ref": "#"}]},
    {"$schema": D7, "definitions": {"a": {"not": {"$ref": "#/definitions/a"}}}},
]
NEXT = {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]}
NO_LOOPS: list[dict[str, Any]] = [
    {"properties": {"tree": {"$ref": "#"}}},
    {"$defs": {"n": {"properties": {"next": NEXT}}}, "$ref": "#/$defs/n"},
    {
        "$schema": D7,
        "definitions": {"a": {"type": "string"}},
        "allOf": [{"$ref": "#/definitions/a"}, {"$ref": "#/definitions/a"}],
    },
]


@pytest.mark.parametrize("schema", LOOPS)
def test_references_that_loop_without_reaching_a_value_are_refused(schema: dict[str, Any]) -> None:
    problem = schema_check.schema_problem(schema)
    assert problem is not None and "loop" in problem


@pytest.mark.parametrize("schema", NO_LOOPS)
def test_recursion_through_a_part_of_the_value_is_no_loop(schema: dict[str, Any]) -> None:
    assert schema_check.schema_problem(schema) is None


def test_a_unicode_property_escape_is_a_valid_pattern() -> None:
    """Python's `re` cannot compile \\p{L}; RE2 (which runs input patterns) and ECMA-262 can."""
    schema = {"properties": {"name": {"type": "string", "pattern": "^\\p{Lu}\\p{Ll}+$"}}}
    assert schema_check.schema_problem(schema) is None
    assert "is not a 'regex'" in (schema_check.schema_problem({"pattern": "a("}) or "")


def test_an_unknown_field_in_an_object_with_pattern_named_fields_is_the_only_one_named() -> None:
    schema_check.install()
    schema = next(e for e in CORPUS if e["id"] == "derived/workflow-dispatch-patternProperties")
    from services.registry.core import describe_violation

    validator = jsonschema.Draft202012Validator(schema["schema"])
    [error] = validator.iter_errors({"ref": "main", "inputs": {"env": "x", "1st": "y"}})
    message, _ = describe_violation(error, ["ref", "inputs"])
    assert "'1st'" in message and "'env'" not in message and "in 'inputs'" in message
    assert "names matching" in message and "ref" not in message.split("allowed:")[1]


def test_a_loop_the_static_check_misses_still_ends_in_a_hint_not_a_traceback(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schema_check, "reference_cycle", lambda schema, cls: None)
    schema = {
        "properties": {"filter": {"$ref": "#/$defs/expr"}, "s": {"pattern": "^x"}},
        "$defs": {"expr": {"anyOf": [{"$ref": "#/$defs/expr"}, {"type": "string"}]}},
    }
    looping = ToolDef(name="looping", description="", input_schema=schema, tool_type="mcp")
    hint = registry._validate(looping, {"filter": 1})
    assert isinstance(hint, Hint) and hint.hint_kind == "schema"
    assert "recursed without end" in hint.message


def test_a_schema_too_deep_to_check_is_a_hint_not_a_traceback(registry: Registry) -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(3000):  # deeper than UpsertTools decodes; a stored row could still hold it
        deep = {"type": "array", "items": deep}
    tool = ToolDef(name="deep", description="", input_schema=deep, tool_type="mcp")
    hint = registry._validate(tool, {"x": 1})
    assert isinstance(hint, Hint) and "nested too deeply" in hint.message
