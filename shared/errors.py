"""The one exception tree of toolmesh. Domain cores raise these; the gRPC layer maps each to a
canonical status code with a google.rpc.ErrorInfo (and BadRequest field violations), so no core
imports grpc and no client ever sees a traceback.

    ToolmeshError                 base; `code` is a canonical gRPC code name
    ├── InvalidArgument           INVALID_ARGUMENT (malformed request, bad input JSON)
    ├── NotFound                  NOT_FOUND (unknown tool, dataset, conversation)
    ├── AlreadyExists             ALREADY_EXISTS
    ├── Unauthenticated           UNAUTHENTICATED (no or unknown API key)
    ├── PermissionDenied          PERMISSION_DENIED
    ├── FailedPrecondition        FAILED_PRECONDITION (a service that is not configured)
    ├── ResourceExhausted         RESOURCE_EXHAUSTED (input or output over a limit)
    ├── Unavailable               UNAVAILABLE (database or downstream service down)
    ├── DeadlineExceeded          DEADLINE_EXCEEDED
    ├── Cancelled                 CANCELLED
    └── Internal                  INTERNAL (a bug; message never includes a traceback)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

ERROR_DOMAIN = "toolmesh.dev"


class ToolmeshError(Exception):
    """Base of every toolmesh error that crosses an RPC boundary."""

    code = "UNKNOWN"
    default_reason = "UNKNOWN"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
        field_violations: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata = dict(metadata or {})
        self.field_violations = list(field_violations)


class InvalidArgument(ToolmeshError):
    code = "INVALID_ARGUMENT"
    default_reason = "INVALID_ARGUMENT"


class NotFound(ToolmeshError):
    code = "NOT_FOUND"
    default_reason = "NOT_FOUND"


class AlreadyExists(ToolmeshError):
    code = "ALREADY_EXISTS"
    default_reason = "ALREADY_EXISTS"


class Unauthenticated(ToolmeshError):
    code = "UNAUTHENTICATED"
    default_reason = "UNAUTHENTICATED"


class PermissionDenied(ToolmeshError):
    code = "PERMISSION_DENIED"
    default_reason = "PERMISSION_DENIED"


class FailedPrecondition(ToolmeshError):
    code = "FAILED_PRECONDITION"
    default_reason = "FAILED_PRECONDITION"


class ResourceExhausted(ToolmeshError):
    code = "RESOURCE_EXHAUSTED"
    default_reason = "RESOURCE_EXHAUSTED"


class Unavailable(ToolmeshError):
    code = "UNAVAILABLE"
    default_reason = "UNAVAILABLE"


class DeadlineExceeded(ToolmeshError):
    code = "DEADLINE_EXCEEDED"
    default_reason = "DEADLINE_EXCEEDED"


class Cancelled(ToolmeshError):
    code = "CANCELLED"
    default_reason = "CANCELLED"


class Internal(ToolmeshError):
    code = "INTERNAL"
    default_reason = "INTERNAL"


BY_CODE: dict[str, type[ToolmeshError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        Unauthenticated,
        PermissionDenied,
        FailedPrecondition,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        Cancelled,
        Internal,
    )
}
