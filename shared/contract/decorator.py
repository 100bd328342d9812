"""The contract boundary: `@uniform_contract` (source decoration — the handler builds Ok and
raises HintException; the decorator guarantees an envelope) and `wrap_handler`, the same wrapper
the registry puts around a spec-only handler when it registers it.

For every call the wrapper: runs the handler (a HintException becomes a Hint before any other
exception becomes an Err); coerces a legacy return (ToolResult, dict, str) to an envelope and
checks it; validates it against the ToolSpec (an empty schema on a tabular tool, a kind outside
expected_envelopes, fewer rows than the data holds: a `contract` Warning on an Ok, a log line
for every kind); and emits the `contract_envelope` event. It returns the envelope."""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar, cast

import pandas as pd

from shared.contract.envelope import (
    Envelope,
    EnvelopeKind,
    HintException,
    Ok,
    Warning,
    envelope_kind,
    infer_schema,
    is_scalar_record,
)
from shared.contract.result import coerce_return, exception_to_envelope
from shared.contract.spec import ToolSpec, expected_kinds, register_spec
from shared.contract.telemetry import ContractEvent, ContractRecorder, emit

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
SPEC_ATTRIBUTE = "__tool_spec__"


def is_contract_wrapped(handler: Callable[..., Any]) -> bool:
    """True for a handler that already returns envelopes through the contract wrapper."""
    return getattr(handler, SPEC_ATTRIBUTE, None) is not None


def spec_of_wrapper(handler: Callable[..., Any]) -> ToolSpec | None:
    """The spec a contract wrapper was built with."""
    spec = getattr(handler, SPEC_ATTRIBUTE, None)
    return spec if isinstance(spec, ToolSpec) else None


def recorder_of(context: Any) -> ContractRecorder | None:
    """The recorder a caller put on the context (the registry's counters), if any."""
    return cast(ContractRecorder | None, getattr(context, "contract_recorder", None))


def validate_envelope(spec: ToolSpec, envelope: Envelope) -> tuple[Envelope, list[str]]:
    """Check `envelope` against `spec`. Each violation is logged; on an Ok it also rides along
    as a Warning(kind="contract") (a Hint or Err has no room for warnings)."""
    violations: list[str] = []
    kind = envelope_kind(envelope)
    if spec.expected_envelopes is not None and kind not in spec.expected_envelopes:
        expected = ", ".join(k for k in ("ok", "hint", "err") if k in spec.expected_envelopes)
        violations.append(
            f"{spec.name} returned {kind}, not one of its expected kinds ({expected})"
        )
    if isinstance(envelope, Ok):
        if spec.is_tabular and not envelope.schema:
            violations.append(f"{spec.name} is tabular but returned an empty schema")
        if isinstance(envelope.data, pd.DataFrame) and envelope.rows < len(envelope.data):
            violations.append(
                f"{spec.name} reported {envelope.rows} row(s) but its data holds "
                f"{len(envelope.data)}"
            )
    for violation in violations:
        logger.warning("contract violation: %s", violation)
    if violations and isinstance(envelope, Ok):
        extra = [Warning("contract", v, {"tool": spec.name}) for v in violations]
        envelope = replace(envelope, warnings=[*envelope.warnings, *extra])
    return envelope, violations


def _complete(spec: ToolSpec, envelope: Envelope) -> Envelope:
    """A single-row dict of scalars from a tabular tool gets an inferred schema."""
    if (
        isinstance(envelope, Ok)
        and spec.is_tabular
        and not envelope.schema
        and is_scalar_record(envelope.data)
    ):
        return replace(envelope, schema=infer_schema(envelope.data), rows=envelope.rows or 1)
    return envelope


def _finish(
    spec: ToolSpec,
    context: Any,
    started: float,
    *,
    raw: Any = None,
    exc: BaseException | None = None,
) -> Envelope:
    if exc is not None:
        envelope, coerced = exception_to_envelope(exc), False
    else:
        envelope, coerced = coerce_return(spec.name, raw)
    envelope, violations = validate_envelope(spec, _complete(spec, envelope))
    emit(
        ContractEvent.of(
            spec.name,
            envelope,
            violations=tuple(violations),
            coerced=coerced,
            origin="handler",
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
            is_cost_rollup=spec.is_cost_rollup,
        ),
        recorder_of(context),
    )
    return envelope


def _failed(spec: ToolSpec, context: Any, started: float, exc: Exception) -> Envelope:
    """A handler's exception as its envelope: a HintException is a Hint (a correction, not
    logged as a failure); anything else an Err, logged with its traceback."""
    if not isinstance(exc, HintException):
        logger.error("tool %s raised %s", spec.name, type(exc).__name__, exc_info=exc)
    return _finish(spec, context, started, exc=exc)


def wrap_handler(handler: Callable[..., Any], spec: ToolSpec) -> Callable[..., Any]:
    """`handler` behind the contract boundary: the wrapper returns an envelope (a coroutine of
    one for an async handler). Only `spec`'s name and flags are used, not spec.handler."""
    if inspect.iscoroutinefunction(handler):

        @functools.wraps(handler)
        async def async_wrapper(inputs: dict[str, Any], context: Any) -> Envelope:
            started = time.perf_counter()
            try:
                raw = await handler(inputs, context)
            except Exception as exc:  # noqa: BLE001 - the contract boundary: failures are envelopes
                return _failed(spec, context, started, exc)
            return _finish(spec, context, started, raw=raw)

        wrapper: Callable[..., Any] = async_wrapper
    else:

        async def finish_awaitable(
            pending: Awaitable[Any], context: Any, started: float
        ) -> Envelope:
            try:
                raw = await pending
            except Exception as exc:  # noqa: BLE001 - the contract boundary: failures are envelopes
                return _failed(spec, context, started, exc)
            return _finish(spec, context, started, raw=raw)

        @functools.wraps(handler)
        def sync_wrapper(inputs: dict[str, Any], context: Any) -> Envelope | Awaitable[Envelope]:
            started = time.perf_counter()
            try:
                raw = handler(inputs, context)
            except Exception as exc:  # noqa: BLE001 - the contract boundary: failures are envelopes
                return _failed(spec, context, started, exc)
            if inspect.isawaitable(raw):  # a sync function handing back a coroutine
                return finish_awaitable(raw, context, started)
            return _finish(spec, context, started, raw=raw)

        wrapper = sync_wrapper
    setattr(wrapper, SPEC_ATTRIBUTE, spec)
    return wrapper


def uniform_contract(
    name: str,
    *,
    is_tabular: bool,
    is_cost_rollup: bool = False,
    expected_envelopes: Iterable[EnvelopeKind] | None = None,
) -> Callable[[F], F]:
    """Source decoration: register a ToolSpec for the decorated handler and return the contract
    wrapper, so every caller — the registry or a direct one — gets an envelope. The handler
    returns Ok (or any legacy shape, coerced) and raises HintException for corrections; annotate
    it as returning `Envelope`."""

    def decorate(handler: F) -> F:
        spec = ToolSpec(
            name=name,
            handler=handler,
            is_tabular=is_tabular,
            is_cost_rollup=is_cost_rollup,
            expected_envelopes=expected_kinds(expected_envelopes),
        )
        wrapper = wrap_handler(handler, spec)
        registered = replace(spec, handler=wrapper)
        setattr(wrapper, SPEC_ATTRIBUTE, registered)
        register_spec(registered)
        return cast(F, wrapper)

    return decorate
