"""Conversions between the wire types (toolmesh.type.v1) and the Python domain types: contexts,
envelopes, tool results and tool definitions. JSON payloads stay JSON text on the wire so integers
survive (google.protobuf.Struct would turn them into doubles)."""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import pandas as pd
from google.protobuf import json_format, struct_pb2
from google.protobuf.timestamp_pb2 import Timestamp

from shared.arrow_ipc import dataframe_to_ipc, ipc_to_dataframe
from shared.contract import (
    Alternative,
    ColumnSpec,
    Effects,
    Envelope,
    Err,
    Hint,
    Ok,
    ToolResult,
    Warning,
    measure_schema,
    to_envelope,
)
from shared.contract.render import render_envelope
from shared.errors import InvalidArgument
from toolmesh.type.v1 import types_pb2 as pb

logger = logging.getLogger(__name__)

MODES = {pb.MODE_CHAT: "chat", pb.MODE_AGENTIC: "agentic", pb.MODE_DELEGATE: "delegate"}
MODE_VALUES = {v: k for k, v in MODES.items()}
TOOL_TYPES = {pb.TOOL_TYPE_SYSTEM: "system", pb.TOOL_TYPE_CUSTOM: "custom", pb.TOOL_TYPE_MCP: "mcp"}
TOOL_TYPE_VALUES = {v: k for k, v in TOOL_TYPES.items()}
STATUSES = {
    pb.TOOL_STATUS_DRAFT: "draft",
    pb.TOOL_STATUS_TESTING: "testing",
    pb.TOOL_STATUS_APPROVED: "approved",
    pb.TOOL_STATUS_REJECTED: "rejected",
}
STATUS_VALUES = {v: k for k, v in STATUSES.items()}
HINT_KINDS = {
    pb.HINT_KIND_SCHEMA: "schema",
    pb.HINT_KIND_FETCH: "fetch",
    pb.HINT_KIND_AMBIGUOUS: "ambiguous",
}
HINT_KIND_VALUES = {v: k for k, v in HINT_KINDS.items()}


# --- JSON -------------------------------------------------------------------------------------


# The width of the identifier columns (tenant, user, conversation, tool_use, namespace) in every
# table: PostgreSQL refuses a longer value, and NUL in any text.
MAX_ID_CHARS = 128
# A tool's description goes into every prompt that offers the tool: the registry refuses a
# longer one, and the MCP bridge clips a server's to it.
MAX_TOOL_DESCRIPTION_CHARS = 32 * 1024
# A tool's display title (an MCP server's `title`): the bridge cuts a server's longer one to this,
# and the registry refuses a longer one.
MAX_TOOL_TITLE_CHARS = 256
# The behaviour hints of a tool's annotations, as stored (tool_definitions.annotations) and as
# the fields of ToolAnnotations.
ANNOTATION_HINTS = ("read_only", "destructive", "idempotent", "open_world")
# A tool's input schema as JSON: every listing of the catalog carries it, and the registry
# compiles it before the tool's first call (a 4 MB one took 12 s). The MCP bridge skips a
# server's tool with a larger one.
MAX_SCHEMA_BYTES = 256 * 1024
# The most code a custom tool may have: the sandbox's pre-check parses it on the service's event
# loop at registration and before an execution (about 2 s per MiB of plain statements, every
# other call waiting), and the registry refuses a definition past it too.
MAX_CUSTOM_CODE_BYTES = 256 * 1024
# A serialised tool result: half the services' 64 MB message limit, so the response around it
# always fits. A larger one is an Err `result_too_large` where it is made.
MAX_RESULT_BYTES = 32 * 1024 * 1024
_CONTROL_CHARS = re.compile("[\x00-\x1f\x7f]")


def has_control(text: str) -> bool:
    """Whether `text` holds a control character (C0 or DEL)."""
    return _CONTROL_CHARS.search(text) is not None


