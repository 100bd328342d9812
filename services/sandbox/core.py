"""The sandbox's domain core: run a custom tool once (pre-check, a fresh isolated worker, nested
call_tool calls through the caller's registry channel) and turn whatever happened into a
ToolResult; and the manual lifecycle of custom tools. Imports no grpc."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd

from services.sandbox import precheck
from services.sandbox.admission import Origin
from services.sandbox.host import Limits, RunOutcome
from shared import schema_check, schema_regex
from shared.arrow_ipc import dataframe_to_ipc, ipc_to_dataframe
from shared.contract import (
    Err,
    Hint,
    Ok,
    ToolResult,
    envelope_to_tool_result,
    measure_schema,
)
from shared.errors import InvalidArgument, ToolmeshError
from shared.telemetry.tracing import tracer

logger = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# How deep a card of a custom tool's response may nest: a google.protobuf.Struct costs two
# message levels a JSON level, and a card nested past ~33 no service can parse back.
MAX_CARD_DEPTH = 32
# How many values (list items and dict entries, at every level) a response's cards may hold in
# all: the service turns them into a Struct on its event loop, at some microseconds a value and
# six times their JSON size (a MiB of `[[0],[0],…]` held every other call for 2.3 s).
MAX_CARD_VALUES = 20_000
# The most one call of a custom tool may say it cost (USD): beyond it, the figure is a bug.
MAX_COST_USD = 1_000_000

# call_tool(name, inputs) -> ToolResult, raising ToolmeshError for RPC-level failures.
NestedCaller = Callable[[str, dict[str, Any]], Awaitable[ToolResult]]


class Runner(Protocol):
    """What runs code in isolation (the WorkerPool)."""

    async def run(
        self,
        *,
        code: str,
        inputs: dict[str, Any],
        tool_name: str,
        limits: Limits,
        df_ipc: bytes | None = None,
        on_call_tool: Any = None,
        origin: Origin | None = None,
    ) -> RunOutcome: ...


@dataclass
class Execution:
    """The outcome of one Execute."""

    result: ToolResult
    execution_ms: float
    tool_calls: int


@dataclass(frozen=True)
class LimitCaps:
    """Service defaults, which are also the most a request may ask for."""

    wall_seconds: float = 30.0
    cpu_seconds: float = 10.0
    memory_bytes: int = 512 * 1024 * 1024
    output_bytes: int = 1024 * 1024
    max_tool_calls: int = 16

    def resolve(
        self,
        wall_seconds: float = 0,
        cpu_seconds: float = 0,
        memory_bytes: int = 0,
        output_bytes: int = 0,
        max_tool_calls: int = 0,
    ) -> Limits:
        """Zero takes the default; anything over the cap is lowered to it."""

        def pick(asked: float, cap: float) -> float:
            return cap if asked <= 0 else min(asked, cap)

        return Limits(
            wall_seconds=pick(wall_seconds, self.wall_seconds),
            cpu_seconds=pick(cpu_seconds, self.cpu_seconds),
            memory_bytes=int(pick(memory_bytes, self.memory_bytes)),
            output_bytes=int(pick(output_bytes, self.output_bytes)),
            max_tool_calls=int(pick(max_tool_calls, self.max_tool_calls)),
        )


class Sandbox:
    """Execute custom tools. One instance per sandbox process."""

    def __init__(self, runner: Runner, *, caps: LimitCaps | None = None) -> None:
        self._runner = runner
        self.caps = caps or LimitCaps()

    async def execute(
        self,
        *,
        tool_name: str,
        code: str,
        inputs: dict[str, Any],
        limits: Limits,
        df: pd.DataFrame | None = None,
        caller: NestedCaller | None = None,
        origin: Origin | None = None,
    ) -> Execution:
        problem = precheck.check(code)
        if problem is not None:
            envelope: Hint | Err = (
                Hint("schema", f"custom tool {tool_name!r}: {problem.message}")
                if problem.syntax
                else Err(f"custom tool {tool_name!r} refused: {problem.message}", "code_rejected")
            )
            return Execution(envelope_to_tool_result(envelope), 0.0, 0)
        nested_cost = [0.0]

        async def on_call_tool(
            name: str, call_inputs: dict[str, Any]
        ) -> tuple[dict[str, Any], bytes | None]:
            if caller is None:
                return {"ok": False, "kind": "err", "error": "call_tool is unavailable"}, None
            with tracer().start_as_current_span(
                "sandbox.call_tool", attributes={"gen_ai.tool.name": name}
            ):
                try:
                    nested = await caller(name, call_inputs)
                except ToolmeshError as exc:
                    return {
                        "ok": False,
                        "kind": "err",
                        "code": exc.code,
                        "reason": exc.reason,
                        "error": exc.message,
                        "content": "",
                    }, None
            nested_cost[0] += nested.cost
            return nested_reply(nested)

        with tracer().start_as_current_span(
            "sandbox.execute", attributes={"gen_ai.tool.name": tool_name}
        ) as span:
            outcome = await self._runner.run(
                code=code,
                inputs=inputs,
                tool_name=tool_name,
                limits=limits,
                df_ipc=dataframe_to_ipc(df) if df is not None else None,
                on_call_tool=on_call_tool,
                origin=origin,
            )
            span.set_attribute("toolmesh.sandbox.tool_calls", outcome.tool_calls)
            if not outcome.ok:
                span.set_attribute("error.type", outcome.error_kind)
        if outcome.table_ipc is not None:
            # Decoding a table costs time in proportion to its cells, some types far more than
            # others: in a thread, so other calls do not wait on this one.
            result = await asyncio.to_thread(outcome_to_result, tool_name, outcome)
        else:
            result = outcome_to_result(tool_name, outcome)
        result.cost += nested_cost[0]
        return Execution(result, outcome.execution_ms, outcome.tool_calls)


def nested_reply(result: ToolResult) -> tuple[dict[str, Any], bytes | None]:
    """A nested tool's result as the dict `call_tool` returns inside the sandbox."""
    env = result.envelope
    kind = "hint" if isinstance(env, Hint) else "err" if isinstance(env, Err) else "ok"
    if env is None and result.error:
        kind = "err"
    reply: dict[str, Any] = {
        "ok": kind == "ok",
        "kind": kind,
        "content": result.content_as_data(),
        "error": result.error,
        "cost": result.cost,
        "data": None,
    }
    table: pd.DataFrame | None = None
    if isinstance(env, Ok):
        if isinstance(env.data, pd.DataFrame):
            table = env.data
        elif env.data is not None:
            reply["data"] = json.loads(json.dumps(env.data, default=str))
    if table is None and result.datasets:
        first = next(iter(result.datasets.values()))
        table = first if isinstance(first, pd.DataFrame) else None
    return reply, dataframe_to_ipc(table) if table is not None else None


