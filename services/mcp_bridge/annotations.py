"""What an MCP server declares about its tools besides their schemas — a tool's `title` and its
`annotations` (readOnlyHint, destructiveHint, idempotentHint, openWorldHint, and a title of
their own) — taken as the untrusted input it is, and the capability gate built on them.

A listing is cleaned before the SDK reads it (`clean_listing`, called on the raw tools/list
answer by the read stream in sdk.py): a hint is kept only when it is a JSON boolean (the SDK's
model would read "yes" or 1 as true), a title only when it is a string, made printable and cut
to MAX_TOOL_TITLE_CHARS; annotations that are not an object are dropped whole, and keys MCP does
not define are dropped (the SDK ignored them anyway). The SDK failed the whole listing, so the
whole connection, on a hint of "maybe" or annotations that were a string; now such a tool is
registered without them. A well-formed tool passes unchanged, so its definition hash
(naming.definition_hash) is what it was before any of this existed."""

from __future__ import annotations

import logging
import reprlib
import unicodedata
from collections.abc import Mapping
from typing import Any

from services.mcp_bridge.model import McpTool, ToolAnnotations
from shared.convert import MAX_TOOL_TITLE_CHARS

logger = logging.getLogger(__name__)

# The annotations' hints: MCP's key, the SDK model's field name, ours.
HINTS = (
    ("readOnlyHint", "read_only_hint", "read_only"),
    ("destructiveHint", "destructive_hint", "destructive"),
    ("idempotentHint", "idempotent_hint", "idempotent"),
    ("openWorldHint", "open_world_hint", "open_world"),
)
_WIRE_KEYS = frozenset(["title", *(wire for wire, _, _ in HINTS)])
# Characters a title cannot hold: controls, format characters (bidirectional overrides,
# zero-width ones), surrogates (not Unicode text), private-use and unassigned code points, and
# the line and paragraph separators.
_UNPRINTABLE_CATEGORIES = frozenset(["Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"])
# What of a title a problem report quotes.
_QUOTED_CHARS = 60


def _printable(char: str) -> bool:
    return unicodedata.category(char) not in _UNPRINTABLE_CATEGORIES


def display_title(value: Any) -> str | None:
    """`value` as a title the mesh shows: None unless it is a string with something printable
    in it. A printable title within MAX_TOOL_TITLE_CHARS is returned as it is; any other has
    each unprintable character turned into a space, its whitespace collapsed, and is cut to
    MAX_TOOL_TITLE_CHARS (ending in "…")."""
    if not isinstance(value, str):
        return None
    if len(value) <= MAX_TOOL_TITLE_CHARS and value.strip() and all(map(_printable, value)):
        return value
    # Only the head can survive the cut: a megabyte title is not walked character by character.
    head = value[: MAX_TOOL_TITLE_CHARS * 4]
    text = " ".join("".join(c if _printable(c) else " " for c in head).split())
    if not text:
        return None
    if len(text) > MAX_TOOL_TITLE_CHARS or len(head) < len(value):
        text = text[: MAX_TOOL_TITLE_CHARS - 1] + "…"
    return text


def _quoted(value: Any) -> str:
    """`value` as a log line may quote it: printable, at most _QUOTED_CHARS characters."""
    text = value if isinstance(value, str) else reprlib.repr(value)
    shown = "".join(c if _printable(c) else "?" for c in text[:_QUOTED_CHARS])
    return shown + ("…" if len(text) > _QUOTED_CHARS else "")


def _clean_tool(tool: dict[str, Any]) -> list[str]:
    """Clean one raw tool of a listing in place; what was dropped or changed, as "field: why"."""
    problems: list[str] = []
    if "title" in tool and tool["title"] is not None:
        title = display_title(tool["title"])
        if title is None:
            problems.append("title: not a printable string")
            del tool["title"]
        elif title != tool["title"]:
            problems.append("title: made printable or cut")
            tool["title"] = title
    annotations = tool.get("annotations")
    if annotations is None:
        return problems
    if not isinstance(annotations, dict):
        problems.append(f"annotations: not an object ({type(annotations).__name__})")
        del tool["annotations"]
        return problems
    clean: dict[str, Any] = {}
    for key, value in annotations.items():
        if key not in _WIRE_KEYS or value is None:
            continue  # the SDK's model ignored keys MCP does not define too
        elif key == "title":
            title = display_title(value)
            if title is None:
                problems.append("annotations.title: not a printable string")
                continue
            if title != value:
                problems.append("annotations.title: made printable or cut")
            clean[key] = title
        elif isinstance(value, bool):
            clean[key] = value
        else:
            problems.append(f"annotations.{key}: {_quoted(reprlib.repr(value))} is not a boolean")
    tool["annotations"] = clean
    return problems


def clean_listing(result: Any, connection: str = "") -> None:
    """Clean the tools of a raw tools/list result in place (see the module's docstring); what
    was dropped is logged, one line per listing."""
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list):
        return
    reported: list[str] = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        problems = _clean_tool(tool)
        if problems:
            reported.append(f"{_quoted(tool.get('name'))} ({'; '.join(problems)})")
    if reported:
        logger.warning(
            "MCP server %s listed tools with annotations it could not keep, ignored: %s%s",
            connection or "(unnamed)",
            ", ".join(reported[:10]),
            f" and {len(reported) - 10} more" if len(reported) > 10 else "",
        )


def _hint(annotations: Mapping[str, Any], names: tuple[str, ...]) -> bool | None:
    for name in names:
        value = annotations.get(name)
        if isinstance(value, bool):
            return value
    return None


def annotations_of(tool: McpTool) -> ToolAnnotations | None:
    """The tool's title (its own, else its annotations') and hints as the registry stores them;
    None when it declared none. Checks types again: a McpTool need not come from a cleaned
    listing."""
    raw = tool.annotations if isinstance(tool.annotations, Mapping) else {}
    found = ToolAnnotations(
        title=display_title(tool.title) or display_title(raw.get("title")),
        **{ours: _hint(raw, (sdk, wire)) for wire, sdk, ours in HINTS},
    )
    return found if found.to_json() is not None else None


def required_capabilities(
    annotations: ToolAnnotations | None, destructive_capability: str
) -> tuple[str, ...]:
    """The capabilities a caller needs for the tool: `destructive_capability` when it is set
    and the server declared the tool destructive (destructiveHint true), else none.

    Only an explicit destructiveHint=true gates. MCP reads an absent destructiveHint as true
    unless readOnlyHint is true, which would gate nearly every tool of a server that annotates
    nothing; and since hints are the server's word, a server can always escape the gate by
    leaving the hint out. The gate is for honest servers marking their dangerous tools, and it
    does what the listing says. A tool declared both read-only and destructive is gated:
    contradictory hints err on the side of asking.

    These are the only capabilities the bridge owns: registered, they replace the ones its
    previous listing of the tool added (so the gate comes off when the hint goes, or when the
    gate is turned off or renamed), and an administrator's own stay (ToolSink.upsert)."""
    if destructive_capability and annotations is not None and annotations.destructive is True:
        return (destructive_capability,)
    return ()
