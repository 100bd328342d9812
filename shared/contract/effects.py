"""The closed effect catalog and the apply-effect chokepoint.

A dispatched call produces typed effect objects besides its result. There are exactly three
kinds (adding a fourth means updating the closed-catalog lint test):

* `TelemetryEvent` — append one row to `conversation_events` (optional `blob` bytes for a
  payload kept in `conversation_event_blobs`);
* `PersistAssistantMessage` — write the assistant message of a turn (for an orchestrator that
  persists chat messages through the same chokepoint);
* `StreamChunks` — display-stream chunks (progress, cards, text deltas, export notices),
  batched: one effect may carry many chunks.

The recording proxies (`RecordingRecorder`, `RecordingDisplay`) build the typed effect, append
it to the shared `EffectLog` in call order and hand it to `apply_effect` at once (so streaming
stays live) — or only record it when the log is deferred, for a later `apply_effects`.
`apply_effect` is the only code that touches the real recorder, display or persister; replay
drives it with recorded effects to rebuild a run's events byte for byte.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

__all__ = [
    "EFFECT_KINDS",
    "STREAM_EVENTS",
    "DisplayHandle",
    "Effect",
    "EffectContext",
    "EffectLog",
    "EventRecorder",
    "PersistAssistantMessage",
    "Persister",
    "RecordingDisplay",
    "RecordingRecorder",
    "StreamChunk",
    "StreamChunks",
    "TelemetryEvent",
    "apply_effect",
    "apply_effects",
    "effect_from_json",
    "effect_to_json",
    "effects_from_json",
    "effects_to_json",
]


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class TelemetryEvent:
    """Append a row to conversation_events. `data` must be JSON-serialisable; `at` is when the
    event happened (it becomes the row's created_at, so a replay reproduces it)."""

    event_type: str
    data: Mapping[str, Any]
    tool_use_id: str = ""
    at: datetime = field(default_factory=_now)
    blob: bytes | None = None


@dataclass(frozen=True)
class PersistAssistantMessage:
    """Write the assistant message row of a turn."""

    message_id: str
    conversation_id: str
    tenant_id: str
    final_text: str
    structured_content: Mapping[str, Any] = field(default_factory=dict)
    cards: Sequence[Mapping[str, Any]] = ()
    cost_usd: float = 0.0


@dataclass(frozen=True)
class StreamChunk:
    """One display-stream chunk: an event name from STREAM_EVENTS and its JSON payload."""

    event: str
    data: Mapping[str, Any]


@dataclass(frozen=True)
class StreamChunks:
    """Display-stream chunks, batched (a turn's many text deltas are one effect, not many)."""

    chunks: tuple[StreamChunk, ...]


Effect = TelemetryEvent | PersistAssistantMessage | StreamChunks
# The closed catalog, by kind name (the JSON form's "kind").
EFFECT_KINDS: dict[str, type[TelemetryEvent | PersistAssistantMessage | StreamChunks]] = {
    "telemetry_event": TelemetryEvent,
    "persist_assistant_message": PersistAssistantMessage,
    "stream_chunks": StreamChunks,
}
_KIND_OF: dict[type, str] = {cls: kind for kind, cls in EFFECT_KINDS.items()}


class EventRecorder(Protocol):
    """The real telemetry backend: writes one conversation_events row."""

    def record(
        self,
        event_type: str,
        data: Mapping[str, Any],
        *,
        tool_use_id: str,
        at: datetime,
        blob: bytes | None,
    ) -> None: ...


class DisplayHandle(Protocol):
    """The real display stream of one call (e.g. a server-streaming RPC's queue)."""

    def progress(self, data: Mapping[str, Any]) -> None: ...
    def card(self, data: Mapping[str, Any]) -> None: ...
    def text(self, data: Mapping[str, Any]) -> None: ...
    def notice(self, data: Mapping[str, Any]) -> None: ...


Persister = Callable[[PersistAssistantMessage], None]

# Display-stream event names and the DisplayHandle method each goes to.
_SSE_DISPATCH: dict[str, str] = {
    "progress": "progress",
    "card": "card",
    "text_delta": "text",
    "export.ready": "notice",
}
STREAM_EVENTS = frozenset(_SSE_DISPATCH)


@dataclass
class EffectContext:
    """The live services effects are applied to; a missing one drops its kind of effect."""

    recorder: EventRecorder | None = None
    display: DisplayHandle | None = None
    persister: Persister | None = None


def apply_effect(effect: Effect, ctx: EffectContext) -> None:
    """The single chokepoint: the only code that writes telemetry events, display chunks and
    persisted messages."""
    if isinstance(effect, TelemetryEvent):
        _apply_telemetry_event(effect, ctx)
    elif isinstance(effect, StreamChunks):
        _apply_stream_chunks(effect, ctx)
    elif isinstance(effect, PersistAssistantMessage):
        _apply_persist(effect, ctx)
    else:
        raise TypeError(f"not an effect of the closed catalog: {type(effect).__name__}")


def apply_effects(effects: Iterable[Effect], ctx: EffectContext) -> None:
    """Apply recorded effects in order (deferred mode, and replay)."""
    for effect in effects:
        apply_effect(effect, ctx)


def _apply_telemetry_event(effect: TelemetryEvent, ctx: EffectContext) -> None:
    if ctx.recorder is None:
        return
    ctx.recorder.record(
        effect.event_type,
        effect.data,
        tool_use_id=effect.tool_use_id,
        at=effect.at,
        blob=effect.blob,
    )


def _apply_stream_chunks(effect: StreamChunks, ctx: EffectContext) -> None:
    if ctx.display is None:
        return
    for chunk in effect.chunks:
        method = _SSE_DISPATCH.get(chunk.event)
        if method is None:
            raise ValueError(f"unknown display event {chunk.event!r}")
        getattr(ctx.display, method)(chunk.data)


def _apply_persist(effect: PersistAssistantMessage, ctx: EffectContext) -> None:
    if ctx.persister is None:
        return
    ctx.persister(effect)


class EffectLog:
    """The effects of one call (or turn) in emission order. With `defer`, the proxies only
    record, and the owner applies the log later with `flush`."""

    def __init__(self, ctx: EffectContext, *, defer: bool = False) -> None:
        self.ctx = ctx
        self.defer = defer
        self.effects: list[Effect] = []
        self._flushed = 0

    def emit(self, effect: Effect) -> None:
        self.effects.append(effect)
        if not self.defer:
            apply_effect(effect, self.ctx)
            self._flushed = len(self.effects)

    def flush(self) -> None:
        """Apply what was recorded but not yet applied."""
        apply_effects(self.effects[self._flushed :], self.ctx)
        self._flushed = len(self.effects)

    def of_kind(self, cls: type[Any]) -> list[Any]:
        return [e for e in self.effects if isinstance(e, cls)]


class RecordingRecorder:
    """The recorder the dispatch path writes to: builds the TelemetryEvent, appends it to the
    log and applies it through the chokepoint."""

    def __init__(self, log: EffectLog) -> None:
        self._log = log

    def record(
        self,
        event_type: str,
        data: Mapping[str, Any],
        *,
        tool_use_id: str = "",
        blob: bytes | None = None,
    ) -> TelemetryEvent:
        event = TelemetryEvent(event_type, dict(data), tool_use_id, _now(), blob)
        self._log.emit(event)
        return event


class RecordingDisplay:
    """The display the dispatch path writes to: batches chunks into one StreamChunks effect."""

    def __init__(self, log: EffectLog) -> None:
        self._log = log

    def send(self, *chunks: tuple[str, Mapping[str, Any]]) -> None:
        if not chunks:
            return
        for event, _ in chunks:
            if event not in STREAM_EVENTS:
                raise ValueError(f"unknown display event {event!r}")
        self._log.emit(StreamChunks(tuple(StreamChunk(e, dict(d)) for e, d in chunks)))


# --- JSON form (replay corpora) ----------------------------------------------------------------


def effect_to_json(effect: Effect) -> dict[str, Any]:
    kind = _KIND_OF.get(type(effect))
    if kind is None:
        raise TypeError(f"not an effect of the closed catalog: {type(effect).__name__}")
    if isinstance(effect, TelemetryEvent):
        return {
            "kind": kind,
            "event_type": effect.event_type,
            "data": effect.data,
            "tool_use_id": effect.tool_use_id,
            "at": effect.at.isoformat(),
            "blob": base64.b64encode(effect.blob).decode("ascii") if effect.blob else None,
        }
    if isinstance(effect, StreamChunks):
        return {"kind": kind, "chunks": [{"event": c.event, "data": c.data} for c in effect.chunks]}
    return {
        "kind": kind,
        "message_id": effect.message_id,
        "conversation_id": effect.conversation_id,
        "tenant_id": effect.tenant_id,
        "final_text": effect.final_text,
        "structured_content": effect.structured_content,
        "cards": list(effect.cards),
        "cost_usd": effect.cost_usd,
    }


def effect_from_json(value: Mapping[str, Any]) -> Effect:
    kind = value.get("kind")
    if kind == "telemetry_event":
        blob = value.get("blob")
        return TelemetryEvent(
            event_type=str(value["event_type"]),
            data=dict(value["data"]),
            tool_use_id=str(value.get("tool_use_id") or ""),
            at=datetime.fromisoformat(str(value["at"])),
            blob=base64.b64decode(blob) if blob else None,
        )
    if kind == "stream_chunks":
        return StreamChunks(
            tuple(StreamChunk(str(c["event"]), dict(c["data"])) for c in value["chunks"])
        )
    if kind == "persist_assistant_message":
        return PersistAssistantMessage(
            message_id=str(value["message_id"]),
            conversation_id=str(value["conversation_id"]),
            tenant_id=str(value["tenant_id"]),
            final_text=str(value["final_text"]),
            structured_content=dict(value.get("structured_content") or {}),
            cards=tuple(value.get("cards") or ()),
            cost_usd=float(value.get("cost_usd") or 0.0),
        )
    raise ValueError(f"unknown effect kind {kind!r}")


# One encoder for every call (json.dumps with options builds one per call).
_EFFECTS_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


def effects_to_json(effects: Iterable[Effect]) -> str:
    return _EFFECTS_JSON.encode([effect_to_json(e) for e in effects])


def effects_from_json(text: str) -> list[Effect]:
    return [effect_from_json(v) for v in json.loads(text)]
