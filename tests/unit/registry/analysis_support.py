"""What the analysis tool tests share: the two small CSV files, a tool context over a data root
and a dataset store, and the readers of a result (the fixtures are in conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.registry.context import ToolContext
from services.registry.datasets import SqlDatasetStore
from shared.config import Settings
from shared.contract import Err, Hint, Ok, Warning

PEOPLE_CSV = (
    "id,name,city,age,joined\n"
    "1,Ada,London,36,2021-03-01\n"
    "2,Grace,Arlington,45,2020-11-15\n"
    "3,Linus,Helsinki,28,2022-01-20\n"
    "4,Margaret,Boston,,2019-07-04\n"
    "5,Zoë,Zürich,,2023-05-05\n"
)
ORDERS_CSV = (
    "order_id,person_id,amount,status\n"
    "100,1,12.50,paid\n"
    "101,1,7.25,paid\n"
    "102,2,99.00,refunded\n"
    "103,3,3.10,paid\n"
)


def make_context(
    tmp_path: Path,
    store: SqlDatasetStore,
    *,
    tenant_id: str = "t1",
    conversation_id: str = "c1",
    **overrides: Any,
) -> ToolContext:
    settings = Settings.from_env({"TOOLMESH_DATA_DIR": str(tmp_path)}).with_overrides(
        data_roots=(tmp_path / "files",), **overrides
    )
    return ToolContext(
        tool_name="analysis",
        tenant_id=tenant_id,
        conversation_id=conversation_id,
        settings=settings,
        datasets=store,
    )


def ok_of(result: Any) -> Ok:
    """The Ok of a spec-only handler's ToolResult, or a source-decorated handler's Ok."""
    if isinstance(result, Ok | Hint | Err):
        assert isinstance(result, Ok), result
        return result
    assert isinstance(result.envelope, Ok), result.content
    assert result.error is None
    return result.envelope


def kinds(ok: object) -> list[str]:
    return [w.kind for w in ok.warnings]  # type: ignore[attr-defined]


def warning_of(ok: object, kind: str) -> Warning:
    """The one warning of `kind` among `ok`'s."""
    [warning] = [w for w in ok.warnings if w.kind == kind]  # type: ignore[attr-defined]
    return warning
