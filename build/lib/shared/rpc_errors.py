"""google.rpc.Status encoding of ToolmeshError: canonical code + ErrorInfo (+ BadRequest), sent in
the `grpc-status-details-bin` trailer; and the reverse, so an error crossing several hops keeps
its code, reason and metadata."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from shared.errors import BY_CODE, ERROR_DOMAIN, ToolmeshError

DETAILS_KEY = "grpc-status-details-bin"


def to_status_code(error: ToolmeshError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, error.code, grpc.StatusCode.UNKNOWN)


def to_rich_status(error: ToolmeshError) -> status_pb2.Status:
    code = to_status_code(error)
    status = status_pb2.Status(code=code.value[0], message=error.message)
    info = error_details_pb2.ErrorInfo(
        reason=error.reason, domain=ERROR_DOMAIN, metadata=error.metadata
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    status.details.append(detail)
    if error.field_violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                for f, d in error.field_violations
            ]
        )
        detail = any_pb2.Any()
        detail.Pack(bad)
        status.details.append(detail)
    return status


def trailing_metadata(error: ToolmeshError) -> tuple[tuple[str, bytes], ...]:
    return ((DETAILS_KEY, to_rich_status(error).SerializeToString()),)


def from_rpc_error(exc: grpc.aio.AioRpcError | grpc.RpcError) -> ToolmeshError:
    """Rebuild a ToolmeshError from a failed call, keeping code, reason and metadata."""
    code_obj = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    code = code_obj.name if code_obj is not None else "UNKNOWN"
    message = (exc.details() if hasattr(exc, "details") else "") or code
    cls = BY_CODE.get(code, ToolmeshError)
    reason: str | None = None
    metadata: dict[str, str] = {}
    violations: list[tuple[str, str]] = []
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailers or ():
        if key != DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations = [(v.field, v.description) for v in bad.field_violations]
    err = cls(message, reason=reason, metadata=metadata, field_violations=violations)
    if cls is ToolmeshError:
        err.code = code
    return err
