"""An MCP CallToolResult as the platform's result envelope: text blocks become the content,
images / audio / embedded resources become cards (and files in the export directory, when one is
given), resource links become cards, `structuredContent` becomes the data, `isError` an Err.
Works on the SDK's content objects by their `type` field, so it needs no SDK import."""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import mimetypes
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shared.contract import Effects, Envelope, Err, Ok

logger = logging.getLogger(__name__)

# Inline base64 in a card only up to this size; larger blobs are exported files only.
MAX_INLINE_BYTES = 256 * 1024
# The most the export directory holds (TOOLMESH_MCP_EXPORT_MAX_BYTES).
DEFAULT_EXPORT_MAX_BYTES = 1 << 30
_SAFE_FILE = re.compile(r"[^a-zA-Z0-9._-]")


def _get(block: Any, name: str, default: Any = None) -> Any:
    if isinstance(block, dict):
        return block.get(name, default)
    return getattr(block, name, default)


def _extension(mime_type: str) -> str:
    return mimetypes.guess_extension(mime_type or "") or ".bin"


class _Exporter:
    """Writes binary blocks under `directory` (content-addressed names) and records them; the
    directory holds at most `max_bytes`, the oldest files deleted past it (every tenant's
    exports share it, and nothing else ever removed one)."""

    def __init__(
        self, directory: Path | None, source_tool: str, max_bytes: int = DEFAULT_EXPORT_MAX_BYTES
    ) -> None:
        self._directory = directory
        self._source_tool = source_tool
        self._max_bytes = max_bytes
        self.exports: dict[str, dict[str, Any]] = {}

    def export(self, raw: bytes, mime_type: str, original: str = "") -> str | None:
        if self._directory is None:
            return None
        digest = hashlib.sha256(raw).hexdigest()[:16]
        stem = _SAFE_FILE.sub("_", Path(original).name) if original else ""
        filename = f"{digest}-{stem}" if stem else f"{digest}{_extension(mime_type)}"
        self._directory.mkdir(parents=True, exist_ok=True)
        path = self._directory / filename
        if not path.exists():
            path.write_bytes(raw)
            prune_exports(self._directory, self._max_bytes, keep=path)
        self.exports[filename] = {
            "path": str(path),
            "mime_type": mime_type,
            "size_bytes": len(raw),
            "source_tool": self._source_tool,
            "original_filename": original,
        }
        return filename


def prune_exports(directory: Path, max_bytes: int, *, keep: Path | None = None) -> int:
    """Delete the oldest files of `directory` until it holds at most 90% of `max_bytes`
    (never `keep`, the file just written); returns how many were deleted."""
    files = []
    total = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        info = entry.stat(follow_symlinks=False)
                        files.append((info.st_mtime, info.st_size, entry.path))
                        total += info.st_size
                except OSError:
                    continue
    except OSError:
        return 0
    if total <= max_bytes:
        return 0
    deleted = 0
    for _mtime, size, path in sorted(files):
        if total <= max_bytes * 0.9:
            break
        if keep is not None and path == str(keep):
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        total -= size
        deleted += 1
    if deleted:
        logger.info("deleted %d old MCP export(s) to keep %s under its limit", deleted, directory)
    return deleted


def _binary_card(
    kind: str, data: str, mime_type: str, exporter: _Exporter, original: str = ""
) -> dict[str, Any]:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MalformedContent(f"{kind} block carries invalid base64 data ({exc})") from None
    card: dict[str, Any] = {"type": kind, "mime_type": mime_type, "size_bytes": len(raw)}
    filename = exporter.export(raw, mime_type, original)
    if filename is not None:
        card["export"] = filename
    if len(raw) <= MAX_INLINE_BYTES:
        card["data_base64"] = data
    return card


class MalformedContent(ValueError):
    """A content block the bridge cannot interpret."""


def map_content(
    blocks: Sequence[Any],
    *,
    export_dir: Path | None = None,
    source_tool: str = "",
    export_max_bytes: int = DEFAULT_EXPORT_MAX_BYTES,
) -> tuple[list[str], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """(text parts, cards, exports) of a result's content blocks; MalformedContent names the
    first block that cannot be mapped."""
    texts: list[str] = []
    cards: list[dict[str, Any]] = []
    exporter = _Exporter(export_dir, source_tool, export_max_bytes)
    for index, block in enumerate(blocks):
        kind = _get(block, "type")
        try:
            if kind == "text":
                texts.append(str(_get(block, "text", "")))
            elif kind in ("image", "audio"):
                data = str(_get(block, "data", ""))
                mime_type = str(_get(block, "mime_type", ""))
                cards.append(_binary_card(kind, data, mime_type, exporter))
            elif kind == "resource":
                cards.append(_resource_card(_get(block, "resource"), exporter))
            elif kind == "resource_link":
                cards.append(
                    {
                        "type": "resource_link",
                        "uri": str(_get(block, "uri", "")),
                        "name": str(_get(block, "name", "") or ""),
                        "mime_type": str(_get(block, "mime_type", "") or ""),
                        "description": str(_get(block, "description", "") or ""),
                    }
                )
            else:
                raise MalformedContent(f"unknown content type {kind!r}")
        except MalformedContent as exc:
            raise MalformedContent(f"content block {index}: {exc}") from None
    return texts, cards, exporter.exports


def _resource_card(resource: Any, exporter: _Exporter) -> dict[str, Any]:
    if resource is None:
        raise MalformedContent("embedded resource without a resource")
    uri = str(_get(resource, "uri", ""))
    mime_type = str(_get(resource, "mime_type", "") or "")
    text = _get(resource, "text")
    if text is not None:
        return {"type": "resource", "uri": uri, "mime_type": mime_type, "text": str(text)}
    blob = _get(resource, "blob")
    if blob is None:
        raise MalformedContent(f"embedded resource {uri!r} has neither text nor blob")
    card = _binary_card("resource", str(blob), mime_type, exporter, original=uri.rsplit("/", 1)[-1])
    card["uri"] = uri
    return card


def result_to_envelope(
    result: Any,
    *,
    connection: str,
    tool: str,
    export_dir: Path | None = None,
    export_max_bytes: int = DEFAULT_EXPORT_MAX_BYTES,
) -> Envelope:
    """The envelope of a CallToolResult (cost always 0: MCP has no billing surface)."""
    source = f"mcp:{connection}:{tool}"
    try:
        texts, cards, exports = map_content(
            list(_get(result, "content") or []),
            export_dir=export_dir,
            source_tool=source,
            export_max_bytes=export_max_bytes,
        )
    except MalformedContent as exc:
        return Err(
            f"MCP server {connection!r} returned malformed content for tool {tool!r}: {exc}",
            err_kind="malformed_result",
        )
    text = "\n".join(t for t in texts if t)
    if _get(result, "is_error", False):
        return Err(text or f"MCP tool {tool!r} of {connection!r} reported an error", "tool_error")
    structured = _get(result, "structured_content")
    data: Any = structured if structured is not None else (text or None)
    return Ok(data=data, effects=Effects(cards=cards, exports=exports, cost=0.0))
