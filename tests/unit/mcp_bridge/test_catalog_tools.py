"""search_mcp_marketplace / install_mcp_server over a local catalog file (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.registry.context import ToolContext
from services.registry.tools.mcp_catalog import (
    CatalogError,
    install_mcp_server,
    load_catalog,
    search_mcp_marketplace,
)
from shared.config import Settings
from shared.contract import Err, HintException, Ok

CATALOG = [
    {
        "name": "time",
        "description": "Current time and timezone conversions.",
        "transport": "stdio",
        "command": "mcp-server-time",
    },
    {
        "name": "weather",
        "description": "Forecasts for a city.",
        "transport": "streamable_http",
        "url": "http://127.0.0.1:1/mcp",
    },
]


def context(tmp_path: Path, catalog: object, **env: str) -> ToolContext:
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(catalog))
    settings = Settings.from_env(
        {"TOOLMESH_DATA_DIR": str(tmp_path), "TOOLMESH_MCP_CATALOG": str(path), **env}
    )
    return ToolContext(tool_name="t", tenant_id="acme", settings=settings)


async def test_search_ranks_name_matches_first_and_empty_lists_all(tmp_path: Path) -> None:
    ctx = context(tmp_path, CATALOG)
    found = await search_mcp_marketplace({"query": "time zone"}, ctx)
    assert isinstance(found.envelope, Ok)
    assert [e["name"] for e in found.envelope.data] == ["time"]
    everything = await search_mcp_marketplace({}, ctx)
    assert isinstance(everything.envelope, Ok)
    assert [e["name"] for e in everything.envelope.data] == ["time", "weather"]
    assert everything.envelope.data[1]["transport"] == "streamable_http"


async def test_a_missing_or_malformed_catalog_is_an_err_naming_the_file(tmp_path: Path) -> None:
    ctx = context(tmp_path, CATALOG, TOOLMESH_MCP_CATALOG=str(tmp_path / "nope.json"))
    missing = await search_mcp_marketplace({}, ctx)
    assert isinstance(missing.envelope, Err)
    assert missing.envelope.err_kind == "mcp_catalog_unavailable"
    assert "nope.json" in missing.envelope.message
    with pytest.raises(CatalogError, match="has no command"):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps([{"name": "x", "transport": "stdio"}]))
        load_catalog(path)


async def test_installing_an_unknown_entry_is_a_hint_with_the_closest_names(
    tmp_path: Path,
) -> None:
    with pytest.raises(HintException) as caught:
        await install_mcp_server({"name": "wether"}, context(tmp_path, CATALOG))
    hint = caught.value.to_hint()
    assert hint.hint_kind == "fetch"
    assert hint.alternatives[0].label == "weather"


async def test_installing_without_a_bridge_says_it_is_not_configured(tmp_path: Path) -> None:
    ctx = context(tmp_path, CATALOG, TOOLMESH_MCP_BRIDGE_ADDR="")
    result = await install_mcp_server({"name": "time"}, ctx)
    assert isinstance(result.envelope, Err)
    assert result.envelope.err_kind == "service_not_configured"
