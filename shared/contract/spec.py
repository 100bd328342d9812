"""The Uniform Tool Contract spec registry: one ToolSpec per tool, held in the module-level
_TOOL_SPECS, and `migrate_tool`, the spec-only registration (the handler's source is untouched;
the registry wraps it with the contract when it registers the handler).

Source decoration (`@uniform_contract`, in shared.contract.decorator) registers a spec too."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from shared.contract.envelope import ENVELOPE_KINDS, EnvelopeKind

logger = logging.getLogger(__name__)

H = TypeVar("H", bound=Callable[..., Any])


@dataclass(frozen=True)
class ToolSpec:
    """How one tool speaks the contract.

    is_tabular: an Ok with an empty schema is a smell (validator warning); False legitimises an
    empty schema for text, render or structural tools.
    is_cost_rollup: the tool's cost already includes its sub-calls' costs (delegation), so cost
    accounting must not add it again.
    expected_envelopes: the envelope kinds the tool may return; None allows all three.
    handler: the callable the registry resolves from handler_path — the raw handler for a
    spec-only tool, the contract wrapper for a source-decorated one."""

    name: str
    handler: Callable[..., Any]
    is_tabular: bool
    is_cost_rollup: bool = False
    expected_envelopes: frozenset[EnvelopeKind] | None = None

    @property
    def source_decorated(self) -> bool:
        """True when the handler itself is the contract wrapper (`@uniform_contract`)."""
        return getattr(self.handler, "__tool_spec__", None) is not None


_TOOL_SPECS: dict[str, ToolSpec] = {}
_LOCK = threading.Lock()


def expected_kinds(kinds: Iterable[str] | None) -> frozenset[EnvelopeKind] | None:
    """Validate an expected_envelopes argument ("ok", "hint", "err")."""
    if kinds is None:
        return None
    if isinstance(kinds, str):
        raise TypeError("expected_envelopes is a set of kinds, not a string")
    chosen = frozenset(kinds)
    unknown = chosen - set(ENVELOPE_KINDS)
    if unknown or not chosen:
        raise ValueError(
            f"expected_envelopes must be a non-empty subset of {ENVELOPE_KINDS}, not {kinds!r}"
        )
    return frozenset(k for k in ENVELOPE_KINDS if k in chosen)


def _origin(handler: Callable[..., Any]) -> str:
    inner = getattr(handler, "__wrapped__", handler)
    return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', repr(inner))}"


def register_spec(spec: ToolSpec) -> ToolSpec:
    """Put `spec` in the registry. Re-registering a name from the same function (a module
    reload) replaces it; a second function claiming a registered name raises ValueError."""
    with _LOCK:
        current = _TOOL_SPECS.get(spec.name)
        if current is not None and _origin(current.handler) != _origin(spec.handler):
            raise ValueError(
                f"tool {spec.name!r} already has a contract spec from "
                f"{_origin(current.handler)}; {_origin(spec.handler)} cannot register another"
            )
        _TOOL_SPECS[spec.name] = spec
    return spec


def unregister_spec(name: str) -> None:
    """Drop a spec (tests registering throw-away tools clean up with this)."""
    with _LOCK:
        _TOOL_SPECS.pop(name, None)


def get_spec(name: str) -> ToolSpec | None:
    """The registered spec of `name`, or None for a tool with no spec."""
    return _TOOL_SPECS.get(name)


def registered_specs() -> Mapping[str, ToolSpec]:
    """A read-only snapshot of every registered spec, by tool name."""
    with _LOCK:
        return MappingProxyType(dict(_TOOL_SPECS))


def migrate_tool(
    handler: H,
    name: str,
    *,
    is_tabular: bool,
    is_cost_rollup: bool = False,
    expected_envelopes: Iterable[EnvelopeKind] | None = None,
) -> H:
    """Spec-only registration: record a ToolSpec for `handler` and return the handler unchanged,
    so direct callers still get its ToolResult. The registry wraps it with the contract when it
    registers the handler, so every dispatched call gets coercion, validation and telemetry."""
    if not callable(handler):
        raise TypeError(f"migrate_tool({name!r}): handler is not callable")
    register_spec(
        ToolSpec(
            name=name,
            handler=handler,
            is_tabular=is_tabular,
            is_cost_rollup=is_cost_rollup,
            expected_envelopes=expected_kinds(expected_envelopes),
        )
    )
    return handler
