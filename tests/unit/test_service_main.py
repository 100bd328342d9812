"""The services' event loop: uvloop by default, asyncio's own with TOOLMESH_EVENT_LOOP=asyncio;
a misspelt choice is refused when the settings are read."""

from __future__ import annotations

import asyncio
import gc
import threading
from pathlib import Path

import pytest
import sniffio
import uvloop

from shared.config import Settings
from shared.service_main import freeze_startup_heap, loop_factory, run


def test_the_event_loop_setting_defaults_to_uvloop_and_refuses_unknown_loops() -> None:
    assert Settings.from_env({}).event_loop == "uvloop"
    assert Settings.from_env({"TOOLMESH_EVENT_LOOP": " AsyncIO "}).event_loop == "asyncio"
    with pytest.raises(ValueError, match="TOOLMESH_EVENT_LOOP='trio' is not one of"):
        Settings.from_env({"TOOLMESH_EVENT_LOOP": "trio"})


def test_the_log_level_is_one_of_loggings_levels_in_any_case() -> None:
    assert Settings.from_env({}).log_level == "INFO"
    assert Settings.from_env({"TOOLMESH_LOG_LEVEL": "warning"}).log_level == "WARNING"
    with pytest.raises(ValueError, match="TOOLMESH_LOG_LEVEL='loud' is not one of debug, info"):
        Settings.from_env({"TOOLMESH_LOG_LEVEL": "LOUD"})


@pytest.mark.parametrize(("choice", "loop_type"), [("uvloop", uvloop.Loop), ("asyncio", None)])
def test_a_service_runs_on_the_loop_it_is_configured_with(
    choice: str, loop_type: type | None
) -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        seen.append(asyncio.get_running_loop())

    run(main(), event_loop=choice)
    (loop,) = seen
    if loop_type is None:
        assert loop_factory(choice) is None
        assert not isinstance(loop, uvloop.Loop)
    else:
        assert isinstance(loop, loop_type)


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_the_loops_thread_tells_sniffio_it_runs_asyncio_and_only_that_thread(choice: str) -> None:
    """anyio (the MCP SDK, HTTP clients) asks sniffio which library runs on every stream
    operation: the service's loop thread answers from its thread-local at once."""
    seen: dict[str, object] = {}

    async def main() -> None:
        seen["loop thread"] = sniffio.thread_local.name
        seen["library"] = sniffio.current_async_library()
        seen["worker thread"] = await asyncio.to_thread(lambda: sniffio.thread_local.name)

    thread = threading.Thread(target=run, args=(main(),), kwargs={"event_loop": choice})
    thread.start()
    thread.join(30)
    assert seen == {"loop thread": "asyncio", "library": "asyncio", "worker thread": None}
    assert sniffio.thread_local.name is None  # this (the test's) thread was left alone


def test_the_start_up_heap_is_frozen_out_of_the_collectors_reach() -> None:
    class Node:
        pass

    before = Node()
    gc.unfreeze()
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0
        # What existed at freeze time is out of every generation; what comes later is not.
        assert not any(o is before for o in gc.get_objects())
        after = Node()
        assert any(o is after for o in gc.get_objects())
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("service", ["registry", "dispatcher", "sandbox", "mcp_bridge", "surface"])
def test_every_service_is_served_by_the_shared_lifecycle(service: str) -> None:
    source = (Path(__file__).parents[2] / "services" / service / "__main__.py").read_text()
    assert "await serve_service(" in source


async def test_a_service_binds_then_freezes_its_heap_announces_and_stops_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """on_bound sees the bound port before readiness is announced, the start-up heap is frozen
    by then, and a stop drains, runs on_stop, then flushes telemetry."""
    from grpc_health.v1 import health_pb2_grpc

    from shared import service_lifecycle
    from shared.server import ServiceBinding

    steps: list[str] = []
    monkeypatch.setattr(
        service_lifecycle,
        "announce_ready",
        lambda service, address: steps.append(
            f"ready {service} frozen={gc.get_freeze_count() > 0}"
        ),
    )
    monkeypatch.setattr(service_lifecycle, "shutdown_tracing", lambda: steps.append("tracing"))
    monkeypatch.setattr(service_lifecycle, "shutdown_metrics", lambda: steps.append("metrics"))
    stop = asyncio.Event()
    bound_ports: list[int] = []

    async def on_bound(port: int) -> None:
        bound_ports.append(port)
        steps.append("bound")
        stop.set()  # stop at once: the service still announces, then drains

    async def on_stop() -> None:
        steps.append("on_stop")
        raise RuntimeError("a failing release still lets telemetry flush")

    class Health(health_pb2_grpc.HealthServicer):
        pass

    binding = ServiceBinding(
        health_pb2_grpc.add_HealthServicer_to_server, Health(), "grpc.health.v1.Health.Unused"
    )
    settings = Settings.from_env({"TOOLMESH_TRACING": "0", "TOOLMESH_SHUTDOWN_GRACE_S": "0.1"})
    gc.unfreeze()
    try:
        with pytest.raises(RuntimeError, match="a failing release"):
            await service_lifecycle.serve_service(
                "probe", settings, 0, binding, stop=stop, on_stop=on_stop, on_bound=on_bound
            )
    finally:
        gc.unfreeze()
    assert bound_ports and bound_ports[0] > 0
    assert steps == ["bound", "ready probe frozen=True", "on_stop", "tracing", "metrics"]


@pytest.mark.parametrize(
    "endpoint", ["127.0.0.1:4317", "http://collector:4317", "https://otel.example.com", "[::1]:1"]
)
def test_an_otlp_endpoint_is_host_port_or_an_http_url(endpoint: str) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f" {endpoint} "}
    assert Settings.from_env(env).otlp_endpoint == endpoint


@pytest.mark.parametrize("endpoint", ["bad endpoint", "host:99999", "ftp://x:1", "http://", ":1"])
def test_a_malformed_otlp_endpoint_stops_the_service_at_start(endpoint: str) -> None:
    with pytest.raises(ValueError, match="is not host:port or an http\\(s\\) URL"):
        Settings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
