"""Registered names of MCP tools (`mcp_<conn>_<tool>` within `[a-zA-Z0-9_-]{1,64}`, collisions
resolved deterministically) and the definition hash the registry pins."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping

from services.mcp_bridge.model import McpTool
from shared.errors import InvalidArgument

MAX_NAME = 64
CONNECTION_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,40}$")
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def check_connection_name(name: str) -> None:
    if not CONNECTION_NAME_RE.match(name):
        raise InvalidArgument(
            f"connection name {name!r} must match [a-zA-Z0-9_-]{{1,40}}",
            reason="INVALID_CONNECTION_NAME",
            field_violations=[("server.name", "must match [a-zA-Z0-9_-]{1,40}")],
        )


def base_name(connection: str, tool: str) -> str:
    """`mcp_<conn>_<tool>` with unsafe characters replaced by `_`; a name over 64 characters is
    cut and ends in 8 hex of the tool's SHA-256, so two long names stay distinct."""
    name = f"mcp_{connection}_{_UNSAFE.sub('_', tool)}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(tool.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9]}_{digest}"


def _with_suffix(base: str, n: int) -> str:
    suffix = f"_{n}"
    return base[: MAX_NAME - len(suffix)] + suffix


def assign_names(
    connection: str,
    tools: Iterable[str],
    *,
    taken: Iterable[str] = (),
    previous: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """{server tool name: registered name} and the renames as "tool -> name".

    Deterministic and stable: a tool keeps the name it had before (`previous`), then tools whose
    name needed no change claim theirs, then the rest in sorted order; a collision with another
    tool of this server or a name `taken` by another owner gets the lowest free `_2`, `_3`, …"""
    blocked = set(taken)
    assigned: dict[str, str] = {}
    used: set[str] = set()
    names = sorted(set(tools))
    for tool in names:
        prev = (previous or {}).get(tool)
        if prev and prev not in used and prev not in blocked:
            assigned[tool] = prev
            used.add(prev)
    unchanged = {t for t in names if base_name(connection, t) == f"mcp_{connection}_{t}"}
    exact = [t for t in names if t not in assigned and t in unchanged]
    rest = [t for t in names if t not in assigned and t not in exact]
    for tool in [*exact, *rest]:
        base = base_name(connection, tool)
        name, n = base, 2
        while name in used or name in blocked:
            name, n = _with_suffix(base, n), n + 1
        assigned[tool] = name
        used.add(name)
    renamed = [
        f"{tool} -> {name}"
        for tool, name in sorted(assigned.items())
        if name != f"mcp_{connection}_{tool}"
    ]
    return assigned, renamed


def definition_hash(tool: McpTool) -> str:
    """SHA-256 over what defines a tool's behaviour for the model: name, title, description,
    input and output schema, annotations (key-sorted JSON; annotations as the SDK's model has
    them, `{"destructive_hint": true, ...}`, None when the server sent none).

    The pin the bridge compares each listing against (a differing digest holds the tool in
    `testing` until approved), so a server turning a tool destructive, or no longer read-only,
    is a change like any other. The formula has counted the title and the annotations since the
    bridge's first release, and it must not change: every stored pin was computed with it, and
    a new formula would hold every MCP tool on its next listing. So there is no legacy digest
    to accept, and none is: accepting a second formula's digest as "unchanged" would let a
    definition through that the first formula pins. What it hashes is what the bridge kept of
    the server's title and annotations (annotations.clean_listing), which for a well-formed
    tool is exactly what the server sent; a tool whose hints were not booleans (the SDK read
    "yes" as true) or whose title was not printable gets a new digest once after the upgrade
    that began cleaning them, and is held once: what it registers did change."""
    canonical = json.dumps(
        {
            "name": tool.name,
            "title": tool.title,
            "description": tool.description,
            "input_schema": tool.input_schema,
            "output_schema": tool.output_schema,
            "annotations": tool.annotations,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def implementation_of(connection: str, tool: str) -> str:
    """The registry's implementation column: `mcp:<conn>:<tool>`."""
    return f"mcp:{connection}:{tool}"


def parse_implementation(implementation: str) -> tuple[str, str] | None:
    """(connection, server tool name) of `mcp:<conn>:<tool>`, None when it is not one."""
    kind, sep, rest = implementation.partition(":")
    if kind != "mcp" or not sep:
        return None
    connection, sep, tool = rest.partition(":")
    if not sep or not connection or not tool:
        return None
    return connection, tool
