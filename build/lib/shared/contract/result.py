"""ToolResult — what handlers return (the spec's dataclass) — and the coercions between it, the
legacy dict shape and the typed envelope."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from shared.contract.envelope import (
    ColumnSpec,
    Effects,
    Envelope,
    Err,
    Hint,
    HintException,
    Ok,
    measure_schema,
)
from shared.contract.render import render_envelope

HINT_PREFIXES = {"schema hint:": "schema", "fetch hint:": "fetch"}


@dataclass
class ToolResult:
    """The legacy-compatible result of a handler. `error` None means success."""

    content: str = ""
    cards: list[dict[str, Any]] = field(default_factory=list)
    cost: float = 0.0
    datasets: dict[str, Any] = field(default_factory=dict)
    exports: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None
    envelope: Envelope | None = None

    @classmethod
    def from_any(cls, value: Any) -> ToolResult:
        """Normalise a handler's return: a ToolResult, a legacy dict
        ({"message", "cards", "metadata", "error"}), an envelope, or a plain string."""
        if isinstance(value, ToolResult):
            return value
        if isinstance(value, Ok | Hint | Err):
            return envelope_to_tool_result(value)
        if isinstance(value, dict):
            content = value.get("message", value.get("content", ""))
            error = value.get("error")
            return cls(
                content=content if isinstance(content, str) else json.dumps(content, default=str),
                cards=list(value.get("cards") or []),
                cost=float(value.get("cost") or 0.0),
                datasets=dict(value.get("datasets") or {}),
                exports=dict(value.get("exports") or {}),
                error=str(error) if error else None,
            )
        if isinstance(value, str):
            return cls(content=value)
        raise TypeError(
            f"handler returned {type(value).__name__}; expected ToolResult, dict, str or envelope"
        )


def to_envelope(result: ToolResult) -> Envelope:
    """Coerce a legacy ToolResult to an envelope: a `schema hint:`/`fetch hint:` error becomes
    that Hint, any other error Err(err_kind="legacy"), anything else Ok with the schema measured
    from the first dataset."""
    if result.envelope is not None:
        return result.envelope
    if result.error is not None:
        text = result.error.strip()
        lowered = text.lower()
        for prefix, kind in HINT_PREFIXES.items():
            if lowered.startswith(prefix):
                return Hint(hint_kind=kind, message=text[len(prefix) :].strip())  # type: ignore[arg-type]
        return Err(message=text, err_kind="legacy")
    effects = Effects(
        cards=list(result.cards),
        datasets=dict(result.datasets),
        exports=dict(result.exports),
        cost=result.cost,
    )
    schema: list[ColumnSpec] = []
    rows = 0
    for value in result.datasets.values():
        if isinstance(value, pd.DataFrame):
            schema = measure_schema(value)
            rows = len(value)
            break
    return Ok(rows=rows, schema=schema, data=result.content or None, effects=effects)


def envelope_to_tool_result(envelope: Envelope) -> ToolResult:
    """Translate an envelope back to a ToolResult at the dispatch boundary."""
    rendered = render_envelope(envelope)
    if isinstance(envelope, Ok):
        fx = envelope.effects
        return ToolResult(
            content=rendered,
            cards=list(fx.cards),
            cost=fx.cost,
            datasets=dict(fx.datasets),
            exports=dict(fx.exports),
            envelope=envelope,
        )
    if isinstance(envelope, Hint):
        return ToolResult(content=rendered, envelope=envelope)
    return ToolResult(content=rendered, error=envelope.message, envelope=envelope)


def exception_to_envelope(exc: BaseException) -> Envelope:
    """A handler's exception as an envelope: HintException first, anything else an Err."""
    if isinstance(exc, HintException):
        return exc.to_hint()
    return Err(message=str(exc) or type(exc).__name__, err_kind=type(exc).__name__)
