"""The dispatcher's guardrails as pure domain logic (no database, no grpc): call identity and the
loop guard, failed approaches and the repeat-failure hint, and policy rules — their validation,
evaluation against a call, and the escalating wording a violation is rendered with.

The state these functions read and produce lives in the database (services/dispatcher/statestore
.py), so any dispatcher replica can serve any conversation."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from typing import Any

from services.dispatcher import jsonpath
from shared.convert import has_control
from shared.errors import InvalidArgument
from shared.lru import ExpiringCache
from shared.schema_regex import compile_re2

# Free-text keys a model uses to narrate a call; they never change what the call does.
NARRATION_KEYS = frozenset({"reasoning", "explanation", "thought", "rationale", "justification"})
LOOP_GUARD_THRESHOLD = 3  # the 4th consecutive identical call is refused
REPEAT_FAILURE_THRESHOLD = 3  # the 3rd identical failure gets a hint

RULE_KINDS = ("deny_tool", "require_prior_tool", "arg_constraint", "rate_limit")
MODES = ("blocking", "advisory")
_NAME_RE = re.compile(r"^[a-zA-Z0-9_\-]{1,64}$")


MAX_PATTERN_CHARS = 500
MAX_WINDOW_S = 31 * 24 * 3600
MAX_RULE_MESSAGE_CHARS = 2000
MAX_RULE_USERS = 1000
MAX_RATE_CALLS = 1_000_000_000
MAX_MATCH_CHARS = 100_000  # a constraint looks at most this much of a value


# --- identity and the loop guard ---------------------------------------------------------------


# One encoder for every call (json.dumps with options builds one each time).
_HASHED = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def args_hash(tool_name: str, tool_input: Any) -> str:
    """Stable 16-hex SHA-256 prefix of the tool name and its arguments with sorted keys."""
    payload = _HASHED.encode([tool_name, tool_input])
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def operative_input(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The input without its top-level narration keys; operative keys are never stripped."""
    return {k: v for k, v in inputs.items() if k not in NARRATION_KEYS}


def call_identity(tool_name: str, inputs: Mapping[str, Any]) -> str:
    """What makes two calls "the same call" for the loop guard and failed approaches."""
    return args_hash(tool_name, operative_input(inputs))


def call_hashes(tool_name: str, inputs: Mapping[str, Any]) -> tuple[str, str]:
    """(args_hash of the input without `reasoning`, call_identity): one hash when the input
    has no other narration key, as usual, since both then hash the same payload."""
    hashed = args_hash(tool_name, {k: v for k, v in inputs.items() if k != "reasoning"})
    if any(k in NARRATION_KEYS and k != "reasoning" for k in inputs):
        return hashed, call_identity(tool_name, inputs)
    return hashed, hashed


@dataclass(frozen=True)
class LoopState:
    """The loop guard's view of a conversation: how many calls it has seen (`seq`, which also
    orders concurrent writes), the identity of the last one and how many in a row had it.

    Read before a call runs and written with its log row after it: a call counts the calls
    (on any replica) that were logged before it started, a batch's calls in input order, and
    (RecentLoops) the calls this replica planned before it, even while they still run; only
    calls of one conversation in flight on different replicas at the same time do not see each
    other. Failed approaches and observation counts are read and written like the state in the
    database, without the in-process part."""

    seq: int = 0
    last_identity: str = ""
    run_length: int = 0

    def advance(self, identity: str) -> LoopState:
        """The state after one more call with `identity` (a refused call counts too, so the
        5th identical call is refused as well)."""
        run = self.run_length + 1 if identity == self.last_identity else 1
        return LoopState(self.seq + 1, identity, run)

    @property
    def refuses(self) -> bool:
        return self.run_length > LOOP_GUARD_THRESHOLD


