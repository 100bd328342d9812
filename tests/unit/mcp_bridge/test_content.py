"""CallToolResult content blocks mapped into the result envelope."""

from __future__ import annotations

import base64
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from services.mcp_bridge.content import MAX_INLINE_BYTES, result_to_envelope
from shared.contract import Err, Ok

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()


def result(*content: dict[str, Any], structured: Any = None, is_error: bool = False) -> Any:
    return SimpleNamespace(content=list(content), structured_content=structured, is_error=is_error)


def envelope(res: Any, export_dir: Path | None = None) -> Any:
    return result_to_envelope(res, connection="srv", tool="t", export_dir=export_dir)


def test_text_blocks_become_the_data_and_cost_is_zero() -> None:
    env = envelope(result({"type": "text", "text": "one"}, {"type": "text", "text": "two"}))
    assert isinstance(env, Ok)
    assert env.data == "one\ntwo"
    assert env.effects.cost == 0.0


def test_structured_content_becomes_the_data() -> None:
    env = envelope(result({"type": "text", "text": "{}"}, structured={"n": 3}))
    assert isinstance(env, Ok) and env.data == {"n": 3}


def test_is_error_is_an_err_with_the_servers_text() -> None:
    env = envelope(result({"type": "text", "text": "broken"}, is_error=True))
    assert env == Err("broken", "tool_error")


def test_an_image_becomes_a_card_and_an_exported_file(tmp_path: Path) -> None:
    env = envelope(result({"type": "image", "data": PNG, "mime_type": "image/png"}), tmp_path)
    assert isinstance(env, Ok)
    [card] = env.effects.cards
    assert card["type"] == "image" and card["mime_type"] == "image/png"
    assert card["data_base64"] == PNG
    [(filename, export)] = env.effects.exports.items()
    assert card["export"] == filename
    assert Path(export["path"]).read_bytes() == base64.b64decode(PNG)
    assert export["source_tool"] == "mcp:srv:t"


def test_a_large_blob_is_exported_but_not_inlined(tmp_path: Path) -> None:
    data = base64.b64encode(b"a" * (MAX_INLINE_BYTES + 1)).decode()
    env = envelope(
        result({"type": "resource", "resource": {"uri": "x://big.bin", "blob": data}}), tmp_path
    )
    assert isinstance(env, Ok)
    [card] = env.effects.cards
    assert "data_base64" not in card and card["uri"] == "x://big.bin"
    assert next(iter(env.effects.exports.values()))["size_bytes"] == MAX_INLINE_BYTES + 1


def test_text_resources_and_resource_links_become_cards() -> None:
    env = envelope(
        result(
            {
                "type": "resource",
                "resource": {"uri": "demo://1", "mime_type": "text/plain", "text": "hi"},
            },
            {"type": "resource_link", "uri": "demo://2", "name": "two"},
        )
    )
    assert isinstance(env, Ok)
    assert [c["type"] for c in env.effects.cards] == ["resource", "resource_link"]
    assert env.effects.cards[0]["text"] == "hi"
    assert env.effects.cards[1]["uri"] == "demo://2"


def test_invalid_base64_or_an_unknown_block_is_a_malformed_result_naming_the_block() -> None:
    bad = envelope(
        result({"type": "text", "text": "ok"}, {"type": "image", "data": "!!", "mime_type": "x"})
    )
    assert isinstance(bad, Err) and bad.err_kind == "malformed_result"
    assert "content block 1" in bad.message
    unknown = envelope(result({"type": "hologram"}))
    assert isinstance(unknown, Err) and "hologram" in unknown.message


def test_the_export_directory_keeps_within_its_limit_oldest_first(tmp_path: Path) -> None:
    """Every tenant's MCP exports share one directory, and nothing removed them: two calls of
    a server answering 20 MB images added 40 MB for good."""
    import os

    blobs = [bytes([i]) * 400_000 for i in range(5)]
    for i, blob in enumerate(blobs):
        block = {"type": "image", "data": base64.b64encode(blob).decode(), "mime_type": "image/png"}
        env = result_to_envelope(
            result(block),
            connection="c",
            tool="t",
            export_dir=tmp_path,
            export_max_bytes=1_000_000,
        )
        assert isinstance(env, Ok)
        (name,) = env.effects.exports
        os.utime(tmp_path / name, (1000 + i, 1000 + i))  # distinct ages, oldest first
    left = sorted(tmp_path.iterdir(), key=lambda p: p.stat().st_mtime)
    assert sum(p.stat().st_size for p in left) <= 1_000_000
    assert [p.read_bytes()[:1] for p in left] == [b"\x03", b"\x04"]  # the newest kept
