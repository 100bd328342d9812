"""Lint-style checks (AST scans) that keep the effect catalog closed and `apply_effect` the only
code that writes telemetry events, display chunks and persisted messages in the dispatcher.

Adding a fourth effect kind, or writing conversation_events / the display from somewhere other
than the chokepoint, fails here with the file and line to look at."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
EFFECTS_MODULE = ROOT / "shared" / "contract" / "effects.py"
SCANNED = [
    *sorted((ROOT / "services" / "dispatcher").rglob("*.py")),
    *sorted((ROOT / "shared" / "contract").rglob("*.py")),
]
CATALOG = {"TelemetryEvent", "PersistAssistantMessage", "StreamChunks"}

# Methods of the real backends (EventRecorder, DisplayHandle) and the EffectContext fields.
DISPLAY_METHODS = {"progress", "card", "text", "notice"}
CONTEXT_FIELDS = {"recorder", "display", "persister"}
# Where the backends may be driven from: the chokepoint's own functions.
CHOKEPOINT_FUNCTIONS = {"_apply_telemetry_event", "_apply_stream_chunks", "_apply_persist"}
# The only places that may build a conversation_events row or touch the events table.
ROW_BUILDERS = {
    ("services/dispatcher/effects.py", "CallEventBuffer.record"),
    ("services/dispatcher/logstore.py", "SqlEventRecorder.record"),
}
# The call log writes and reads it; retention only deletes rows past their age.
EVENT_TABLE_USERS = {"services/dispatcher/logstore.py", "services/dispatcher/retention.py"}
# The recording proxies' one entry each on the dispatcher side.
PROXY_CALLERS = {
    ("services/dispatcher/effects.py", "CallEffects.event"),
    ("services/dispatcher/effects.py", "CallEffects.stream"),
}


def _scopes(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(qualified function name, node) for every node, '' at module level."""

    def walk(node: ast.AST, scope: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            name = scope
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{scope}.{child.name}" if scope else child.name
            yield name, child
            yield from walk(child, name)

    yield from walk(tree, "")


def _chain(node: ast.AST) -> list[str]:
    """`a.b.c` as ['a', 'b', 'c'] (calls and subscripts in between are skipped)."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            return parts[::-1]
        else:
            return parts[::-1]


def violations(path: str, source: str) -> list[str]:
    """Every place in one module that writes around the chokepoint."""
    found: list[str] = []
    tree = ast.parse(source)
    for scope, node in _scopes(tree):
        where = f"{path}:{getattr(node, 'lineno', 0)} in {scope or '<module>'}"
        leaf = scope.rsplit(".", 1)[-1]
        if isinstance(node, ast.Call):
            chain = _chain(node.func)
            # ctx.recorder.record(...), ctx.display.card(...), ctx.persister(...)
            touches_backend = (len(chain) >= 2 and chain[-2] in CONTEXT_FIELDS) or (
                chain and chain[-1] == "persister"
            )
            if touches_backend and leaf not in CHOKEPOINT_FUNCTIONS:
                found.append(f"{where}: drives a live backend ({'.'.join(chain)})")
            if (
                len(chain) >= 2
                and chain[-1] in DISPLAY_METHODS
                and leaf not in CHOKEPOINT_FUNCTIONS
            ):
                found.append(f"{where}: calls a display method ({'.'.join(chain)})")
            if chain and chain[-1] == "EventRecord" and (path, scope) not in ROW_BUILDERS:
                found.append(f"{where}: builds a conversation_events row outside the recorder")
            if (
                chain
                and chain[-1] in ("record", "send")
                and path.startswith("services/dispatcher/")
                and (path, scope) not in PROXY_CALLERS
            ):
                found.append(f"{where}: records around the CallEffects proxies")
            if chain[-2:] == ["events", "append"] and (path, scope) not in ROW_BUILDERS:
                found.append(f"{where}: appends to an event list directly")
        if (
            isinstance(node, ast.Name)
            and node.id in ("ConversationEventRow", "_EVENTS", "ConversationEventBlobRow")
            and path not in EVENT_TABLE_USERS
        ):
            found.append(f"{where}: touches the conversation_events table")
    return found


def test_the_effect_catalog_is_closed() -> None:
    tree = ast.parse(EFFECTS_MODULE.read_text())
    union: set[str] = set()
    kinds: set[str] = set()
    handled: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "Effect" for t in node.targets
        ):
            union = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "EFFECT_KINDS":
            assert isinstance(node.value, ast.Dict)
            kinds = {v.id for v in node.value.values if isinstance(v, ast.Name)}
        if isinstance(node, ast.FunctionDef) and node.name == "apply_effect":
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "isinstance":
                    handled.add(getattr(call.args[1], "id", ""))
    assert union == CATALOG, "the Effect union changed: update the closed catalog deliberately"
    assert kinds == CATALOG, "EFFECT_KINDS must list exactly the closed catalog"
    assert handled == CATALOG, "apply_effect must handle exactly the closed catalog"


def test_only_the_chokepoint_writes_events_display_and_persistence() -> None:
    found: list[str] = []
    for file in SCANNED:
        rel = file.relative_to(ROOT).as_posix()
        found.extend(violations(rel, file.read_text()))
    assert not found, "\n".join(found)


def test_the_scan_catches_writes_around_the_chokepoint() -> None:
    """The checker itself fails on each kind of bypass."""
    bad = """
def handler(ctx, plan, conn):
    ctx.recorder.record("x", {}, tool_use_id="", at=None, blob=None)
    plan.display.card({"type": "x"})
    ctx.persister(None)
    plan.events.append(EventRecord("x", {}))
    conn.execute(insert(_EVENTS), [])
    plan.fx.recorder.record("x", {})
"""
    found = violations("services/dispatcher/rogue.py", bad)
    assert len(found) >= 6
    joined = "\n".join(found)
    for needle in (
        "drives a live backend",
        "calls a display method",
        "builds a conversation_events row",
        "appends to an event list",
        "touches the conversation_events table",
        "records around the CallEffects proxies",
    ):
        assert needle in joined, needle
