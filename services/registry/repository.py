"""Storage of tool definitions behind a small interface; the only module of the registry that
speaks SQLAlchemy. Seeding runs in one transaction, and so does an upsert, including the merge
of an MCP server's listing into the rows an administrator may have edited (`upsert` with
mcp_listing)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import false, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from services.registry.model import SeedReport, ToolDef
from shared.db.engine import translate_db_errors
from shared.db.models import ToolDefinitionRow
from shared.errors import AlreadyExists, NotFound, Unavailable

logger = logging.getLogger(__name__)

# Fields seeding refreshes on existing rows; tool_type and status are never overwritten.
SEED_REFRESHED = (
    "description",
    "input_schema",
    "category",
    "handler_path",
    "status_message",
    "large_output",
)
# A row's columns that are a ToolDef's fields (the search vector and the listing's bookkeeping
# are not).
_ROW_FIELDS = tuple(
    c.key
    for c in ToolDefinitionRow.__table__.columns
    if c.key not in ("embedding", "listing_capabilities")
)
# What an upsert never takes from the definition given: the row's identity and bookkeeping.
_NOT_WRITTEN = ("id", "created_at", "updated_at", "version", "deleted_at")
# What the MCP bridge's registration of a server's listing replaces on a row already stored for
# the same connection: what the server declares. Every other field is an administrator's
# (enabled and status by SetToolStatus; category, timeout_seconds, domain, ... by UpsertTools)
# and is kept, a field added later included; status, rejection_reason and required_capabilities
# are merged (_listing_values).
LISTING_FIELDS = ("description", "input_schema", "implementation", "definition_hash", "annotations")


class ToolRepository(Protocol):
    def get(self, name: str) -> ToolDef | None: ...
    def names(self) -> list[str]: ...
    def find(
        self,
        *,
        tenant_id: str = "",
        tool_type: str = "",
        category: str = "",
        created_by: str = "",
        include_deleted: bool = False,
    ) -> list[ToolDef]: ...
    def for_llm(self, tenant_id: str) -> list[ToolDef]: ...
    def seed(self, tools: Sequence[dict[str, Any]], retired: Iterable[str]) -> SeedReport: ...
    def upsert(self, tools: Sequence[ToolDef], *, mcp_listing: bool = False) -> list[ToolDef]: ...
    def soft_delete(self, names: Sequence[str], created_by: str) -> list[str]: ...
    def set_status(
        self, name: str, status: str | None, reason: str, enabled: bool | None
    ) -> ToolDef: ...


_SEED_ATTEMPTS = 3


def _to_def(row: ToolDefinitionRow) -> ToolDef:
    return ToolDef(**{f: getattr(row, f) for f in _ROW_FIELDS})


def _same_connection(row: ToolDefinitionRow, tool: ToolDef) -> bool:
    """Whether `row` is `tool`'s own (the same MCP connection's), not one another owner left."""
    return (row.tool_type, row.tenant_id, row.created_by) == (
        tool.tool_type,
        tool.tenant_id,
        tool.created_by,
    )


def _listing_values(row: ToolDefinitionRow, tool: ToolDef) -> dict[str, Any]:
    """What an MCP listing writes on `row`, already stored for the same connection: the fields
    the server declares (LISTING_FIELDS); the status and rejection reason only when the
    definition hash changed (the bridge holds a changed definition in testing, and an
    administrator's approval or rejection of an unchanged one stands); and as required
    capabilities the stored ones minus those the previous listing added, plus the listing's own
    (`tool.required_capabilities`, the bridge's destructive gate).

    A row whose listing capabilities were never recorded (written before listings were merged,
    or by an administrator) counts those of its capabilities the listing asks for as the
    listing's: a gate unchanged across the upgrade stays the bridge's to take off. Any other
    capability is kept, an unknown one erring on the side of asking."""
    listed = row.listing_capabilities
    stored = list(row.required_capabilities or [])
    wanted = list(dict.fromkeys(tool.required_capabilities))
    if listed is None:
        listed = [c for c in stored if c in wanted]
    administrators = [c for c in stored if c not in listed]
    added = [c for c in wanted if c not in administrators]
    values: dict[str, Any] = {f: getattr(tool, f) for f in LISTING_FIELDS}
    values["listing_capabilities"] = added
    # In the stored order, the listing's new ones last.
    capabilities = [c for c in stored if c in administrators or c in added]
    values["required_capabilities"] = capabilities + [c for c in added if c not in capabilities]
    if row.definition_hash != tool.definition_hash:
        values["status"] = tool.status
        values["rejection_reason"] = tool.rejection_reason
    return values


def _upsert_values(
    row: ToolDefinitionRow | None, tool: ToolDef, mcp_listing: bool
) -> dict[str, Any]:
    """What an upsert of `tool` writes on `row` (None: a new row); see SqlToolRepository.upsert."""
    values = {f: getattr(tool, f) for f in _ROW_FIELDS if f not in _NOT_WRITTEN}
    if mcp_listing:
        if row is not None and _same_connection(row, tool):
            return _listing_values(row, tool)
        # A new row, or one another owner left deleted: nothing of it is inherited.
        listed = list(dict.fromkeys(tool.required_capabilities))
        values["required_capabilities"] = listed
        values["listing_capabilities"] = listed
        return values
    if row is not None and (row.tool_type, row.tenant_id) == (tool.tool_type, tool.tenant_id):
        # Of the capabilities the last listing added, those an administrator's write keeps stay
        # the listing's (to take off when the server drops its hint); the others are gone.
        listed_before = row.listing_capabilities
        if listed_before is not None:
            kept = [c for c in listed_before if c in tool.required_capabilities]
            values["listing_capabilities"] = kept
    elif row is not None:  # another owner's deleted row, revived: none of it is inherited
        values["listing_capabilities"] = None
    return values


def _now() -> datetime:
    return datetime.now(UTC)


class SqlToolRepository:
    """ToolRepository over SQLAlchemy (SQLite or PostgreSQL)."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def get(self, name: str) -> ToolDef | None:
        with translate_db_errors(), self._sessions() as s:
            row = s.scalar(select(ToolDefinitionRow).where(ToolDefinitionRow.name == name))
            return _to_def(row) if row is not None else None

    def names(self) -> list[str]:
        with translate_db_errors(), self._sessions() as s:
            stmt = select(ToolDefinitionRow.name).where(ToolDefinitionRow.deleted_at.is_(None))
            return list(s.scalars(stmt))

    def find(
        self,
        *,
        tenant_id: str = "",
        tool_type: str = "",
        category: str = "",
        created_by: str = "",
        include_deleted: bool = False,
    ) -> list[ToolDef]:
        stmt = select(ToolDefinitionRow)
        if tenant_id:
            stmt = stmt.where(ToolDefinitionRow.tenant_id.in_(("*", tenant_id)))
        if tool_type:
            stmt = stmt.where(ToolDefinitionRow.tool_type == tool_type)
        if category:
            stmt = stmt.where(ToolDefinitionRow.category == category)
        if created_by:
            stmt = stmt.where(ToolDefinitionRow.created_by == created_by)
        if not include_deleted:
            stmt = stmt.where(ToolDefinitionRow.deleted_at.is_(None))
        with translate_db_errors(), self._sessions() as s:
            return [_to_def(r) for r in s.scalars(stmt.order_by(ToolDefinitionRow.name))]

    def for_llm(self, tenant_id: str) -> list[ToolDef]:
        stmt = select(ToolDefinitionRow).where(
            ToolDefinitionRow.status == "approved",
            ToolDefinitionRow.enabled.is_(True),
            ToolDefinitionRow.category != "internal",
            ToolDefinitionRow.deleted_at.is_(None),
            or_(ToolDefinitionRow.tenant_id == "*", ToolDefinitionRow.tenant_id == tenant_id),
        )
        with translate_db_errors(), self._sessions() as s:
            return [_to_def(r) for r in s.scalars(stmt)]

    def seed(self, tools: Sequence[dict[str, Any]], retired: Iterable[str]) -> SeedReport:
        """Upsert the code's system tools. Existing rows get SEED_REFRESHED fields refreshed
        (never tool_type or status); a changed description clears the embedding; retired names
        are soft-deleted; live system rows the code does not know are reported, never deleted.

        Replicas starting together seed at once: the loser's transaction fails (a duplicate
        name, or on SQLite a write from a stale snapshot) and is run again, now seeing the
        winner's rows."""
        retired = set(retired)
        for attempt in range(1, _SEED_ATTEMPTS + 1):
            try:
                return self._seed_once(tools, retired)
            except (IntegrityError, Unavailable) as exc:
                if attempt == _SEED_ATTEMPTS:
                    raise
                logger.info("seeding raced another replica (%s); seeding again", type(exc).__name__)
        raise AssertionError("unreachable")

    def _seed_once(self, tools: Sequence[dict[str, Any]], retired: set[str]) -> SeedReport:
        report = SeedReport()
        known = {t["name"] for t in tools}
        with translate_db_errors(), self._sessions.begin() as s:
            rows = {r.name: r for r in s.scalars(select(ToolDefinitionRow))}
            for schema in tools:
                name = schema["name"]
                if name in retired:
                    continue
                row = rows.get(name)
                values = {
                    "description": schema["description"],
                    "input_schema": schema["input_schema"],
                    "category": schema["category"],
                    "handler_path": schema["handler_path"],
                    "status_message": schema.get("status_message"),
                    "large_output": bool(schema.get("large_output", False)),
                }
                if row is None:
                    s.add(
                        ToolDefinitionRow(
                            name=name,
                            implementation=f"system:{name}",
                            tool_type="system",
                            status="approved",
                            enabled=True,
                            tenant_id="*",
                            created_by="system",
                            **values,
                        )
                    )
                    report.created.append(name)
                    continue
                changed = {k: v for k, v in values.items() if getattr(row, k) != v}
                if row.deleted_at is not None and row.tool_type == "system":
                    row.deleted_at = None  # un-retired in code: revive
                    changed["deleted_at"] = None
                if not changed:
                    report.unchanged.append(name)
                    continue
                if "description" in changed:
                    row.embedding = None
                for k, v in changed.items():
                    setattr(row, k, v)
                row.version = (row.version or 1) + 1
                report.updated.append(name)
            for name in sorted(retired):
                row = rows.get(name)
                if row is not None and row.deleted_at is None:
                    row.deleted_at = _now()
                    report.retired.append(name)
            for name, row in sorted(rows.items()):
                if (
                    row.tool_type == "system"
                    and row.deleted_at is None
                    and name not in known
                    and name not in retired
                ):
                    report.unknown.append(name)
        if report.unknown:
            logger.warning(
                "seeding: %d live system tool(s) unknown to this code, left alone: %s",
                len(report.unknown),
                report.unknown,
            )
        return report

    def upsert(self, tools: Sequence[ToolDef], *, mcp_listing: bool = False) -> list[ToolDef]:
        """Create or update each definition by name, in one transaction. A name live as another
        type's or tenant's tool is AlreadyExists (TOOL_NAME_TAKEN); a soft-deleted row is
        revived.

        Without `mcp_listing` each definition is stored as given (an administrator's write; of
        the capabilities the last MCP listing added, those it keeps stay the listing's). With
        it, the definitions are an MCP server's listing as the bridge registers it: a row
        already stored for the same connection is merged (_listing_values), keeping what an
        administrator set; a new row, or one another owner left deleted, is stored as given,
        its required capabilities recorded as the listing's. Each row is read with SELECT ... FOR
        UPDATE: on PostgreSQL an administrator's SetToolStatus or UpsertTools of it waits for
        this transaction rather than being overwritten by it."""
        out: list[ToolDef] = []
        with translate_db_errors(), self._sessions.begin() as s:
            if s.get_bind().dialect.name == "sqlite":
                # No FOR UPDATE there, and the driver opens a transaction at its first write: a
                # write that matches nothing takes the database's write lock first, so no other
                # connection can change the rows read below before they are written.
                s.execute(
                    update(ToolDefinitionRow).where(false()).values(name=ToolDefinitionRow.name)
                )
            for tool in tools:
                row = s.scalar(
                    select(ToolDefinitionRow)
                    .where(ToolDefinitionRow.name == tool.name)
                    .with_for_update()
                )
                if row is not None:
                    taken = row.tool_type != tool.tool_type or row.tenant_id != tool.tenant_id
                    if taken and row.deleted_at is None:
                        raise AlreadyExists(
                            f"tool {tool.name!r} already exists as a {row.tool_type} tool "
                            f"of tenant {row.tenant_id!r}",
                            reason="TOOL_NAME_TAKEN",
                        )
                values = _upsert_values(row, tool, mcp_listing)
                if row is None:
                    row = ToolDefinitionRow(**values)
                    s.add(row)
                else:
                    if row.description != values.get("description", row.description):
                        row.embedding = None
                    for k, v in values.items():
                        setattr(row, k, v)
                    row.deleted_at = None
                    row.version = (row.version or 1) + 1
                try:
                    s.flush()
                except IntegrityError as exc:
                    raise AlreadyExists(
                        f"tool {tool.name!r} was created concurrently", reason="TOOL_NAME_TAKEN"
                    ) from exc
                out.append(_to_def(row))
        return out

    def soft_delete(self, names: Sequence[str], created_by: str) -> list[str]:
        stmt = select(ToolDefinitionRow).where(ToolDefinitionRow.deleted_at.is_(None))
        if names:
            stmt = stmt.where(ToolDefinitionRow.name.in_(list(names)))
        if created_by:
            stmt = stmt.where(ToolDefinitionRow.created_by == created_by)
        with translate_db_errors(), self._sessions.begin() as s:
            rows = list(s.scalars(stmt))
            now = _now()
            for row in rows:
                row.deleted_at = now
            return sorted(r.name for r in rows)

    def set_status(
        self, name: str, status: str | None, reason: str, enabled: bool | None
    ) -> ToolDef:
        with translate_db_errors(), self._sessions.begin() as s:
            row = s.scalar(select(ToolDefinitionRow).where(ToolDefinitionRow.name == name))
            if row is None or row.deleted_at is not None:
                raise NotFound(f"no tool named {name!r}", reason="TOOL_NOT_FOUND")
            if status:
                row.status = status
                row.rejection_reason = reason if status == "rejected" else None
            if enabled is not None:
                row.enabled = enabled
            s.flush()
            return _to_def(row)