class RecentLoops:
    """The loop state each conversation reached with the last call this replica planned, for
    `ttl_s` seconds (at most `max_entries` conversations, the oldest forgotten first).

    The database holds a call's loop state only once its log row commits, after the tool ran:
    calls of one conversation sent at once as separate RPCs (an agent that runs a turn's calls
    concurrently) would each read the state before the others and all run — 1,000 identical
    `ping`s at once ran 29 times where the guard allows 3. A call instead starts from whichever
    is later, by call_seq, of the stored state and the one remembered here; the memory need
    only outlive the gap between a call's snapshot read and the commits of the calls planned
    before it, so a short TTL keeps it small. Planning a call reads and updates it in one step
    on the event loop (no await between), so concurrent calls are counted in the order they
    were planned."""

    def __init__(self, ttl_s: float = 30.0, max_entries: int = 65_536) -> None:
        self._entries: ExpiringCache[tuple[str, str], LoopState] = ExpiringCache(ttl_s, max_entries)

    def latest(self, key: tuple[str, str], stored: LoopState, now: float) -> LoopState:
        """The later of the stored state and the one remembered for `key` (the stored one
        when they tie: it is what every replica sees)."""
        remembered = self._entries.get(key, now)
        return stored if remembered is None or remembered.seq <= stored.seq else remembered

    def remember(self, key: tuple[str, str], loop: LoopState, now: float) -> None:
        self._entries.put(key, loop, now)

    def __len__(self) -> int:
        return len(self._entries)


def loop_guard_message(tool_name: str, run_length: int) -> str:
    return (
        f"{tool_name} was not run: this is call {run_length} in a row with the same arguments "
        f"(narration aside), and the loop guard allows {LOOP_GUARD_THRESHOLD}. Repeating it will "
        "not change the result — change the arguments or take a different approach."
    )


# --- failed approaches ---------------------------------------------------------------------------


@dataclass
class FailedApproach:
    """A tool + arguments that failed in a conversation, with the last reason."""

    tool_name: str
    identity: str
    reason: str
    attempts: int = 0


def record_failed_approach(
    approaches: MutableMapping[tuple[str, str], FailedApproach],
    tool_name: str,
    identity: str,
    reason: str,
) -> FailedApproach:
    """Idempotent append: one entry per (tool, identity); a repeat increments its attempts."""
    entry = approaches.get((tool_name, identity))
    if entry is None:
        entry = FailedApproach(tool_name, identity, reason, 0)
        approaches[(tool_name, identity)] = entry
    entry.attempts += 1
    entry.reason = reason
    return entry


def repeat_failure_hint(
    approach: FailedApproach | None, threshold: int = REPEAT_FAILURE_THRESHOLD
) -> str | None:
    """A "consider a different approach" hint once the same call failed `threshold` times.
    It is advice appended to the result, never a termination."""
    if approach is None or approach.attempts < threshold:
        return None
    reason = approach.reason.strip().splitlines()[0][:300] if approach.reason.strip() else "?"
    return (
        f"{approach.tool_name} has now failed {approach.attempts} times with these same "
        f"arguments in this conversation (last error: {reason}). Consider a different approach "
        "instead of retrying it unchanged."
    )


# --- policy rules ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyRule:
    """A validated policy rule (see validate_rule for the params of each kind)."""

    id: int
    tenant_id: str
    name: str
    kind: str
    tool_name: str
    mode: str
    params: Mapping[str, Any]
    message: str = ""
    enabled: bool = True
    created_by: str = ""
    created_at: datetime | None = None

    @property
    def blocking(self) -> bool:
        return self.mode == "blocking"

    def applies_to(self, tenant_id: str, tool_name: str) -> bool:
        return (
            self.enabled
            and self.tenant_id in ("*", tenant_id)
            and self.tool_name in ("*", tool_name)
        )

    @cached_property
    def path(self) -> jsonpath.JsonPath:
        return jsonpath.parse(str(self.params["path"]))

    @cached_property
    def pattern(self) -> Any:
        """The rule's regex on RE2 (linear time: a pattern that backtracks catastrophically
        on some argument cannot stall the dispatcher). A stored pattern RE2 cannot take, from
        before rules were checked for it, runs on `re`."""
        source = str(self.params["pattern"])
        try:
            return compile_re2(source)
        except ValueError:
            return re.compile(source)

    @property
    def window_s(self) -> int:
        return int(self.params["window_seconds"])

    @property
    def max_calls(self) -> int:
        return int(self.params["max_calls"])

    @property
    def prior_tool(self) -> str:
        return str(self.params["prior_tool"])


