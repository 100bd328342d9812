"""Telemetry shared by every service: OpenTelemetry tracing setup, the gRPC tracing/error
interceptor, trace-aware logging, and a local OTLP receiver (collector.py)."""
