"""Configuration: environment variables (`TOOLMESH_*`, standard `OTEL_*`) read once into a frozen
settings object. Every default is documented here and in the README."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

DEFAULT_PORTS: dict[str, int] = {
    "registry": 50051,
    "dispatcher": 50052,
    "sandbox": 50053,
    "mcp_bridge": 50054,
    "surface": 50055,
}
# Services implemented so far; `toolmesh up` starts exactly these. A service that is not
# implemented is never started, so nothing pretends to be it.
IMPLEMENTED_SERVICES: tuple[str, ...] = ("registry", "dispatcher")
DEFAULT_COLLECTOR_PORT = 4317


def _bool(value: str | None, default: bool) -> bool:
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _float(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key, "")
    if raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"{key}={raw!r} is not a number") from exc


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"{key}={raw!r} is not an integer") from exc


@dataclass(frozen=True)
class Settings:
    """Everything a toolmesh process is configured by.

    data_dir            TOOLMESH_DATA_DIR, default ./.toolmesh — SQLite file, datasets, files.
    database_url        TOOLMESH_DATABASE_URL, default sqlite:///<data_dir>/toolmesh.db.
    host                TOOLMESH_HOST, default 127.0.0.1 — the address services bind.
    ports               TOOLMESH_<SERVICE>_PORT, defaults 50051..50055.
    addresses           TOOLMESH_<SERVICE>_ADDR — where clients reach a service; defaults to
                        host:port for implemented services, empty (not configured) otherwise.
    data_roots          TOOLMESH_DATA_ROOTS (os.pathsep-separated), default <data_dir>/files —
                        the only directories load_dataset may read.
    tool_timeout_s      TOOLMESH_TOOL_TIMEOUT_S, default 300 — per-call timeout.
    max_input_bytes     TOOLMESH_MAX_INPUT_BYTES, default 4 MiB — largest accepted tool input.
    tool_cache_ttl_s    TOOLMESH_TOOL_CACHE_TTL_S, default 2 — registry definition cache.
    tracing             TOOLMESH_TRACING, default on — OpenTelemetry spans on every hop.
    otlp_endpoint       OTEL_EXPORTER_OTLP_ENDPOINT (standard); empty exports nothing.
    log_level           TOOLMESH_LOG_LEVEL, default INFO.
    disabled_flags      TOOLMESH_DISABLED_FLAGS (comma-separated feature flags turned off).
    grace_s             TOOLMESH_SHUTDOWN_GRACE_S, default 5 — graceful shutdown window.
    max_depth           TOOLMESH_MAX_CALL_DEPTH, default 8 — tool-composition nesting limit.
    """

    data_dir: Path
    database_url: str
    host: str = "127.0.0.1"
    ports: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))
    addresses: Mapping[str, str] = field(default_factory=dict)
    data_roots: tuple[Path, ...] = ()
    tool_timeout_s: float = 300.0
    max_input_bytes: int = 4 * 1024 * 1024
    tool_cache_ttl_s: float = 2.0
    tracing: bool = True
    otlp_endpoint: str = ""
    log_level: str = "INFO"
    disabled_flags: frozenset[str] = frozenset()
    grace_s: float = 5.0
    max_depth: int = 8

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        data_dir = Path(env.get("TOOLMESH_DATA_DIR") or ".toolmesh").resolve()
        database_url = env.get("TOOLMESH_DATABASE_URL") or f"sqlite:///{data_dir / 'toolmesh.db'}"
        host = env.get("TOOLMESH_HOST") or "127.0.0.1"
        ports = {
            name: _int(env, f"TOOLMESH_{name.upper()}_PORT", default)
            for name, default in DEFAULT_PORTS.items()
        }
        addresses: dict[str, str] = {}
        for name in DEFAULT_PORTS:
            key = f"TOOLMESH_{name.upper()}_ADDR"
            if key in env:
                addresses[name] = env[key]
            elif name in IMPLEMENTED_SERVICES:
                addresses[name] = f"{host}:{ports[name]}"
            else:
                addresses[name] = ""
        roots_raw = env.get("TOOLMESH_DATA_ROOTS", "")
        roots = tuple(Path(p).resolve() for p in roots_raw.split(os.pathsep) if p) or (
            data_dir / "files",
        )
        flags = frozenset(
            f.strip() for f in env.get("TOOLMESH_DISABLED_FLAGS", "").split(",") if f.strip()
        )
        return cls(
            data_dir=data_dir,
            database_url=database_url,
            host=host,
            ports=ports,
            addresses=addresses,
            data_roots=roots,
            tool_timeout_s=_float(env, "TOOLMESH_TOOL_TIMEOUT_S", 300.0),
            max_input_bytes=_int(env, "TOOLMESH_MAX_INPUT_BYTES", 4 * 1024 * 1024),
            tool_cache_ttl_s=_float(env, "TOOLMESH_TOOL_CACHE_TTL_S", 2.0),
            tracing=_bool(env.get("TOOLMESH_TRACING"), True),
            otlp_endpoint=env.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
            log_level=env.get("TOOLMESH_LOG_LEVEL") or "INFO",
            disabled_flags=flags,
            grace_s=_float(env, "TOOLMESH_SHUTDOWN_GRACE_S", 5.0),
            max_depth=_int(env, "TOOLMESH_MAX_CALL_DEPTH", 8),
        )

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    def address(self, service: str) -> str:
        """Where clients reach `service`; empty when it is not configured."""
        return self.addresses.get(service, "")
