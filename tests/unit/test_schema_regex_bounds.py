"""What the RE2 pattern cache of input validation holds stays bounded: in patterns, in what
their programs may grow to, and in memory, however many distinct patterns tenants' tools and
MCP servers bring; and a pattern too large for the search budget is enforced all the same."""

from __future__ import annotations

import gc
import random
from pathlib import Path

from shared import schema_regex
from shared.schema_regex import SEARCH_MAX_MEM, Re2Search


def test_distinct_patterns_stay_within_the_count_and_the_memory_budget() -> None:
    search = Re2Search(max_entries=50, budget_bytes=20 * SEARCH_MAX_MEM)
    for i in range(500):
        assert search.search(f"^t{i}_[a-z]+$", f"t{i}_ok")
        assert not search.search(f"^t{i}_[a-z]+$", "nope")
        assert search.search("^kept$", "kept")  # used all along: never the one dropped
        assert len(search) <= 20
        assert search.budgeted_bytes <= 20 * SEARCH_MAX_MEM
    assert "^kept$" in search._compiled
    for i in range(100):  # patterns RE2 cannot run count against the number of entries
        assert search.search(f"(a{i})\\1", "x")
        assert len(search) <= 50


def test_a_pattern_too_large_for_the_search_budget_is_still_enforced() -> None:
    # 20,000 alternatives: a program of ~146,000 instructions, over what 1 MiB allows.
    big = "^(?:" + "|".join(f"w{i}x{i * 7}" for i in range(20_000)) + ")$"
    search = Re2Search()
    assert search.search(big, "w19999x139993")
    assert not search.search(big, "w19999x139994")
    assert search.budgeted_bytes > SEARCH_MAX_MEM  # counted at what it may grow to


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_patterns_whose_dfa_explodes_hold_little_memory_each() -> None:
    # One search of 200 KB against `[ab]*a[ab]{20}$` made RE2 keep ~3 MiB of DFA states
    # under its default budget; 40 such patterns kept ~120 MiB.
    random.seed(7)
    text = "".join(random.choice("ab") for _ in range(200_000))
    search = Re2Search()
    gc.collect()
    before = rss_kb()
    for i in range(40):
        search.search(f"c{i}|[ab]*a[ab]{{20}}$", text)
    gc.collect()
    grown_mib = (rss_kb() - before) / 1024
    assert grown_mib < 48, f"40 patterns hold {grown_mib:.0f} MiB"


def test_validation_uses_the_bounded_searcher() -> None:
    schema_regex.install()
    import jsonschema._keywords

    assert jsonschema._keywords.re is schema_regex.SEARCH  # type: ignore[attr-defined]
    assert schema_regex.SEARCH.max_entries == schema_regex.MAX_CACHED_PATTERNS