def validate_rule(rule: PolicyRule) -> PolicyRule:
    """The rule with normalised params, or InvalidArgument listing every problem as a field
    violation (field names as in the PolicyRule message)."""
    problems: list[tuple[str, str]] = []
    if not rule.tenant_id.strip() or len(rule.tenant_id) > 128 or has_control(rule.tenant_id):
        problems.append(
            ("rule.tenant_id", "required (a tenant id or '*'), at most 128 printable chars")
        )
    if not rule.name.strip() or len(rule.name) > 128 or has_control(rule.name):
        problems.append(("rule.name", "required, at most 128 printable characters"))
    if len(rule.created_by) > 128 or has_control(rule.created_by):
        problems.append(("rule.created_by", "at most 128 printable characters"))
    # Copied into the warnings of every call the rule fires on.
    if len(rule.message) > MAX_RULE_MESSAGE_CHARS or "\x00" in rule.message:
        problems.append(
            ("rule.message", f"at most {MAX_RULE_MESSAGE_CHARS} characters, no NUL characters")
        )
    if rule.kind not in RULE_KINDS:
        problems.append(("rule.kind", f"must be one of {', '.join(RULE_KINDS)}"))
    if rule.mode not in MODES:
        problems.append(("rule.mode", "must be blocking or advisory"))
    if rule.tool_name != "*" and not _NAME_RE.match(rule.tool_name):
        problems.append(("rule.tool_name", "must be a tool name ([a-zA-Z0-9_-]{1,64}) or '*'"))
    params: dict[str, Any] = dict(rule.params)
    if rule.kind == "deny_tool":
        params = _deny_params(params, problems)
    elif rule.kind == "require_prior_tool":
        params = _prior_params(rule, params, problems)
    elif rule.kind == "arg_constraint":
        params = _constraint_params(params, problems)
    elif rule.kind == "rate_limit":
        params = _rate_params(params, problems)
    if problems:
        raise InvalidArgument(
            "invalid policy rule: " + "; ".join(f"{f}: {d}" for f, d in problems),
            reason="INVALID_POLICY_RULE",
            field_violations=problems,
        )
    return replace(rule, params=params)


def _unknown_keys(params: Mapping[str, Any], allowed: set[str], problems: list[Any]) -> None:
    for key in sorted(set(params) - allowed):
        problems.append((f"rule.params_json.{key}", f"unknown key; allowed: {sorted(allowed)}"))


def _deny_params(params: dict[str, Any], problems: list[tuple[str, str]]) -> dict[str, Any]:
    _unknown_keys(params, {"user_ids", "unless_capability"}, problems)
    out: dict[str, Any] = {}
    users = params.get("user_ids")
    if users is not None:
        if (
            not isinstance(users, list)
            or not users
            or len(users) > MAX_RULE_USERS
            or not all(
                isinstance(u, str) and u and len(u) <= 128 and not has_control(u) for u in users
            )
        ):
            problems.append(
                (
                    "rule.params_json.user_ids",
                    f"must be a list of 1..{MAX_RULE_USERS} ids (printable, at most 128 chars)",
                )
            )
        else:
            out["user_ids"] = sorted(set(users))
    capability = params.get("unless_capability")
    if capability is not None:
        if not isinstance(capability, str) or not capability.strip():
            problems.append(("rule.params_json.unless_capability", "must be a capability name"))
        else:
            out["unless_capability"] = capability
    return out


