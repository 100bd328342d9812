"""The CLI's output: `echo` and `echo_json`, through which every command prints, so that text
a server sent cannot drive the terminal; and the tool lists, execution log and span trees."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import grpc

from shared.cli import EXIT_RPC_ERROR
from shared.config import Settings
from shared.contract.table import fit
from shared.rpc_errors import from_rpc_error
from shared.telemetry import semconv

# What a terminal acts on instead of showing: C0 controls but tab and newline (ESC opens CSI,
# OSC 8 hyperlink and OSC 52 clipboard sequences; BEL, BS and CR ring, erase and overwrite),
# DEL, the C1 controls U+0080-U+009F (U+009B is a one-character CSI to some terminals), and
# the bidi embeddings, overrides and isolates U+202A-U+202E and U+2066-U+2069, which reorder
# what is shown (trojan-source text). Servers, tools and MCP servers choose what comes back.
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_text(text: str) -> str:
    """`text` as a terminal may show it: each character it would act on written as an escape
    (ESC as `\\x1b`, a right-to-left override as `\\u202e`); tabs and newlines kept. Applying
    it twice changes nothing more."""
    return _UNSAFE.sub(_escaped, text)


def json_text(text: str) -> str:
    """A JSON document with the same characters escaped as JSON escapes (`\\u001b`,
    `\\u202e`): the same value to a parser. json.dumps escapes C0 controls, but with
    ensure_ascii=False (used for readable non-ASCII text) leaves DEL, C1 and bidi controls raw;
    outside indentation such characters can only stand inside strings, where the escape means
    the same character. Newlines (indentation) stay."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def echo(text: str = "", *, file: TextIO | None = None, flush: bool = False) -> None:
    """Print one piece of human-readable output (a line or several) through terminal_text:
    every printer of the CLI but the --json ones comes here."""
    print(terminal_text(text), file=file, flush=flush)


def echo_json(text: str) -> None:
    """Print a JSON document (--json output) through json_text."""
    print(json_text(text))


# Reasons that mean the service itself could not be reached (no answer, or a hop behind it
# down), not an answer it gave: only these get the "is the mesh running?" line.
_UNREACHED = ("UNAVAILABLE", "SERVICE_UNAVAILABLE")


def rpc_failure(exc: grpc.RpcError, service: str, address: str) -> int:
    """Report a failed RPC to `service` at `address` on stderr — its code, reason and message,
    then each field violation — and return the CLI's exit code for it."""
    err = from_rpc_error(exc)
    echo(f"error: {err.code} ({err.reason}): {err.message}", file=sys.stderr)
    if err.code == "UNAVAILABLE" and err.reason in _UNREACHED:
        echo(
            f"is the mesh running? ({service} at {address}; start it with `make up`)",
            file=sys.stderr,
        )
    for field, description in err.field_violations:
        echo(f"  {field}: {description}", file=sys.stderr)
    return EXIT_RPC_ERROR


def _width() -> int | None:
    """The terminal's width in columns when output goes to one; None when it goes to a pipe or
    a file, which get every line whole (a listing piped to grep or saved must not lose text)."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size((120, 20)).columns


# How `tools --all` marks a tool's declared hints (MCP annotations), in this order.
_HINT_MARKS = (
    ("read_only", "read-only"),
    ("destructive", "destructive"),
    ("idempotent", "idempotent"),
    ("open_world", "open-world"),
)


def _declared(annotations: dict[str, Any], capabilities: Sequence[str]) -> str:
    """A tool's title, the hints its server declared true, and the capabilities it requires,
    as a prefix of its listed description ("" when none)."""
    parts = [f'"{annotations["title"]}"'] if annotations.get("title") else []
    hints = [mark for key, mark in _HINT_MARKS if annotations.get(key) is True]
    if hints:
        parts.append(",".join(hints))
    if capabilities:
        parts.append("needs " + ",".join(capabilities))
    return f"({'; '.join(parts)}) " if parts else ""


def print_tools(tools: Sequence[dict[str, Any]], *, as_json: bool) -> None:
    if as_json:
        echo_json(json.dumps(list(tools), indent=2, ensure_ascii=False))
        return
    names = [terminal_text(t["name"]) for t in tools]  # escaped before the columns are sized
    name_w = max((len(name) for name in names), default=4)
    width = _width()
    for name, t in zip(names, tools, strict=True):
        extra = f"[{t['type']}/{t['status']}/{t['category']}] " if "type" in t else ""
        extra += _declared(t.get("annotations") or {}, t.get("required_capabilities") or [])
        desc = terminal_text(extra + t["description"]).replace("\n", " ")
        if width is not None:  # cut to the terminal by display width (wide characters count 2)
            desc = fit(desc, max(20, width - name_w - 3))
        echo(f"{name:<{name_w}}  {desc}")
    echo(f"({len(tools)} tools)")


def print_log(entries: Sequence[Any], *, as_json: bool) -> None:
    if as_json:
        from google.protobuf import json_format

        echo_json(json.dumps([json_format.MessageToDict(e) for e in entries], indent=2))
        return
    for e in entries:
        when = (
            e.created_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")
            if e.HasField("created_at")
            else ""
        )
        mark = "ok " if e.success else "ERR"
        summary = terminal_text(e.error if not e.success and e.error else e.output_summary)
        summary = summary.replace("\n", " ")
        model = f"  model={terminal_text(e.model)}" if e.model else ""
        echo(
            f"{when}  {mark}  {e.tool_name:<20} {e.execution_ms:8.1f} ms  "
            f"{e.tenant_id}/{e.conversation_id}{model}  trace={e.trace_id or '-'}  {summary[:80]}"
        )
    echo(f"({len(entries)} rows)")


def _is_tool_call(span: Any) -> bool:
    """A dispatch (refused ones included) or a tool's execution."""
    return "DispatcherService/DispatchToolCall" in span.name or (
        span.attributes.get(semconv.GEN_AI_OPERATION_NAME) == semconv.OPERATION_EXECUTE_TOOL
    )


