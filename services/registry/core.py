"""The registry's domain core: system handler registration, the model-facing catalog, input
validation and execute_tool routing (system handlers in-process; custom tools to the sandbox;
MCP tools to the bridge). Imports no grpc; tested without a network.

Handler registration applies the Uniform Tool Contract: a handler whose tool has a ToolSpec
(`migrate_tool`) is wrapped with the contract boundary when it is registered, so every dispatched
call gets the envelope's coercion, validation and `contract_envelope` telemetry while a direct
caller of the handler function still gets its ToolResult; a source-decorated handler
(`@uniform_contract`) is used as it is. Counters of those envelopes are per registry process."""

from __future__ import annotations

import asyncio
import contextvars
import copy
import difflib
import functools
import importlib
import inspect
import itertools
import json
import logging
import reprlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence, Sized
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, cast

import jsonschema
import referencing.exceptions
from jsonschema.exceptions import ValidationError
from opentelemetry.trace import Span, Status, StatusCode

from services.registry.catalog import RETIRED_TOOLS, TOOL_ORDER_INDEX, build_system_tools
from services.registry.context import ToolContext, cancellable, reset_cancellation
from services.registry.fast_accept import Acceptor, fast_acceptor
from services.registry.model import SeedReport, ToolDef
from services.registry.repository import ToolRepository
from shared import convert, schema_check, schema_regex
from shared.config import DEFAULT_DB_WAIT_S
from shared.contract import (
    Alternative,
    ContractCounters,
    ContractEvent,
    Envelope,
    Err,
    Hint,
    HintException,
    ToolResult,
    ToolSpec,
    envelope_to_tool_result,
    exception_to_envelope,
    get_spec,
    is_contract_wrapped,
    normalise_result,
    wrap_handler,
)
from shared.contract.telemetry import emit
from shared.costs import BudgetExceeded
from shared.db.engine import db_thread
from shared.errors import FailedPrecondition, NotFound
from shared.lru import ExpiringCache, LruCache
from shared.telemetry import metrics, semconv
from shared.telemetry.tracing import current_trace_id, span_attributes, tracer
from shared.telemetry.usage import UsageEntry

logger = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any], ToolContext], Any]
# A tool version's jsonschema validator and its compiled first pass (None when it has none).
Validators = tuple[jsonschema.protocols.Validator, Acceptor | None]

REASONING_FIELD: dict[str, Any] = {
    "type": "string",
    "description": (
        "Why you chose this tool and approach. Recorded for audit; not passed to the tool."
    ),
}
NO_REASONING_TOOLS = frozenset({"plan"})
MAX_VALIDATION_ERRORS = 3
# Violations collected before the hint is written (the first ones, sorted by path).
MAX_COLLECTED_ERRORS = 100
# An input with more JSON nodes than this (or a string longer than LARGE_INPUT_CHARS) is
# validated in a thread when the compiled acceptor does not settle it.
LARGE_INPUT_NODES = 2000
LARGE_INPUT_CHARS = 65536
# gen_ai.tool.type values of the GenAI semantic conventions.
_GENAI_TOOL_TYPE = {"system": "function", "custom": "function", "mcp": "extension"}
# Tool arguments and results go on spans only when opted in, and then clipped.
_PAYLOAD_ATTRIBUTE_CHARS = 4096