def _prior_params(
    rule: PolicyRule, params: dict[str, Any], problems: list[tuple[str, str]]
) -> dict[str, Any]:
    _unknown_keys(params, {"prior_tool"}, problems)
    prior = params.get("prior_tool")
    if not isinstance(prior, str) or not _NAME_RE.match(prior):
        problems.append(("rule.params_json.prior_tool", "required: the tool that must come first"))
        return {}
    if rule.tool_name == "*":
        problems.append(("rule.tool_name", "require_prior_tool needs a specific tool, not '*'"))
    elif prior == rule.tool_name:
        problems.append(("rule.params_json.prior_tool", "must differ from the guarded tool"))
    return {"prior_tool": prior}


def _constraint_params(params: dict[str, Any], problems: list[tuple[str, str]]) -> dict[str, Any]:
    _unknown_keys(params, {"path", "pattern", "must_match"}, problems)
    out: dict[str, Any] = {}
    path = params.get("path")
    if not isinstance(path, str):
        problems.append(("rule.params_json.path", "required: a JSON path like $.a.b[0]"))
    else:
        try:
            jsonpath.parse(path)
            out["path"] = path
        except jsonpath.JsonPathError as exc:
            problems.append(("rule.params_json.path", str(exc)))
    pattern = params.get("pattern")
    if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN_CHARS:
        problems.append(
            ("rule.params_json.pattern", f"required: a regex of 1..{MAX_PATTERN_CHARS} chars")
        )
    else:
        try:
            compile_re2(pattern)
            out["pattern"] = pattern
        except ValueError as exc:
            problems.append(
                (
                    "rule.params_json.pattern",
                    f"not an RE2 regex (no backreferences or lookaround): {exc}",
                )
            )
    must_match = params.get("must_match")
    if not isinstance(must_match, bool):
        problems.append(("rule.params_json.must_match", "required: true or false"))
    else:
        out["must_match"] = must_match
    return out


def _rate_params(params: dict[str, Any], problems: list[tuple[str, str]]) -> dict[str, Any]:
    _unknown_keys(params, {"max_calls", "window_seconds"}, problems)
    out: dict[str, Any] = {}
    max_calls = params.get("max_calls")
    if (
        not isinstance(max_calls, int)
        or isinstance(max_calls, bool)
        or not 1 <= max_calls <= MAX_RATE_CALLS
    ):
        problems.append(
            ("rule.params_json.max_calls", f"required: an integer in 1..{MAX_RATE_CALLS}")
        )
    else:
        out["max_calls"] = max_calls
    window = params.get("window_seconds")
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= MAX_WINDOW_S:
        problems.append(
            ("rule.params_json.window_seconds", f"required: an integer in 1..{MAX_WINDOW_S}")
        )
    else:
        out["window_seconds"] = window
    return out


@dataclass(frozen=True)
class CallFacts:
    """What the policy checks know about a call."""

    tool_name: str
    inputs: Mapping[str, Any]
    tenant_id: str
    user_id: str
    capabilities: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Check:
    """One rule checked against one call: whether it fired and why."""

    rule: PolicyRule
    fired: bool
    detail: str = ""


