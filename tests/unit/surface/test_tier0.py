"""Tier-0: age-weighted scores, surface misses, the derivation and the stored floor's parsing."""

from __future__ import annotations

import logging

import pytest

from services.surface.tier0 import (
    ANCHORS,
    TARGET_FLOOR,
    BucketCounts,
    Derivation,
    compute_scores,
    derive_tier0,
    encode_floor,
    parse_floor,
)


def test_scores_weight_calls_by_age_bucket() -> None:
    scores = compute_scores({"a": BucketCounts(recent=2, mid=3, old=10)})
    assert scores["a"] == pytest.approx(2 * 3.0 + 3 * 1.0 + 10 * 0.2)


def test_surface_misses_add_to_the_score() -> None:
    scores = compute_scores(
        {"a": BucketCounts(recent=1)}, {"a": BucketCounts(recent=1), "b": BucketCounts(old=5)}
    )
    assert scores["a"] == pytest.approx(3.0 + 2.0 * 3.0)
    assert scores["b"] == pytest.approx(2.0 * 5 * 0.2)


def test_derivation_puts_anchors_first_then_best_scores_up_to_the_target() -> None:
    scores = {f"tool_{i:02d}": float(i) for i in range(40)}
    derived = derive_tier0(scores)
    assert derived.names[: len(ANCHORS)] == ANCHORS
    assert len(derived.names) == TARGET_FLOOR
    assert derived.names[len(ANCHORS)] == "tool_39"
    assert derived.warning == ""


def test_derivation_skips_retired_tools_and_warns_when_too_small(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        derived = derive_tier0({"gone": 50.0, "live": 1.0}, eligible={"live"})
    assert "gone" not in derived.names and "live" in derived.names
    assert "outside [25, 35]" in derived.warning
    assert any("outside" in r.message for r in caplog.records)


def test_anchors_alone_beyond_the_target_make_the_floor_verbatim() -> None:
    anchors = tuple(f"anchor_{i}" for i in range(44))
    derived = derive_tier0({"popular": 1000.0}, anchors=anchors)
    assert derived.names == anchors and derived.warning


@pytest.mark.parametrize(
    "stored", [None, "", "not json", '{"names": 3}', '{"names": ["a", 7]}', "[]"]
)
def test_unparsable_or_missing_floor_is_none(stored: str | None) -> None:
    assert parse_floor(stored) is None or parse_floor(stored) == ()


def test_stored_floor_round_trips() -> None:
    assert parse_floor(encode_floor(Derivation(("a", "b", "a")))) == ("a", "b")
