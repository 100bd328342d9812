"""Where and how the OTLP exporters connect: the standard OTEL_EXPORTER_OTLP_* semantics, applied
by the OpenTelemetry exporters themselves, with one toolmesh default.

gRPC: the endpoint goes to the exporter as given. `https://host:port` is TLS; `http://host:port`
is plaintext; for a bare `host:port` OTEL_EXPORTER_OTLP_INSECURE (or its signal-specific
variant, which wins) decides, as the OTLP exporter specification has it. TLS trusts
OTEL_EXPORTER_OTLP_CERTIFICATE (a PEM CA bundle; the system roots without one) and presents
OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE / _CLIENT_KEY when set (mTLS), or their signal-specific
variants — all read by the exporter. The one difference from the library's defaults: a bare
`host:port` with no INSECURE variable set is plaintext, as a local collector (the span store of
`toolmesh up`) expects, where the library would try TLS.

HTTP/protobuf: the URL is the endpoint plus the signal's path (`/v1/traces`, `/v1/metrics`),
`http://` when the endpoint has no scheme; the exporter reads the same certificate variables
for an https:// URL."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

Signal = Literal["traces", "metrics"]
HTTP_PROTOCOLS = ("http/protobuf", "http")


def has_scheme(endpoint: str) -> bool:
    return endpoint.lower().startswith(("http://", "https://"))


def grpc_insecure(
    endpoint: str, signal: Signal, env: Mapping[str, str] | None = None
) -> bool | None:
    """The `insecure` argument for a gRPC exporter of `signal`. The scheme decides when there is
    one (https:// is TLS, http:// plaintext: the INSECURE variables apply only to an endpoint
    without a scheme). For a bare host:port, None when OTEL_EXPORTER_OTLP_<SIGNAL>_INSECURE or
    OTEL_EXPORTER_OTLP_INSECURE is set (the exporter reads them), else True (plaintext)."""
    env = os.environ if env is None else env
    scheme = endpoint.split("://", 1)[0].lower() if "://" in endpoint else ""
    if scheme == "https":
        return False
    if scheme == "http":
        return True
    if f"OTEL_EXPORTER_OTLP_{signal.upper()}_INSECURE" in env:
        return None
    if "OTEL_EXPORTER_OTLP_INSECURE" in env:
        return None
    return True


def http_url(endpoint: str, signal: Signal) -> str:
    """The OTLP/HTTP URL of `signal` under a base endpoint (host:port or an http(s) URL)."""
    base = endpoint.rstrip("/")
    if not has_scheme(base):
        base = f"http://{base}"
    return f"{base}/v1/{signal}"
