"""Fixtures of the contract tests: throw-away tool names whose specs are removed afterwards, and
a context carrying its own counters (as the registry's context does)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from shared.contract import ContractCounters
from shared.contract.spec import unregister_spec


@dataclass
class FakeContext:
    """The one thing the contract boundary reads from a context: where to count."""

    contract_recorder: ContractCounters = field(default_factory=ContractCounters)


@pytest.fixture
def tool_name() -> Iterator[str]:
    """A unique tool name; its spec is unregistered after the test."""
    name = f"test_tool_{uuid.uuid4().hex[:8]}"
    yield name
    unregister_spec(name)


@pytest.fixture
def context() -> FakeContext:
    return FakeContext()