def _clip(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _PAYLOAD_ATTRIBUTE_CHARS else text[:_PAYLOAD_ATTRIBUTE_CHARS] + "…"


def _envelope_kind(result: ToolResult) -> str:
    env = result.envelope
    if isinstance(env, Hint):
        return "hint"
    if isinstance(env, Err) or (env is None and result.error is not None):
        return "err"
    return "ok"


class ToolExecutor(Protocol):
    """Runs a non-system tool (custom in the sandbox, mcp through the bridge)."""

    async def execute(
        self, tool: ToolDef, inputs: dict[str, Any], context: ToolContext
    ) -> ToolResult: ...


@dataclass(frozen=True)
class LlmTool:
    """A tool schema ready for a provider, with the reasoning field injected."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass
class Execution:
    """The outcome of execute_tool."""

    result: ToolResult
    tool: ToolDef
    execution_ms: float


# Tool names are at most 64 characters (model.NAME_PATTERN); what a caller names is compared and
# quoted up to twice that.
MAX_MATCHED_CHARS = 128
MAX_CACHED_TOOLS = 4096
# Tools whose validators are kept compiled (the least recently called beyond it are compiled
# again when called: a fraction of a millisecond for a usual schema).
MAX_CACHED_VALIDATORS = 1024
MAX_LISTED_FIELDS = 10
MAX_LISTED_OPTIONS = 20  # enum options named in a hint
MAX_SCORED_OPTIONS = 1000  # enum options compared with the value for alternatives
MAX_MESSAGE_CHARS = 300


def closest_names(name: str, candidates: Sequence[str], n: int = 3) -> list[str]:
    """The n candidates most similar to `name`, best first (never empty when there are any).
    Only the first MAX_MATCHED_CHARS characters of `name` are compared: difflib's cost grows
    with the product of the lengths, and a megabyte name held a service's loop for minutes."""
    name = name[:MAX_MATCHED_CHARS]
    close = difflib.get_close_matches(name, candidates, n=n, cutoff=0.5)
    if len(close) < n:
        ranked = sorted(candidates, key=lambda c: -difflib.SequenceMatcher(None, name, c).ratio())
        close += [c for c in ranked if c not in close][: n - len(close)]
    return close


def inject_reasoning(name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The model-facing schema: a required `reasoning` string on every tool except plan."""
    out = copy.deepcopy(dict(schema))
    if name in NO_REASONING_TOOLS:
        return out
    out.setdefault("type", "object")
    props = dict(out.get("properties") or {})
    props["reasoning"] = dict(REASONING_FIELD)
    out["properties"] = props
    required = [r for r in out.get("required") or [] if r != "reasoning"]
    out["required"] = [*required, "reasoning"]
    return out


# Sync handlers' worker threads per nesting depth (TOOLMESH_HANDLER_THREADS).
DEFAULT_HANDLER_THREADS = 16


class HandlerThreads:
    """The worker threads sync handlers run on: a bounded pool per nesting depth, each made on
    first use, apart from asyncio's default executor.

    Apart, because the default executor (min(32, cores + 4) threads) also serves the registry's
    own reads, the catalog and cache-missing tool lookups: slow tools there stalled every call.
    Per depth, because a sync handler composing a tool (call_tool_blocking) holds its thread
    while the nested call runs: with one pool, parents holding every thread wait for nested
    calls that wait for a thread, until their timeouts. A call at depth d only waits for calls
    at depth d + 1, and the deepest allowed depth never composes, so no wait goes in a circle.
    Calls beyond a pool's threads queue for one, under their deadline."""

    def __init__(self, per_depth: int = DEFAULT_HANDLER_THREADS, *, max_depth: int = 8) -> None:
        if per_depth < 1:
            raise ValueError(f"handler threads per depth must be at least 1, not {per_depth}")
        self.per_depth = per_depth
        self._max_depth = max(0, max_depth)
        self._pools: dict[int, ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    @property
    def pools_made(self) -> int:
        return len(self._pools)

    def pool(self, depth: int) -> ThreadPoolExecutor:
        """The pool of calls at `depth`, clamped to [0, max_depth]: a deeper call is refused
        before it runs, and a negative depth (a hostile context) is a top-level call."""
        level = min(max(depth, 0), self._max_depth)
        pool = self._pools.get(level)
        if pool is None:
            with self._lock:
                pool = self._pools.get(level)
                if pool is None:
                    pool = ThreadPoolExecutor(
                        self.per_depth, thread_name_prefix=f"tool-handler-d{level}"
                    )
                    self._pools[level] = pool
        return pool

    def shutdown(self) -> None:
        """Stop taking work; queued calls are cancelled, running ones finish on their own."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)


class Registry:
    """execute_tool and the catalog. One instance per registry process."""

    def __init__(
        self,
        repo: ToolRepository,
        *,
        context_defaults: Callable[[ToolContext], None] | None = None,
        routes: Mapping[str, ToolExecutor | None] | None = None,
        cache_ttl_s: float = 2.0,
        max_depth: int = 8,
        disabled_flags: frozenset[str] = frozenset(),
        clock: Callable[[], float] = time.monotonic,
        contract_stats: ContractCounters | None = None,
        specs: Callable[[str], ToolSpec | None] = get_spec,
        trace_payloads: bool = False,
        handler_threads: int = DEFAULT_HANDLER_THREADS,
        max_cached_validators: int = MAX_CACHED_VALIDATORS,
        db_wait_s: float = DEFAULT_DB_WAIT_S,
    ) -> None:
        """`db_wait_s`: how long one database operation of a call may take before the call
        answers UNAVAILABLE (shared.db.engine.bounded_db_wait; TOOLMESH_DB_WAIT_S)."""
        schema_regex.install()  # input patterns run on RE2, never on backtracking `re`
        schema_check.install()  # multipleOf and uniqueItems checked as the first pass does
        self._trace_payloads = trace_payloads
        self._repo = repo
        self._context_defaults = context_defaults
        self._routes = dict(routes or {})
        self._handlers: dict[str, Handler] = {}
        # name -> (its definition or None,) for cache_ttl_s: the names of the last
        # cache_ttl_s, unknown ones too, not every name looked up until MAX_CACHED_TOOLS.
        self._cache: ExpiringCache[str, tuple[ToolDef | None]] = ExpiringCache(
            cache_ttl_s, MAX_CACHED_TOOLS
        )
        # Per tool name, for the version last seen: jsonschema's validator, and the compiled
        # first pass that accepts valid input without it (services.registry.fast_accept), when
        # there is one. A schema that cannot validate anything is cached as the Hint every call
        # gets. One version per name (a new version replaces the old one), the names used
        # least recently dropped past MAX_CACHED_VALIDATORS: tools registered, re-registered
        # and deleted for weeks kept every version's validator before.
        self._validators_cache: LruCache[str, tuple[int, Validators | Hint]] = LruCache(
            max_cached_validators
        )
        self.db_wait_s = db_wait_s
        self._max_depth = max_depth
        self._threads = HandlerThreads(handler_threads, max_depth=max_depth)
        self._clock = clock
        self._specs = specs
        self.contract_stats = contract_stats if contract_stats is not None else ContractCounters()
        self.system_tools = build_system_tools(disabled_flags)

    def close(self) -> None:
        """Release the handler threads (at shutdown)."""
        self._threads.shutdown()

    # --- registration ---------------------------------------------------------------------

    def seed_system_tools(
        self,
        tools: Sequence[dict[str, Any]] | None = None,
        retired: Sequence[str] = RETIRED_TOOLS,
    ) -> SeedReport:
        report = self._repo.seed(self.system_tools if tools is None else tools, retired)
        self._cache.clear()
        logger.info(
            "seeded system tools: %d created, %d updated, %d unchanged, %d retired, %d unknown",
            len(report.created),
            len(report.updated),
            len(report.unchanged),
            len(report.retired),
            len(report.unknown),
        )
        return report

    def register_handler(self, name: str, handler: Handler) -> None:
        """Register `handler` for `name`, behind the contract boundary when `name` has a spec."""
        self._handlers[name] = self._apply_contract(name, handler)

    def _apply_contract(self, name: str, handler: Handler) -> Handler:
        if is_contract_wrapped(handler):
            return handler  # source-decorated: already returns envelopes
        spec = self._specs(name)
        if spec is None:
            return handler
        return cast(Handler, wrap_handler(handler, spec))

    def auto_register_handlers(self) -> dict[str, str]:
        """Import the handler of every live system row and register it (wrapped with the
        contract when its tool has a spec). A broken handler is logged and skipped; returns
        {name: error} for those."""
        failures: dict[str, str] = {}
        no_spec: list[str] = []
        for tool in self._repo.find(tool_type="system"):
            if not tool.handler_path:
                continue
            try:
                handler = resolve_handler(tool.handler_path)
            except (ImportError, AttributeError, TypeError, ValueError) as exc:
                failures[tool.name] = f"{type(exc).__name__}: {exc}"
                logger.warning(
                    "handler of %s (%s) not registered: %s", tool.name, tool.handler_path, exc
                )
                continue
            self.register_handler(tool.name, handler)
            if self._specs(tool.name) is None:
                no_spec.append(tool.name)
        if no_spec:
            logger.warning(
                "system tools without a contract spec (legacy results, no contract telemetry): %s",
                ", ".join(sorted(no_spec)),
            )
        logger.info("registered %d system handlers", len(self._handlers))
        return failures

    @property
    def repo(self) -> ToolRepository:
        return self._repo

    @property
    def handler_names(self) -> list[str]:
        return sorted(self._handlers)

    def invalidate(self, name: str | None = None) -> None:
        """Forget what is cached of `name` (its definition and its validators: it changed or
        went), or every cached definition when None (validators are per version: a changed
        tool's new version gets its own)."""
        if name is None:
            self._cache.clear()
        else:
            self._cache.pop(name)
            self._validators_cache.pop(name)

    # --- catalog --------------------------------------------------------------------------

    def tools_for_llm(self, tenant_id: str) -> list[LlmTool]:
        tools = list(self._repo.for_llm(tenant_id))
        tools.sort(key=lambda t: (TOOL_ORDER_INDEX.get(t.name, len(TOOL_ORDER_INDEX)), t.name))
        return [
            LlmTool(t.name, t.description, inject_reasoning(t.name, t.input_schema)) for t in tools
        ]

    async def lookup(self, name: str, tenant_id: str) -> ToolDef:
        """The live tool visible to the tenant, or NotFound naming the closest tools."""
        now = self._clock()
        cached = self._cache.get(name, now)
        if cached is not None:
            (tool,) = cached
        else:
            tool = await db_thread(self.db_wait_s, "a tool definition's read", self._repo.get, name)
            self._cache.put(name, (tool,), now)
        if tool is None or not tool.live or not tool.visible_to(tenant_id):
            # Suggest only tools this tenant can see: other tenants' tool names stay private.
            visible = await db_thread(
                self.db_wait_s, "the tool list's read", self._repo.find, tenant_id=tenant_id
            )
            names = [t.name for t in visible]
            suggestions = closest_names(name, names)
            hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
            # The name as given, cut to what a tool name can be: it travels in the status
            # message and its metadata, which gRPC caps at 16 KB of headers.
            shown = convert.clip(name, MAX_MATCHED_CHARS)
            raise NotFound(
                f"unknown tool {shown!r}{hint}",
                reason="TOOL_NOT_FOUND",
                metadata={"tool": shown, "suggestions": ",".join(suggestions)},
            )
        return tool

    # --- execution ------------------------------------------------------------------------

    async def execute(self, name: str, inputs: dict[str, Any], context: ToolContext) -> Execution:
        """Run one tool. RPC-level problems raise ToolmeshError; everything the tool itself does
        wrong comes back as a result with an Err or Hint envelope."""
        started = self._clock()
        tool = await self.lookup(name, context.tenant_id)
        reasoning = inputs.pop("reasoning", None)
        if reasoning is not None:
            context.reasoning = str(reasoning)
        context.tool_name = name
        context.contract_recorder = self.contract_stats
        if self._context_defaults is not None:
            self._context_defaults(context)
        with tracer().start_as_current_span(
            f"execute_tool {name}",
            attributes=span_attributes(
                gen_ai__operation__name=semconv.OPERATION_EXECUTE_TOOL,
                gen_ai__tool__name=name,
                gen_ai__tool__call__id=context.tool_use_id,
                gen_ai__tool__type=_GENAI_TOOL_TYPE.get(tool.tool_type, tool.tool_type),
                gen_ai__tool__description=tool.description[:500],
                gen_ai__conversation__id=context.conversation_id,
                toolmesh__tenant__id=context.tenant_id,
                toolmesh__user__id=context.user_id,
                toolmesh__call__depth=context.depth,
            ),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            if self._trace_payloads:
                span.set_attribute("gen_ai.tool.call.arguments", _clip(inputs))
            if context.cost.exhausted():
                result = self._answer(
                    tool,
                    Err(
                        str(
                            BudgetExceeded(
                                context.cost.limit or 0.0, context.cost.spent, f"before {name}"
                            )
                        ),
                        err_kind="budget_exceeded",
                    ),
                )
            else:
                result = await self._guarded(tool, inputs, context)
            await self._account(tool, result, context, span)
            kind = _envelope_kind(result)
            span.set_attribute(semconv.TOOLMESH_ENVELOPE_KIND, kind)
            error_type = ""
            if kind == "err":
                err = result.envelope
                error_type = err.err_kind if isinstance(err, Err) else "legacy"
                span.set_attribute(semconv.ERROR_TYPE, error_type)
                span.set_status(Status(StatusCode.ERROR, (result.error or "")[:200]))
            if self._trace_payloads:
                span.set_attribute("gen_ai.tool.call.result", _clip(result.content))
        elapsed = self._clock() - started
        metrics.record_tool_call(
            name,
            _GENAI_TOOL_TYPE.get(tool.tool_type, tool.tool_type),
            kind,
            elapsed,
            error_type=error_type,
        )
        return Execution(result=result, tool=tool, execution_ms=elapsed * 1000)

    async def _account(
        self, tool: ToolDef, result: ToolResult, context: ToolContext, span: Span
    ) -> None:
        """Settle the call's cost. What the handler declared beyond what it charged through
        its context (an LLM call, a composed tool) is a paid tool's own leaf: recorded here,
        once — except for cost-rollup tools, whose declared cost is their sub-calls'. The
        call's total goes on the result and, as the rollup, on the span."""
        spec = self._specs(tool.name) if tool.tool_type == "system" else None
        rollup = spec is not None and spec.is_cost_rollup
        declared = max(0.0, float(result.cost or 0.0))
        own = 0.0 if rollup else max(0.0, declared - context.cost.total)
        if own > 0:
            context.cost.leaves += own
            span.set_attribute(semconv.GEN_AI_USAGE_COST_AMOUNT, own)
            span.set_attribute(semconv.GEN_AI_USAGE_COST_CURRENCY, semconv.COST_CURRENCY)
            if context.usage is not None:
                entry = UsageEntry(
                    tenant_id=context.tenant_id,
                    tool_name=tool.name,
                    kind="tool",
                    cost_usd=own,
                    user_id=context.user_id,
                    conversation_id=context.conversation_id,
                    tool_use_id=context.tool_use_id,
                    trace_id=current_trace_id(),
                )
                await db_thread(
                    self.db_wait_s, "the usage log's write", context.usage.record, entry
                )
            metrics.record_cost(context.tenant_id, tool.name, own)
        # A rollup tool's declared total already holds its sub-calls' costs (logged by them).
        result.cost = max(context.cost.total, declared) if rollup else context.cost.total
        if result.cost > 0:
            span.set_attribute(semconv.TOOLMESH_COST_ROLLUP_AMOUNT, result.cost)

    def _answer(self, tool: ToolDef, envelope: Envelope) -> ToolResult:
        """An envelope the registry answers itself, without running the handler; counted with
        the tool's contract envelopes when the tool has a spec."""
        if tool.tool_type == "system" and self._specs(tool.name) is not None:
            emit(ContractEvent.of(tool.name, envelope, origin="registry"), self.contract_stats)
        return envelope_to_tool_result(envelope)

    async def _guarded(
        self, tool: ToolDef, inputs: dict[str, Any], context: ToolContext
    ) -> ToolResult:
        refusal = self._refusal(tool, context)
        if refusal is not None:
            return self._answer(tool, refusal)
        hint = await self._validate_off_loop(tool, inputs)
        if hint is not None:
            return self._answer(tool, hint)
        if tool.tool_type == "system":
            return await self._run_system(tool, inputs, context)
        executor = self._routes.get(tool.tool_type)
        if executor is None:
            service = "sandbox" if tool.tool_type == "custom" else "mcp_bridge"
            raise FailedPrecondition(
                f"{tool.tool_type} tool {tool.name!r} cannot run: the {service} service is not "
                f"configured (set TOOLMESH_{service.upper()}_ADDR)",
                reason="SERVICE_NOT_CONFIGURED",
                metadata={"service": service, "tool": tool.name},
            )
        return await executor.execute(tool, inputs, context)

    def _refusal(self, tool: ToolDef, context: ToolContext) -> Err | None:
        if not tool.enabled:
            return Err(f"tool {tool.name!r} is disabled", err_kind="tool_disabled")
        if tool.status != "approved":
            return Err(
                f"tool {tool.name!r} is {tool.status}, not approved", err_kind="tool_not_approved"
            )
        missing = sorted(set(tool.required_capabilities) - context.capabilities)
        if missing:
            return Err(
                f"tool {tool.name!r} requires capabilities the caller lacks: {', '.join(missing)}",
                err_kind="permission_denied",
            )
        if context.depth > self._max_depth:
            return Err(
                f"tool composition nested deeper than {self._max_depth} calls",
                err_kind="max_depth_exceeded",
            )
        return None

    def _cached_validators(self, tool: ToolDef) -> Validators | Hint | None:
        cached = self._validators_cache.get(tool.name)
        return cached[1] if cached is not None and cached[0] == tool.version else None

    def _validators(self, tool: ToolDef) -> Validators | Hint:
        """The tool's validator and compiled acceptor (made once per tool version), or a
        `schema` Hint when its input schema cannot validate anything (schema_check)."""
        cached = self._cached_validators(tool)
        if cached is None:
            dialect = schema_check.dialect(tool.input_schema)
            defect = schema_check.schema_defect(tool.input_schema, dialect)
            if defect is not None:
                logger.error("tool %s has an unusable input_schema: %s", tool.name, defect)
                cached = Hint("schema", f"tool {tool.name!r} has an invalid input schema: {defect}")
            else:
                cached = (
                    dialect(tool.input_schema),
                    fast_acceptor(tool.input_schema, dialect=schema_check.dialect_uri(dialect)),
                )
            self._validators_cache.put(tool.name, (tool.version, cached))
        return cached

    def _validate(self, tool: ToolDef, inputs: dict[str, Any]) -> Hint | None:
        """None when `inputs` satisfy the tool's input schema, else a `schema` Hint."""
        found = self._validators(tool)
        if isinstance(found, Hint):
            return found
        validator, accept = found
        if accept is not None and accept(inputs):
            return None
        return self._violations(tool, validator, inputs)

    async def _validate_off_loop(self, tool: ToolDef, inputs: dict[str, Any]) -> Hint | None:
        """`_validate`, with the Python validator run in a thread for a large input: walking
        megabytes of JSON in Python takes seconds, which on the event loop would stall every
        other call of the registry."""
        found: Validators | Hint | None = self._cached_validators(tool)
        if found is None and not is_large(tool.input_schema):
            found = self._validators(tool)
        elif found is None:  # checking and compiling a large schema takes a while: not on the loop
            found = await asyncio.to_thread(self._validators, tool)
        if isinstance(found, Hint):
            return found
        validator, accept = found
        if accept is not None and accept(inputs):
            return None
        if is_large(inputs):
            return await asyncio.to_thread(self._violations, tool, validator, inputs)
        return self._violations(tool, validator, inputs)

    def _violations(self, tool: ToolDef, validator: Any, inputs: dict[str, Any]) -> Hint | None:
        """The first violations of `inputs`, as a `schema` Hint (None if there are none).
        At most MAX_COLLECTED_ERRORS are collected: an input can break a schema a million
        times (one per item of an array), and each error jsonschema makes costs kilobytes."""
        try:
            found = list(itertools.islice(validator.iter_errors(inputs), MAX_COLLECTED_ERRORS + 1))
        except referencing.exceptions.Unresolvable as exc:  # an MCP server's dangling $ref
            logger.error("tool %s has an unresolvable $ref in its input_schema: %s", tool.name, exc)
            return Hint(
                "schema",
                f"tool {tool.name!r} has an invalid input schema: its reference "
                f"{convert.clip(str(exc.ref), 100)!r} cannot be resolved",
            )
        except RecursionError:  # a loop schema_check did not see (through a $dynamicRef...)
            logger.error("tool %s: validating its input recursed without end", tool.name)
            return Hint(
                "schema",
                f"tool {tool.name!r} has an invalid input schema: validating against it "
                "recursed without end (its references loop)",
            )
        if not found:
            return None
        capped = len(found) > MAX_COLLECTED_ERRORS
        errors = sorted(found[:MAX_COLLECTED_ERRORS], key=lambda e: (len(e.path), str(e.path)))
        props = list((tool.input_schema.get("properties") or {}).keys())
        messages: list[str] = []
        alternatives: list[Alternative] = []
        for error in errors[:MAX_VALIDATION_ERRORS]:
            message, alts = describe_violation(error, props)
            messages.append(message)
            alternatives.extend(alts)
        more = len(errors) - MAX_VALIDATION_ERRORS
        if capped:
            text = "; ".join(messages) + f"; and at least {more + 1} more"
        else:
            text = "; ".join(messages) + (f"; and {more} more" if more > 0 else "")
        return Hint("schema", f"invalid input for {tool.name}: {text}", alternatives)

    async def _run_system(
        self, tool: ToolDef, inputs: dict[str, Any], context: ToolContext
    ) -> ToolResult:
        handler = self._handlers.get(tool.name)
        if handler is None:
            return self._answer(
                tool,
                Err(
                    f"system tool {tool.name!r} has no registered handler "
                    f"({tool.handler_path or 'no handler_path'})",
                    err_kind="handler_missing",
                ),
            )
        try:
            if inspect.iscoroutinefunction(handler):
                raw = await handler(inputs, context)
            else:
                raw = await _run_in_thread(
                    self._threads.pool(context.depth), handler, inputs, context
                )
                if inspect.isawaitable(raw):
                    raw = await raw
        except HintException as exc:
            return envelope_to_tool_result(exc.to_hint())
        except Exception as exc:  # a handler without a contract spec: its failure is an Err
            logger.exception("tool %s raised %s: %s", tool.name, type(exc).__name__, exc)
            return envelope_to_tool_result(exception_to_envelope(exc))
        # A contract-wrapped handler returned an envelope; a legacy one keeps its own content.
        return normalise_result(tool.name, raw)


async def _run_in_thread(
    pool: ThreadPoolExecutor, handler: Handler, inputs: dict[str, Any], context: ToolContext
) -> Any:
    """A sync handler on a worker thread of `pool`, in a copy of the caller's context (its
    trace and its cancellation). Cancelled while it waits for a thread, it never runs. Once it
    runs, the thread cannot be stopped from outside: its cancellation event is set, and the
    handler's long work (a query's watchdog, a file's reader) stops on it instead of running on
    to its own limits."""
    event = threading.Event()
    token = cancellable(event)
    try:
        work = functools.partial(contextvars.copy_context().run, handler, inputs, context)
        return await asyncio.get_running_loop().run_in_executor(pool, work)
    except asyncio.CancelledError:
        event.set()
        raise
    finally:
        reset_cancellation(token)


def describe_violation(
    error: ValidationError, props: Sequence[str]
) -> tuple[str, list[Alternative]]:
    """One schema violation as text for the model, naming the field and what was expected."""
    # Field names and messages come from the caller's input: clipped, so that a megabyte key or
    # a hundred thousand of them make a hint of a few lines, not of megabytes.
    where = convert.clip("/".join(str(p) for p in error.absolute_path), MAX_MATCHED_CHARS)
    field = f"'{where}'" if where else "input"
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    instance: Any = error.instance
    prefix = f"{where}/" if where else ""
    if error.validator == "required":
        missing = _named(error, error.validator_value, "{!r} is a required property")
        return f"missing required field '{prefix}{missing}'", []
    if error.validator in ("dependentRequired", "dependencies") and isinstance(instance, Mapping):
        for present, needed in cast(Mapping[str, Any], error.validator_value).items():
            if present in instance and isinstance(needed, list):
                for name in needed:
                    if error.message == f"{name!r} is a dependency of {present!r}":
                        return (
                            f"missing required field '{prefix}{convert.clip(str(name), 100)}' "
                            f"(required when '{convert.clip(str(present), 100)}' is given)",
                            [],
                        )
    if error.validator == "additionalProperties" and isinstance(instance, Mapping):
        unknown = _unknown_fields(error, schema, instance, where, props)
        if unknown is not None:
            return unknown
    if error.validator == "type":
        return (
            f"field {field}: expected {_type_names(error.validator_value)}, got "
            f"{_json_type(error.instance)} {_short(error.instance)}",
            [],
        )
    if error.validator in ("anyOf", "oneOf") and error.context:
        return _describe_alternatives(error, field, props)
    bound = _BOUNDS.get(str(error.validator))
    if bound is not None and isinstance(instance, Sized) and isinstance(error.validator_value, int):
        limit, noun = bound
        count = error.validator_value
        return (
            f"field {field}: expected {limit} {count} {noun}{'' if count == 1 else 's'}, "
            f"got {len(instance)}",
            [],
        )
    if error.validator == "contains":
        wanted = convert.clip(json.dumps(error.validator_value, default=str), MAX_MESSAGE_CHARS)
        return f"field {field}: expected at least one item matching {wanted}", []
    if error.validator is None and schema == {} and error.validator_value is None:
        return f"field {field} is not allowed here (got {_short(error.instance)})", []
    if error.validator == "enum":
        # Clipped on both sides: SequenceMatcher is quadratic, and the value comes from the
        # caller (a megabyte string took seconds), the options from any MCP server.
        values = cast(list[Any], error.validator_value)
        options = [_option_text(v) for v in values[:MAX_SCORED_OPTIONS]]
        given = convert.clip(_short(error.instance, MAX_MATCHED_CHARS), MAX_MATCHED_CHARS)
        alternatives = [
            Alternative(o, round(_similarity(given, convert.clip(o, MAX_MATCHED_CHARS)), 2))
            for o in options
        ]
        alternatives.sort(key=lambda a: -a.score)
        listed = convert.clip(str(options[:MAX_LISTED_OPTIONS]), MAX_MESSAGE_CHARS)
        if len(values) > MAX_LISTED_OPTIONS:
            listed += f" (and {len(values) - MAX_LISTED_OPTIONS} more)"
        return f"field {field}: {_short(error.instance)} is not one of {listed}", alternatives[:3]
    return f"field {field}: {convert.clip(error.message, MAX_MESSAGE_CHARS)}", []


# Size keywords: the bound and what is counted.
_BOUNDS = {
    "minItems": ("at least", "item"),
    "maxItems": ("at most", "item"),
    "minLength": ("at least", "character"),
    "maxLength": ("at most", "character"),
    "minProperties": ("at least", "field"),
    "maxProperties": ("at most", "field"),
}


def _named(error: ValidationError, names: Any, template: str) -> str:
    """Which of `names` the error's message is about (jsonschema words one error per name;
    a name may hold a quote, so the message is matched, not split)."""
    if isinstance(names, list):
        for name in names:
            if error.message == template.format(name):
                return convert.clip(str(name), MAX_MATCHED_CHARS)
    text = error.message.split("'")[1] if "'" in error.message else error.message
    return convert.clip(text, MAX_MATCHED_CHARS)


def _unknown_fields(
    error: ValidationError,
    schema: Mapping[str, Any],
    instance: Mapping[str, Any],
    where: str,
    props: Sequence[str],
) -> tuple[str, list[Alternative]] | None:
    """`additionalProperties: false` broken: the fields neither declared nor matching a
    `patternProperties` name, in the object where they are (None when there are none)."""
    declared = [p for p in (schema.get("properties") or {}) if isinstance(p, str)]
    patterns = [p for p in (schema.get("patternProperties") or {}) if isinstance(p, str)]
    # Every field counted (the input is bounded in bytes, and RE2 is linear), the first few kept.
    is_declared = set(declared).__contains__
    first: list[str] = []
    count = 0
    for key in instance:
        if is_declared(key) or any(schema_regex.SEARCH.search(p, key) for p in patterns):
            continue
        count += 1
        if len(first) < MAX_LISTED_FIELDS:
            first.append(key)
    if not count:
        return None
    # At the root, a subschema's (allOf's) error is told against the tool's own fields.
    known = declared or ([] if where or patterns else list(props))
    alternatives = []
    shown = [convert.clip(extra, MAX_MATCHED_CHARS) for extra in first]
    for extra in shown:
        for match in difflib.get_close_matches(extra, known, n=2, cutoff=0.5):
            score = difflib.SequenceMatcher(None, extra, match).ratio()
            alternatives.append(Alternative(match, round(score, 2), {"instead_of": extra}))
    allowed = ", ".join(known)
    if patterns:
        matching = "names matching " + ", ".join(repr(convert.clip(p, 60)) for p in patterns[:3])
        allowed = f"{allowed}, {matching}" if allowed else matching
    more = f" and {count - len(shown)} more" if count > len(shown) else ""
    listed = ", ".join(map(repr, shown))
    inside = f" in '{where}'" if where else ""
    return f"unknown field(s) {listed}{more}{inside} (allowed: {allowed or 'none'})", alternatives


def _describe_alternatives(
    error: ValidationError, field: str, props: Sequence[str]
) -> tuple[str, list[Alternative]]:
    """anyOf / oneOf matched by no alternative. When each failed on its type: the types they
    expect (a nullable field: "expected string or null"). Otherwise the alternatives of the
    value's own type are the candidates: one that tells its forms apart by a constant field
    (a discriminator: "kind" is "date" or "tag") is told as that field's options; else the
    candidate with the fewest violations, and no wrong constant, is described."""
    branches: dict[Any, list[ValidationError]] = {}
    for sub in error.context or []:
        branch = sub.relative_schema_path[0] if sub.relative_schema_path else None
        branches.setdefault(branch, []).append(sub)
    count = len(cast(list[Any], error.validator_value))
    candidates = {
        b: subs
        for b, subs in branches.items()
        if not any(s.validator == "type" and not s.relative_path for s in subs)
    }
    if not candidates:
        expected: list[str] = []
        for subs in branches.values():
            typed = next(s for s in subs if s.validator == "type" and not s.relative_path)
            value: Any = typed.validator_value
            expected.extend(str(v) for v in (value if isinstance(value, list) else [value]))
        return (
            f"field {field}: expected {_type_names(list(dict.fromkeys(expected)))}, got "
            f"{_json_type(error.instance)} {_short(error.instance)}",
            [],
        )
    discriminator = _discriminator(candidates, error.instance)
    if discriminator is not None:
        key, options = discriminator
        where = convert.clip("/".join(map(str, [*error.absolute_path, key])), MAX_MATCHED_CHARS)
        given = error.instance.get(key) if isinstance(error.instance, Mapping) else None
        listed = convert.clip(", ".join(map(repr, options)), MAX_MESSAGE_CHARS)
        return (
            f"field '{where}': expected one of {listed}, got {_short(given)}",
            [Alternative(o, 0.0) for o in options[:MAX_LISTED_OPTIONS]],
        )
    ranked = sorted(candidates.values(), key=lambda subs: (_wrong_constants(subs), len(subs)))
    # The most relevant violation of that alternative, as jsonschema ranks them; a nested
    # anyOf / oneOf among them is described by this function again, not descended blindly.
    best = max(ranked[0], key=jsonschema.exceptions.relevance)
    closest, alternatives = describe_violation(best, props)
    if len(candidates) == 1:  # the one alternative of the value's type: its violation
        return closest, alternatives
    return f"field {field} matches none of its {count} allowed forms; closest: {closest}", (
        alternatives
    )


def _wrong_constants(errors: list[ValidationError]) -> int:
    return sum(1 for e in errors if e.validator in ("const", "enum") and len(e.relative_path) <= 1)


def _discriminator(
    candidates: Mapping[Any, list[ValidationError]], instance: Any
) -> tuple[str, list[str]] | None:
    """The field every candidate alternative pins to its own constant (and the value has
    wrong), with the constants; None when there is none."""
    if len(candidates) < 2 or not isinstance(instance, Mapping):
        return None
    keys: set[str] | None = None
    options: dict[str, list[str]] = {}
    for subs in candidates.values():
        pinned: dict[str, list[Any]] = {}
        for sub in subs:
            if sub.validator in ("const", "enum") and len(sub.relative_path) == 1:
                key = str(sub.relative_path[0])
                value: Any = sub.validator_value
                pinned[key] = list(value) if sub.validator == "enum" else [value]
        keys = set(pinned) if keys is None else keys & set(pinned)
        for key, values in pinned.items():
            options.setdefault(key, []).extend(_option_text(v) for v in values)
    if not keys:
        return None
    key = sorted(keys)[0]
    return key, list(dict.fromkeys(options[key]))


def _option_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _type_names(value: Any) -> str:
    names = [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return " or ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + " or " + names[-1]


def is_large(value: Any, max_nodes: int = LARGE_INPUT_NODES) -> bool:
    """Whether a decoded JSON value has more than `max_nodes` nodes or a string longer than
    LARGE_INPUT_CHARS; the walk stops at the bound, so it is cheap whatever the value."""
    stack = [value]
    seen = 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > max_nodes:
            return True
        if isinstance(item, dict):
            stack.extend(itertools.islice(item.values(), max_nodes - seen + 1))
            seen += min(len(item), max_nodes)  # the keys
        elif isinstance(item, list):
            stack.extend(itertools.islice(item, max_nodes - seen + 1))
        elif isinstance(item, str) and len(item) > LARGE_INPUT_CHARS:
            return True
    return False


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 200
_REPR.maxlevel = 3
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = _REPR.maxset = 30


def _short(value: Any, limit: int = 60) -> str:
    """A short repr of a caller's value (bounded work: a megabyte value is not repr'd whole)."""
    text = _REPR.repr(value) if isinstance(value, str | list | dict | int) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def resolve_handler(path: str) -> Handler:
    """Import `package.module.function`."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"handler_path {path!r} is not a dotted path")
    module = importlib.import_module(module_name)
    handler = getattr(module, attr)
    if not callable(handler):
        raise TypeError(f"{path} is not callable")
    return cast(Handler, handler)
