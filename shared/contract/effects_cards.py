"""Card effects at the end of a response: singleton card types are deduplicated (the last one
wins) and `map_display` cards that share a `display_id` are merged into one map (sources,
layers, bounds and legend combined), placed where the last of them stood.

Pure functions over JSON objects; a card that is not a JSON object with a string "type" is
reported, not passed on (`check_cards`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SINGLETON_CARD_TYPES = frozenset({"cited_answer", "map_display"})
MAP_DISPLAY = "map_display"


class CardError(ValueError):
    """A card that cannot be passed on (not a JSON object, no type, not serialisable)."""

    def __init__(self, index: int, problem: str) -> None:
        super().__init__(f"card {index}: {problem}")
        self.index = index
        self.problem = problem


def check_cards(cards: Iterable[Any]) -> list[dict[str, Any]]:
    """The cards as plain JSON objects; CardError names the first one that is not."""
    out: list[dict[str, Any]] = []
    for i, card in enumerate(cards):
        if not isinstance(card, Mapping):
            raise CardError(i, f"is a {type(card).__name__}, not a JSON object")
        if not isinstance(card.get("type"), str) or not card.get("type"):
            raise CardError(i, 'has no string "type"')
        try:
            text = json.dumps(card, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CardError(i, f"is not JSON-serialisable: {exc}") from None
        out.append(json.loads(text))
    return out


def _merge_unique(first: Sequence[Any], second: Sequence[Any], key: str) -> list[Any]:
    """Items of both lists, in order, without repeats (by `key` for objects that have it)."""
    seen: set[str] = set()
    out: list[Any] = []
    for item in [*first, *second]:
        ident = (
            str(item[key])
            if isinstance(item, Mapping) and key in item
            else json.dumps(item, sort_keys=True, default=str)
        )
        if ident in seen:
            continue
        seen.add(ident)
        out.append(item)
    return out


def _union_bounds(a: Any, b: Any) -> Any:
    """[west, south, east, north] covering both; whichever is valid when only one is."""

    def valid(x: Any) -> bool:
        return (
            isinstance(x, Sequence)
            and not isinstance(x, str)
            and len(x) == 4
            and all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                for v in x
            )
        )

    if valid(a) and valid(b):
        return [min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])]
    return b if valid(b) else a


def _merge_legend(a: Any, b: Any) -> Any:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return {**a, **b}
    if isinstance(a, list) and isinstance(b, list):
        return _merge_unique(a, b, "label")
    return b if b is not None else a


def _body(card: Mapping[str, Any]) -> dict[str, Any]:
    """Where a card keeps its fields: under "data" when it has one, else at the top."""
    data = card.get("data")
    return dict(data) if isinstance(data, Mapping) else dict(card)


def merge_map_displays(older: Mapping[str, Any], newer: Mapping[str, Any]) -> dict[str, Any]:
    """One map from two: sources and layers unioned by id, bounds unioned, legends combined;
    every other field from the newer card."""
    a, b = _body(older), _body(newer)
    merged = {**a, **b}
    merged["sources"] = _merge_unique(a.get("sources") or [], b.get("sources") or [], "id")
    merged["layers"] = _merge_unique(a.get("layers") or [], b.get("layers") or [], "id")
    bounds = _union_bounds(a.get("bounds"), b.get("bounds"))
    if bounds is not None:
        merged["bounds"] = bounds
    legend = _merge_legend(a.get("legend"), b.get("legend"))
    if legend is not None:
        merged["legend"] = legend
    if isinstance(newer.get("data"), Mapping):
        return {**older, **newer, "data": merged}
    return {**merged, "type": MAP_DISPLAY}


def _display_id(card: Mapping[str, Any]) -> str:
    return str(card.get("display_id") or _body(card).get("display_id") or "")


def _finalize(cards: Sequence[Mapping[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(position, card) of every card kept, in order; a merged map takes the position of the
    last map_display of its display_id."""
    maps: dict[str, dict[str, Any]] = {}
    for card in cards:
        if card.get("type") == MAP_DISPLAY:
            key = _display_id(card)
            maps[key] = merge_map_displays(maps[key], card) if key in maps else dict(card)
    last: dict[tuple[str, str], int] = {}
    for i, card in enumerate(cards):
        kind = str(card.get("type"))
        if kind in SINGLETON_CARD_TYPES:
            last[(kind, _display_id(card) if kind == MAP_DISPLAY else "")] = i
    out: list[tuple[int, dict[str, Any]]] = []
    for i, card in enumerate(cards):
        kind = str(card.get("type"))
        if kind not in SINGLETON_CARD_TYPES:
            out.append((i, dict(card)))
            continue
        display = _display_id(card) if kind == MAP_DISPLAY else ""
        if last[(kind, display)] == i:
            out.append((i, maps[display] if kind == MAP_DISPLAY else dict(card)))
    return out


def finalize_cards(cards: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The cards of a response as the frontend should get them: `map_display` cards with the
    same display_id merged; then one card per singleton type (the last; for maps, one per
    display_id) — each in the position of its last occurrence; other cards untouched."""
    return [card for _, card in _finalize(cards)]


def finalize_turn_cards(
    groups: Sequence[Sequence[Mapping[str, Any]]],
) -> list[list[dict[str, Any]]]:
    """finalize_cards over the results of one turn (in input order): a singleton kept once for
    the whole turn, in the result where it last appeared."""
    owner: list[int] = []
    flat: list[Mapping[str, Any]] = []
    for g, cards in enumerate(groups):
        owner.extend([g] * len(cards))
        flat.extend(cards)
    out: list[list[dict[str, Any]]] = [[] for _ in groups]
    for i, card in _finalize(flat):
        out[owner[i]].append(card)
    return out
