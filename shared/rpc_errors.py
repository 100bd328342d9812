"""google.rpc.Status encoding of ToolmeshError: canonical code + ErrorInfo (+ BadRequest), sent in
the `grpc-status-details-bin` trailer; and the reverse, so an error crossing several hops keeps
its code, reason and metadata."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from shared.errors import BY_CODE, ERROR_DOMAIN, ToolmeshError

DETAILS_KEY = "grpc-status-details-bin"


# What an error status carries is bounded, in bytes: the message goes out as the grpc-message
# header (percent-encoded, so a non-ASCII byte takes three) and again, with the details, in a
# binary trailer (base64), and a client drops a call whose headers pass 16 KB
# (RESOURCE_EXHAUSTED, "metadata size exceeds hard limit") — which is what an error quoting a
# client's 100 KB id became; past 8 KB (the soft limit) it may be dropped. At most ~1.8 KB of
# message and ~4 KB of trailer go out.
MAX_MESSAGE_BYTES = 600
MAX_DETAIL_BYTES = 200
MAX_DETAILS_BYTES = 1500
MAX_DETAILS = 16


def _clip(text: str, max_bytes: int) -> str:
    """`text`, or as much of it as fits `max_bytes` of UTF-8 and how long it was."""
    encoded = text.encode("utf-8", "replace")
    if len(encoded) <= max_bytes:
        return text
    kept = encoded[:max_bytes].decode("utf-8", "ignore")
    return f"{kept}… ({len(text)} characters)"


def status_message(error: ToolmeshError) -> str:
    """The error's message as it goes out on the wire."""
    return _clip(error.message, MAX_MESSAGE_BYTES)


def _bounded(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Clipped pairs, as many as fit MAX_DETAILS and MAX_DETAILS_BYTES in all."""
    kept: list[tuple[str, str]] = []
    total = 0
    for key, value in pairs[:MAX_DETAILS]:
        pair = (_clip(key, MAX_DETAIL_BYTES), _clip(value, MAX_DETAIL_BYTES))
        total += len(pair[0].encode("utf-8", "replace")) + len(pair[1].encode("utf-8", "replace"))
        if total > MAX_DETAILS_BYTES:
            break
        kept.append(pair)
    return kept


def to_status_code(error: ToolmeshError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, error.code, grpc.StatusCode.UNKNOWN)


def to_rich_status(error: ToolmeshError) -> status_pb2.Status:
    code = to_status_code(error)
    status = status_pb2.Status(code=code.value[0], message=status_message(error))
    info = error_details_pb2.ErrorInfo(
        reason=_clip(error.reason, MAX_DETAIL_BYTES),
        domain=ERROR_DOMAIN,
        metadata=dict(_bounded(list(error.metadata.items()))),
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    status.details.append(detail)
    if error.field_violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                for f, d in _bounded(list(error.field_violations))
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
