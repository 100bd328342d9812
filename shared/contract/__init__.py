"""The result contract every tool boundary speaks: the legacy-compatible ToolResult, the typed
Ok | Hint | Err envelope, coercion between them, the model-facing rendering, the ToolSpec
registry with `migrate_tool` and `@uniform_contract`, and the contract telemetry."""

from shared.contract.decorator import (
    is_contract_wrapped,
    uniform_contract,
    validate_envelope,
    wrap_handler,
)
from shared.contract.envelope import (
    Alternative,
    ColumnSpec,
    Effects,
    Envelope,
    EnvelopeKind,
    Err,
    Hint,
    HintException,
    HintKind,
    Ok,
    Warning,
    envelope_kind,
    measure_schema,
)
from shared.contract.render import render_envelope, strip_ok_status
from shared.contract.result import (
    ToolResult,
    coerce_return,
    envelope_to_tool_result,
    exception_to_envelope,
    normalise_result,
    to_envelope,
)
from shared.contract.spec import (
    ToolSpec,
    get_spec,
    migrate_tool,
    registered_specs,
)
from shared.contract.telemetry import (
    ContractCounters,
    ContractEvent,
    ContractRecorder,
    ToolContractStats,
)

__all__ = [
    "Alternative",
    "ColumnSpec",
    "ContractCounters",
    "ContractEvent",
    "ContractRecorder",
    "Effects",
    "Envelope",
    "EnvelopeKind",
    "Err",
    "Hint",
    "HintException",
    "HintKind",
    "Ok",
    "ToolContractStats",
    "ToolResult",
    "ToolSpec",
    "Warning",
    "coerce_return",
    "envelope_kind",
    "envelope_to_tool_result",
    "exception_to_envelope",
    "get_spec",
    "is_contract_wrapped",
    "measure_schema",
    "migrate_tool",
    "normalise_result",
    "registered_specs",
    "render_envelope",
    "strip_ok_status",
    "to_envelope",
    "uniform_contract",
    "validate_envelope",
    "wrap_handler",
]
