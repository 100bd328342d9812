"""The effect catalog and the apply-effect chokepoint: each kind reaches its backend, the
recording proxies keep call order and apply at once (or defer), the JSON form round-trips for
replay; and the card effects of a response (singleton dedup, map_display merge)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.contract.effects import (
    EFFECT_KINDS,
    Effect,
    EffectContext,
    EffectLog,
    PersistAssistantMessage,
    RecordingDisplay,
    RecordingRecorder,
    StreamChunk,
    StreamChunks,
    TelemetryEvent,
    apply_effect,
    effects_from_json,
    effects_to_json,
)
from shared.contract.effects_cards import (
    CardError,
    check_cards,
    finalize_cards,
    finalize_turn_cards,
    merge_map_displays,
)


@dataclass
class Recorder:
    rows: list[tuple[str, dict[str, Any], str, datetime, bytes | None]] = field(
        default_factory=list
    )

    def record(
        self,
        event_type: str,
        data: Mapping[str, Any],
        *,
        tool_use_id: str,
        at: datetime,
        blob: bytes | None,
    ) -> None:
        self.rows.append((event_type, dict(data), tool_use_id, at, blob))


@dataclass
class Display:
    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def progress(self, data: Mapping[str, Any]) -> None:
        self.sent.append(("progress", dict(data)))

    def card(self, data: Mapping[str, Any]) -> None:
        self.sent.append(("card", dict(data)))

    def text(self, data: Mapping[str, Any]) -> None:
        self.sent.append(("text", dict(data)))

    def notice(self, data: Mapping[str, Any]) -> None:
        self.sent.append(("notice", dict(data)))


AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def test_the_catalog_is_closed_at_three_kinds() -> None:
    assert set(EFFECT_KINDS) == {"telemetry_event", "persist_assistant_message", "stream_chunks"}


def test_each_effect_kind_reaches_its_backend() -> None:
    recorder, display = Recorder(), Display()
    persisted: list[PersistAssistantMessage] = []
    ctx = EffectContext(recorder=recorder, display=display, persister=persisted.append)
    apply_effect(TelemetryEvent("tool_call", {"a": 1}, "tu1", AT), ctx)
    apply_effect(
        StreamChunks((StreamChunk("progress", {"m": 1}), StreamChunk("text_delta", {"t": "x"}))),
        ctx,
    )
    message = PersistAssistantMessage("m1", "c1", "t1", "done", {}, (), 0.5)
    apply_effect(message, ctx)
    assert recorder.rows == [("tool_call", {"a": 1}, "tu1", AT, None)]
    assert display.sent == [("progress", {"m": 1}), ("text", {"t": "x"})]
    assert persisted == [message]


def test_a_missing_backend_drops_its_effects_and_anything_else_is_refused() -> None:
    apply_effect(TelemetryEvent("x", {}), EffectContext())
    with pytest.raises(TypeError):
        apply_effect("not an effect", EffectContext())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown display event"):
        apply_effect(StreamChunks((StreamChunk("confetti", {}),)), EffectContext(display=Display()))


def test_the_proxies_record_in_order_and_apply_at_once() -> None:
    recorder, display = Recorder(), Display()
    log = EffectLog(EffectContext(recorder=recorder, display=display))
    RecordingRecorder(log).record("tool_call", {"n": 1}, tool_use_id="a")
    assert len(recorder.rows) == 1  # applied at the moment of emission: streaming stays live
    RecordingDisplay(log).send(("card", {"type": "x"}), ("text_delta", {"text": "hi"}))
    RecordingRecorder(log).record("outcome", {"n": 2})
    assert [type(e).__name__ for e in log.effects] == [
        "TelemetryEvent",
        "StreamChunks",
        "TelemetryEvent",
    ]
    assert len(log.effects[1].chunks) == 2  # type: ignore[union-attr]
    assert [r[0] for r in recorder.rows] == ["tool_call", "outcome"]


def test_a_deferred_log_applies_only_on_flush() -> None:
    recorder = Recorder()
    log = EffectLog(EffectContext(recorder=recorder), defer=True)
    RecordingRecorder(log).record("a", {})
    RecordingRecorder(log).record("b", {})
    assert recorder.rows == []
    log.flush()
    log.flush()  # idempotent: nothing applied twice
    assert [r[0] for r in recorder.rows] == ["a", "b"]


def test_the_json_form_round_trips_every_kind() -> None:
    effects: list[Effect] = [
        TelemetryEvent("tool_result", {"content": "✓ ok.", "n": [1, 2.5, None]}, "t", AT, b"\x00z"),
        StreamChunks((StreamChunk("export.ready", {"file_id": "f"}),)),
        PersistAssistantMessage("m", "c", "t", "text", {"k": "v"}, ({"type": "x"},), 0.25),
    ]
    assert effects_from_json(effects_to_json(effects)) == effects


# --- cards -----------------------------------------------------------------------------------


def test_singleton_cards_keep_only_the_last_in_its_position() -> None:
    cards: list[dict[str, Any]] = [
        {"type": "cited_answer", "answer": "old"},
        {"type": "chart", "id": 1},
        {"type": "cited_answer", "answer": "new"},
        {"type": "chart", "id": 2},
    ]
    assert finalize_cards(cards) == [
        {"type": "chart", "id": 1},
        {"type": "cited_answer", "answer": "new"},
        {"type": "chart", "id": 2},
    ]


def test_maps_with_one_display_id_merge_sources_layers_bounds_and_legend() -> None:
    first = {
        "type": "map_display",
        "display_id": "m",
        "title": "first",
        "sources": [{"id": "s1"}],
        "layers": [{"id": "l1"}],
        "bounds": [0, 0, 10, 10],
        "legend": [{"label": "rivers"}],
    }
    second = {
        "type": "map_display",
        "display_id": "m",
        "title": "second",
        "sources": [{"id": "s1"}, {"id": "s2"}],
        "layers": [{"id": "l2"}],
        "bounds": [-5, 2, 8, 20],
        "legend": [{"label": "rivers"}, {"label": "roads"}],
    }
    other = {"type": "map_display", "display_id": "n", "sources": [{"id": "x"}]}
    out = finalize_cards([first, other, {"type": "table"}, second])
    assert [c["type"] for c in out] == ["map_display", "table", "map_display"]
    merged = out[2]
    assert merged["title"] == "second"
    assert merged["sources"] == [{"id": "s1"}, {"id": "s2"}]
    assert merged["layers"] == [{"id": "l1"}, {"id": "l2"}]
    assert merged["bounds"] == [-5, 0, 10, 20]
    assert merged["legend"] == [{"label": "rivers"}, {"label": "roads"}]
    assert out[0]["display_id"] == "n"


def test_maps_that_keep_their_fields_under_data_merge_there() -> None:
    a = {"type": "map_display", "data": {"display_id": "m", "layers": [{"id": 1}]}}
    b = {"type": "map_display", "data": {"display_id": "m", "layers": [{"id": 2}]}}
    merged = merge_map_displays(a, b)
    assert merged["type"] == "map_display"
    assert merged["data"]["layers"] == [{"id": 1}, {"id": 2}]


def test_a_turn_keeps_a_singleton_once_in_the_result_where_it_last_appeared() -> None:
    turn: list[list[dict[str, Any]]] = [
        [{"type": "cited_answer", "a": 1}, {"type": "chart"}],
        [{"type": "cited_answer", "a": 2}],
        [{"type": "note"}],
    ]
    assert finalize_turn_cards(turn) == [
        [{"type": "chart"}],
        [{"type": "cited_answer", "a": 2}],
        [{"type": "note"}],
    ]


@pytest.mark.parametrize(
    ("card", "problem"),
    [
        ("text", "not a JSON object"),
        ({"title": "x"}, 'no string "type"'),
        ({"type": "x", "when": object()}, "not JSON-serialisable"),
        ({"type": "x", "value": float("nan")}, "not JSON-serialisable"),
    ],
)
def test_a_card_that_is_not_a_json_object_with_a_type_is_named(card: Any, problem: str) -> None:
    with pytest.raises(CardError, match=problem) as info:
        check_cards([{"type": "ok"}, card])
    assert info.value.index == 1
