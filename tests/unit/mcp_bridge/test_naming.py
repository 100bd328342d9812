"""Registered names of MCP tools and the pinned definition hash."""

from __future__ import annotations

import re

import pytest

from services.mcp_bridge.model import McpTool, ServerConfig, redact_url
from services.mcp_bridge.naming import (
    assign_names,
    base_name,
    check_connection_name,
    definition_hash,
    parse_implementation,
)
from shared.errors import InvalidArgument

VALID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def test_a_plain_tool_is_mcp_conn_tool() -> None:
    names, renamed = assign_names("srv", ["search"])
    assert names == {"search": "mcp_srv_search"}
    assert renamed == []


def test_unsafe_characters_are_replaced_and_reported() -> None:
    names, renamed = assign_names("srv", ["get-tiny-image", "a.b c/d"])
    assert names["get-tiny-image"] == "mcp_srv_get-tiny-image"
    assert names["a.b c/d"] == "mcp_srv_a_b_c_d"
    assert renamed == ["a.b c/d -> mcp_srv_a_b_c_d"]


def test_a_name_over_64_characters_is_cut_with_a_distinguishing_digest() -> None:
    long_a, long_b = "x" * 80 + "a", "x" * 80 + "b"
    names, renamed = assign_names("srv", [long_a, long_b])
    assert all(VALID.match(n) and len(n) == 64 for n in names.values())
    assert names[long_a] != names[long_b]
    assert len(renamed) == 2


def test_collisions_are_resolved_deterministically_whatever_the_order() -> None:
    first, _ = assign_names("srv", ["dup.name", "dup_name", "dup name"])
    second, renamed = assign_names("srv", ["dup name", "dup_name", "dup.name"])
    assert first == second
    # The tool whose name needed no change keeps it; the others get _2, _3 in sorted order.
    assert first["dup_name"] == "mcp_srv_dup_name"
    assert sorted(first.values()) == [
        "mcp_srv_dup_name",
        "mcp_srv_dup_name_2",
        "mcp_srv_dup_name_3",
    ]
    assert len(renamed) == 2


def test_a_tool_keeps_its_previous_name_and_names_taken_by_others_are_avoided() -> None:
    names, _ = assign_names(
        "srv",
        ["dup.name", "dup_name"],
        previous={"dup.name": "mcp_srv_dup_name"},
    )
    assert names == {"dup.name": "mcp_srv_dup_name", "dup_name": "mcp_srv_dup_name_2"}
    taken, renamed = assign_names("srv", ["echo"], taken={"mcp_srv_echo"})
    assert taken == {"echo": "mcp_srv_echo_2"}
    assert renamed == ["echo -> mcp_srv_echo_2"]


def test_a_suffix_on_a_64_character_name_stays_within_64() -> None:
    long = "y" * 70
    base = base_name("srv", long)
    names, _ = assign_names("srv", [long], taken={base})
    assert len(names[long]) == 64 and names[long].endswith("_2")


@pytest.mark.parametrize("name", ["", "has space", "x" * 41, "dot.ted"])
def test_a_bad_connection_name_is_invalid_argument(name: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_connection_name(name)
    assert caught.value.reason == "INVALID_CONNECTION_NAME"


def test_the_definition_hash_changes_with_schema_or_description_only() -> None:
    tool = McpTool("t", "does a thing", {"type": "object"})
    same = McpTool("t", "does a thing", {"type": "object"})
    assert definition_hash(tool) == definition_hash(same)
    assert definition_hash(tool) != definition_hash(McpTool("t", "does another", tool.input_schema))
    changed_schema = McpTool("t", "does a thing", {"type": "object", "required": ["x"]})
    assert definition_hash(tool) != definition_hash(changed_schema)


def test_implementation_round_trips_tool_names_with_colons() -> None:
    assert parse_implementation("mcp:srv:ns:tool") == ("srv", "ns:tool")
    assert parse_implementation("system:ping") is None
    assert parse_implementation("mcp:srv") is None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://u:secret@host:8080/mcp?api_key=abc&x=1",
            "https://u:***@host:8080/mcp?api_key=***&x=***",
        ),
        ("https://token@host/p", "https://***@host/p"),
        ("http://127.0.0.1:9/mcp", "http://127.0.0.1:9/mcp"),
        ("http://[::1/", "***"),
    ],
)
def test_a_url_is_shown_without_its_secrets(url: str, shown: str) -> None:
    """ListConnections and error messages showed a password or a token in a server's URL."""
    assert redact_url(url) == shown
    config = ServerConfig(name="c", transport="streamable_http", url=url)
    assert config.redacted().url == shown
    assert config.url == url  # kept whole: the bridge needs it to reconnect