def print_trace(settings: Settings, trace_id: str | None, *, last: bool) -> int:
    from shared.telemetry.collector import read_spans

    path = settings.data_dir / "spans.jsonl"
    if not path.exists():
        echo(f"no span store at {path} (spans are stored there by `toolmesh up`)", file=sys.stderr)
        return 2
    try:
        spans = read_spans(path)
    except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError, KeyError) as exc:
        # A directory, an unreadable file, a line that is not a span record: read_spans
        # raises whatever the first bad line makes of it.
        echo(f"error: cannot read the span store {path}: {exc}", file=sys.stderr)
        return 2
    if not spans:
        echo("the span store is empty", file=sys.stderr)
        return 2
    if last or not trace_id:
        # The last tool call's trace, not the last RPC's: `toolmesh log` is traced too.
        calls = [s for s in spans if _is_tool_call(s)] or spans
        trace_id = max(calls, key=lambda s: s.end_ns).trace_id
    chosen = [s for s in spans if s.trace_id == trace_id]
    if not chosen:
        echo(f"no spans for trace {trace_id}", file=sys.stderr)
        return 2
    by_parent: dict[str, list[Any]] = {}
    ids = {s.span_id for s in chosen}
    for s in sorted(chosen, key=lambda s: s.start_ns):
        parent = s.parent_span_id if s.parent_span_id in ids else ""
        by_parent.setdefault(parent, []).append(s)
    leaves = [s.attributes.get(semconv.GEN_AI_USAGE_COST_AMOUNT) for s in chosen]
    total = sum(c for c in leaves if isinstance(c, int | float))
    start = min(s.start_ns for s in chosen)
    end = max(s.end_ns for s in chosen)
    echo(f"trace {trace_id}  {(end - start) / 1e6:.2f} ms  cost ${total:.6f}")

    def walk(parent: str, depth: int) -> None:
        for s in by_parent.get(parent, []):
            ms = (s.end_ns - s.start_ns) / 1e6
            status = "" if s.status_code != "ERROR" else f"  ERROR {s.status_message}"
            # A leaf's own cost (LLM call, paid tool), and a tool call's rollup of its leaves.
            leaf = s.attributes.get(semconv.GEN_AI_USAGE_COST_AMOUNT)
            rollup = s.attributes.get(semconv.TOOLMESH_COST_ROLLUP_AMOUNT)
            cost_text = f"  ${leaf:.6f}" if isinstance(leaf, int | float) and leaf else ""
            if isinstance(rollup, int | float) and rollup and rollup != leaf:
                cost_text += f"  (call total ${rollup:.6f})"
            tokens = s.attributes.get(semconv.GEN_AI_USAGE_INPUT_TOKENS)
            if tokens is not None:
                out = s.attributes.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS, 0)
                cost_text += f"  {tokens}+{out} tokens"
            tenant = s.attributes.get(semconv.TOOLMESH_TENANT_ID)
            who = f"  tenant={tenant}" if tenant and s.kind == "SERVER" else ""
            where = f"[{s.service_name}, {s.kind.lower()}]"
            echo(f"{'  ' * depth}{s.name}  {where}  {ms:.2f} ms{cost_text}{who}{status}")
            walk(s.span_id, depth + 1)

    walk("", 1)
    return 0
