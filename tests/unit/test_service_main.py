"""The services' event loop: uvloop by default, asyncio's own with TOOLMESH_EVENT_LOOP=asyncio;
a misspelt choice is refused when the settings are read."""

from __future__ import annotations

import asyncio
import gc
import re
from pathlib import Path

import pytest
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
def test_every_service_freezes_its_heap_just_before_it_announces_readiness(service: str) -> None:
    source = (Path(__file__).parents[2] / "services" / service / "__main__.py").read_text()
    assert re.search(r"freeze_startup_heap\(\)\n\s*announce_ready\(", source)


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
