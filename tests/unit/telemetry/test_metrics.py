"""Metrics are measured off the request path: a record only queues it, and every collection
(periodic, force_flush, shutdown) first feeds the queue to the SDK, so nothing taken before a
collection is missing from it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from shared.telemetry import metrics, semconv


@pytest.fixture
def reader() -> Iterator[Any]:
    made = metrics.draining(InMemoryMetricReader)()
    metrics.install("unit", made, set_global=False)
    try:
        yield made
    finally:
        metrics.shutdown_metrics()


def _points(reader: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def test_a_collection_sees_every_measurement_taken_before_it(reader: Any) -> None:
    for i in range(2500):  # more than one drain batch
        metrics.record_tool_call("ping", "function", "ok" if i % 5 else "err", 0.002)
    metrics.record_cost("tenant-a", "call_llm", 0.25)
    points = _points(reader)
    durations = points[semconv.METRIC_EXECUTE_TOOL_DURATION]
    assert sum(p.count for p in durations) == 2500
    calls = {p.attributes["toolmesh.outcome"]: p.value for p in points[semconv.METRIC_TOOL_CALLS]}
    assert calls == {"ok": 2000, "err": 500}
    (cost,) = points[semconv.METRIC_COST]
    assert cost.value == pytest.approx(0.25)
    assert cost.attributes[semconv.TOOLMESH_TENANT_ID] == "tenant-a"


def test_recording_only_queues_and_the_feeder_drains_in_the_background(reader: Any) -> None:
    metrics.record_tool_call("ping", "function", "ok", 0.001)
    assert len(metrics._pending.queue) == 2  # a duration and an outcome count
    deadline = time.monotonic() + 5 * metrics.DRAIN_INTERVAL_S
    while metrics._pending.queue and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not metrics._pending.queue


def test_a_bad_measurement_is_dropped_and_the_rest_still_arrive(reader: Any) -> None:
    metrics._pending.add(semconv.METRIC_EXECUTE_TOOL_DURATION, "not a number", {})  # type: ignore[arg-type]
    metrics.record_tool_call("ping", "function", "ok", 0.001)
    points = _points(reader)
    assert sum(p.count for p in points[semconv.METRIC_EXECUTE_TOOL_DURATION]) >= 1


def test_without_a_provider_nothing_is_queued() -> None:
    assert metrics._provider is None
    metrics.record_tool_call("ping", "function", "ok", 0.001)
    assert not metrics._pending.queue


def test_counter_additions_reach_the_sdk_summed_per_attribute_set(
    reader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = metrics._instrument
    adds: list[tuple[str, float]] = []

    class Counting:
        def __init__(self, name: str) -> None:
            self.name, self.inner = name, real(name)

        def add(self, value: float, attrs: dict[str, Any]) -> None:
            adds.append((self.name, value))
            self.inner.add(value, attrs)

        def record(self, value: float, attrs: dict[str, Any]) -> None:
            self.inner.record(value, attrs)

    monkeypatch.setattr(metrics, "_instrument", Counting)
    for i in range(300):
        metrics.record_tool_call("ping", "function", "ok" if i % 3 else "err", 0.001)
    metrics._pending.add(semconv.METRIC_TOOL_CALLS, "one", {})  # type: ignore[arg-type]
    metrics.record_cost("tenant-a", "call_llm", 0.5)
    metrics.record_cost("tenant-a", "call_llm", 0.25)
    points = _points(reader)
    calls = {p.attributes["toolmesh.outcome"]: p.value for p in points[semconv.METRIC_TOOL_CALLS]}
    assert calls == {"ok": 200, "err": 100}  # the bad addition dropped, the rest whole
    assert sum(p.count for p in points[semconv.METRIC_EXECUTE_TOOL_DURATION]) == 300
    (cost,) = points[semconv.METRIC_COST]
    assert cost.value == pytest.approx(0.75)
    # One SDK addition per attribute set and drain, not one per call (the background feeder
    # may drain once in the middle; the bad addition is tried alone).
    tool_calls = [value for name, value in adds if name == semconv.METRIC_TOOL_CALLS]
    assert "one" in tool_calls
    numbers = [v for v in tool_calls if v != "one"]
    assert sum(numbers) == 300 and len(numbers) <= 4
