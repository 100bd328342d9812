"""The resident floor (Tier 0): hand-maintained anchors, usage scores from the execution log and
from surface misses, and the derivation of the floor that is stored in the pinned seed-log row.
Pure functions; the store reads and writes the rows."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

SEED_KEY = "tool_surface_tier0_v1"
TARGET_FLOOR = 30
MIN_FLOOR, MAX_FLOOR = 25, 35

# Always resident whatever the usage history says: a usage-ranked floor cannot include a new
# capability that has generated no telemetry yet. Keep this list below TARGET_FLOOR so the
# usage-ranked half of the derivation stays live.
ANCHORS: tuple[str, ...] = (
    "search_tools",  # the escape hatch: without it nothing outside the floor is reachable
    "load_dataset",  # every data conversation starts by loading a file
    "preview_data",  # the first look at a loaded dataset
    "describe_entry",  # columns, types and ranges before writing SQL
    "query",  # read-only SQL over the conversation's datasets
    "plan",  # multi-step work is planned first (agentic-only: stripped in chat mode)
    "request_user_input",  # asking the user beats guessing
    "generate_document",  # the usual deliverable of a data conversation
    "create_chart",  # the second most common deliverable
    "export",  # results leave the platform through it
    "web_search",  # replaced by a native capability on some models (capability filter)
    "fetch_url",  # reads a page the user pasted
)

# The bootstrap floor when no derivation was ever stored or the stored value does not parse:
# the anchors plus the tools a fresh installation is most likely to need.
STATIC_FLOOR: tuple[str, ...] = (
    *ANCHORS,
    "search_catalog",
    "analyze_data",
    "query_frames",
    "query_datasource",
    "present_rows",
    "document_conversation",
    "export_excel",
    "display_map",
    "delegate",
    "call_llm",
)

# Unioned into the resolved floor unconditionally: usage can never derive these out.
SYSTEM_TOOL_NAMES: frozenset[str] = frozenset(
    {
        "search_catalog",
        "search_tools",
        "describe_entry",
        "query",
        "query_frames",
        "query_datasource",
        "analyze_data",
        "preview_data",
        "recall_entities",
        "get_entity",
        "present_rows",
    }
)

# Age buckets of compute_scores: (maximum age in days, weight); older rows weigh OLD_WEIGHT.
AGE_BUCKETS: tuple[tuple[int, float], ...] = ((30, 3.0), (90, 1.0))
OLD_WEIGHT = 0.2
# A surface miss (a tool paged in from outside the floor) weighs like this many calls: the
# model needed the tool and had to search for it first.
MISS_WEIGHT = 2.0


@dataclass(frozen=True)
class BucketCounts:
    """Calls (or misses) of one tool per age bucket: < 30 days, < 90 days, older."""

    recent: int = 0
    mid: int = 0
    old: int = 0

    def weighted(self) -> float:
        return (
            self.recent * AGE_BUCKETS[0][1] + self.mid * AGE_BUCKETS[1][1] + self.old * OLD_WEIGHT
        )


def compute_scores(
    usage: Mapping[str, BucketCounts], misses: Mapping[str, BucketCounts] | None = None
) -> dict[str, float]:
    """Per-tool score: age-weighted calls plus MISS_WEIGHT times age-weighted surface misses."""
    scores: dict[str, float] = {}
    for name, counts in usage.items():
        scores[name] = scores.get(name, 0.0) + counts.weighted()
    for name, counts in (misses or {}).items():
        scores[name] = scores.get(name, 0.0) + MISS_WEIGHT * counts.weighted()
    return scores


@dataclass(frozen=True)
class Derivation:
    """A derived floor, anchors first, and the warning when its size is out of range."""

    names: tuple[str, ...]
    warning: str = ""


def derive_tier0(
    scores: Mapping[str, float],
    *,
    anchors: Sequence[str] = ANCHORS,
    target: int = TARGET_FLOOR,
    eligible: Iterable[str] | None = None,
) -> Derivation:
    """ANCHORS first (in order), then the highest-scoring other tools until `target` names.
    `eligible` (the live tool names) keeps retired tools out of the usage half."""
    names = list(dict.fromkeys(anchors))
    allowed = set(eligible) if eligible is not None else None
    ranked = sorted(
        (n for n, s in scores.items() if s > 0 and n not in names),
        key=lambda n: (-scores[n], n),
    )
    for name in ranked:
        if len(names) >= target:
            break
        if allowed is None or name in allowed:
            names.append(name)
    warning = ""
    if not MIN_FLOOR <= len(names) <= MAX_FLOOR:
        warning = (
            f"derived floor has {len(names)} tools, outside [{MIN_FLOOR}, {MAX_FLOOR}] "
            f"({len(anchors)} anchors, {len(ranked)} tools with usage)"
        )
        logger.warning("tier0: %s", warning)
    return Derivation(tuple(names), warning)


def encode_floor(derivation: Derivation) -> str:
    return json.dumps({"names": list(derivation.names), "warning": derivation.warning})


def parse_floor(value: str | None) -> tuple[str, ...] | None:
    """The names of a stored floor, or None when absent or unparsable (callers fall back to
    STATIC_FLOOR)."""
    if not value:
        return None
    try:
        data = json.loads(value)
    except (json.JSONDecodeError, TypeError):
        return None
    names = data.get("names") if isinstance(data, dict) else data
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        return None
    return tuple(dict.fromkeys(names))
