"""The guardrails' domain logic without a network: call identity and the loop guard, failed
approaches and the repeat-failure hint, policy rule validation, evaluation and the escalating
wording of a violation."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from services.dispatcher import jsonpath
from services.dispatcher.guardrails import (
    CallFacts,
    FailedApproach,
    LoopState,
    PolicyRule,
    RecentLoops,
    args_hash,
    call_hashes,
    call_identity,
    check_rule,
    evaluate_policies,
    record_failed_approach,
    render_violation,
    repeat_failure_hint,
    validate_rule,
    window_start,
)
from shared.errors import InvalidArgument


def rule(kind: str, params: dict[str, Any], **kw: Any) -> PolicyRule:
    fields: dict[str, Any] = {
        "id": 1,
        "tenant_id": "t1",
        "name": f"{kind}-rule",
        "kind": kind,
        "tool_name": "query",
        "mode": "blocking",
        "params": params,
    }
    fields.update(kw)
    return validate_rule(PolicyRule(**fields))


def call(inputs: dict[str, Any] | None = None, **kw: Any) -> CallFacts:
    fields: dict[str, Any] = {
        "tool_name": "query",
        "inputs": inputs or {},
        "tenant_id": "t1",
        "user_id": "u1",
    }
    fields.update(kw)
    return CallFacts(**fields)


# --- identity and the loop guard --------------------------------------------------------------


def test_identity_ignores_every_narration_key_but_no_operative_key() -> None:
    base = call_identity("query", {"sql": "select 1"})
    narrated = {
        "sql": "select 1",
        "reasoning": "a",
        "explanation": "b",
        "thought": "c",
        "rationale": "d",
        "justification": "e",
    }
    assert call_identity("query", narrated) == base
    assert call_identity("query", {"sql": "select 2"}) != base
    assert call_identity("query", {"sql": "select 1", "limit": 5}) != base
    assert call_identity("preview_data", {"sql": "select 1"}) != base


def test_identity_strips_narration_keys_only_at_the_top_level() -> None:
    nested_a = {"options": {"explanation": "x"}}
    nested_b = {"options": {"explanation": "y"}}
    assert call_identity("t", nested_a) != call_identity("t", nested_b)


def test_args_hash_is_16_hex_and_key_order_independent() -> None:
    a = args_hash("t", {"x": 1, "y": {"b": 2, "a": 1}})
    assert a == args_hash("t", {"y": {"a": 1, "b": 2}, "x": 1})
    assert len(a) == 16
    int(a, 16)


def test_the_fourth_consecutive_identical_call_is_refused_and_so_is_the_fifth() -> None:
    state = LoopState()
    verdicts = []
    for _ in range(5):
        state = state.advance("h1")
        verdicts.append(state.refuses)
    assert verdicts == [False, False, False, True, True]
    assert state.seq == 5


def test_a_different_call_resets_the_run() -> None:
    state = LoopState()
    for identity in ["h1", "h1", "h1", "h2", "h1"]:
        state = state.advance(identity)
    assert (state.last_identity, state.run_length, state.refuses) == ("h1", 1, False)


def test_recent_loops_take_the_later_state_and_forget_after_their_ttl() -> None:
    recent = RecentLoops(ttl_s=10, max_entries=2)
    key = ("t", "c")
    stored = LoopState(3, "h1", 2)
    assert recent.latest(key, stored, now=0) is stored  # nothing remembered
    planned = stored.advance("h1")
    recent.remember(key, planned, now=0)
    assert recent.latest(key, stored, now=5) == planned  # its log row not committed yet
    assert recent.latest(key, LoopState(4, "h2", 1), now=5) == LoopState(4, "h2", 1)  # a tie
    assert recent.latest(key, LoopState(6, "h2", 1), now=5) == LoopState(6, "h2", 1)
    assert recent.latest(key, stored, now=10) is stored  # expired
    recent.remember(("t", "d"), planned, now=11)  # drops the expired entry
    assert len(recent) == 1
    recent.remember(("t", "e"), planned, now=12)
    recent.remember(("t", "f"), planned, now=13)  # over max_entries: the oldest goes
    assert len(recent) == 2 and recent.latest(("t", "d"), stored, now=13) is stored
    assert recent.latest(("t", "f"), stored, now=13) == planned


# --- failed approaches ------------------------------------------------------------------------


def test_record_failed_approach_keeps_one_entry_per_call_and_counts_attempts() -> None:
    approaches: dict[tuple[str, str], FailedApproach] = {}
    record_failed_approach(approaches, "query", "h1", "boom 1")
    record_failed_approach(approaches, "query", "h2", "other")
    entry = record_failed_approach(approaches, "query", "h1", "boom 2")
    assert len(approaches) == 2
    assert (entry.attempts, entry.reason) == (2, "boom 2")


def test_the_repeat_failure_hint_appears_at_the_third_failure_only() -> None:
    approaches: dict[tuple[str, str], FailedApproach] = {}
    hints = [
        repeat_failure_hint(record_failed_approach(approaches, "query", "h", "no such column"))
        for _ in range(4)
    ]
    assert hints[:2] == [None, None]
    assert hints[2] is not None and "3 times" in hints[2] and "no such column" in hints[2]
    assert hints[3] is not None and "4 times" in hints[3]
    assert repeat_failure_hint(None) is None


# --- policy rules: validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "params", "tool", "field"),
    [
        ("nonsense", {}, "query", "rule.kind"),
        ("deny_tool", {"user_ids": []}, "query", "rule.params_json.user_ids"),
        ("deny_tool", {"unless_capability": 3}, "query", "rule.params_json.unless_capability"),
        ("deny_tool", {"whatever": 1}, "query", "rule.params_json.whatever"),
        ("require_prior_tool", {}, "query", "rule.params_json.prior_tool"),
        ("require_prior_tool", {"prior_tool": "query"}, "query", "rule.params_json.prior_tool"),
        ("require_prior_tool", {"prior_tool": "describe_entry"}, "*", "rule.tool_name"),
        (
            "arg_constraint",
            {"path": "sql", "pattern": "x", "must_match": True},
            "query",
            "rule.params_json.path",
        ),
        (
            "arg_constraint",
            {"path": "$.a[*]", "pattern": "x", "must_match": True},
            "query",
            "rule.params_json.path",
        ),
        (
            "arg_constraint",
            {"path": "$.sql", "pattern": "(", "must_match": True},
            "query",
            "rule.params_json.pattern",
        ),
        (
            "arg_constraint",
            {"path": "$.sql", "pattern": "(?=drop)d", "must_match": True},
            "query",
            "rule.params_json.pattern",
        ),
        (
            "arg_constraint",
            {"path": "$.sql", "pattern": "x"},
            "query",
            "rule.params_json.must_match",
        ),
        (
            "rate_limit",
            {"max_calls": 0, "window_seconds": 60},
            "query",
            "rule.params_json.max_calls",
        ),
        (
            "rate_limit",
            {"max_calls": 5, "window_seconds": 0},
            "query",
            "rule.params_json.window_seconds",
        ),
        (
            "rate_limit",
            {"max_calls": True, "window_seconds": 60},
            "query",
            "rule.params_json.max_calls",
        ),
        ("deny_tool", {}, "bad name!", "rule.tool_name"),
    ],
)
def test_a_malformed_rule_is_rejected_naming_the_field(
    kind: str, params: dict[str, Any], tool: str, field: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        rule(kind, params, tool_name=tool)
    assert caught.value.reason == "INVALID_POLICY_RULE"
    assert field in [f for f, _ in caught.value.field_violations]


def test_every_problem_of_a_rule_is_reported_at_once() -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate_rule(PolicyRule(0, "", "", "deny_tool", "query", "sometimes", {}))
    fields = {f for f, _ in caught.value.field_violations}
    assert {"rule.tenant_id", "rule.name", "rule.mode"} <= fields


# --- policy rules: evaluation -----------------------------------------------------------------


def test_deny_tool_denies_the_whole_tenant_by_default() -> None:
    r = rule("deny_tool", {})
    assert check_rule(r, call()).fired
    assert not r.applies_to("t2", "query")
    assert not r.applies_to("t1", "preview_data")


def test_deny_tool_can_target_users_or_callers_lacking_a_capability() -> None:
    for_user = rule("deny_tool", {"user_ids": ["u1"]})
    assert check_rule(for_user, call(user_id="u1")).fired
    assert not check_rule(for_user, call(user_id="u2")).fired
    unless = rule("deny_tool", {"unless_capability": "sql"})
    assert check_rule(unless, call()).fired
    assert not check_rule(unless, call(capabilities=frozenset({"sql"}))).fired


def test_require_prior_tool_fires_until_the_prior_tool_succeeded() -> None:
    r = rule("require_prior_tool", {"prior_tool": "describe_entry"})
    assert check_rule(r, call(), prior_tools=[]).fired
    assert not check_rule(r, call(), prior_tools=["describe_entry"]).fired


@pytest.mark.parametrize(
    ("inputs", "must_match", "fired"),
    [
        ({"sql": "DROP TABLE x"}, False, True),
        ({"sql": "select 1"}, False, False),
        ({}, False, False),  # a missing value never matches
        ({"sql": "select 1"}, True, True),
        ({"sql": "drop table x"}, True, False),
        ({}, True, True),
    ],
)
def test_an_argument_constraint_checks_a_json_path_against_a_regex(
    inputs: dict[str, Any], must_match: bool, fired: bool
) -> None:
    r = rule("arg_constraint", {"path": "$.sql", "pattern": "(?i)drop", "must_match": must_match})
    assert check_rule(r, call(inputs)).fired is fired


def test_an_argument_constraint_reaches_nested_values_and_non_strings() -> None:
    r = rule(
        "arg_constraint",
        {"path": "$.opts.limits[1]", "pattern": "^[0-9]{1,3}$", "must_match": True},
    )
    assert not check_rule(r, call({"opts": {"limits": [5, 100]}})).fired
    assert check_rule(r, call({"opts": {"limits": [5, 100000]}})).fired
    assert check_rule(r, call({"opts": {"limits": [5]}})).fired


def test_an_argument_constraint_runs_on_re2_so_no_argument_can_stall_the_dispatcher() -> None:
    """`^(a+)+$` backtracks for hours on 40 characters in Python's `re`; in a child process with
    a deadline, so that a regression fails instead of hanging."""
    code = (
        "from tests.unit.dispatcher.test_guardrails import rule, call; "
        "from services.dispatcher.guardrails import check_rule; "
        "r = rule('arg_constraint', {'path': '$.sql', 'pattern': '^(a+)+$', 'must_match': True}); "
        "print(check_rule(r, call({'sql': 'a' * 40 + '!'})).fired, "
        "check_rule(r, call({'sql': 'aaaa'})).fired)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["True", "False"]


def test_a_rate_limit_fires_above_max_calls_in_the_window() -> None:
    r = rule("rate_limit", {"max_calls": 2, "window_seconds": 60})
    assert [check_rule(r, call(), rate_count=n).fired for n in (1, 2, 3)] == [False, False, True]
    assert window_start(125.0, 60) == 120


def test_violation_wording_escalates_with_the_repeat_count() -> None:
    r = rule("require_prior_tool", {"prior_tool": "describe_entry"}, message="describe first")
    first, second, third, seventh = (render_violation(r, "", n) for n in (1, 2, 3, 7))
    assert first == f"Policy '{r.name}': describe first."
    assert "Second time" in second and "twice" in second
    assert third.startswith("STOP. You've skipped this 3 times.")
    assert seventh.startswith("STOP. You've skipped this 7 times.")


def test_evaluation_counts_each_violation_so_a_batch_escalates_in_order() -> None:
    blocking = rule("require_prior_tool", {"prior_tool": "describe_entry"}, id=1)
    advisory = rule(
        "arg_constraint",
        {"path": "$.sql", "pattern": "(?i)select \\*", "must_match": False},
        id=2,
        mode="advisory",
    )
    elsewhere = rule("deny_tool", {}, id=3, tenant_id="t2")
    observations = {1: 1}
    decisions = [
        evaluate_policies(
            [blocking, advisory, elsewhere],
            call({"sql": "select * from t"}),
            prior_tools=[],
            rate_counts={},
            observations=observations,
        )
        for _ in range(2)
    ]
    assert [c.rule.id for c in decisions[0].checks] == [1, 2]  # rule 3 is another tenant's
    assert [(v[0].rule.id, v[1]) for v in decisions[0].violations] == [(1, 2), (2, 1)]
    assert [v[0].rule.id for v in decisions[0].blocking] == [1]
    assert [v[0].rule.id for v in decisions[0].advisory] == [2]
    assert decisions[1].blocking[0][2].startswith("STOP. You've skipped this 3 times.")
    assert observations == {1: 3, 2: 2}


# --- the JSON-path subset ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "found", "value"),
    [
        ("$", True, {"a": {"b": [10, 20]}, "we ird": 1}),
        ("$.a.b[0]", True, 10),
        ("$.a.b[-1]", True, 20),
        ("$['a'][\"b\"][1]", True, 20),
        ("$['we ird']", True, 1),
        ("$.a.b[2]", False, None),
        ("$.a.c", False, None),
        ("$.a.b.c", False, None),
    ],
)
def test_the_json_path_subset_finds_values(path: str, found: bool, value: Any) -> None:
    doc = {"a": {"b": [10, 20]}, "we ird": 1}
    assert jsonpath.parse(path).find(doc) == (found, value)


@pytest.mark.parametrize("path", ["a.b", "$..a", "$.a[*]", "$.a[?(@.x)]", "$.", "$[1:2]"])
def test_paths_outside_the_subset_are_rejected(path: str) -> None:
    with pytest.raises(jsonpath.JsonPathError):
        jsonpath.parse(path)


@pytest.mark.parametrize(
    "inputs",
    [
        {},
        {"sql": "SELECT 1"},
        {"sql": "SELECT 1", "reasoning": "why"},
        {"sql": "SELECT 1", "thought": "hm"},
        {"sql": "SELECT 1", "reasoning": "why", "explanation": "because"},
        {"reasoning": "only narration"},
    ],
)
def test_call_hashes_are_the_args_hash_without_reasoning_and_the_identity(
    inputs: dict[str, Any],
) -> None:
    hashed, identity = call_hashes("query", inputs)
    assert hashed == args_hash("query", {k: v for k, v in inputs.items() if k != "reasoning"})
    assert identity == call_identity("query", inputs)