def outcome_to_result(tool_name: str, outcome: RunOutcome) -> ToolResult:
    """What the worker answered as a ToolResult. Everything in it came from the tool's code
    (a worker can forge any frame), so nothing is taken on trust: a table that does not decode,
    or a response the service could not send on or must not act on, is an Err `bad_result`."""
    if not outcome.ok:
        return envelope_to_tool_result(
            Err(f"custom tool {tool_name!r}: {outcome.message}", outcome.error_kind)
        )

    def bad(problem: str) -> ToolResult:
        return envelope_to_tool_result(
            Err(f"custom tool {tool_name!r} returned a bad result: {problem}", "bad_result")
        )

    if outcome.form == "table" and outcome.table_ipc is not None:
        # Any failure here is the table's (forged pandas metadata raised TypeError and
        # KeyError in to_pandas, duplicate column names AttributeError in measure_schema).
        try:
            df = ipc_to_dataframe(outcome.table_ipc)
        except Exception as exc:  # noqa: BLE001 - see above
            return bad(f"its table is not an Arrow IPC stream ({_said(exc)})")
        try:
            envelope = Ok(rows=len(df), schema=measure_schema(df), data=df)
        except Exception as exc:  # noqa: BLE001 - see above
            return bad(f"its table cannot be described ({_said(exc)})")
        return ToolResult(content=outcome.content, envelope=envelope)
    if outcome.form == "response" and outcome.response is not None:
        problem = response_problem(outcome.response)
        if problem is not None:
            return bad(problem)
        try:
            return ToolResult.from_any(outcome.response)
        except Exception as exc:  # noqa: BLE001 - whatever the dict holds is the tool's doing
            return bad(_said(exc))
    return ToolResult(content=outcome.content, envelope=Ok(data=None))


