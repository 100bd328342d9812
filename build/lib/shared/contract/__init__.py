"""The result contract every tool boundary speaks: the legacy-compatible ToolResult, the typed
Ok | Hint | Err envelope, coercion between them, and the model-facing rendering."""

from shared.contract.envelope import (
    Alternative,
    ColumnSpec,
    Effects,
    Envelope,
    Err,
    Hint,
    HintException,
    HintKind,
    Ok,
    Warning,
    measure_schema,
)
from shared.contract.render import render_envelope, strip_ok_status
from shared.contract.result import ToolResult, envelope_to_tool_result, to_envelope

__all__ = [
    "Alternative",
    "ColumnSpec",
    "Effects",
    "Envelope",
    "Err",
    "Hint",
    "HintException",
    "HintKind",
    "Ok",
    "ToolResult",
    "Warning",
    "envelope_to_tool_result",
    "measure_schema",
    "render_envelope",
    "strip_ok_status",
    "to_envelope",
]
