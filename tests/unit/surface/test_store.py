"""The surface store's request-path writes and reads on SQLite and PostgreSQL: paging in adds
only new names (in the order given) and counts a surface miss once per newly added name outside
the floor; the working set reads back in insertion order per conversation namespace."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.surface.store import SqlSurfaceStore

NOW = datetime(2026, 3, 14, 15, 9, tzinfo=UTC)


def test_page_in_adds_new_names_once_and_counts_misses_outside_the_floor(
    sessions: sessionmaker[Session],
) -> None:
    store = SqlSurfaceStore(sessions)
    floor = frozenset({"query"})
    added = store.page_in("conv", "", ["crm_b", "query", "crm_a", "crm_b"], floor, NOW)
    assert added == ["crm_b", "query", "crm_a"]
    # Again with one new name: only that one is added and counted.
    assert store.page_in("conv", "", ["crm_a", "crm_c", "query"], floor, NOW) == ["crm_c"]
    assert store.working_set("conv", "") == ["crm_b", "query", "crm_a", "crm_c"]
    misses = store.miss_counts(NOW)
    assert {name: c.recent for name, c in misses.items()} == {"crm_a": 1, "crm_b": 1, "crm_c": 1}
    # Another conversation paging the same tool in is another miss on the same day.
    assert store.page_in("other", "", ["crm_a"], floor, NOW) == ["crm_a"]
    assert store.miss_counts(NOW)["crm_a"].recent == 2


def test_working_sets_are_per_conversation_and_namespace(sessions: sessionmaker[Session]) -> None:
    store = SqlSurfaceStore(sessions)
    assert store.add_to_working_set("conv", "ns1", ["b", "a"]) == ["b", "a"]
    assert store.add_to_working_set("conv", "ns1", ["a"]) == []
    assert store.add_to_working_set("conv", "ns2", ["a"]) == ["a"]
    assert store.working_set("conv", "ns1") == ["b", "a"]
    assert store.working_set("conv", "ns2") == ["a"]
    assert store.working_set("conv", "") == []
    assert store.page_in("conv", "ns1", [], frozenset(), NOW) == []


def test_a_store_needs_sessions_bound_to_an_engine() -> None:
    with pytest.raises(TypeError):
        SqlSurfaceStore(sessionmaker())


def test_the_seed_log_keeps_the_last_write_even_when_writers_race(
    sessions: sessionmaker[Session],
) -> None:
    """The Tier-0 floor is written by a derivation at start and by one a call asks for, on
    every replica: writers at once all succeed (a read-then-insert made the second fail on the
    key, logging a traceback), and the value is one of theirs."""
    store = SqlSurfaceStore(sessions)
    assert store.read_seed("k") is None
    store.write_seed("k", "first")
    store.write_seed("k", "second")
    assert store.read_seed("k") == "second"
    start = threading.Barrier(8)

    def write(n: int) -> None:
        start.wait(10)
        SqlSurfaceStore(sessions).write_seed("race", f"value-{n}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(8)))  # every writer returns: none raised
    assert store.read_seed("race") in {f"value-{n}" for n in range(8)}
