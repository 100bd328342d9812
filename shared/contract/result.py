"""ToolResult — what handlers return (the spec's dataclass) — and the coercions between it, the
legacy dict shape and the typed envelope:

* `to_envelope`: a legacy result as an envelope (the spec's coercion rules);
* `envelope_to_tool_result`: an envelope back to a ToolResult at the dispatch boundary;
* `exception_to_envelope`: HintException → Hint, any other exception → Err;
* `coerce_return` / `normalise_result`: whatever a handler returned, checked — a return of the
  wrong type, a dataset that is not a DataFrame or a card that is not a JSON object is an Err
  whose kind names the problem, never a crash."""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from shared.contract.envelope import (
    ColumnSpec,
    Effects,
    Envelope,
    Err,
    Hint,
    HintException,
    HintKind,
    Ok,
    measure_schema,
)
from shared.contract.render import render_envelope, strip_ok_status

HINT_PREFIXES: dict[str, HintKind] = {"schema hint:": "schema", "fetch hint:": "fetch"}


@dataclass
class ToolResult:
    """The legacy-compatible result of a handler. `error` None means success. `envelope` is the
    typed envelope the content was rendered from, when there is one."""

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

    def content_as_data(self) -> str:
        """The content as data for another tool's handler (RAG synthesis, enrichment, …): the
        leading `✓ ok.` status line is stripped; Hint and Err text is kept intact, so a caller
        cannot mistake a failure for content."""
        return strip_ok_status(self.content)

    # The spec's name for content_as_data (engine/tool_result.py:_get_content).
    _get_content = content_as_data


def to_envelope(result: ToolResult) -> Envelope:
    """Coerce a legacy ToolResult to an envelope: a `schema hint:`/`fetch hint:` error becomes
    that Hint, any other error Err(err_kind="legacy"), anything else Ok with the schema measured
    from the first dataset and the content as its data."""
    if result.envelope is not None:
        return result.envelope
    if result.error is not None:
        text = result.error.strip()
        lowered = text.lower()
        for prefix, kind in HINT_PREFIXES.items():
            if lowered.startswith(prefix):
                return Hint(hint_kind=kind, message=text[len(prefix) :].strip())
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


# The envelope turned into a ToolResult last (by identity) and its rendered text. A spec-only
# handler returns envelope_to_tool_result(envelope) to its direct callers; behind the contract
# wrapper the registry gets that envelope back and turns it into a ToolResult again, right after,
# in the same task: the same rendering twice on every such call. Envelopes are not changed in
# place once made (the contract boundary makes a new one with dataclasses.replace), so the text
# is reused once; any other sequence of calls just renders.
_last_rendered: tuple[weakref.ref[Any], str] | None = None


def envelope_to_tool_result(envelope: Envelope) -> ToolResult:
    """Translate an envelope back to a ToolResult at the dispatch boundary: Ok carries its
    effects, Hint is not an error, Err sets `error`."""
    global _last_rendered
    last = _last_rendered
    if last is not None and last[0]() is envelope:
        rendered = last[1]
        _last_rendered = None
    else:
        rendered = render_envelope(envelope)
        _last_rendered = (weakref.ref(envelope), rendered)
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
    """A handler's exception as an envelope: HintException first, anything else an Err named
    after the exception class."""
    if isinstance(exc, HintException):
        return exc.to_hint()
    # An exception may name its own err_kind (e.g. BudgetExceeded -> "budget_exceeded").
    kind = getattr(exc, "err_kind", None)
    return Err(
        message=str(exc) or type(exc).__name__,
        err_kind=kind if isinstance(kind, str) and kind else type(exc).__name__,
    )


# --- checks of what a handler returned ----------------------------------------------------------


def check_effects(
    tool_name: str, cards: list[Any], datasets: Mapping[str, Any], content: Any = ""
) -> Err | None:
    """The Err for a malformed part of a result, or None when every part is well-formed."""
    if not isinstance(content, str):
        return Err(
            f"{tool_name} returned {type(content).__name__} content, not text",
            err_kind="invalid_result",
        )
    for name, value in datasets.items():
        if not isinstance(value, pd.DataFrame):
            return Err(
                f"{tool_name} returned dataset {name!r} as {type(value).__name__}, not a DataFrame",
                err_kind="invalid_dataset",
            )
    for position, card in enumerate(cards):
        if not isinstance(card, Mapping):
            return Err(
                f"{tool_name} returned card {position} as {type(card).__name__}, not an object",
                err_kind="invalid_card",
            )
        try:
            json.dumps(card)
        except (TypeError, ValueError) as exc:
            return Err(
                f"{tool_name} returned card {position}, which is not JSON-serialisable: {exc}",
                err_kind="invalid_card",
            )
    return None


def _checked_envelope(tool_name: str, envelope: Envelope) -> Envelope:
    if not isinstance(envelope, Ok):
        return envelope
    problem = check_effects(tool_name, envelope.effects.cards, envelope.effects.datasets)
    if problem is not None:
        return problem
    if isinstance(envelope.data, pd.DataFrame) and not envelope.schema:
        # The schema is measured from the data, never declared: fill in a forgotten one.
        return replace(envelope, schema=measure_schema(envelope.data))
    return envelope


def coerce_return(tool_name: str, raw: Any) -> tuple[Envelope, bool]:
    """A handler's return as a checked envelope, and whether it was coerced from a legacy shape
    (ToolResult without an envelope, dict, str) rather than returned as an envelope."""
    if isinstance(raw, Ok | Hint | Err):
        return _checked_envelope(tool_name, raw), False
    if isinstance(raw, ToolResult) and raw.envelope is not None:
        return _checked_envelope(tool_name, raw.envelope), False
    checked = _checked_legacy(tool_name, raw)
    return (checked if isinstance(checked, Err) else to_envelope(checked)), True


def normalise_result(tool_name: str, raw: Any) -> ToolResult:
    """Whatever a handler without a contract spec returned, as a checked ToolResult (a legacy
    result keeps its own content)."""
    checked = _checked_legacy(tool_name, raw)
    return envelope_to_tool_result(checked) if isinstance(checked, Err) else checked


def _checked_legacy(tool_name: str, raw: Any) -> ToolResult | Err:
    """A legacy return as a ToolResult, or the Err naming what is wrong with it."""
    try:
        result = ToolResult.from_any(raw)
    except TypeError as exc:
        return Err(f"{tool_name}: {exc}", err_kind="invalid_result")
    problem = check_effects(tool_name, result.cards, result.datasets, result.content)
    return result if problem is None else problem
