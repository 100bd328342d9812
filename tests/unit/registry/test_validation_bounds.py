"""Input validation under hostile input: an input that breaks a schema a million times, a
megabyte value against an enum, a large input with a schema the compiled validator leaves to
jsonschema. Each gets its `schema` Hint with bounded work, and none stalls the event loop."""

from __future__ import annotations

import asyncio
import itertools
import time
import tracemalloc
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.registry.core import (
    LARGE_INPUT_NODES,
    MAX_COLLECTED_ERRORS,
    Registry,
    is_large,
)
from services.registry.repository import SqlToolRepository
from shared.contract import Hint
from tests.unit.registry.test_fast_accept import tool


@pytest.fixture
def registry(sessions: sessionmaker[Session]) -> Registry:
    return Registry(SqlToolRepository(sessions), cache_ttl_s=0.0)


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The functions run through asyncio.to_thread from now on (they still run)."""
    seen: list[Any] = []
    real = asyncio.to_thread

    async def counting(func: Any, *args: Any) -> Any:
        seen.append(func)
        return await real(func, *args)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    return seen


TAGS = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}}
# A pattern keeps the compiled first pass out: jsonschema walks every input.
PATTERNED = {
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}}},
}


def test_a_million_violations_make_a_short_hint_with_bounded_memory(registry: Registry) -> None:
    tags = tool("tags", TAGS)
    inputs = {"tags": [1] * 1_000_000}
    tracemalloc.start()
    try:
        hint = registry._validate(tags, inputs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(hint, Hint) and hint.hint_kind == "schema"
    assert "'tags/0': expected string, got integer 1" in hint.message
    assert f"and at least {MAX_COLLECTED_ERRORS - 2} more" in hint.message
    assert len(hint.message) < 1000
    assert peak < 50 * 1024 * 1024  # all errors collected: gigabytes


def test_a_few_violations_are_all_counted(registry: Registry) -> None:
    hint = registry._validate(tool("tags", TAGS), {"tags": [1, 2, 3, 4, 5]})
    assert isinstance(hint, Hint)
    assert hint.message.endswith("; and 2 more")


def test_a_megabyte_value_against_a_large_enum_is_refused_with_a_bounded_hint(
    registry: Registry,
) -> None:
    options = [f"option-{i}" for i in range(5000)]
    formats = tool("formats", {"type": "object", "properties": {"format": {"enum": options}}})
    started = time.perf_counter()
    hint = registry._validate(formats, {"format": "option-" + "x" * 1_000_000})
    assert time.perf_counter() - started < 5  # unclipped: quadratic in the value's length
    assert isinstance(hint, Hint) and hint.hint_kind == "schema"
    assert "(and 4980 more)" in hint.message
    assert len(hint.message) < 1000
    assert len(hint.alternatives) == 3
    assert all(a.label in options for a in hint.alternatives)


def test_a_short_enum_hint_still_lists_every_option(registry: Registry) -> None:
    schema = {"type": "object", "properties": {"format": {"enum": ["csv", "parquet"]}}}
    formats = tool("fmt", schema)
    hint = registry._validate(formats, {"format": "cvs"})
    assert isinstance(hint, Hint)
    assert "'cvs' is not one of ['csv', 'parquet']" in hint.message
    assert hint.alternatives[0].label == "csv"


def test_largeness_is_decided_with_a_bounded_walk() -> None:
    assert not is_large({"a": 1, "b": [1, 2, {"c": "x"}]})
    assert is_large({"a": list(range(LARGE_INPUT_NODES))})
    assert is_large({f"k{i}": i for i in range(LARGE_INPUT_NODES)})
    assert is_large({"s": "x" * 100_000})
    deep: Any = 1
    for _ in range(LARGE_INPUT_NODES + 10):
        deep = [deep]
    assert is_large(deep)

    class Counted(list):
        """A list that counts the items the walk takes from it."""

        taken = 0

        def __iter__(self) -> Any:
            for item in super().__iter__():
                Counted.taken += 1
                yield item

    assert is_large({"a": Counted(range(5_000_000))})
    assert Counted.taken <= LARGE_INPUT_NODES + 1  # stops at the bound, not at the end


async def test_a_large_input_jsonschema_must_walk_does_not_stall_the_event_loop(
    registry: Registry,
) -> None:
    patterned = tool("patterned", PATTERNED)
    inputs = {"tags": ["abc"] * 60_000 + [1]}
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.005)

    beat = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    started = time.perf_counter()
    hint = await registry._validate_off_loop(patterned, inputs)
    took = time.perf_counter() - started
    beat.cancel()
    assert isinstance(hint, Hint) and "'tags/60000'" in hint.message
    during = [t for t in ticks if t >= started]
    gaps = [b - a for a, b in itertools.pairwise(ticks) if b >= started]
    # The validation took a while (a thread held the GIL most of it); the loop kept ticking.
    # Run on the loop, no tick at all would fall inside it.
    assert took > 0.05
    assert len(during) >= 2, (took, during)
    assert max(gaps) < took, (took, gaps)


async def test_a_small_input_is_validated_on_the_loop(registry: Registry, hops: list[Any]) -> None:
    patterned = tool("patterned", PATTERNED)
    assert await registry._validate_off_loop(patterned, {"tags": ["abc"]}) is None
    hint = await registry._validate_off_loop(patterned, {"tags": ["ABC"]})
    assert isinstance(hint, Hint)
    assert hops == []


async def test_a_large_schema_is_compiled_off_the_loop_and_still_enforced(
    registry: Registry, hops: list[Any]
) -> None:
    properties = {f"p{i}": {"type": "integer"} for i in range(LARGE_INPUT_NODES)}
    wide = tool("wide", {"type": "object", "properties": properties})
    hint = await registry._validate_off_loop(wide, {"p7": "seven"})
    assert isinstance(hint, Hint) and "'p7'" in hint.message
    assert len(hops) == 1  # compiled in a thread once, then cached
    assert await registry._validate_off_loop(wide, {"p7": 7}) is None
    assert len(hops) == 1
