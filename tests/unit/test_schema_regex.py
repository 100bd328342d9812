"""Input-schema patterns on RE2: the same answers as before for ordinary patterns, linear time
for pathological ones, and patterns RE2 cannot run refused at registration (not enforced when
they arrive anyway, from an MCP server)."""

from __future__ import annotations

import logging
import subprocess
import sys

import jsonschema
import pytest

from shared import schema_regex

schema_regex.install()


def errors(schema: dict, instance: object) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [e.message for e in validator.iter_errors(instance)]


def test_ordinary_patterns_validate_as_before() -> None:
    schema = {"type": "string", "pattern": "^[a-z]+-[0-9]{2}$"}
    assert errors(schema, "abc-12") == []
    assert errors(schema, "abc-123") == ["'abc-123' does not match '^[a-z]+-[0-9]{2}$'"]
    assert errors({"pattern": "b"}, "abc") == []  # a search, not a full match


def test_pattern_properties_and_additional_properties_use_the_patterns() -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^x-": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert errors(schema, {"x-a": 1}) == []
    assert errors(schema, {"x-a": "1"}) == ["'1' is not of type 'integer'"]
    assert errors(schema, {"y": 1}) == ["'y' does not match any of the regexes: '^x-'"]


def test_a_catastrophic_pattern_answers_at_once() -> None:
    """In a child process with a deadline, so that a regression fails instead of hanging."""
    code = (
        "import jsonschema; from shared import schema_regex; schema_regex.install(); "
        "v = jsonschema.Draft202012Validator({'pattern': '^(a+)+$'}); "
        "print(len(list(v.iter_errors('a' * 5000 + '!'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "1"


def test_a_pattern_re2_cannot_run_is_refused_at_registration() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"pattern": "(?=x)y"}, "b": {"pattern": "^ok$"}},
        "patternProperties": {"(a)\\1": {}},
    }
    assert sorted(schema_regex.unsupported_patterns(schema)) == ["(?=x)y", "(a)\\1"]
    problem = schema_regex.pattern_problem(schema)
    assert problem is not None and "RE2" in problem
    assert schema_regex.pattern_problem({"properties": {"pattern": {"type": "string"}}}) is None


def test_a_pattern_re2_cannot_run_is_not_enforced_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="shared.schema_regex"):
        assert errors({"pattern": "(?<=q)z(?!w)"}, "anything") == []
    assert "not an RE2 expression" in caplog.text


@pytest.mark.parametrize(
    ("pattern", "matches", "refuses"),
    [
        # ECMA-262's \uXXXX, as CJK name fields write it.
        ("^[\\u4e00-\\u9fa5]+$", "张伟", "Zhang"),
        ("^\\u0041+$", "AAA", "BBB"),
        # The code-point form.
        ("^\\u{1F600}$", "\U0001f600", "x"),
        # An escaped backslash followed by a u stays a backslash and a u.
        ("^\\\\u0041$", "\\u0041", "A"),
    ],
)
def test_ecma_unicode_escapes_run_on_re2(pattern: str, matches: str, refuses: str) -> None:
    compiled = schema_regex.compile_re2(pattern)
    assert compiled.search(matches) and not compiled.search(refuses)
    assert schema_regex.unsupported_patterns({"pattern": pattern}) == []


def test_a_cjk_range_pattern_is_enforced_in_validation() -> None:
    schema_regex.install()
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^[\\u4e00-\\u9fa5]+$"}},
    }
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid({"name": "李娜"})
    assert not validator.is_valid({"name": "Li Na"})