def response_problem(response: dict[str, Any]) -> str | None:
    """Why a custom tool's response dict (`result = {"message": ..., ...}`) cannot be returned,
    or None. Exports name files on the host and datasets are the platform's tables: code that
    ran in a sandbox has neither (its files are gone when it answers, and its table is its
    `result`), and an export path it named would be any file under the service's data dir —
    the database included — registered for download."""
    for key in ("exports", "datasets"):
        if response.get(key):
            return (
                f"result[{key!r}]: a custom tool cannot return {key} (it has no files outside "
                "its sandbox); assign a DataFrame to `result` to return a table"
            )
    cards = response.get("cards")
    if cards is not None:
        if not isinstance(cards, list) or not all(isinstance(c, dict) for c in cards):
            return "result['cards'] must be a list of dicts"
        depth, values = _shape(cards, MAX_CARD_VALUES)
        if depth > MAX_CARD_DEPTH + 1:  # the list of cards is a level of its own
            return f"a card nests more than {MAX_CARD_DEPTH} levels deep"
        if values > MAX_CARD_VALUES:
            return (
                f"result['cards'] hold more than {MAX_CARD_VALUES} values in all (list items "
                "and dict entries); return data as a DataFrame `result` instead"
            )
    cost = response.get("cost")
    if cost is not None and (
        isinstance(cost, bool)
        or not isinstance(cost, int | float)
        or not 0 <= cost <= MAX_COST_USD  # an int of 400 digits overflowed math.isfinite
    ):
        return f"result['cost'] must be a number of USD from 0 to {MAX_COST_USD:g}"
    return None


def _said(exc: BaseException) -> str:
    """`Type: message` of an exception, clipped (its text may come from the tool's data)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a message that cannot be rendered says nothing
        text = ""
    return f"{type(exc).__name__}: {text}"[:200]


def _shape(value: Any, max_values: int) -> tuple[int, int]:
    """How deep dicts and lists nest in a decoded JSON value, and how many values (list items,
    dict entries) they hold; iteratively (no recursion), and no further than past `max_values`
    values."""
    deepest = values = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack and values <= max_values:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node
        values += len(children)
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return deepest, values


# --- lifecycle ------------------------------------------------------------------------------


def validate_definition(name: str, code: str, input_schema: dict[str, Any], tenant_id: str) -> None:
    """A custom tool's definition, checked before it is stored (INVALID_ARGUMENT otherwise)."""
    violations: list[tuple[str, str]] = []
    if not NAME_RE.match(name):
        violations.append(("tool.name", "must match [a-zA-Z0-9_-]{1,64}"))
    if not tenant_id:
        violations.append(("tool.tenant_id", "a custom tool belongs to a tenant (or '*')"))
    problem = precheck.check(code)
    if problem is not None:
        violations.append(("tool.implementation", problem.message))
    # The registry's own check of a custom tool's schema (its dialect, reference loops, types
    # with the fix named), so a definition the sandbox stores is one the registry accepts.
    problem_text = schema_check.schema_problem(input_schema) or schema_regex.pattern_problem(
        input_schema
    )
    if problem_text is not None:
        violations.append(("tool.input_schema_json", problem_text))
    if violations:
        raise InvalidArgument(
            f"invalid custom tool {name!r}: " + "; ".join(f"{f}: {d}" for f, d in violations),
            reason="INVALID_TOOL_DEFINITION",
            field_violations=violations,
        )
