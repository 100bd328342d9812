"""Configuration: environment variables (`TOOLMESH_*`, standard `OTEL_*`) read once into a frozen
settings object. Every default is documented here and in the README."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_PORTS: dict[str, int] = {
    "registry": 50051,
    "dispatcher": 50052,
    "sandbox": 50053,
    "mcp_bridge": 50054,
    "surface": 50055,
}
# Services implemented so far; `toolmesh up` starts exactly these. A service that is not
# implemented is never started, so nothing pretends to be it.
IMPLEMENTED_SERVICES: tuple[str, ...] = (
    "registry",
    "dispatcher",
    "sandbox",
    "mcp_bridge",
    "surface",
)
DEFAULT_COLLECTOR_PORT = 4317
# The longest retention TOOLMESH_RETENTION_DAYS and `toolmesh db prune` take (a century).
MAX_RETENTION_DAYS = 36_500
# How long a dispatched call waits for one database operation (TOOLMESH_DB_WAIT_S).
DEFAULT_DB_WAIT_S = 15.0


def _bool(value: str | None, default: bool) -> bool:
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _float(env: Mapping[str, str], key: str, default: float) -> float:
    """A number of seconds, dollars or the like: finite and not negative (every setting read
    this way is one; `nan` or `-1` made timeouts that never or always fired)."""
    raw = env.get(key, "")
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{key}={raw!r} is not a number") from exc
    if not 0 <= value < math.inf:  # NaN fails too
        raise ValueError(f"{key}={raw!r} is not a finite number of at least 0")
    return value


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    """A count, size or id: not negative (every setting read this way is one)."""
    raw = env.get(key, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"{key}={raw!r} is not an integer") from exc
    if value < 0:
        raise ValueError(f"{key}={raw!r} is negative")
    return value


def _bounded_float(
    env: Mapping[str, str], key: str, default: float, low: float, high: float
) -> float:
    value = _float(env, key, default)
    if not low <= value <= high:  # NaN fails too
        raise ValueError(f"{key}={value} is not between {low:g} and {high:g}")
    return value


def _bounded_int(env: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
    value = _int(env, key, default)
    if not low <= value <= high:
        raise ValueError(f"{key}={value} is not between {low} and {high}")
    return value


def _choice(env: Mapping[str, str], key: str, choices: tuple[str, ...], default: str) -> str:
    raw = env.get(key, "").strip().lower()
    if raw == "":
        return default
    if raw not in choices:
        raise ValueError(f"{key}={raw!r} is not one of {', '.join(choices)}")
    return raw


def _capability(env: Mapping[str, str], key: str) -> str:
    """A capability name (empty: none): at most 128 characters, no control characters or
    spaces — what a tool's required_capabilities and a caller's capabilities can hold."""
    raw = env.get(key, "").strip()
    if len(raw) > 128 or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in raw):
        raise ValueError(f"{key}={raw[:140]!r} is not a capability name (128 printable characters)")
    return raw


@dataclass(frozen=True)
class MuxSettings:
    """The mesh's call streams (shared.mux), read by every channel a service opens to another.

    enabled     TOOLMESH_MUX, default on — the mesh's internal unary calls go over call
                streams; off: plain unary RPCs.
    streams     TOOLMESH_MUX_STREAMS, default 2 — streams per channel, calls taking them in
                turn (each stream goes to one replica of the called service).
    max_age_s   TOOLMESH_MUX_MAX_AGE_S, default 60 — how long a stream takes new calls before
                a fresh one replaces it (so replicas added later get calls)."""

    enabled: bool = True
    streams: int = 2
    max_age_s: float = 60.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MuxSettings:
        env = os.environ if env is None else env
        streams = _int(env, "TOOLMESH_MUX_STREAMS", 2)
        if not 1 <= streams <= 64:
            raise ValueError(f"TOOLMESH_MUX_STREAMS={streams} is not between 1 and 64")
        max_age_s = _float(env, "TOOLMESH_MUX_MAX_AGE_S", 60.0)
        if not max_age_s > 0:
            raise ValueError(f"TOOLMESH_MUX_MAX_AGE_S={max_age_s} is not a positive number")
        return cls(
            enabled=_bool(env.get("TOOLMESH_MUX"), True), streams=streams, max_age_s=max_age_s
        )


def _endpoint(env: Mapping[str, str], key: str) -> str:
    """An OTLP endpoint: host:port or an http(s) URL (empty: none). Checked here, so that a typo
    stops the service with one line at start instead of failing every export later."""
    raw = env.get(key, "").strip()
    if not raw:
        return ""
    url = raw if "://" in raw else f"http://{raw}"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not 0..65535
    except ValueError:
        parts, port = None, None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or any(c.isspace() for c in raw)
        or (port is not None and port == 0)
    ):
        raise ValueError(f"{key}={raw!r} is not host:port or an http(s) URL")
    return raw


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
    log_group_delay_ms  TOOLMESH_LOG_GROUP_DELAY_MS, default 2 (0..100; 0 turns it off) — on
                        SQLite, while the dispatcher's event loop is saturated, how long the
                        commit of a call's log rows waits for other recent calls' rows (group
                        commit; on an idle loop a commit never waits).
    max_dataset_bytes   TOOLMESH_MAX_DATASET_BYTES, default 128 MiB — the most load_dataset reads
                        from one file (after decompression; for Parquet, its uncompressed size)
                        and the largest result query keeps for save_as.
    tool_cache_ttl_s    TOOLMESH_TOOL_CACHE_TTL_S, default 2 — registry definition cache.
    tracing             TOOLMESH_TRACING, default on — OpenTelemetry spans on every hop.
    otlp_endpoint       OTEL_EXPORTER_OTLP_ENDPOINT (standard); empty exports nothing.
    otlp_protocol       OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL
                        (standard): "grpc" (default) or "http/protobuf" — for spans.
    otlp_metrics_protocol  OTEL_EXPORTER_OTLP_METRICS_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL
                        (standard), the same choice for metrics. TLS follows the standard
                        variables (shared/telemetry/endpoints.py): an https:// endpoint, or
                        OTEL_EXPORTER_OTLP_INSECURE=false for a bare host:port, exports over TLS
                        trusting OTEL_EXPORTER_OTLP_CERTIFICATE (with _CLIENT_CERTIFICATE /
                        _CLIENT_KEY for mTLS); http:// or a bare host:port is plaintext.
    log_level           TOOLMESH_LOG_LEVEL, default INFO.
    event_loop          TOOLMESH_EVENT_LOOP, default uvloop — the services' event loop: uvloop,
                        or asyncio (the standard loop; also used when uvloop is not installed).
                        The MCP bridge always runs on asyncio's loop (services/mcp_bridge).
    mux                 TOOLMESH_MUX, TOOLMESH_MUX_STREAMS, TOOLMESH_MUX_MAX_AGE_S: the call
                        streams between services (MuxSettings).
    disabled_flags      TOOLMESH_DISABLED_FLAGS (comma-separated feature flags turned off).
    grace_s             TOOLMESH_SHUTDOWN_GRACE_S, default 5 — graceful shutdown window.
    max_in_flight       TOOLMESH_MAX_IN_FLIGHT, default 4096 (0: no limit) — calls a service
                        runs at once (health and reflection aside); past it a new call is
                        answered RESOURCE_EXHAUSTED, reason OVERLOADED, at once, instead of
                        queueing without bound.
    max_depth           TOOLMESH_MAX_CALL_DEPTH, default 8 — tool-composition nesting limit.
    handler_threads     TOOLMESH_HANDLER_THREADS, default 16 (1..1024) — worker threads the
                        registry runs sync tool handlers on, per nesting depth (a composing
                        handler's nested call never waits for its parent's thread); calls
                        beyond them wait for one, under their deadline.
    sandbox_pool_size   TOOLMESH_SANDBOX_POOL_SIZE, default 2 — pre-started single-use workers.
    sandbox_wall_s      TOOLMESH_SANDBOX_WALL_S, default 30 — a custom tool's wall-clock limit
                        (a tool's own timeout_seconds, when lower, wins).
    sandbox_cpu_s       TOOLMESH_SANDBOX_CPU_S, default 10 — its CPU-time limit.
    sandbox_memory_mb   TOOLMESH_SANDBOX_MEMORY_MB, default 512 — address space it may add.
    sandbox_output_bytes  TOOLMESH_SANDBOX_OUTPUT_BYTES, default 1 MiB — largest result.
    sandbox_max_tool_calls  TOOLMESH_SANDBOX_MAX_TOOL_CALLS, default 16 — call_tool calls per
                        execution (each call's inputs at most 1 MiB).
    sandbox_job_lease_s TOOLMESH_SANDBOX_JOB_LEASE_S, default 60 — a claimed job's lease: its
                        worker renews it every third of this; a job whose lease expired (its
                        worker died) is claimed again by any worker.
    sandbox_job_max_attempts  TOOLMESH_SANDBOX_JOB_MAX_ATTEMPTS, default 3 — claims a job gets in
                        all; one abandoned that often is failed (reason JOB_ABANDONED).
    sandbox_uid, sandbox_gid  TOOLMESH_SANDBOX_UID / TOOLMESH_SANDBOX_GID, default 65534 / 65534
                        (nobody / nogroup) — the host uid and gid custom tools run as when the
                        sandbox service runs as root (never 0); an unprivileged service runs
                        them as its own uid inside a user namespace.
    sandbox_max_concurrent  TOOLMESH_SANDBOX_MAX_CONCURRENT, default 16 — custom-tool executions
                        one sandbox process runs at once (nested ones included).
    sandbox_tenant_max_concurrent  TOOLMESH_SANDBOX_TENANT_MAX_CONCURRENT, default 4 — the most
                        of those one tenant's executions take at once (0: no cap of its own).
    sandbox_tmp_mb      TOOLMESH_SANDBOX_TMP_MB, default TOOLMESH_SANDBOX_MEMORY_MB (512) — size
                        cap of the private /tmp the sandbox's workers share (bwrap 0.8+; 0: none).
    sandbox_slot_wait_s TOOLMESH_SANDBOX_SLOT_WAIT_S, default 10 — the longest an execution waits
                        for a slot (a nested one never past its caller's wall clock); then Err
                        concurrency_limit.
    sandbox_job_workers TOOLMESH_SANDBOX_JOB_WORKERS, default 1 — tool-build job workers per
                        sandbox process (0: this replica claims no jobs).
    api_keys_file       TOOLMESH_API_KEYS_FILE, default none (every service runs open) — JSON of
                        API key digests and their tenants (shared/auth.py); when set, every
                        service given it authenticates every call (health and reflection
                        aside): the dispatcher takes the tenant from the key, and the registry,
                        sandbox, mcp_bridge and surface (shared.server.MeshAuth) require an admin
                        key for their administrative and mesh-internal RPCs and a key allowed
                        for the tenant elsewhere. Clients, and the services calling each other,
                        send TOOLMESH_API_KEY as `authorization: Bearer`.
    retention_days      TOOLMESH_RETENTION_DAYS, default 0 (keep everything) — each dispatcher
                        deletes the tool_execution_log rows and conversation_events (with their
                        blobs) older than this many days, the state, datasets and exports
                        of conversations with no call for as long, and the usage_log rows as
                        old but those of a conversation called since (dispatcher/retention.py).
    retention_interval_s  TOOLMESH_RETENTION_INTERVAL_S, default 3600 — how often it sweeps
                        (the first sweep at start).
    db_wait_s           TOOLMESH_DB_WAIT_S, default 15 (0.1 to 3600) — every service answers
                        a call UNAVAILABLE (DATABASE_UNAVAILABLE) when one database operation
                        of it has not answered within this long (a frozen server or host),
                        instead of holding it until its deadline. A write that times out may
                        still land once the database answers.
    replay_window_s     TOOLMESH_REPLAY_WINDOW_S, default 86400 (0 to 30 days; 0 turns replay
                        off) — a retried call (same tool_use id, tool and input in the
                        conversation) answered within this long is answered with its logged
                        response instead of running the tool again (DispatchToolCall).
    llm_timeout_s       TOOLMESH_LLM_TIMEOUT_S, default 120 (1 to 3600) — the longest an LLM
                        provider may stay silent within one attempt (to connect, or between two
                        events of the streamed answer); not a bound on the answer's length.
    llm_deadline_s      TOOLMESH_LLM_DEADLINE_S, default 300 (1 to 86400) — one LLM call in
                        all, every attempt and every wait between them (a tool's LLM call is
                        also bounded by the tool's own timeout).
    llm_max_retries     TOOLMESH_LLM_MAX_RETRIES, default 2 (0 to 10) — retries of a transient
                        LLM failure within the deadline.
    trace_payloads      TOOLMESH_TRACE_PAYLOADS, default off — put tool arguments and results
                        (clipped to 4 KB) on execute_tool spans.
    conversation_budget_usd
                        TOOLMESH_CONVERSATION_BUDGET_USD, default 0 (no ceiling) — the most a
                        conversation may spend (sum of its usage_log); calls beyond are refused.
    mcp_call_timeout_s  TOOLMESH_MCP_CALL_TIMEOUT_S, default 120 — an MCP tool call's timeout
                        when neither the tool nor the caller gives one.
    mcp_connect_timeout_s  TOOLMESH_MCP_CONNECT_TIMEOUT_S, default 30 — opening an MCP session
                        (process start + initialize + tools/list) must finish within it.
    mcp_restart_backoff_s  TOOLMESH_MCP_RESTART_BACKOFF_S, default 0.5 — first delay before a
                        crashed MCP server is restarted; doubles per failure up to
                        mcp_restart_backoff_max_s (TOOLMESH_MCP_RESTART_BACKOFF_MAX_S, default 30).
    mcp_hold_changed    TOOLMESH_MCP_HOLD_CHANGED, default on — an MCP tool whose definition
                        changed on reconnect is held in `testing` until approved.
    mcp_export_max_bytes  TOOLMESH_MCP_EXPORT_MAX_BYTES, default 1 GiB — the most the files an
                        MCP result's images, audio and blobs are exported to may hold together;
                        past it the oldest are deleted (their downloads then answer
                        FAILED_PRECONDITION).
    mcp_catalog_path    TOOLMESH_MCP_CATALOG, default <data_dir>/mcp_catalog.json — the local
                        catalog of installable MCP servers an admin maintains.
    mcp_destructive_capability  TOOLMESH_MCP_DESTRUCTIVE_CAPABILITY, default empty (no gating) —
                        a capability the MCP bridge adds to the required_capabilities of every
                        tool whose server declares `destructiveHint: true` (explicitly: an
                        absent hint does not gate), so only callers holding it can run (or be
                        offered) such tools; at most 128 printable characters.
    surface_embeddings  TOOLMESH_SURFACE_EMBEDDINGS, default on — search_tools fuses embedding
                        similarity with BM25 (off, or the model package absent: BM25 alone).
    surface_floor_ttl_s TOOLMESH_SURFACE_FLOOR_TTL_S, default 30 — how long a surface replica
                        caches the stored Tier-0 floor.
    surface_derive_interval_s  TOOLMESH_SURFACE_DERIVE_INTERVAL_S, default 3600 — how often the
                        surface re-derives the Tier-0 floor (0: only on demand).
    """

    data_dir: Path
    database_url: str
    host: str = "127.0.0.1"
    ports: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))
    addresses: Mapping[str, str] = field(default_factory=dict)
    data_roots: tuple[Path, ...] = ()
    tool_timeout_s: float = 300.0
    max_input_bytes: int = 4 * 1024 * 1024
    log_group_delay_ms: float = 2.0
    max_dataset_bytes: int = 128 * 1024 * 1024
    tool_cache_ttl_s: float = 2.0
    tracing: bool = True
    otlp_endpoint: str = ""
    otlp_protocol: str = "grpc"
    otlp_metrics_protocol: str = "grpc"
    log_level: str = "INFO"
    event_loop: str = "uvloop"
    mux: MuxSettings = field(default_factory=MuxSettings)
    disabled_flags: frozenset[str] = frozenset()
    grace_s: float = 5.0
    max_in_flight: int = 4096
    max_depth: int = 8
    handler_threads: int = 16
    sandbox_pool_size: int = 2
    sandbox_wall_s: float = 30.0
    sandbox_cpu_s: float = 10.0
    sandbox_memory_mb: int = 512
    sandbox_output_bytes: int = 1024 * 1024
    sandbox_max_tool_calls: int = 16
    sandbox_max_concurrent: int = 16
    sandbox_tenant_max_concurrent: int = 4
    sandbox_slot_wait_s: float = 10.0
    sandbox_tmp_mb: int = 512
    sandbox_job_workers: int = 1
    sandbox_job_lease_s: float = 60.0
    sandbox_job_max_attempts: int = 3
    sandbox_uid: int = 65534
    sandbox_gid: int = 65534
    api_keys_file: str = ""
    retention_days: float = 0.0
    retention_interval_s: float = 3600.0
    db_wait_s: float = DEFAULT_DB_WAIT_S
    replay_window_s: float = 86_400.0
    llm_timeout_s: float = 120.0
    llm_deadline_s: float = 300.0
    llm_max_retries: int = 2
    trace_payloads: bool = False
    conversation_budget_usd: float = 0.0
    mcp_call_timeout_s: float = 120.0
    mcp_connect_timeout_s: float = 30.0
    mcp_restart_backoff_s: float = 0.5
    mcp_restart_backoff_max_s: float = 30.0
    mcp_hold_changed: bool = True
    mcp_export_max_bytes: int = 1 << 30
    mcp_catalog_path: Path | None = None
    mcp_destructive_capability: str = ""
    surface_embeddings: bool = True
    surface_floor_ttl_s: float = 30.0
    surface_derive_interval_s: float = 3600.0

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
            log_group_delay_ms=_bounded_float(env, "TOOLMESH_LOG_GROUP_DELAY_MS", 2.0, 0, 100),
            max_dataset_bytes=_int(env, "TOOLMESH_MAX_DATASET_BYTES", 128 * 1024 * 1024),
            tool_cache_ttl_s=_float(env, "TOOLMESH_TOOL_CACHE_TTL_S", 2.0),
            tracing=_bool(env.get("TOOLMESH_TRACING"), True),
            otlp_endpoint=_endpoint(env, "OTEL_EXPORTER_OTLP_ENDPOINT"),
            otlp_protocol=(
                env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "grpc"
            ).strip(),
            otlp_metrics_protocol=(
                env.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "grpc"
            ).strip(),
            log_level=_choice(
                env, "TOOLMESH_LOG_LEVEL", ("debug", "info", "warning", "error", "critical"), "info"
            ).upper(),
            event_loop=_choice(env, "TOOLMESH_EVENT_LOOP", ("uvloop", "asyncio"), "uvloop"),
            mux=MuxSettings.from_env(env),
            disabled_flags=flags,
            grace_s=_float(env, "TOOLMESH_SHUTDOWN_GRACE_S", 5.0),
            max_in_flight=_bounded_int(env, "TOOLMESH_MAX_IN_FLIGHT", 4096, 0, 1 << 20),
            max_depth=_int(env, "TOOLMESH_MAX_CALL_DEPTH", 8),
            handler_threads=_bounded_int(env, "TOOLMESH_HANDLER_THREADS", 16, 1, 1024),
            sandbox_pool_size=_int(env, "TOOLMESH_SANDBOX_POOL_SIZE", 2),
            sandbox_wall_s=_float(env, "TOOLMESH_SANDBOX_WALL_S", 30.0),
            sandbox_cpu_s=_float(env, "TOOLMESH_SANDBOX_CPU_S", 10.0),
            sandbox_memory_mb=_int(env, "TOOLMESH_SANDBOX_MEMORY_MB", 512),
            sandbox_output_bytes=_int(env, "TOOLMESH_SANDBOX_OUTPUT_BYTES", 1024 * 1024),
            sandbox_max_tool_calls=_int(env, "TOOLMESH_SANDBOX_MAX_TOOL_CALLS", 16),
            sandbox_max_concurrent=_int(env, "TOOLMESH_SANDBOX_MAX_CONCURRENT", 16),
            sandbox_tenant_max_concurrent=_int(env, "TOOLMESH_SANDBOX_TENANT_MAX_CONCURRENT", 4),
            sandbox_slot_wait_s=_float(env, "TOOLMESH_SANDBOX_SLOT_WAIT_S", 10.0),
            sandbox_tmp_mb=_int(
                env, "TOOLMESH_SANDBOX_TMP_MB", _int(env, "TOOLMESH_SANDBOX_MEMORY_MB", 512)
            ),
            sandbox_job_workers=_int(env, "TOOLMESH_SANDBOX_JOB_WORKERS", 1),
            sandbox_job_lease_s=_float(env, "TOOLMESH_SANDBOX_JOB_LEASE_S", 60.0),
            sandbox_job_max_attempts=_int(env, "TOOLMESH_SANDBOX_JOB_MAX_ATTEMPTS", 3),
            sandbox_uid=_int(env, "TOOLMESH_SANDBOX_UID", 65534),
            sandbox_gid=_int(env, "TOOLMESH_SANDBOX_GID", 65534),
            api_keys_file=env.get("TOOLMESH_API_KEYS_FILE", ""),
            trace_payloads=_bool(env.get("TOOLMESH_TRACE_PAYLOADS"), False),
            conversation_budget_usd=_float(env, "TOOLMESH_CONVERSATION_BUDGET_USD", 0.0),
            retention_days=_bounded_float(
                env, "TOOLMESH_RETENTION_DAYS", 0.0, 0, MAX_RETENTION_DAYS
            ),
            retention_interval_s=_bounded_float(
                env, "TOOLMESH_RETENTION_INTERVAL_S", 3600.0, 0.01, 7 * 86_400
            ),
            db_wait_s=_bounded_float(env, "TOOLMESH_DB_WAIT_S", DEFAULT_DB_WAIT_S, 0.1, 3600),
            replay_window_s=_bounded_float(
                env, "TOOLMESH_REPLAY_WINDOW_S", 86_400.0, 0, 30 * 86_400
            ),
            llm_timeout_s=_bounded_float(env, "TOOLMESH_LLM_TIMEOUT_S", 120.0, 1, 3600),
            llm_deadline_s=_bounded_float(env, "TOOLMESH_LLM_DEADLINE_S", 300.0, 1, 86_400),
            llm_max_retries=_bounded_int(env, "TOOLMESH_LLM_MAX_RETRIES", 2, 0, 10),
            mcp_call_timeout_s=_float(env, "TOOLMESH_MCP_CALL_TIMEOUT_S", 120.0),
            mcp_export_max_bytes=_bounded_int(
                env, "TOOLMESH_MCP_EXPORT_MAX_BYTES", 1 << 30, 1 << 20, 1 << 50
            ),
            mcp_connect_timeout_s=_float(env, "TOOLMESH_MCP_CONNECT_TIMEOUT_S", 30.0),
            mcp_restart_backoff_s=_float(env, "TOOLMESH_MCP_RESTART_BACKOFF_S", 0.5),
            mcp_restart_backoff_max_s=_float(env, "TOOLMESH_MCP_RESTART_BACKOFF_MAX_S", 30.0),
            mcp_hold_changed=_bool(env.get("TOOLMESH_MCP_HOLD_CHANGED"), True),
            mcp_catalog_path=Path(
                env.get("TOOLMESH_MCP_CATALOG") or data_dir / "mcp_catalog.json"
            ).resolve(),
            mcp_destructive_capability=_capability(env, "TOOLMESH_MCP_DESTRUCTIVE_CAPABILITY"),
            surface_embeddings=_bool(env.get("TOOLMESH_SURFACE_EMBEDDINGS"), True),
            surface_floor_ttl_s=_float(env, "TOOLMESH_SURFACE_FLOOR_TTL_S", 30.0),
            surface_derive_interval_s=_float(env, "TOOLMESH_SURFACE_DERIVE_INTERVAL_S", 3600.0),
        )

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    def address(self, service: str) -> str:
        """Where clients reach `service`; empty when it is not configured."""
        return self.addresses.get(service, "")
