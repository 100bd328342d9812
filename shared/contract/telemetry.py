"""Contract telemetry: the `contract_envelope` event recorded for every call at the contract
boundary (after coercion and validation), and ContractCounters, the per-tool Ok / Hint / Err
counters with hint_kind and err_kind tallies.

An event goes three ways (`emit`): a log line (`contract_envelope tool=… kind=…`; DEBUG for a
clean Ok, INFO otherwise, with the event as `extra={"contract_envelope": {...}}` for structured
handlers), a `contract_envelope` event on the current OpenTelemetry span, and the recorder's
counters. Counters live in the process that ran the handler — one registry replica; a store
shared across replicas can replace ContractCounters behind the ContractRecorder protocol."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from opentelemetry import trace

from shared.contract.envelope import Envelope, EnvelopeKind, Err, Hint, Ok, envelope_kind

logger = logging.getLogger(__name__)

EVENT_NAME = "contract_envelope"
Origin = Literal["handler", "registry"]


@dataclass(frozen=True)
class ContractEvent:
    """One call's envelope as telemetry. `origin` is "handler" for the contract wrapper and
    "registry" for an envelope the registry answered without running the handler (input
    validation, refusal, missing handler)."""

    tool_name: str
    kind: EnvelopeKind
    hint_kind: str | None = None
    err_kind: str | None = None
    rows: int | None = None
    warning_kinds: tuple[str, ...] = ()
    violations: tuple[str, ...] = ()
    coerced: bool = False
    origin: Origin = "handler"
    duration_ms: float | None = None
    cost_usd: float = 0.0
    is_cost_rollup: bool = False

    @classmethod
    def of(cls, tool_name: str, envelope: Envelope, **extra: Any) -> ContractEvent:
        kind = envelope_kind(envelope)
        return cls(
            tool_name=tool_name,
            kind=kind,
            hint_kind=envelope.hint_kind if isinstance(envelope, Hint) else None,
            err_kind=envelope.err_kind if isinstance(envelope, Err) else None,
            rows=envelope.rows if isinstance(envelope, Ok) else None,
            warning_kinds=tuple(w.kind for w in envelope.warnings)
            if isinstance(envelope, Ok)
            else (),
            cost_usd=envelope.effects.cost if isinstance(envelope, Ok) else 0.0,
            **extra,
        )

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["warning_kinds"] = list(self.warning_kinds)
        data["violations"] = list(self.violations)
        return data


class ContractRecorder(Protocol):
    """Where contract events are counted."""

    def record(self, event: ContractEvent) -> None: ...


@dataclass(frozen=True)
class ToolContractStats:
    """The counters of one tool."""

    tool_name: str
    ok: int = 0
    hint: int = 0
    err: int = 0
    hint_kinds: Mapping[str, int] = field(default_factory=dict)
    err_kinds: Mapping[str, int] = field(default_factory=dict)
    contract_violations: int = 0  # calls whose envelope broke the tool's spec
    coerced: int = 0  # legacy returns (ToolResult, dict, str) translated to an envelope

    @property
    def calls(self) -> int:
        return self.ok + self.hint + self.err


@dataclass
class _Tally:
    kinds: Counter[str] = field(default_factory=Counter)
    hint_kinds: Counter[str] = field(default_factory=Counter)
    err_kinds: Counter[str] = field(default_factory=Counter)
    violations: int = 0
    coerced: int = 0


class ContractCounters:
    """In-process per-tool counters; thread-safe (sync handlers run in worker threads)."""

    def __init__(self, *, now: Callable[[], datetime] | None = None) -> None:
        self._lock = threading.Lock()
        self._tallies: dict[str, _Tally] = {}
        self.since: datetime = now() if now is not None else datetime.now(UTC)

    def record(self, event: ContractEvent) -> None:
        with self._lock:
            tally = self._tallies.get(event.tool_name)
            if tally is None:
                tally = self._tallies[event.tool_name] = _Tally()
            tally.kinds[event.kind] += 1
            if event.hint_kind is not None:
                tally.hint_kinds[event.hint_kind] += 1
            if event.err_kind is not None:
                tally.err_kinds[event.err_kind] += 1
            tally.violations += bool(event.violations)
            tally.coerced += event.coerced

    def snapshot(self, tool_name: str | None = None) -> list[ToolContractStats]:
        """The counters of `tool_name` (every tool when None) by name; a tool with no recorded
        call is absent."""
        with self._lock:
            names = sorted(self._tallies) if tool_name is None else [tool_name]
            return [
                ToolContractStats(
                    tool_name=name,
                    ok=t.kinds["ok"],
                    hint=t.kinds["hint"],
                    err=t.kinds["err"],
                    hint_kinds=dict(sorted(t.hint_kinds.items())),
                    err_kinds=dict(sorted(t.err_kinds.items())),
                    contract_violations=t.violations,
                    coerced=t.coerced,
                )
                for name in names
                if (t := self._tallies.get(name)) is not None
            ]


_PROCESS_COUNTERS = ContractCounters()


def process_counters() -> ContractCounters:
    """The counters of calls made outside a registry (a direct call of a decorated handler)."""
    return _PROCESS_COUNTERS


def emit(event: ContractEvent, recorder: ContractRecorder | None = None) -> None:
    """Record `event`: log line, span event, counters (`recorder`, else the process's)."""
    level = logging.DEBUG if event.kind == "ok" and not event.violations else logging.INFO
    if logger.isEnabledFor(level):
        logger.log(
            level,
            "%s tool=%s kind=%s hint_kind=%s err_kind=%s rows=%s warnings=%s violations=%d "
            "coerced=%s origin=%s",
            EVENT_NAME,
            event.tool_name,
            event.kind,
            event.hint_kind or "-",
            event.err_kind or "-",
            "-" if event.rows is None else event.rows,
            ",".join(event.warning_kinds) or "-",
            len(event.violations),
            event.coerced,
            event.origin,
            extra={EVENT_NAME: event.as_dict()},
        )
    span = trace.get_current_span()
    if span.is_recording():
        attributes: dict[str, Any] = {
            "toolmesh.tool.name": event.tool_name,
            "toolmesh.envelope.kind": event.kind,
            "toolmesh.envelope.coerced": event.coerced,
            "toolmesh.envelope.origin": event.origin,
        }
        if event.hint_kind is not None:
            attributes["toolmesh.envelope.hint_kind"] = event.hint_kind
        if event.err_kind is not None:
            attributes["toolmesh.envelope.err_kind"] = event.err_kind
        if event.violations:
            attributes["toolmesh.contract.violations"] = list(event.violations)
        span.add_event(EVENT_NAME, attributes)
    (recorder if recorder is not None else _PROCESS_COUNTERS).record(event)
