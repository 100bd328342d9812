"""working_set_entries.tenant_id: a working set belongs to (tenant, conversation, namespace), so
two tenants using the same conversation id never see each other's paged-in tools

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06 21:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows written before get '' (no tenant recorded): the surface shows them to every tenant
    # of their conversation, as before, rather than dropping what was paged in.
    with op.batch_alter_table("working_set_entries") as batch:
        batch.add_column(sa.Column("tenant_id", sa.String(128), nullable=False, server_default=""))
        batch.drop_constraint("uq_working_set_entries_key", type_="unique")
        batch.create_unique_constraint(
            "uq_working_set_entries_key",
            ["tenant_id", "conversation_id", "namespace_id", "tool_name"],
        )


def downgrade() -> None:
    # Rows of several tenants with one (conversation, namespace, tool) become one row.
    op.execute(
        "DELETE FROM working_set_entries WHERE id NOT IN (SELECT min(id) FROM "
        "working_set_entries GROUP BY conversation_id, namespace_id, tool_name)"
    )
    with op.batch_alter_table("working_set_entries") as batch:
        batch.drop_constraint("uq_working_set_entries_key", type_="unique")
        batch.create_unique_constraint(
            "uq_working_set_entries_key", ["conversation_id", "namespace_id", "tool_name"]
        )
        batch.drop_column("tenant_id")
