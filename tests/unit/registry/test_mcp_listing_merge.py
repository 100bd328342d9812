"""The MCP bridge's registration of a server's listing (UpsertTools with mcp_listing) merged into
the rows an administrator edits, on both databases: the bridge owns what the server declares and
its destructive gate capability, the administrator everything else, and a re-listing keeps it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from services.registry.core import Registry
from services.registry.model import ToolDef
from services.registry.repository import SqlToolRepository
from services.registry.servicer import RegistryServicer, tool_to_pb
from shared.errors import InvalidArgument
from toolmesh.registry.v1 import registry_pb2 as rpb
from toolmesh.type.v1 import types_pb2 as pb

GATE = "mcp.destructive"
ADMIN = "billing.admin"


def listed(name: str = "wipe", *, gate: bool = True, **changes: Any) -> ToolDef:
    """One tool of connection `inv` as the bridge registers it (GrpcToolSink's fields)."""
    tool = ToolDef(
        name=f"mcp_inv_{name}",
        description=f"[MCP: inv] {name} things",
        input_schema={"type": "object"},
        tool_type="mcp",
        status="approved",
        category="mcp",
        implementation=f"mcp:inv:{name}",
        tenant_id="*",
        created_by="mcp:inv",
        definition_hash="h1",
        annotations={"destructive": True},
        required_capabilities=[GATE] if gate else [],
    )
    return replace(tool, **changes)


def relist(repo: SqlToolRepository, *tools: ToolDef) -> list[ToolDef]:
    return repo.upsert(list(tools), mcp_listing=True)


def administer(repo: SqlToolRepository, name: str, **changes: Any) -> ToolDef:
    """An administrator's UpsertTools: the stored definition, read back, changed, written."""
    stored = repo.get(name)
    assert stored is not None
    (written,) = repo.upsert([replace(stored, **changes)])
    return written


def stored(repo: SqlToolRepository, name: str = "mcp_inv_wipe") -> ToolDef:
    tool = repo.get(name)
    assert tool is not None
    return tool


def test_a_relisting_keeps_an_administrators_capabilities_beside_the_gate(
    sessions: sessionmaker[Session],
) -> None:
    repo = SqlToolRepository(sessions)
    relist(repo, listed())
    administer(repo, "mcp_inv_wipe", required_capabilities=[GATE, ADMIN])

    (after,) = relist(repo, listed(description="[MCP: inv] reworded"))

    assert after.required_capabilities == [GATE, ADMIN]
    assert stored(repo).required_capabilities == [GATE, ADMIN]
    assert after.description == "[MCP: inv] reworded"
    # What records the listing's own capabilities is never shown.
    assert after.annotations == {"destructive": True} == stored(repo).annotations
    assert tool_to_pb(after).annotations == pb.ToolAnnotations(destructive=True)

    # The administrator's own write still replaces them; only the gate comes back.
    assert administer(repo, "mcp_inv_wipe", required_capabilities=[]).required_capabilities == []
    relist(repo, listed())
    assert stored(repo).required_capabilities == [GATE]


@pytest.mark.parametrize(
    ("relisted", "left"),
    [
        (listed(gate=False, annotations=None, definition_hash="h2"), [ADMIN]),  # hint gone
        (listed(gate=False), [ADMIN]),  # the gate turned off
        (listed(required_capabilities=["mcp.dangerous"]), [ADMIN, "mcp.dangerous"]),  # renamed
        (listed(), [ADMIN, GATE]),  # unchanged
    ],
    ids=["hint-gone", "gate-off", "gate-renamed", "unchanged"],
)
def test_the_gate_follows_the_listing_and_the_administrators_capability_stays(
    sessions: sessionmaker[Session], relisted: ToolDef, left: list[str]
) -> None:
    repo = SqlToolRepository(sessions)
    relist(repo, listed())
    administer(repo, "mcp_inv_wipe", required_capabilities=[ADMIN, GATE])

    relist(repo, relisted)

    assert stored(repo).required_capabilities == left
    relist(repo, listed(gate=False))  # and the next listing still knows the gate's from ADMIN
    assert stored(repo).required_capabilities == [ADMIN]


def test_an_administrator_who_already_required_the_gate_capability_keeps_it(
    sessions: sessionmaker[Session],
) -> None:
    """The tool required the capability before the server declared it destructive: the gate did
    not add it, so the gate going away does not take it off."""
    repo = SqlToolRepository(sessions)
    relist(repo, listed(gate=False, annotations=None))
    administer(repo, "mcp_inv_wipe", required_capabilities=[GATE])

    relist(repo, listed(definition_hash="h2"))
    assert stored(repo).required_capabilities == [GATE]
    relist(repo, listed(gate=False, annotations=None, definition_hash="h3"))
    assert stored(repo).required_capabilities == [GATE]


def test_a_relisting_keeps_what_an_administrator_set_and_replaces_what_the_server_declares(
    sessions: sessionmaker[Session],
) -> None:
    repo = SqlToolRepository(sessions)
    relist(repo, listed())
    administer(
        repo,
        "mcp_inv_wipe",
        category="internal",
        timeout_seconds=30.0,
        domain="ops",
        status_message="Wiping",
        large_output=True,
        dependencies=["mcp_inv_peek"],
    )
    repo.set_status("mcp_inv_wipe", None, "", enabled=False)

    relist(
        repo,
        listed(
            description="[MCP: inv] now wipes more",
            input_schema={"type": "object", "required": ["x"]},
            annotations={"destructive": True, "title": "Wipe"},
            definition_hash="h2",
            status="testing",
        ),
    )

    tool = stored(repo)
    assert (tool.enabled, tool.category, tool.timeout_seconds) == (False, "internal", 30.0)
    assert (tool.domain, tool.status_message, tool.large_output) == ("ops", "Wiping", True)
    assert tool.dependencies == ["mcp_inv_peek"]
    assert tool.description == "[MCP: inv] now wipes more"
    assert tool.input_schema == {"type": "object", "required": ["x"]}
    assert tool.annotations == {"destructive": True, "title": "Wipe"}
    assert (tool.definition_hash, tool.status) == ("h2", "testing")


def test_a_review_stands_while_the_definition_is_unchanged(
    sessions: sessionmaker[Session],
) -> None:
    """The bridge proposes the status it read; an approval or rejection made since stands."""
    repo = SqlToolRepository(sessions)
    relist(repo, listed(status="testing"))
    repo.set_status("mcp_inv_wipe", "rejected", "wipes the wrong disk", enabled=None)

    relist(repo, listed(status="testing"))
    tool = stored(repo)
    assert (tool.status, tool.rejection_reason) == ("rejected", "wipes the wrong disk")

    relist(repo, listed(status="testing", definition_hash="h2"))  # changed: held again
    tool = stored(repo)
    assert (tool.status, tool.rejection_reason) == ("testing", None)
    repo.set_status("mcp_inv_wipe", "approved", "", enabled=None)
    relist(repo, listed(status="testing", definition_hash="h2"))
    assert stored(repo).status == "approved"


def test_a_row_gated_before_listings_were_merged_gives_up_the_gate_when_the_hint_goes(
    sessions: sessionmaker[Session],
) -> None:
    """Rows the bridge wrote before this release hold its gate with no record of whose it is."""
    repo = SqlToolRepository(sessions)
    repo.upsert([listed(required_capabilities=[ADMIN, GATE])])  # as the old bridge wrote rows

    relist(repo, listed())
    assert stored(repo).required_capabilities == [ADMIN, GATE]
    relist(repo, listed(gate=False, annotations=None, definition_hash="h2"))
    assert stored(repo).required_capabilities == [ADMIN]


def test_a_deleted_tool_listed_again_keeps_what_was_set_only_for_its_own_connection(
    sessions: sessionmaker[Session],
) -> None:
    """Disconnect soft-deletes a connection's tools; connecting it again revives them."""
    repo = SqlToolRepository(sessions)
    relist(repo, listed(), listed("peek", gate=False, created_by="mcp:old"))
    for name in ("mcp_inv_wipe", "mcp_inv_peek"):
        administer(repo, name, required_capabilities=[GATE, ADMIN], timeout_seconds=5.0)
        repo.set_status(name, None, "", enabled=False)
    repo.soft_delete([], "mcp:inv")
    repo.soft_delete([], "mcp:old")

    relist(repo, listed(gate=False), listed("peek", gate=False))

    wipe = stored(repo)
    assert wipe.live
    assert (wipe.required_capabilities, wipe.timeout_seconds, wipe.enabled) == ([ADMIN], 5.0, False)
    # Another connection's leftover row is taken over as new: nothing of it is inherited.
    peek = stored(repo, "mcp_inv_peek")
    assert peek.live and peek.created_by == "mcp:inv"
    assert (peek.required_capabilities, peek.timeout_seconds, peek.enabled) == ([], None, True)


# --- UpsertTools ------------------------------------------------------------------------------


async def test_upsert_tools_merges_only_when_asked_and_only_mcp_tools(
    sessions: sessionmaker[Session],
) -> None:
    repo = SqlToolRepository(sessions)
    registry = Registry(repo, cache_ttl_s=0.0)
    servicer = RegistryServicer(registry, max_input_bytes=1 << 20)
    context: Any = None  # UpsertTools does not use it
    relist(repo, listed())
    administer(repo, "mcp_inv_wipe", required_capabilities=[GATE, ADMIN])
    try:
        request = rpb.UpsertToolsRequest(tools=[tool_to_pb(listed())], mcp_listing=True)
        (merged,) = (await servicer.UpsertTools(request, context)).tools
        assert list(merged.required_capabilities) == [GATE, ADMIN]

        # Without mcp_listing the definition is stored as given (an administrator's write).
        request = rpb.UpsertToolsRequest(tools=[tool_to_pb(listed(gate=False))])
        (replaced,) = (await servicer.UpsertTools(request, context)).tools
        assert list(replaced.required_capabilities) == []

        custom = listed(name="own", tool_type="custom", implementation="def run(): ...")
        with pytest.raises(InvalidArgument) as refused:
            await servicer.UpsertTools(
                rpb.UpsertToolsRequest(
                    tools=[tool_to_pb(listed()), tool_to_pb(custom)], mcp_listing=True
                ),
                context,
            )
        assert refused.value.reason == "INVALID_TOOL_DEFINITION"
        assert [field for field, _ in refused.value.field_violations] == ["tools[1].tool_type"]
        assert repo.get("mcp_inv_own") is None
    finally:
        registry.close()


def test_a_listing_waits_for_an_administrators_write_in_progress_and_keeps_it(
    sessions: sessionmaker[Session], engine: Any
) -> None:
    """An administrator's transaction holding the tool's row (PostgreSQL: FOR UPDATE) or the
    database's write lock (SQLite) when the listing starts: the listing reads the row once that
    transaction committed and merges into it (without a lock first, SQLite let the listing read
    the old row, then failed its write as 'database is locked', or lost the change)."""
    import threading
    import time

    from sqlalchemy import select, update

    from shared.db.models import ToolDefinitionRow

    repo = SqlToolRepository(sessions)
    relist(repo, listed())
    outcome: list[Any] = []
    admin = sessions()
    admin.begin()
    # The administrator's write, not committed yet: the row is locked on both databases.
    admin.execute(
        update(ToolDefinitionRow)
        .where(ToolDefinitionRow.name == "mcp_inv_wipe")
        .values(required_capabilities=[GATE, ADMIN])
    )
    assert admin.scalar(
        select(ToolDefinitionRow.name).where(ToolDefinitionRow.name == "mcp_inv_wipe")
    )

    def listing() -> None:
        try:
            outcome.append(relist(repo, listed(description="[MCP: inv] reworded", gate=False)))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            outcome.append(exc)

    thread = threading.Thread(target=listing)
    thread.start()
    time.sleep(0.5)  # the listing is waiting for the lock by now
    admin.commit()
    admin.close()
    thread.join(30)
    assert not thread.is_alive()
    (result,) = outcome
    assert not isinstance(result, Exception), result
    # The server dropped its hint: the gate comes off, the administrator's capability stays.
    assert stored(repo).required_capabilities == [ADMIN]
    assert stored(repo).description == "[MCP: inv] reworded"