def clip(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def printable(text: str) -> str:
    """`text` with its control characters as U+FFFD (what a column and a message can hold)."""
    return _CONTROL_CHARS.sub("\ufffd", text)


def annotations_to_pb(value: Mapping[str, Any] | None) -> pb.ToolAnnotations | None:
    """A stored annotations object ({"title": str, "read_only": bool, ...}) as ToolAnnotations;
    None when there is none. A hint that is not a boolean, or a title that is not a string, is
    left out."""
    if not value:
        return None
    msg = pb.ToolAnnotations()
    title = value.get("title")
    if isinstance(title, str):
        msg.title = title
    for hint in ANNOTATION_HINTS:
        flag = value.get(hint)
        if isinstance(flag, bool):
            setattr(msg, hint, flag)
    return msg


def annotations_from_pb(m: pb.ToolAnnotations) -> dict[str, Any] | None:
    """ToolAnnotations as the stored object: the title when not empty and each hint that is set;
    None when that leaves nothing."""
    value: dict[str, Any] = {"title": m.title} if m.title else {}
    for hint in ANNOTATION_HINTS:
        if m.HasField(hint):
            value[hint] = getattr(m, hint)
    return value or None


def check_ids(fields: Sequence[tuple[str, str]]) -> None:
    """INVALID_ARGUMENT naming the first (field, value) that cannot be stored as an id: over
    MAX_ID_CHARS characters (ID_TOO_LONG) or holding control characters (ID_INVALID)."""
    for name, value in fields:
        if len(value) > MAX_ID_CHARS:
            raise InvalidArgument(
                f"{name} is {len(value)} characters, over the {MAX_ID_CHARS}-character limit",
                reason="ID_TOO_LONG",
                field_violations=[(name, "too long")],
            )
        if has_control(value):
            raise InvalidArgument(
                f"{name} {printable(value)!r} holds control characters",
                reason="ID_INVALID",
                field_violations=[(name, "control characters")],
            )


def context_ids(context: pb.CallContext, prefix: str = "context.") -> list[tuple[str, str]]:
    """The identifiers of a CallContext as (field, value) pairs for check_ids."""
    return [
        (f"{prefix}tenant_id", context.tenant_id),
        (f"{prefix}user_id", context.user_id),
        (f"{prefix}conversation_id", context.conversation_id),
        (f"{prefix}namespace_id", context.namespace_id),
        (f"{prefix}tool_use_id", context.tool_use_id),
        (f"{prefix}model", context.model),
    ]


def _reject_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON value (JSON has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJson(f"the number {text[:40]} is out of range for a double")
    return value


class _NotJson(ValueError):
    """Raised from the decoder's hooks: the text parses but is not acceptable JSON."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are unique (I-JSON, RFC 7493): with a key twice, which value is
    meant depends on the parser (Python's keeps the last, others the first or refuse), so the
    policy checks, the tool and whoever reads the logged input could each see another value."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _NotJson(
                    f"the key {clip(key, 80)!r} appears twice in one object (which is meant?)"
                )
            seen.add(key)
    return obj


# Deeper inputs are refused: past a few hundred levels, schema validation and rendering run out
# of Python's recursion limit (a 500-level input was an INTERNAL error in the registry); no
# tool's input needs more than a handful.
MAX_JSON_DEPTH = 100
_DECODER = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys
)
# A JSON string escape of a UTF-16 surrogate: only these can decode to an unpaired surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json_object(text: str, field: str) -> dict[str, Any]:
    """Decode JSON text that must be an object; INVALID_ARGUMENT naming the field otherwise.
    An empty string is an empty object. Also refused, as what no other service, database or
    client could take back: NaN and Infinity (not JSON), numbers beyond a double's range or
    Python's 4300-digit integer limit, nesting deeper than MAX_JSON_DEPTH, a key twice in one
    object, and escapes of unpaired UTF-16 surrogates (not Unicode text: no UTF-8 encoder takes
    them)."""
    if text.strip() == "":
        return {}
    try:
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(
            f"{field} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            reason="INPUT_NOT_JSON",
            field_violations=[(field, f"invalid JSON: {exc.msg}")],
        ) from None
    except RecursionError:
        raise _unacceptable(field, "it is nested too deeply") from None
    except ValueError as exc:  # _NotJson, or an integer over sys.get_int_max_str_digits()
        detail = (
            str(exc)
            if isinstance(exc, _NotJson)
            else f"an integer has more than {sys.get_int_max_str_digits()} digits"
        )
        raise _unacceptable(field, detail) from None
    if not isinstance(value, dict):
        raise InvalidArgument(
            f"{field} must be a JSON object, got {type(value).__name__}",
            reason="INPUT_NOT_OBJECT",
            field_violations=[(field, f"must be a JSON object, got {type(value).__name__}")],
        )
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _depth(value) > MAX_JSON_DEPTH:
        raise _unacceptable(field, f"it is nested more than {MAX_JSON_DEPTH} levels deep")
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start : exc.end]
            raise _unacceptable(
                field, f"it escapes an unpaired UTF-16 surrogate ({bad!a}), not Unicode text"
            ) from None
    return value


def _depth(value: Any) -> int:
    """How deep containers nest in a decoded JSON value (iteratively: no recursion limit)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return deepest


def _unacceptable(field: str, detail: str) -> InvalidArgument:
    return InvalidArgument(
        f"{field} is not acceptable JSON: {detail}",
        reason="INPUT_NOT_JSON",
        field_violations=[(field, detail)],
    )


# One encoder for every call: json.dumps with options builds a new JSONEncoder each time, a
# third of the cost of encoding a small payload (the encoder keeps no state between calls).
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


def dumps(value: Any) -> str:
    """Compact JSON; non-finite floats and unknown types degrade to strings, never raise."""
    return _COMPACT.encode(value)


def _json_key(key: Any) -> str:
    """A mapping key as the json module writes it (True -> "true", None -> "null", 1.5 ->
    "1.5"), so a result reads the same whether or not it also held a value only the lenient
    path can write; any other key as its str()."""
    if isinstance(key, str):
        return key
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return int.__repr__(key)
    if isinstance(key, float):
        return float.__repr__(key) if math.isfinite(key) else str(key)
    return str(key)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {_json_key(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def to_struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(_jsonable(value))
    return s


def from_struct(s: struct_pb2.Struct) -> dict[str, Any]:
    return json_format.MessageToDict(s)


def to_timestamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


# --- Envelope ---------------------------------------------------------------------------------


def column_to_pb(c: ColumnSpec) -> pb.ColumnSpec:
    msg = pb.ColumnSpec(
        name=c.name,
        dtype=c.dtype,
        dtype_provenance=pb.DTYPE_PROVENANCE_INFERRED
        if c.dtype_provenance == "inferred"
        else pb.DTYPE_PROVENANCE_MEASURED,
    )
    if c.null_count is not None:
        msg.null_count = c.null_count
    if c.distinct_count is not None:
        msg.distinct_count = c.distinct_count
    return msg


def column_from_pb(m: pb.ColumnSpec) -> ColumnSpec:
    return ColumnSpec(
        name=m.name,
        dtype=m.dtype,
        null_count=m.null_count if m.HasField("null_count") else None,
        distinct_count=m.distinct_count if m.HasField("distinct_count") else None,
        dtype_provenance="inferred"
        if m.dtype_provenance == pb.DTYPE_PROVENANCE_INFERRED
        else "measured",
    )


def dataset_to_pb(name: str, value: Any) -> pb.Dataset:
    if not isinstance(value, pd.DataFrame):
        raise TypeError(f"dataset {name!r} is {type(value).__name__}, not a DataFrame")
    return pb.Dataset(
        name=name,
        arrow_ipc=dataframe_to_ipc(value),
        rows=len(value),
        columns=[column_to_pb(c) for c in measure_schema(value)],
    )


def export_to_pb(filename: str, e: Mapping[str, Any]) -> pb.Export:
    return pb.Export(
        filename=filename,
        path=str(e.get("path", "")),
        mime_type=str(e.get("mime_type", "")),
        size_bytes=int(e.get("size_bytes") or 0),
        source_tool=str(e.get("source_tool", "")),
        original_filename=str(e.get("original_filename", "")),
        file_id=str(e.get("file_id", "") or ""),
    )


def _export_from_pb(e: pb.Export) -> dict[str, Any]:
    return {
        "path": e.path,
        "mime_type": e.mime_type,
        "size_bytes": e.size_bytes,
        "source_tool": e.source_tool,
        "original_filename": e.original_filename,
        "file_id": e.file_id or None,
    }


def effects_to_pb(fx: Effects) -> pb.Effects:
    msg = pb.Effects()
    _effects_into(msg, fx, include_datasets=True)
    return msg


def _effects_into(msg: pb.Effects, fx: Effects, *, include_datasets: bool) -> None:
    if fx.cards:
        msg.cards.extend(to_struct(c) for c in fx.cards)
    if include_datasets and fx.datasets:
        msg.datasets.extend(dataset_to_pb(n, d) for n, d in fx.datasets.items())
    if fx.exports:
        msg.exports.extend(export_to_pb(n, e) for n, e in fx.exports.items())
    msg.cost_usd = fx.cost
    msg.SetInParent()  # present even when empty, as when it was built whole


# Data of the common kind (str keys, JSON scalars, lists, finite numbers) encodes directly;
# anything else (a non-finite float, a set, a type JSON lacks) fails here and goes through
# _jsonable, which also gives it a readable form.
_STRICT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def data_json(data: Any) -> str:
    """An envelope's data as compact JSON (non-finite floats and unknown types as strings)."""
    try:
        return _STRICT.encode(data)
    except (TypeError, ValueError):
        return dumps(_jsonable(data))


def envelope_to_pb(env: Envelope, *, include_datasets: bool = True) -> pb.Envelope:
    msg = pb.Envelope()
    envelope_into(msg, env, include_datasets=include_datasets)
    return msg


def envelope_into(msg: pb.Envelope, env: Envelope, *, include_datasets: bool = True) -> None:
    """Fill an empty Envelope message in place (no copies of nested messages)."""
    if isinstance(env, Ok):
        ok = msg.ok
        ok.rows = env.rows
        if env.schema:
            ok.schema.extend(column_to_pb(c) for c in env.schema)
        if isinstance(env.data, pd.DataFrame):
            ok.table.CopyFrom(dataset_to_pb("", env.data))
        elif env.data is not None:
            ok.data_json = data_json(env.data)
        if env.warnings:
            ok.warnings.extend(
                pb.Warning(kind=w.kind, message=w.message, details=to_struct(w.details))
                for w in env.warnings
            )
        _effects_into(ok.effects, env.effects, include_datasets=include_datasets)
        return
    if isinstance(env, Hint):
        hint = msg.hint
        hint.hint_kind = HINT_KIND_VALUES[env.hint_kind]
        hint.message = env.message
        hint.alternatives.extend(
            pb.Alternative(label=a.label, score=a.score, details=to_struct(a.details))
            for a in env.alternatives
        )
        hint.SetInParent()
        return
    err = msg.err
    err.message = env.message
    err.err_kind = env.err_kind
    err.SetInParent()


def envelope_from_pb(m: pb.Envelope) -> Envelope:
    kind = m.WhichOneof("kind")
    if kind == "ok":
        ok = m.ok
        data: Any = None
        if ok.HasField("table"):
            data = ipc_to_dataframe(ok.table.arrow_ipc)
        elif ok.data_json:
            data = json.loads(ok.data_json)
        return Ok(
            rows=ok.rows,
            schema=[column_from_pb(c) for c in ok.schema],
            data=data,
            warnings=[
                Warning(kind=w.kind, message=w.message, details=from_struct(w.details))
                for w in ok.warnings
            ],
            effects=Effects(
                cards=[from_struct(c) for c in ok.effects.cards],
                datasets={d.name: ipc_to_dataframe(d.arrow_ipc) for d in ok.effects.datasets},
                exports={e.filename: _export_from_pb(e) for e in ok.effects.exports},
                cost=ok.effects.cost_usd,
            ),
        )
    if kind == "hint":
        h = m.hint
        return Hint(
            hint_kind=HINT_KINDS.get(h.hint_kind, "schema"),  # type: ignore[arg-type]
            message=h.message,
            alternatives=[
                Alternative(label=a.label, score=a.score, details=from_struct(a.details))
                for a in h.alternatives
            ],
        )
    if kind == "err":
        return Err(message=m.err.message, err_kind=m.err.err_kind)
    return Err(message="result carried no envelope", err_kind="empty_result")


# --- ToolResult -------------------------------------------------------------------------------


def tool_result_to_pb(result: ToolResult) -> pb.ToolResult:
    """Serialise a handler's result (see tool_result_into)."""
    msg = pb.ToolResult()
    tool_result_into(msg, result)
    return msg


def tool_result_into(msg: pb.ToolResult, result: ToolResult) -> None:
    """Serialise a handler's result into an empty ToolResult message, in place (a response
    built around it copies nothing). Content is the rendered envelope; datasets go as Arrow
    IPC once (in the result, not again inside the envelope's effects).

    A result holding text that is not Unicode (an unpaired UTF-16 surrogate, which a sandboxed
    tool or an MCP server can send as a JSON escape) cannot go into a protobuf string: it
    becomes an Err result naming that, rather than failing the RPC; so does a result over
    MAX_RESULT_BYTES (`result_too_large`), which no service could send on."""
    try:
        _tool_result_into(msg, result)
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end] if isinstance(exc.object, str) else ""
        message = (
            "the tool's result cannot be returned: it holds text that is not valid Unicode "
            f"(an unpaired UTF-16 surrogate, {bad!a}); the tool must return valid text"
        )
        logger.warning("%s", message)
        msg.CopyFrom(error_result_pb(message, "malformed_result"))
        return
    size = msg.ByteSize()
    if size > MAX_RESULT_BYTES:
        text = (
            f"the tool's result is {size} bytes, over the {MAX_RESULT_BYTES}-byte limit of a "
            "result (it could not be sent between services); the tool must return less, or "
            "write it to an export"
        )
        logger.warning("%s", text)
        msg.CopyFrom(error_result_pb(text, "result_too_large"))


def _tool_result_into(msg: pb.ToolResult, result: ToolResult) -> None:
    envelope = to_envelope(result)
    msg.content = result.content if result.envelope is not None else render_envelope(envelope)
    if result.cards:
        msg.cards.extend(to_struct(c) for c in result.cards)
    msg.cost_usd = result.cost
    if result.datasets:
        msg.datasets.extend(dataset_to_pb(n, d) for n, d in result.datasets.items())
    if result.exports:
        msg.exports.extend(export_to_pb(n, e) for n, e in result.exports.items())
    msg.error = result.error or ""
    envelope_into(msg.envelope, envelope, include_datasets=False)


def tool_result_from_pb(m: pb.ToolResult) -> ToolResult:
    envelope = envelope_from_pb(m.envelope) if m.HasField("envelope") else None
    return ToolResult(
        content=m.content,
        cards=[from_struct(c) for c in m.cards],
        cost=m.cost_usd,
        datasets={d.name: ipc_to_dataframe(d.arrow_ipc) for d in m.datasets},
        exports={e.filename: _export_from_pb(e) for e in m.exports},
        error=m.error or None,
        envelope=envelope,
    )


def error_result_pb(message: str, err_kind: str) -> pb.ToolResult:
    """A ToolResult carrying only an Err envelope."""
    env = Err(message=message, err_kind=err_kind)
    return pb.ToolResult(content=render_envelope(env), error=message, envelope=envelope_to_pb(env))


def envelope_kind(m: pb.ToolResult) -> str:
    """ "ok", "hint" or "err" of a wire result."""
    kind = m.envelope.WhichOneof("kind") if m.HasField("envelope") else None
    if kind:
        return kind
    return "err" if m.error else "ok"