def window_start(now_s: float, window_s: int) -> int:
    """The fixed rate-limit window `now_s` falls in."""
    return int(now_s // window_s) * window_s


def check_rule(
    rule: PolicyRule,
    call: CallFacts,
    *,
    prior_tools: Iterable[str] = (),
    rate_count: int = 0,
) -> Check:
    """Evaluate one applicable rule. `prior_tools`: tools that succeeded earlier in the
    conversation; `rate_count`: calls in the current window including this one."""
    if rule.kind == "deny_tool":
        users = rule.params.get("user_ids")
        capability = rule.params.get("unless_capability")
        if users is not None and call.user_id not in users:
            return Check(rule, False)
        if capability is not None and capability in call.capabilities:
            return Check(rule, False)
        why = f"lacks capability {capability!r}" if capability else "is denied"
        return Check(rule, True, f"{call.tool_name} {why} for this caller")
    if rule.kind == "require_prior_tool":
        if rule.prior_tool in set(prior_tools):
            return Check(rule, False)
        return Check(
            rule,
            True,
            f"call {rule.prior_tool} earlier in this conversation before {rule.tool_name}",
        )
    if rule.kind == "arg_constraint":
        return _check_constraint(rule, call)
    if rule.kind == "rate_limit":
        if rate_count <= rule.max_calls:
            return Check(rule, False)
        return Check(
            rule,
            True,
            f"{call.tool_name} is limited to {rule.max_calls} calls per {rule.window_s}s for this "
            f"tenant (this is call {rate_count} in the window)",
        )
    return Check(rule, False)


def _check_constraint(rule: PolicyRule, call: CallFacts) -> Check:
    found, value = rule.path.find(dict(call.inputs))
    must_match = bool(rule.params["must_match"])
    matched = False
    if found:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        matched = rule.pattern.search(text[:MAX_MATCH_CHARS]) is not None
    if matched == must_match:
        return Check(rule, False)
    verb = "must match" if must_match else "must not match"
    where = rule.path.text if found else f"{rule.path.text} (missing)"
    return Check(rule, True, f"{where} {verb} /{rule.pattern.pattern}/")


def render_violation(rule: PolicyRule, detail: str, count: int) -> str:
    """What the model reads; the wording escalates with how often this user hit the rule."""
    text = (rule.message or detail).rstrip(".")
    if count <= 1:
        return f"Policy '{rule.name}': {text}."
    if count == 2:
        return (
            f"Second time — policy '{rule.name}': {text}. You have skipped this twice now; "
            "follow it before going on."
        )
    return f"STOP. You've skipped this {count} times. Policy '{rule.name}': {text}."


@dataclass
class PolicyDecision:
    """The outcome of the policy checks of one call."""

    checks: list[Check] = field(default_factory=list)
    # (check, count after this violation, rendered text), in rule order
    violations: list[tuple[Check, int, str]] = field(default_factory=list)

    @property
    def blocking(self) -> list[tuple[Check, int, str]]:
        return [v for v in self.violations if v[0].rule.blocking]

    @property
    def advisory(self) -> list[tuple[Check, int, str]]:
        return [v for v in self.violations if not v[0].rule.blocking]


def check_policies(
    rules: Sequence[PolicyRule],
    call: CallFacts,
    *,
    prior_tools: Iterable[str],
    rate_counts: Mapping[int, int],
) -> list[Check]:
    """Check every rule that applies to the call, in rule order."""
    prior = set(prior_tools)
    return [
        check_rule(rule, call, prior_tools=prior, rate_count=rate_counts.get(rule.id, 0))
        for rule in rules
        if rule.applies_to(call.tenant_id, call.tool_name)
    ]


def escalate(checks: Sequence[Check], observations: MutableMapping[int, int]) -> PolicyDecision:
    """Count and render the violations among `checks`. `observations` (rule id -> how often
    this user violated it so far) is incremented per violation, so a batch escalates in order."""
    decision = PolicyDecision(checks=list(checks))
    for check in checks:
        if check.fired:
            count = observations.get(check.rule.id, 0) + 1
            observations[check.rule.id] = count
            text = render_violation(check.rule, check.detail, count)
            decision.violations.append((check, count, text))
    return decision


def evaluate_policies(
    rules: Sequence[PolicyRule],
    call: CallFacts,
    *,
    prior_tools: Iterable[str],
    rate_counts: Mapping[int, int],
    observations: MutableMapping[int, int],
) -> PolicyDecision:
    """check_policies then escalate."""
    checks = check_policies(rules, call, prior_tools=prior_tools, rate_counts=rate_counts)
    return escalate(checks, observations)


def refusal_message(tool_name: str, blocking: Sequence[tuple[Check, int, str]]) -> str:
    return f"{tool_name} was not run. " + " ".join(text for _, _, text in blocking)
