"""OTLP export honours the standard transport settings: an https:// endpoint (or
OTEL_EXPORTER_OTLP_INSECURE=false) exports over TLS, trusting OTEL_EXPORTER_OTLP_CERTIFICATE and
presenting the client certificate and key when given; http:// or a bare host:port stays
plaintext (the local span store of `toolmesh up`); OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL picks
the HTTP/protobuf metric exporter."""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import socket
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from shared.config import Settings
from shared.telemetry import metrics, semconv
from shared.telemetry.collector import CollectorThread, MemorySpanSink
from shared.telemetry.endpoints import grpc_insecure, http_url
from shared.telemetry.otlp import FastOTLPSpanExporter
from shared.telemetry.tracing import span_exporter

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

SPAN_NAME = "tls-probe-span-name"
_OTEL_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_METRICS_INSECURE",
    "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _OTEL_VARS:
        monkeypatch.delenv(name, raising=False)


# --- a throw-away PKI ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> Any:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(
    subject: str, key: Any, issuer: Any, issuer_key: Any, *, ca: bool, sans: list[Any]
) -> Any:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_key(path: Path, key: Any) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _write_cert(path: Path, cert: Any) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _issue(
        "toolmesh test CA", ca_key, _name("toolmesh test CA"), ca_key, ca=True, sans=[]
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _issue(
        "localhost",
        server_key,
        ca_cert.subject,
        ca_key,
        ca=False,
        sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _issue("toolmesh-client", client_key, ca_cert.subject, ca_key, ca=False, sans=[])
    return Pki(
        ca=_write_cert(root / "ca.pem", ca_cert),
        server_cert=_write_cert(root / "server.pem", server_cert),
        server_key=_write_key(root / "server.key", server_key),
        client_cert=_write_cert(root / "client.pem", client_cert),
        client_key=_write_key(root / "client.key", client_key),
    )


# --- a TLS-only OTLP/gRPC receiver, behind a proxy that records what goes over the wire --------


@dataclass
class Received:
    spans: list[str] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    event: threading.Event = field(default_factory=threading.Event)


class _Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                self.received.spans.extend(s.name for s in ss.spans)
        self.received.event.set()
        return trace_service_pb2.ExportTraceServiceResponse()


class _Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                self.received.metrics.extend(m.name for m in sm.metrics)
        self.received.event.set()
        return metrics_service_pb2.ExportMetricsServiceResponse()


class RecordingProxy:
    """A TCP relay to `target_port` that keeps every byte the client sent."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sent = bytearray()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if record:
                    with self._lock:
                        self.sent.extend(chunk)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            s.close()


@dataclass
class TlsReceiver:
    received: Received
    proxy: RecordingProxy


def _tls_receiver(pki: Pki, *, require_client_auth: bool) -> Iterator[TlsReceiver]:
    received = Received()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Traces(received), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Metrics(received), server)
    creds = grpc.ssl_server_credentials(
        [(pki.server_key.read_bytes(), pki.server_cert.read_bytes())],
        root_certificates=pki.ca.read_bytes() if require_client_auth else None,
        require_client_auth=require_client_auth,
    )
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    proxy = RecordingProxy(port)
    try:
        yield TlsReceiver(received, proxy)
    finally:
        proxy.close()
        server.stop(grace=None)


@pytest.fixture
def tls(pki: Pki) -> Iterator[TlsReceiver]:
    yield from _tls_receiver(pki, require_client_auth=False)


@pytest.fixture
def mtls(pki: Pki) -> Iterator[TlsReceiver]:
    yield from _tls_receiver(pki, require_client_auth=True)


def _settings(endpoint: str, **env: str) -> Settings:
    return Settings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, **env})


def _export_one_span(settings: Settings) -> Any:
    exporter = span_exporter(settings)
    provider = TracerProvider(resource=Resource.create({"service.name": "toolmesh-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        with provider.get_tracer("toolmesh").start_as_current_span(SPAN_NAME):
            pass
    finally:
        provider.shutdown()
    return exporter


def _assert_tls_only(proxy: RecordingProxy) -> None:
    sent = bytes(proxy.sent)
    assert sent, "nothing reached the receiver"
    assert sent[:1] == b"\x16", "the first bytes are not a TLS handshake record"
    assert b"PRI * HTTP/2.0" not in sent  # no plaintext HTTP/2 preface
    assert SPAN_NAME.encode() not in sent  # the span went encrypted
    assert b"toolmesh-test" not in sent


# --- spans ----------------------------------------------------------------------------------------


def test_an_https_endpoint_with_the_ca_exports_spans_over_tls_only(
    tls: TlsReceiver, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki.ca))
    exporter = _export_one_span(_settings(f"https://localhost:{tls.proxy.port}"))
    assert isinstance(exporter, FastOTLPSpanExporter)  # the fast encoder is still the one used
    assert tls.received.event.wait(10)
    assert tls.received.spans == [SPAN_NAME]
    _assert_tls_only(tls.proxy)


def test_insecure_false_makes_a_bare_host_port_tls(
    tls: TlsReceiver, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "false")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki.ca))
    _export_one_span(_settings(f"localhost:{tls.proxy.port}"))
    assert tls.received.event.wait(10)
    assert tls.received.spans == [SPAN_NAME]
    _assert_tls_only(tls.proxy)


def test_the_client_certificate_and_key_are_presented_for_mtls(
    mtls: TlsReceiver, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki.ca))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", str(pki.client_cert))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CLIENT_KEY", str(pki.client_key))
    _export_one_span(_settings(f"https://127.0.0.1:{mtls.proxy.port}"))
    assert mtls.received.event.wait(10)
    assert mtls.received.spans == [SPAN_NAME]
    _assert_tls_only(mtls.proxy)


def test_an_untrusted_server_gets_no_spans(
    tls: TlsReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No CA given: the system roots do not trust the throw-away CA, so nothing is exported
    # (and nothing falls back to plaintext).
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    _export_one_span(_settings(f"https://localhost:{tls.proxy.port}"))
    assert not tls.received.spans
    assert b"PRI * HTTP/2.0" not in bytes(tls.proxy.sent)


@pytest.mark.parametrize("scheme", ["", "http://"])
def test_a_bare_or_http_endpoint_stays_plaintext(scheme: str) -> None:
    sink = MemorySpanSink()
    with CollectorThread(sink) as collector:
        exporter = _export_one_span(_settings(f"{scheme}127.0.0.1:{collector.port}"))
        assert isinstance(exporter, FastOTLPSpanExporter)
        spans = sink.wait_for_sync(lambda s: s.name == SPAN_NAME, timeout=10)
    assert [s.name for s in spans] == [SPAN_NAME]


def test_the_insecure_decision_follows_the_standard_variables() -> None:
    assert grpc_insecure("https://c:4317", "traces", {}) is False
    assert grpc_insecure("http://c:4317", "traces", {"OTEL_EXPORTER_OTLP_INSECURE": "false"})
    assert grpc_insecure("c:4317", "traces", {}) is True
    # Set for a bare host:port: the exporter reads the variable itself.
    assert grpc_insecure("c:4317", "traces", {"OTEL_EXPORTER_OTLP_INSECURE": "false"}) is None
    assert grpc_insecure("c:4317", "metrics", {"OTEL_EXPORTER_OTLP_METRICS_INSECURE": "x"}) is None
    assert grpc_insecure("c:4317", "metrics", {"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "x"}) is True
    assert http_url("c:4318", "metrics") == "http://c:4318/v1/metrics"
    assert http_url("https://c:4318/", "traces") == "https://c:4318/v1/traces"


# --- metrics ------------------------------------------------------------------------------------


@pytest.fixture
def metrics_setup(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """setup_metrics for real, without making its MeterProvider the process's global one."""
    monkeypatch.setattr(metrics.metrics, "set_meter_provider", lambda provider: None)
    try:
        yield
    finally:
        metrics.shutdown_metrics()


def _record_and_flush(settings: Settings) -> None:
    metrics.setup_metrics("unit", settings)
    assert metrics._provider is not None
    metrics.record_tool_call("ping", "function", "ok", 0.01)
    metrics.shutdown_metrics()  # drains, then force_flush exports


def test_metrics_go_over_tls_to_an_https_endpoint(
    tls: TlsReceiver, pki: Pki, metrics_setup: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki.ca))
    _record_and_flush(_settings(f"https://localhost:{tls.proxy.port}"))
    assert tls.received.event.wait(10)
    assert semconv.METRIC_TOOL_CALLS in tls.received.metrics
    sent = bytes(tls.proxy.sent)
    assert sent[:1] == b"\x16" and semconv.METRIC_TOOL_CALLS.encode() not in sent


class _Recorder(http.server.BaseHTTPRequestHandler):
    posts: list[tuple[str, str, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.posts.append((self.path, self.headers.get("Content-Type", ""), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_receiver() -> Iterator[tuple[int, list[tuple[str, str, bytes]]]]:
    posts: list[tuple[str, str, bytes]] = []
    handler = type("Handler", (_Recorder,), {"posts": posts})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], posts
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"]
)
def test_http_protobuf_metrics_are_posted_to_v1_metrics(
    variable: str,
    http_receiver: tuple[int, list[tuple[str, str, bytes]]],
    metrics_setup: None,
) -> None:
    port, posts = http_receiver
    settings = _settings(f"127.0.0.1:{port}", **{variable: "http/protobuf"})
    assert settings.otlp_metrics_protocol == "http/protobuf"
    _record_and_flush(settings)
    assert posts, "no POST reached the HTTP receiver"
    path, content_type, body = posts[0]
    assert path == "/v1/metrics"
    assert content_type == "application/x-protobuf"
    request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
    names = {
        m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    assert semconv.METRIC_TOOL_CALLS in names


def test_the_metrics_protocol_defaults_to_grpc_and_has_its_own_variable() -> None:
    assert Settings.from_env({}).otlp_metrics_protocol == "grpc"
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http"}
    settings = Settings.from_env(env)
    assert (settings.otlp_protocol, settings.otlp_metrics_protocol) == ("grpc", "http")
    exporter = metrics.metric_exporter(_settings("127.0.0.1:1", **env))
    assert type(exporter).__module__.startswith("opentelemetry.exporter.otlp.proto.http")
    exporter.shutdown()
    exporter = metrics.metric_exporter(_settings("127.0.0.1:1"))
    assert type(exporter).__module__.startswith("opentelemetry.exporter.otlp.proto.grpc")
    exporter.shutdown()
